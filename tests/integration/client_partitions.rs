//! The Rust client's deadlines against a real server, with short session
//! timeouts: a holder cut off by a partition (the proxy of
//! common/proxy.rs, sockets kept open) or paused with SIGSTOP knows it
//! lost the lock before anybody else is granted it, whatever kind of grant
//! it held (a session grant, a fixed lease, a watchdog's lease); a waiter
//! cut off at its turn holds nobody up past its session's timeout; a short
//! silence loses nothing; a server restart under a session loses its
//! session grants for good and sends its waits again.
//!
//! Conditions are awaited with deadlines; the only sleeps are a
//! partition's length under test. Asserted are safety orderings (lost
//! before granted, FIFO), not timings.

use crate::common::proxy::Proxy;
use crate::common::*;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flock_client::{Guard, LeaseLost, Lock, SharedConnection, FOREVER};

const MS: Duration = Duration::from_millis(1);
/// The session timeout of the processes cut off.
const T: Duration = Duration::from_millis(1000);

fn client(url: &str) -> redis::Client {
    redis::Client::open(url).expect("client")
}

/// A proxy to `s`, and the session grant of `L` held through it (session
/// timeout `T`).
fn holder_behind_a_proxy(s: &Server) -> (Proxy, Guard<SharedConnection>) {
    let proxy = Proxy::start(s.port);
    let lock = Lock::new("L", 10 * SECOND).session_timeout(T);
    let guard = lock.acquire_on(&client(&proxy.url()), None).unwrap().expect("granted");
    (proxy, guard)
}

/// The `CLIENT ID` of the (one) connection that reads a session's inbox.
fn session_reader(c: &mut Connection) -> i64 {
    let mut id = None;
    wait_until("a session's reader", 5 * SECOND, || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(c).expect("CLIENT LIST");
        id = list
            .lines()
            .find(|l| l.contains("cmd=flock.inbox"))
            .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")).and_then(|id| id.parse().ok()));
        id.is_some()
    });
    id.expect("found")
}

/// A thread of another process (its own client) waiting for `key` without
/// limit: its guard and when its acquire returned.
fn waiter(url: &str, key: &str) -> JoinHandle<(Guard<SharedConnection>, Instant)> {
    let (client, key) = (client(url), key.to_string());
    std::thread::spawn(move || {
        let guard = Lock::new(key, 10 * SECOND).acquire_on(&client, Some(FOREVER)).unwrap().expect("granted");
        (guard, Instant::now())
    })
}

/// `waiter`, once it is the `place`th in `key`'s queue.
fn queued(s: &Server, key: &str, place: usize) -> JoinHandle<(Guard<SharedConnection>, Instant)> {
    let mut admin = s.conn();
    let next = waiter(&s.url(), key);
    wait_until("the waiter to queue", 5 * SECOND, || queue_of(&mut admin, key).len() == place);
    next
}

/// The holder (behind `proxy`) is cut off while `key`'s `next` waiter (of
/// another process) is queued: it is reported lost as `why` before that
/// waiter is granted.
fn cut_off_holder_knows_first<C: redis::ConnectionLike>(
    s: &Server,
    proxy: &Proxy,
    key: &str,
    guard: Guard<C>,
    next: JoinHandle<(Guard<SharedConnection>, Instant)>,
    why: LeaseLost,
) {
    let mut admin = s.conn();
    proxy.partition();
    let (next, granted) = next.join().expect("the waiter");
    let token = next.token();
    let lost = guard.lost_at().expect("the holder knows");
    assert!(lost < granted, "lost {:?} after the next holder was granted", lost - granted);
    assert_eq!(guard.lost_reason(), Some(why));
    assert!(guard.lost() && token > guard.token());
    proxy.heal();
    // Its release after the loss fails, and leaves the new holder alone.
    assert_eq!(error_code(&guard.release().unwrap_err()), "NOTOWNER");
    assert_eq!(token_of(&mut admin, key) as u64, token);
}

#[test]
fn a_holder_cut_off_with_a_session_grant_knows_it_lost_the_lock_before_the_next_is_granted() {
    let s = Server::start();
    let (proxy, guard) = holder_behind_a_proxy(&s);
    assert!(guard.session_grant());
    let next = queued(&s, "L", 1);
    cut_off_holder_knows_first(&s, &proxy, "L", guard, next, LeaseLost::Unconfirmed);
}

