//! The Rust client API (crate `flock-client`) against a
//! real server: tokens, release on drop, waiting, the watchdog and lease loss.

use crate::common::proxy::Proxy;
use crate::common::*;

use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use flock_client::{Guard, LeaseLost, Lock, FOREVER};

const MS: Duration = Duration::from_millis(1);

fn client(s: &Server) -> redis::Client {
    redis::Client::open(s.url()).expect("client")
}

/// A fresh hold of lock `L` with `lease`, on a connection of its own.
fn hold(s: &Server, lease: Duration) -> Guard<Connection> {
    Lock::new("L", lease).acquire(s.conn(), None).unwrap().expect("granted")
}

fn token_if_held(c: &mut Connection, key: &str) -> Option<u64> {
    info_field(c, key, "token").map(|v| redis::from_redis_value(&v).expect("token"))
}

#[test]
fn guard_carries_the_token_and_owner_and_reenters_on_the_same_thread() {
    let s = Server::start();
    let (mut c, mut admin) = (s.conn(), s.conn());
    let lock = Lock::new("L", 10 * SECOND);
    let owner = lock.owner();
    let (process, thread) = owner.rsplit_once(':').expect("owner is <uuid>:<thread>");
    assert_eq!(process.len(), 36, "uuid-shaped process id in {owner}");
    assert!(thread.parse::<u64>().is_ok(), "thread id in {owner}");

    let guard = lock.acquire(&mut c, None).unwrap().expect("free lock granted");
    assert_eq!(Some(guard.token()), token_if_held(&mut admin, "L"));
    assert_eq!(owner_of(&mut admin, "L").as_deref(), Some(owner.as_str()));
    assert_eq!(guard.owner(), owner);

    // Same thread, another connection: a second hold with the same token.
    let mut c2 = s.conn();
    let again = lock.acquire(&mut c2, None).unwrap().expect("reentered");
    assert_eq!(again.token(), guard.token());
    assert_eq!(info_field(&mut admin, "L", "holds"), Some(Value::Int(2)));

    // Another thread is another owner: a try gets nothing.
    let other = std::thread::scope(|t| t.spawn(|| lock.owner()).join().unwrap());
    assert_ne!(other, owner);
    assert!(lock.clone().with_owner(other).acquire(s.conn(), None).unwrap().is_none());

    assert_eq!(again.release().unwrap(), 1);
    assert_eq!(guard.release().unwrap(), 0);
    assert!(info(&mut admin, "L").is_none());
}

#[test]
fn dropping_the_guard_releases_the_hold() {
    let s = Server::start();
    let mut admin = s.conn();
    {
        let mut guard = hold(&s, 10 * SECOND);
        // The guard's connection stays usable for work.
        let pong: String = redis::cmd("PING").query(guard.conn()).unwrap();
        assert_eq!(pong, "PONG");
        assert!(owner_of(&mut admin, "L").is_some());
    }
    assert!(info(&mut admin, "L").is_none(), "dropped guard released the lock");
    assert_eq!(s.stat("releases"), 1);
}

#[test]
fn waiting_acquire_is_handed_the_lock_or_times_out() {
    let s = Server::start();
    let mut admin = s.conn();
    let lock = Lock::new("L", 10 * SECOND);
    let holder = lock.acquire(s.conn(), None).unwrap().expect("granted");

    // Busy: a try is None at once; a bounded wait is None after its time.
    let other = lock.clone().with_owner("other");
    assert!(other.acquire(s.conn(), None).unwrap().is_none());
    let started = Instant::now();
    assert!(other.acquire(s.conn(), Some(100 * MS)).unwrap().is_none());
    assert!(started.elapsed() >= 100 * MS);

    // Waiting without limit: handed the lock when the holder lets go.
    let waiter = {
        let (other, mut c) = (other.clone(), s.conn());
        std::thread::spawn(move || other.acquire(&mut c, Some(FOREVER)).unwrap().map(|g| g.token()))
    };
    wait_queue(&mut admin, "L", &["other"]);
    let first = holder.token();
    drop(holder);
    let second = waiter.join().unwrap().expect("handed the lock");
    assert!(second > first, "hand-off token {second} > {first}");
    assert!(info(&mut admin, "L").is_none(), "the waiter's guard was dropped in its thread");
}