#[test]
fn a_holder_cut_off_with_a_fixed_lease_knows_it_lost_the_lock_before_the_next_is_granted() {
    let s = Server::start();
    let proxy = Proxy::start(s.port);
    let mut admin = s.conn();
    // The holder's lease starts at its turn, with the next waiter queued
    // behind it already: however late a loaded machine runs the threads,
    // nobody but the holder can be granted the lock while it holds it.
    assert!(acquire(&mut admin, "L", "first", 60_000).unwrap().is_some());
    let holder = std::thread::spawn({
        let client = client(&proxy.url());
        // The session would last longer than the lease: the lease decides.
        move || {
            let lock = Lock::new("L", 10 * SECOND).lease(300 * MS).session_timeout(10 * SECOND);
            lock.acquire_on(&client, Some(FOREVER)).unwrap().expect("granted")
        }
    });
    wait_until("the holder to queue", 5 * SECOND, || queue_of(&mut admin, "L").len() == 1);
    let next = queued(&s, "L", 2);
    assert_eq!(release(&mut admin, "L", "first").unwrap(), 0);
    let guard = holder.join().expect("the holder");
    cut_off_holder_knows_first(&s, &proxy, "L", guard, next, LeaseLost::Expired);
}

#[test]
fn a_holder_cut_off_whose_watchdog_renews_without_a_session_knows_it_lost_the_lock_before_the_next_is_granted() {
    let s = Server::start();
    let proxy = Proxy::start(s.port);
    let holder = client(&proxy.url());
    let mut admin = s.conn();
    // No session: a bare connection, the lease renewed by the watchdog (a
    // lease it keeps up with while the next waiter connects and queues on
    // a loaded machine).
    let mut guard = Lock::new("L", 1200 * MS).acquire(holder.get_connection().unwrap(), None).unwrap().expect("held");
    assert!(!guard.session_grant());
    let _lost = guard.watchdog(&holder).unwrap();
    // A few renewals first, a third of a lease apart: the lease outlives itself.
    wait_until("three renewals", 10 * SECOND, || renew_calls(&mut admin) >= 3);
    assert!(!guard.lost(), "renewed");
    let next = queued(&s, "L", 1);
    cut_off_holder_knows_first(&s, &proxy, "L", guard, next, LeaseLost::Unconfirmed);
}

/// What `paused_holder_child` (run in a child process) says, line by line.
struct Child {
    child: std::process::Child,
    lines: Receiver<String>,
}