#[test]
fn watchdog_keeps_a_short_lease_alive_and_stops_on_release() {
    let s = Server::start();
    let mut admin = s.conn();
    // Short next to the default, long enough for a loaded machine's renewals.
    let lease = 1200 * MS;
    let mut guard = hold(&s, lease);
    let lost = guard.watchdog(&client(&s)).unwrap();
    let token = guard.token();

    // Six renewals, a third of a lease apart: two lease periods, without
    // renewals it would have expired.
    let started = Instant::now();
    while renew_calls(&mut admin) < 6 {
        assert_eq!(token_if_held(&mut admin, "L"), Some(token), "still held after {:?}", started.elapsed());
        assert!(started.elapsed() < 10 * lease, "only {} renewals", renew_calls(&mut admin));
        std::thread::sleep(20 * MS);
    }
    assert!(!guard.lost());
    assert_eq!(s.stat("lease_expiries"), 0);
    assert_eq!(lost.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty));

    // Released: the watchdog ends without reporting a loss, and renews no
    // more (another owner's lease runs out on time).
    assert_eq!(guard.release().unwrap(), 0);
    assert_eq!(lost.recv_timeout(SECOND), Err(RecvTimeoutError::Disconnected));
    let mut c = s.conn();
    acquire(&mut c, "L", "next", 200).unwrap().expect("free after release");
    wait_until("next's lease to run out", 2 * SECOND, || info(&mut admin, "L").is_none());
}

#[test]
fn watchdog_reports_lease_loss_after_forcerelease() {
    let s = Server::start();
    let mut admin = s.conn();
    // A lease the watchdog keeps up with while the waiter connects and
    // queues on a loaded machine.
    let mut guard = hold(&s, 1200 * MS);
    let lost = guard.watchdog(&client(&s)).unwrap();
    // A waiter gets the lock the moment it is taken away.
    let waiter = spawn_waiter(&s, "L", "next", 10_000, 5_000);
    wait_queue(&mut admin, "L", &["next"]);

    assert_eq!(force_release(&mut admin, "L").unwrap(), 1);
    assert!(waiter.join().unwrap().unwrap().is_some());
    assert_eq!(lost.recv_timeout(2 * SECOND), Ok(LeaseLost::NotOwner));
    assert!(guard.lost());
    // Its release is refused and leaves the new holder alone.
    let e = guard.release().unwrap_err();
    assert_eq!(error_code(&e), "NOTOWNER");
    assert_eq!(owner_of(&mut admin, "L").as_deref(), Some("next"));
}

#[test]
fn manual_renew_extends_the_lease_and_detects_loss() {
    let s = Server::start();
    let mut admin = s.conn();
    let mut guard = hold(&s, 10 * SECOND);
    assert_eq!(guard.renew().unwrap(), guard.token());
    force_release(&mut admin, "L").unwrap();
    assert_eq!(error_code(&guard.renew().unwrap_err()), "NOTOWNER");
    assert!(guard.lost());
}

#[test]
fn watchdog_reports_an_unreachable_server_after_one_lease() {
    let mut s = Server::start();
    let lease = 300 * MS;
    let mut guard = hold(&s, lease);
    let lost = guard.watchdog(&client(&s)).unwrap();
    let stopped = Instant::now();
    s.stop(Stop::Kill);
    assert_eq!(lost.recv_timeout(5 * SECOND), Ok(LeaseLost::Unconfirmed));
    assert!(stopped.elapsed() >= lease - lease / 3, "reported only after about one lease: {:?}", stopped.elapsed());
    assert!(guard.lost());
    // Dropping the guard with the server gone does not panic.
}

/// How many `FLOCK.FENCED` the server received (run, failed or rejected).
fn fenced_sent(admin: &mut Connection) -> u64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(admin).unwrap();
    let Some(line) = stats.lines().find_map(|l| l.strip_prefix("cmdstat_flock.fenced:")) else { return 0 };
    line.split(',')
        .filter_map(|field| field.split_once('='))
        .filter(|(name, _)| matches!(*name, "calls" | "rejected_calls"))
        .map(|(_, n)| n.parse::<u64>().unwrap())
        .sum()
}

fn get(admin: &mut Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(admin).unwrap()
}

/// The error of a fenced command the server (or the guard) refused as stale.
pub fn stale(r: RedisResult<impl std::fmt::Debug>, what: &str) -> redis::RedisError {
    let e = expect_err(r, what);
    assert_eq!(e.code(), Some("STALE"), "{what}: {e}");
    e
}