impl Child {
    /// The test binary again, running only `paused_holder_child`, which
    /// holds `key` on the server at `url` with session timeout `T`.
    fn start(url: &str, key: &str) -> Child {
        let exe = std::env::current_exe().expect("the test binary");
        let mut child = Command::new(exe)
            .args(["--exact", "client_partitions::paused_holder_child", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env("FLOCK_CHILD_URL", url)
            .env("FLOCK_CHILD_KEY", key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the child");
        let out = child.stdout.take().expect("its stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                // The first one shares its line with libtest's `test ... `.
                if let Some((_, said)) = line.split_once("holder: ") {
                    let _ = tx.send(said.to_string());
                }
            }
        });
        Child { child, lines }
    }

    fn say(&mut self, what: &str) {
        let stdin = self.child.stdin.as_mut().expect("its stdin");
        writeln!(stdin, "{what}").and_then(|_| stdin.flush()).expect("tell the child");
    }

    fn hear(&self) -> String {
        self.lines.recv_timeout(30 * SECOND).expect("the child answers")
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child of `a_holder_paused_past_its_deadline_...`: holds the lock,
/// then answers `check` (lost? why?) and `release` from its stdin.
#[test]
#[ignore = "the child process of a_holder_paused_past_its_deadline_sees_it_lost_at_its_first_check_after_resuming"]
fn paused_holder_child() {
    let (Ok(url), Ok(key)) = (std::env::var("FLOCK_CHILD_URL"), std::env::var("FLOCK_CHILD_KEY")) else {
        return;
    };
    let client = client(&url);
    let guard = Lock::new(key, 10 * SECOND).session_timeout(T).acquire_on(&client, None).unwrap().expect("held");
    println!("holder: granted {}", guard.token());
    let mut guard = Some(guard);
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        match (line.trim(), &guard) {
            ("check", Some(g)) => println!("holder: lost={} reason={:?}", g.lost(), g.lost_reason()),
            ("release", Some(_)) => {
                let released = guard.take().expect("held").release();
                println!("holder: released {:?}", released.map_err(|e| error_code(&e)));
            }
            _ => println!("holder: ?"),
        }
    }
}

/// The read answered during the pause confirms the session as of its send,
/// and the next one waits half the time left: a pause shorter than T/2 - m
/// is heard of in time, at the client and at the server. The session
/// reader's socket has a timeout, so its read returns EINTR on resuming
/// (signal(7)); that must not end the session either.
#[test]
fn a_holder_paused_for_a_third_of_its_session_timeout_loses_nothing() {
    let s = Server::start();
    let mut admin = s.conn();
    let mut child = Child::start(&s.url(), "L");
    let held = child.hear();
    let token = token_of(&mut admin, "L");
    {
        let _stopped = Stopped::process(child.child.id());
        std::thread::sleep(T / 3); // the pause tested
    }
    // Past the session's timeout since the pause began: any loss has come.
    std::thread::sleep(T);
    child.say("check");
    assert_eq!(child.hear(), "lost=false reason=None", "{held}");
    assert_eq!(token_of(&mut admin, "L"), token);
    assert_eq!(s.stat("session_expiries"), 0);
}

#[test]
fn a_holder_paused_past_its_deadline_sees_it_lost_at_its_first_check_after_resuming() {
    let s = Server::start();
    let mut admin = s.conn();
    let mut child = Child::start(&s.url(), "L");
    let held = child.hear();
    assert!(held.starts_with("granted "), "{held}");
    child.say("check");
    assert_eq!(child.hear(), "lost=false reason=None");

    let next = waiter(&s.url(), "L");
    wait_until("the waiter to queue", 5 * SECOND, || queue_of(&mut admin, "L").len() == 1);
    let (next, _) = {
        // Stopped: no heartbeat, no timer runs. Its session expires on the
        // server, which hands the lock over meanwhile.
        let _stopped = Stopped::process(child.child.id());
        next.join().expect("the waiter")
        // SIGCONT here.
    };
    let token = next.token();
    // Its first check after resuming: lost, before any I/O could tell it.
    child.say("check");
    let said = child.hear();
    assert!(said.starts_with("lost=true reason=Some("), "{said}");
    assert!(said.contains("Unconfirmed") || said.contains("SessionEnded"), "{said}");
    child.say("release");
    assert_eq!(child.hear(), "released Err(\"NOTOWNER\")");
    assert_eq!(token_of(&mut admin, "L") as u64, token, "the next holder keeps it");
}

#[test]
fn a_waiting_process_cut_off_at_its_turn_holds_nobody_up_past_its_session_and_waits_again_after() {
    let s = Server::start();
    let mut admin = s.conn();
    let proxy = Proxy::start(s.port);
    let holder = Lock::new("L", 10 * SECOND).with_owner("holder").acquire(s.conn(), None).unwrap().expect("held");
    let cut = {
        let client = client(&proxy.url());
        std::thread::spawn(move || {
            let lock = Lock::new("L", 10 * SECOND).with_owner("cut").session_timeout(T);
            lock.acquire_on(&client, Some(30 * SECOND)).map(|g| g.map(|g| g.release()))
        })
    };
    wait_queue(&mut admin, "L", &["cut"]);
    let next = {
        let client = client(&s.url());
        std::thread::spawn(move || {
            let guard = Lock::new("L", 10 * SECOND).with_owner("next").acquire_on(&client, Some(FOREVER));
            guard.unwrap().expect("granted")
        })
    };
    wait_queue(&mut admin, "L", &["cut", "next"]);
    let connections = proxy.accepted();
    proxy.partition();
    drop(holder);
    // The grant to `cut` sits in its unread inbox until its session
    // expires; then it passes on.
    let next = next.join().expect("next");
    assert_eq!(owner_of(&mut admin, "L").as_deref(), Some("next"));
    // The partition lasts until `cut` has given its session up (and tries
    // a new one): a reader the machine held up past its deadline would
    // still take the reply a heal let through, with a grant the server
    // has taken back.
    wait_until("cut to open a new session", 5 * SECOND, || proxy.accepted() > connections);
    // Healed, `cut`'s wait is sent again on a new session (the same
    // request ID, what is left of its time) and queues behind.
    proxy.heal();
    wait_queue(&mut admin, "L", &["cut"]);
    drop(next);
    let released = cut.join().expect("cut").unwrap().expect("granted after the heal");
    assert_eq!(released.unwrap(), 0);
    assert!(info(&mut admin, "L").is_none());
}

#[test]
fn a_holder_cut_off_with_a_hundred_waiters_behind_passes_the_lock_on_after_its_timeout_in_fifo_order() {
    const N: usize = 100;
    let s = Server::start();
    let mut admin = s.conn();
    let (proxy, guard) = holder_behind_a_proxy(&s);
    let others = client(&s.url());
    let granted = Arc::new(Mutex::new(Vec::new()));
    let start = Arc::new(Barrier::new(N));
    let threads: Vec<_> = (0..N)
        .map(|_| {
            let (others, granted, start) = (others.clone(), Arc::clone(&granted), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                let guard: Guard<SharedConnection> =
                    Lock::new("L", 10 * SECOND).acquire_on(&others, Some(FOREVER)).unwrap().expect("handed");
                granted.lock().unwrap().push((guard.owner().to_string(), Instant::now()));
                guard.release().unwrap();
            })
        })
        .collect();
    wait_until("100 waiters queued", 20 * SECOND, || queue_of(&mut admin, "L").len() == N);
    let queue = queue_of(&mut admin, "L");
    proxy.partition();
    for t in threads {
        t.join().expect("a waiter");
    }
    let granted = granted.lock().unwrap();
    let order: Vec<&str> = granted.iter().map(|(o, _)| o.as_str()).collect();
    assert_eq!(order, queue.iter().map(String::as_str).collect::<Vec<_>>(), "granted in queue order");
    assert_eq!(guard.lost_reason(), Some(LeaseLost::Unconfirmed));
    assert!(guard.lost_at().expect("lost") < granted[0].1, "the holder knew first");
    proxy.heal();
    assert!(info(&mut admin, "L").is_none());
}

#[test]
fn a_session_silent_for_less_than_a_third_of_its_timeout_loses_nothing() {
    // The longest silence a holder always survives: its read sent just
    // before the cut is answered up to T/4 after the heal, and the deadline
    // is T − m after the read before it, sent up to T/4 earlier: T/2 − m.
    let t = 1500 * MS;
    let s = Server::start();
    let mut admin = s.conn();
    let proxy = Proxy::start(s.port);
    let holder = client(&proxy.url());
    let guard = Lock::new("L", 10 * SECOND).session_timeout(t).acquire_on(&holder, None).unwrap().expect("granted");
    let fixed = Lock::new("F", 10 * SECOND)
        .lease(10 * SECOND)
        .session_timeout(t)
        .acquire_on(&holder, None)
        .unwrap()
        .expect("granted");
    let reader = session_reader(&mut admin);
    for _ in 0..3 {
        proxy.partition();
        // The partition's length under test.
        std::thread::sleep(t / 3 - 150 * MS);
        proxy.heal();
        // A whole timeout after it: nothing was lost.
        let until = Instant::now() + t;
        while Instant::now() < until {
            assert!(!guard.lost() && !fixed.lost(), "{:?} {:?}", guard.lost_reason(), fixed.lost_reason());
            std::thread::sleep(10 * MS);
        }
    }
    assert_eq!(session_reader(&mut admin), reader, "the same session throughout");
    assert_eq!(s.stat("session_expiries"), 0);
    assert_eq!(owner_of(&mut admin, "L").as_deref(), Some(guard.owner()));
    assert_eq!(guard.release().unwrap(), 0);
    assert_eq!(fixed.release().unwrap(), 0);
}

#[test]
fn a_server_restart_under_a_session_loses_its_session_grants_for_good_and_sends_its_waits_again() {
    let mut s = Server::start();
    let mut admin = s.conn();
    let c = client(&s.url());
    let timeout = 3 * SECOND;
    let guard = Lock::new("L", 10 * SECOND).session_timeout(timeout).acquire_on(&c, None).unwrap().expect("granted");
    let owner = guard.owner().to_string();
    let lost = guard.lost_channel();
    acquire(&mut admin, "W", "other", 60_000).unwrap().expect("W held by another");
    let waiting = {
        let c = c.clone();
        std::thread::spawn(move || {
            let lock = Lock::new("W", 10 * SECOND).with_owner("w").session_timeout(timeout);
            lock.acquire_on(&c, Some(60 * SECOND)).map(|g| g.map(|g| g.release()))
        })
    };
    wait_queue(&mut admin, "W", &["w"]);

    // Saved and restarted: the grants come back from the RDB (L with the
    // session's timeout as its lease), the session does not.
    s.restart(Stop::ShutdownSave);
    let mut admin = s.conn();
    assert_eq!(lost.recv_timeout(10 * SECOND), Ok(LeaseLost::SessionEnded));
    // The waits are sent again on a new session; L is never taken again.
    wait_queue(&mut admin, "W", &["w"]);
    wait_until("L's lease from the RDB to run out", 2 * timeout, || info(&mut admin, "L").is_none());
    assert_eq!(s.stat("reentrant_acquires"), 0, "no re-watch of a session grant");
    assert_ne!(owner_of(&mut admin, "L").as_deref(), Some(owner.as_str()));
    assert_eq!(error_code(&guard.release().unwrap_err()), "NOTOWNER");
    release(&mut admin, "W", "other").unwrap();
    assert_eq!(waiting.join().expect("the waiter").unwrap().expect("granted").unwrap(), 0);
}