#[test]
fn fenced_writes_while_the_grant_holds_and_is_refused_once_it_was_force_released() {
    let s = Server::start();
    let mut admin = s.conn();
    // No client given: no session, so the force-release below is not
    // pushed to the guard; only the fenced write can find it out.
    let mut guard = Lock::new("{order:1}:lock", Duration::from_secs(60))
        .acquire(s.conn(), None)
        .unwrap()
        .expect("a free lock is granted");

    let set: String = guard.fenced(redis::cmd("SET").arg("{order:1}:row").arg("v1")).unwrap();
    assert_eq!(set, "OK");
    let read: Option<String> = guard.fenced(redis::cmd("GET").arg("{order:1}:row")).unwrap();
    assert_eq!(read.as_deref(), Some("v1"));

    // The command's own error passes through and loses nothing.
    let e = guard.fenced::<i64>(redis::cmd("INCR").arg("{order:1}:row")).expect_err("INCR of a non-integer");
    assert_eq!(e.kind(), redis::ErrorKind::ResponseError, "{e}");
    assert!(e.to_string().contains("not an integer"), "{e}");
    assert!(!guard.lost(), "the command's own error is no loss");
    assert_eq!(guard.lost_reason(), None);

    // A cursor argument cannot be read back from the Cmd: refused here.
    let sent = fenced_sent(&mut admin);
    let e = guard.fenced::<redis::Value>(redis::cmd("SCAN").cursor_arg(0)).expect_err("a cursor argument");
    assert_eq!(e.kind(), redis::ErrorKind::ClientError, "{e}");
    assert_eq!(fenced_sent(&mut admin), sent, "nothing was sent");
    assert!(!guard.lost());

    force_release(&mut admin, "{order:1}:lock").unwrap();
    assert!(!guard.lost(), "no session: the force-release is not pushed");
    let sent = fenced_sent(&mut admin);
    let e = stale(
        guard.fenced::<String>(redis::cmd("SET").arg("{order:1}:row").arg("v2")),
        "a write after the force-release",
    );
    assert!(e.to_string().contains(&format!("token {} does not hold this lock", guard.token())), "{e}");
    assert_eq!(fenced_sent(&mut admin), sent + 1, "the server's refusal is counted, so the count shows a send");
    assert!(guard.lost(), "a STALE reply marks the guard lost");
    assert_eq!(guard.lost_reason(), Some(LeaseLost::NotOwner));

    // Known lost here: refused without sending.
    let sent = fenced_sent(&mut admin);
    let e =
        stale(guard.fenced::<String>(redis::cmd("SET").arg("{order:1}:row").arg("v3")), "a write through a lost guard");
    assert!(e.to_string().contains("not sent"), "{e}");
    assert_eq!(fenced_sent(&mut admin), sent, "nothing was sent");
    assert_eq!(get(&mut admin, "{order:1}:row").as_deref(), Some("v1"), "no stale write ran");

    let released = guard.release().expect_err("the guard was lost");
    assert_eq!(released.code(), Some("NOTOWNER"), "{released}");
}

#[test]
fn lock_delay_is_asked_with_the_acquire_and_keeps_the_lock_closed_after_the_lease_runs_out() {
    let s = Server::start();
    let mut c = s.conn();
    // Held long enough to be read on a loaded machine; the lease that runs
    // out is a RENEW's of 100 ms.
    let guard =
        Lock::new("delayed", 60 * SECOND).lock_delay(Duration::from_millis(400)).acquire(s.conn(), None).unwrap();
    let guard = guard.expect("a free lock is granted");
    let Some(Value::Array(holders)) = info_field(&mut c, "delayed", "holders") else { panic!("no holders") };
    let delay = fields_of(&holders[0]).into_iter().find(|(k, _)| k == "lock-delay-ms").map(|(_, v)| int(&v));
    assert_eq!(delay, Some(400));
    // Connected before the delay starts: a connect may take long on a loaded machine.
    let other = s.conn();
    renew(&mut c, "delayed", guard.owner(), 100).unwrap();
    wait_until("the lease to end into its delay", Duration::from_secs(5), || {
        info_field(&mut c, "delayed", "delayed-ms").is_some_and(|v| int(&v) > 0)
    });
    assert!(Lock::new("delayed", 10_000 * MS).acquire(other, None).unwrap().is_none(), "closed during the delay");
    drop(guard);
}

/// docs/client-protocol.md, "stale holds": an acquire whose every reply was
/// lost may still have been granted, a hold its owner does not know of. The
/// owner's next grant reenters it, and gives it back, so that the caller
/// holds one and its one release frees the lock.
#[test]
fn a_hold_whose_acquire_lost_every_reply_is_given_back_by_the_owners_next_grant() {
    let s = Server::start();
    let mut admin = s.conn();
    let key = "unknown-acquire";
    let proxy = Proxy::start(s.port);
    // The process dies as the server grants it: its reply, and every
    // resend, is lost.
    proxy.kill_at_reply_to("FLOCK.ACQUIRE");
    let conn = redis::Client::open(proxy.url()).unwrap().get_connection().unwrap();
    let e = Lock::new(key, 10 * SECOND).with_owner("me").acquire(conn, None).expect_err("every reply was lost");
    assert!(e.is_io_error(), "{e}");
    assert_eq!(holds(&mut admin, key), 1, "the server granted it all the same");

    let g = Lock::new(key, 10 * SECOND).with_owner("me").acquire(s.conn(), None).unwrap().expect("a reentry");
    assert_eq!(holds(&mut admin, key), 1, "the unknown hold was given back");
    assert_eq!(g.release().unwrap(), 0);
    assert_eq!(info(&mut admin, key), None);
}
