//! Request IDs (`ID request-id` on ACQUIRE, RELEASE, RENEW, FORCERELEASE):
//! a resent command is answered its first reply and applied once. Real
//! clients resend through a proxy that loses a reply (redis-py with its
//! default retry, the Rust client); then each rule directly, and the IDs
//! across reloads, restarts, replication and failover.

use crate::common::proxy::Proxy;
use crate::common::*;

use std::path::Path;
use std::process::Command;

/// The holds of `key`, 0 when nobody holds it.
fn holds_or_zero(c: &mut Connection, key: &str) -> i64 {
    info_field(c, key, "holds").map_or(0, |v| redis::from_redis_value(&v).expect("holds"))
}

// ------------------------------------------------- redis-py through the proxy

/// Runs tests/python/lost_release_reply.py through a proxy that swallows the
/// reply to the first FLOCK.RELEASE; returns (release reply, holds after).
fn redis_py_release_with_lost_reply(with_id: bool) -> (i64, i64) {
    let s = Server::start();
    let proxy = Proxy::start(s.port);
    proxy.drop_reply_to("FLOCK.RELEASE", 1);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/lost_release_reply.py");
    let mode = if with_id { "with-id" } else { "without-id" };
    let out =
        Command::new("python3").arg(script).arg(proxy.port.to_string()).arg("L").arg(mode).output().expect("python3");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "lost_release_reply.py {mode}:\n{stdout}\n{stderr}");
    println!("{mode}: {}", stdout.trim());
    assert_eq!(proxy.dropped(), 1, "the proxy swallowed the first release's reply");
    assert_eq!(proxy.seen("FLOCK.RELEASE"), 2, "redis-py resent the release once");
    let field = |name: &str| -> i64 {
        let word = stdout.split_whitespace().find_map(|w| w.strip_prefix(name)?.strip_prefix('='));
        word.and_then(|w| w.parse().ok()).unwrap_or_else(|| panic!("no {name}= in {stdout}"))
    };
    assert!(field("retries") >= 1, "redis-py retries: {stdout}");
    assert_eq!(holds_or_zero(&mut s.conn(), "L"), field("holds"), "the script read the server's holds");
    (field("reply"), field("holds"))
}

#[test]
fn redis_py_retry_of_a_release_whose_reply_was_lost_releases_twice_without_id() {
    require_redis_py();
    // The documented failure: the resend releases the second hold too.
    assert_eq!(redis_py_release_with_lost_reply(false), (0, 0));
}

#[test]
fn redis_py_retry_of_a_release_whose_reply_was_lost_releases_once_with_id() {
    require_redis_py();
    assert_eq!(redis_py_release_with_lost_reply(true), (1, 1));
}

// ------------------------------------------------ the Rust client through the proxy

mod rust_client {
    use super::*;
    use flock_client::Lock;
    use std::time::Duration;

    #[test]
    fn rust_client_resends_acquire_release_and_renew_whose_reply_was_lost_and_each_applies_once() {
        let s = Server::start();
        let proxy = Proxy::start(s.port);
        let client = redis::Client::open(proxy.url()).expect("client");
        let mut admin = s.conn();
        let lock = Lock::new("L", 60 * SECOND).reconnect_with(&client);
        let lost_reply_to = |command: &str, resends_before: usize| {
            assert_eq!(proxy.seen(command), resends_before);
            proxy.drop_reply_to(command, 1);
        };

        // The grant's reply is lost: the resend gets the same token, one hold.
        lost_reply_to("FLOCK.ACQUIRE", 0);
        let first = lock.acquire(client.get_connection().unwrap(), None).unwrap().expect("granted");
        assert_eq!((proxy.dropped(), proxy.seen("FLOCK.ACQUIRE")), (1, 2), "one lost reply, one resend");
        assert_eq!(holds_or_zero(&mut admin, "L"), 1);
        assert_eq!(info_field(&mut admin, "L", "token"), Some(Value::Int(first.token() as i64)));

        // A reentry's reply is lost: still one more hold, not two.
        lost_reply_to("FLOCK.ACQUIRE", 2);
        let second = lock.acquire(client.get_connection().unwrap(), None).unwrap().expect("reentered");
        assert_eq!(second.token(), first.token());
        assert_eq!(holds_or_zero(&mut admin, "L"), 2);

        // A release's reply is lost: the resend answers 1 and the lock keeps 1 hold.
        lost_reply_to("FLOCK.RELEASE", 0);
        assert_eq!(second.release().unwrap(), 1);
        assert_eq!((proxy.dropped(), proxy.seen("FLOCK.RELEASE")), (3, 2));
        assert_eq!(holds_or_zero(&mut admin, "L"), 1);

        // A renewal's reply is lost, by hand and the watchdog's.
        let mut first = first;
        lost_reply_to("FLOCK.RENEW", 0);
        assert_eq!(first.renew().unwrap(), first.token());
        assert_eq!((proxy.dropped(), proxy.seen("FLOCK.RENEW")), (4, 2));
        proxy.drop_reply_to("FLOCK.RENEW", 1);
        // A lease the watchdog's lost reply, reconnection and resend fit in
        // on a loaded machine.
        let mut watched = Lock::new("W", 1200 * Duration::from_millis(1))
            .acquire(client.get_connection().unwrap(), None)
            .unwrap()
            .expect("granted");
        let lost = watched.watchdog(&client).unwrap();
        wait_until("the watchdog's renewal to lose a reply and renew again", 5 * SECOND, || {
            proxy.dropped() == 5 && proxy.seen("FLOCK.RENEW") >= 5
        });
        assert!(!watched.lost() && lost.try_recv().is_err(), "a lost renewal reply is no lost lease");
        assert_eq!(watched.release().unwrap(), 0);

        assert_eq!(first.release().unwrap(), 0);
        assert!(info(&mut admin, "L").is_none());
        assert_eq!(s.stat("releases"), 2, "L and W released once each");
    }

    #[test]
    fn rust_client_on_a_redis_client_resends_without_reconnect_with() {
        // A `redis::Client` as the connection opens one per command: a resend
        // needs nothing more.
        let s = Server::start();
        let proxy = Proxy::start(s.port);
        let client = redis::Client::open(proxy.url()).expect("client");
        let mut admin = s.conn();
        let lock = Lock::new("L", 60 * SECOND);
        let a = lock.acquire(client.clone(), None).unwrap().expect("granted");
        let b = lock.acquire(client.clone(), None).unwrap().expect("reentered");
        proxy.drop_reply_to("FLOCK.RELEASE", 1);
        assert_eq!(b.release().unwrap(), 1);
        assert_eq!((proxy.dropped(), proxy.seen("FLOCK.RELEASE")), (1, 2));
        assert_eq!(holds_or_zero(&mut admin, "L"), 1);
        assert_eq!(a.release().unwrap(), 0);
    }
}

// ------------------------------------------------------------ each rule directly

fn with_id(cmd: &str, args: &[&str], id: &str) -> redis::Cmd {
    let mut cmd = redis::cmd(cmd);
    cmd.arg(args).arg("ID").arg(id);
    cmd
}

fn acquire_id(c: &mut Connection, key: &str, owner: &str, id: &str) -> RedisResult<Option<i64>> {
    with_id("FLOCK.ACQUIRE", &[key, owner, "60000"], id).query(c)
}

fn release_id(c: &mut Connection, key: &str, owner: &str, id: &str) -> RedisResult<i64> {
    with_id("FLOCK.RELEASE", &[key, owner], id).query(c)
}

fn renew_id(c: &mut Connection, key: &str, owner: &str, id: &str) -> RedisResult<i64> {
    with_id("FLOCK.RENEW", &[key, owner, "60000"], id).query(c)
}

fn force_id(c: &mut Connection, key: &str, id: &str) -> RedisResult<i64> {
    with_id("FLOCK.FORCERELEASE", &[key], id).query(c)
}

fn token(c: &mut Connection, key: &str) -> Option<i64> {
    info_field(c, key, "token").map(|v| redis::from_redis_value(&v).expect("token"))
}

fn pttl(c: &mut Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(c).expect("PTTL")
}

#[test]
fn acquire_repeat_answers_its_token_without_another_hold_while_that_grant_is_held() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire_id(&mut c, "L", "a", "g1").unwrap().expect("granted");
    assert_eq!(acquire_id(&mut c, "L", "a", "g1").unwrap(), Some(t));
    assert_eq!(holds_or_zero(&mut c, "L"), 1, "the repeat added no hold");
    assert_eq!(acquire_id(&mut c, "L", "a", "g2").unwrap(), Some(t), "a new ID reenters");
    assert_eq!(acquire_id(&mut c, "L", "a", "g2").unwrap(), Some(t));
    assert_eq!(acquire_id(&mut c, "L", "a", "g1").unwrap(), Some(t));
    assert_eq!(holds_or_zero(&mut c, "L"), 2);
    assert_eq!(s.stat("reentrant_acquires"), 1);
}

#[test]
fn acquire_repeat_after_its_grant_ended_is_a_new_request() {
    let s = Server::start();
    let mut c = s.conn();
    acquire_id(&mut c, "L", "a", "g1").unwrap().expect("granted");
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    let t2 = acquire(&mut c, "L", "b", 60_000).unwrap().expect("b granted");
    // A try now: the lock is b's, so nil, and a is not queued.
    assert_eq!(acquire_id(&mut c, "L", "a", "g1").unwrap(), None);
    assert_eq!((owner_of(&mut c, "L").as_deref(), token(&mut c, "L")), (Some("b"), Some(t2)));
    assert!(queue_of(&mut c, "L").is_empty());
    // With WAIT it queues as any new request does, and is granted after b.
    let mut w = s.conn();
    let waiter = std::thread::spawn(move || {
        with_id("FLOCK.ACQUIRE", &["L", "a", "60000", "WAIT", "30000"], "g1").query::<Option<i64>>(&mut w)
    });
    wait_queue(&mut c, "L", &["a"]);
    assert_eq!(release(&mut c, "L", "b").unwrap(), 0);
    let t3 = waiter.join().unwrap().unwrap().expect("a granted after b");
    assert!(t3 > t2);
    assert_eq!(acquire_id(&mut c, "L", "a", "g1").unwrap(), Some(t3), "this grant is now the one under g1");
    assert_eq!(holds_or_zero(&mut c, "L"), 1);
}

#[test]
fn release_repeat_after_the_lock_went_to_the_next_waiter_answers_the_first_reply() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    let b = spawn_waiter(&s, "L", "b", 60_000, 30_000);
    wait_queue(&mut c, "L", &["b"]);
    assert_eq!(release_id(&mut c, "L", "a", "r1").unwrap(), 0);
    let tb = b.join().unwrap().unwrap().expect("b handed the lock");
    assert_eq!(release_id(&mut c, "L", "a", "r1").unwrap(), 0, "the first reply, not NOTOWNER");
    assert_eq!(
        (owner_of(&mut c, "L").as_deref(), token(&mut c, "L"), holds_or_zero(&mut c, "L")),
        (Some("b"), Some(tb), 1)
    );
    assert_eq!(error_code(&release(&mut c, "L", "a").unwrap_err()), "NOTOWNER", "without the ID: not the holder");
}

#[test]
fn release_repeat_of_one_of_two_holds_leaves_one() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("reentered");
    assert_eq!(release_id(&mut c, "L", "a", "r1").unwrap(), 1);
    assert_eq!(release_id(&mut c, "L", "a", "r1").unwrap(), 1);
    assert_eq!(holds_or_zero(&mut c, "L"), 1);
}

#[test]
fn renew_repeat_answers_the_first_token_even_after_the_lock_was_lost() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    assert_eq!(renew_id(&mut c, "L", "a", "n1").unwrap(), t);
    assert_eq!(renew_id(&mut c, "L", "a", "n1").unwrap(), t);
    force_release(&mut c, "L").unwrap();
    acquire(&mut c, "L", "b", 60_000).unwrap().expect("b granted");
    assert_eq!(renew_id(&mut c, "L", "a", "n1").unwrap(), t, "the first reply");
    assert_eq!(error_code(&renew(&mut c, "L", "a", 60_000).unwrap_err()), "NOTOWNER");
    assert_eq!(error_code(&renew_id(&mut c, "L", "a", "n2").unwrap_err()), "NOTOWNER", "a new ID is a new request");
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("b"));
}

#[test]
fn forcerelease_repeat_keeps_the_holder_granted_since() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    let b = spawn_waiter(&s, "L", "b", 60_000, 30_000);
    wait_queue(&mut c, "L", &["b"]);
    assert_eq!(force_id(&mut c, "L", "f1").unwrap(), 1);
    let tb = b.join().unwrap().unwrap().expect("b handed the lock");
    assert_eq!(force_id(&mut c, "L", "f1").unwrap(), 1, "the first reply");
    assert_eq!((owner_of(&mut c, "L").as_deref(), token(&mut c, "L")), (Some("b"), Some(tb)), "b stays");
    assert_eq!(s.stat("force_releases"), 1);
}

#[test]
fn a_wait_whose_waiter_disconnected_before_its_grant_was_not_applied_and_its_repeat_is_new() {
    use std::io::Write;
    let s = Server::start();
    let mut c = s.conn();
    let ta = acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    raw.write_all(b"FLOCK.ACQUIRE L b 60000 WAIT 0 ID w1\r\n").unwrap();
    wait_queue(&mut c, "L", &["b"]);
    drop(raw);
    wait_queue(&mut c, "L", &[]);
    // The repeat is a new request: a try while a holds gets nil.
    assert_eq!(acquire_id(&mut c, "L", "b", "w1").unwrap(), None);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    let tb = acquire_id(&mut c, "L", "b", "w1").unwrap().expect("granted now");
    assert!(tb > ta);
    assert_eq!(holds_or_zero(&mut c, "L"), 1);
}

/// A half-open connection: the client gave up on it (a network fault) and
/// resends on a new one, while the server still has it waiting.
#[test]
fn a_wait_resent_on_another_connection_takes_over_its_place_and_the_first_is_answered_resent() {
    use std::io::{BufRead, BufReader, Write};
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, &[("flock.max-waiters", "2")]);
    let ta = acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    let mut first = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    first.write_all(b"FLOCK.ACQUIRE L b 60000 WAIT 0 ID w1\r\n").unwrap();
    wait_queue(&mut c, "L", &["b"]);
    let mut behind = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    behind.write_all(b"FLOCK.ACQUIRE L c 60000 WAIT 0\r\n").unwrap();
    wait_queue(&mut c, "L", &["b", "c"]);

    // The queue is full, but the resend is no new waiter.
    let mut again = s.conn();
    let resend = std::thread::spawn(move || -> RedisResult<Option<i64>> {
        with_id("FLOCK.ACQUIRE", &["L", "b", "60000", "WAIT", "0"], "w1").query(&mut again)
    });
    first.set_read_timeout(Some(5 * SECOND)).unwrap();
    let mut answer = String::new();
    BufReader::new(&first).read_line(&mut answer).unwrap();
    assert!(answer.starts_with("-RESENT "), "the first connection is told: {answer:?}");
    assert_eq!(s.stat("waiters_resent"), 1);
    assert_eq!(queue_of(&mut c, "L"), ["b", "c"], "b keeps its place before c");
    assert_eq!(s.blocked_clients(), 2, "the resend and c wait");

    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    let tb = resend.join().unwrap().unwrap().expect("the resend is granted in b's place");
    assert!(tb > ta);
    assert_eq!((owner_of(&mut c, "L").as_deref(), queue_of(&mut c, "L")), (Some("b"), vec!["c".to_string()]));
    // A grant made under the ID: one more resend answers it and adds no hold.
    assert_eq!(acquire_id(&mut c, "L", "b", "w1").unwrap(), Some(tb));
    assert_eq!(holds_or_zero(&mut c, "L"), 1);
}

#[test]
fn an_id_reused_with_another_command_is_an_idreused_error_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire_id(&mut c, "L", "a", "x").unwrap().expect("granted");
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("reentered");
    let e = release_id(&mut c, "L", "a", "x").unwrap_err();
    assert_eq!(error_code(&e), "IDREUSED");
    assert!(e.to_string().contains("FLOCK.ACQUIRE"), "{e}");
    assert_eq!(error_code(&renew_id(&mut c, "L", "a", "x").unwrap_err()), "IDREUSED");
    assert_eq!(error_code(&force_id(&mut c, "L", "x").unwrap_err()), "IDREUSED");
    assert_eq!((token(&mut c, "L"), holds_or_zero(&mut c, "L")), (Some(t), 2));
    // The same ID on another lock is another request.
    assert!(release_id(&mut c, "M", "a", "x").is_err_and(|e| error_code(&e) == "NOTOWNER"));
}

#[test]
fn bad_ids_are_errors_and_change_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("reentered");
    let long = "i".repeat(65);
    let bad: [&[&str]; 4] = [&["ID", ""], &["ID", &long], &["ID"], &["ID", "x", "ID", "y"]];
    for (key, owner) in [("L", "a"), ("free", "a")] {
        for options in bad {
            let commands: [(&str, Vec<&str>); 4] = [
                ("FLOCK.ACQUIRE", vec![key, owner, "60000"]),
                ("FLOCK.RELEASE", vec![key, owner]),
                ("FLOCK.RENEW", vec![key, owner, "60000"]),
                ("FLOCK.FORCERELEASE", vec![key]),
            ];
            for (name, args) in commands {
                let e = redis::cmd(name).arg(&args).arg(options).query::<Value>(&mut c).unwrap_err();
                assert!(e.to_string().contains("ID"), "{name} {args:?} {options:?}: {e}");
            }
        }
    }
    assert_eq!(holds_or_zero(&mut c, "L"), 2);
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert_eq!(keys, ["L"], "no key made");
    assert_eq!(pttl(&mut c, "L"), -1);
}

#[test]
fn without_id_a_resend_is_applied_again() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("reentered");
    assert_eq!(release(&mut c, "L", "a").unwrap(), 1);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0, "the resend released the second hold");
    assert!(!redis::cmd("EXISTS").arg("L").query::<bool>(&mut c).unwrap(), "nothing remembered, no key left");
}

#[test]
fn a_free_lock_leaves_no_key_and_a_resend_within_the_window_is_still_answered() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, &[("flock.retry-window-ms", "300")]);
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    assert_eq!(release_id(&mut c, "L", "a", "r1").unwrap(), 0);
    assert!(!exists(&mut c, "L"), "free means gone: no key left");
    assert_eq!(s.stat("remembered_free_locks"), 1);
    assert_eq!(release_id(&mut c, "L", "a", "r1").unwrap(), 0, "remembered within the window");
    assert_eq!(error_code(&renew_id(&mut c, "L", "a", "r1").unwrap_err()), "IDREUSED");
    assert!(!exists(&mut c, "L"), "a resend makes no key either");
    // An old client's SET NX finds the name free at once.
    let set: Option<String> = redis::cmd("SET").arg("L").arg("x").arg("NX").arg("PX").arg(100).query(&mut c).unwrap();
    assert_eq!(set.as_deref(), Some("OK"));
    let _: i64 = redis::cmd("DEL").arg("L").query(&mut c).unwrap();
    // Made again, the lock takes its records back, and gives them away again.
    acquire(&mut c, "L", "b", 60_000).unwrap().expect("granted");
    assert_eq!(s.stat("remembered_free_locks"), 0, "the lock has them again");
    assert_eq!(release_id(&mut c, "L", "a", "r1").unwrap(), 0, "found in the lock made again");
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("b"), "and b's grant untouched");
    assert_eq!(release(&mut c, "L", "b").unwrap(), 0);
    wait_until("the records to be forgotten after the window", 5 * SECOND, || s.stat("remembered_free_locks") == 0);
    assert_eq!(error_code(&release_id(&mut c, "L", "a", "r1").unwrap_err()), "NOTOWNER", "forgotten");
    // A held lock forgets too: once r2 (a RELEASE) is forgotten, a RENEW under
    // r2 is no IDREUSED error but a new request.
    acquire(&mut c, "M", "a", 60_000).unwrap().expect("granted");
    assert_eq!(release_id(&mut c, "M", "a", "r2").unwrap(), 0);
    let t = acquire(&mut c, "M", "a", 60_000).unwrap().expect("granted again");
    assert_eq!(error_code(&renew_id(&mut c, "M", "a", "r2").unwrap_err()), "IDREUSED");
    wait_until("M's record of r2 to be forgotten", 5 * SECOND, || renew_id(&mut c, "M", "a", "r2").is_ok());
    assert_eq!(renew_id(&mut c, "M", "a", "r2").unwrap(), t);
    assert_eq!(release(&mut c, "M", "a").unwrap(), 0, "one hold: the renewals added none");
}

// --------------------------------------------------- IDs survive reloads and restarts

/// Records on three locks: `held` (granted under `<p>acq`, one hold),
/// `free` (released under `<p>rel`: no key) and `forced` (force-released
/// under `<p>frc`, then granted to `next`).
fn make_records(c: &mut Connection, p: &str) -> i64 {
    let (held, free, forced) = (format!("{p}held"), format!("{p}free"), format!("{p}forced"));
    let t = acquire_id(c, &held, "a", &format!("{p}acq")).unwrap().expect("granted");
    acquire(c, &free, "a", 60_000).unwrap().expect("granted");
    assert_eq!(release_id(c, &free, "a", &format!("{p}rel")).unwrap(), 0);
    acquire(c, &forced, "a", 60_000).unwrap().expect("granted");
    assert_eq!(force_id(c, &forced, &format!("{p}frc")).unwrap(), 1);
    acquire(c, &forced, "next", 60_000).unwrap().expect("granted");
    t
}

/// The repeats of `make_records`' commands answer their first replies and
/// change nothing.
fn check_records(c: &mut Connection, p: &str, t: i64, how: &str) {
    check_records_but(c, p, t, how, true);
}

/// As `check_records`; unless `free_kept`, the free lock's record is known
/// to be gone (NOTOWNER).
fn check_records_but(c: &mut Connection, p: &str, t: i64, how: &str, free_kept: bool) {
    let (held, free, forced) = (format!("{p}held"), format!("{p}free"), format!("{p}forced"));
    assert_eq!(acquire_id(c, &held, "a", &format!("{p}acq")).unwrap(), Some(t), "{how}: ACQUIRE repeat");
    assert_eq!(holds(c, &held), 1, "{how}: no extra hold");
    let repeat = release_id(c, &free, "a", &format!("{p}rel"));
    match free_kept {
        true => assert_eq!(repeat.unwrap(), 0, "{how}: RELEASE repeat"),
        false => assert_eq!(error_code(&repeat.unwrap_err()), "NOTOWNER", "{how}: RELEASE repeat, forgotten"),
    }
    assert!(!exists(c, &free), "{how}: {free} free, no key");
    assert_eq!(force_id(c, &forced, &format!("{p}frc")).unwrap(), 1, "{how}: FORCERELEASE repeat");
    assert_eq!(owner_of(c, &forced).as_deref(), Some("next"), "{how}: the holder granted since stays");
    assert_eq!(error_code(&release_id(c, &held, "a", &format!("{p}acq")).unwrap_err()), "IDREUSED", "{how}");
}

#[test]
fn ids_survive_debug_reload() {
    let s = Server::start();
    let mut c = s.conn();
    let t = make_records(&mut c, "");
    let ok: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(ok, "OK");
    check_records(&mut c, "", t, "DEBUG RELOAD");
}

#[test]
fn ids_survive_an_rdb_restart() {
    let mut s = Server::start();
    let t = make_records(&mut s.conn(), "");
    s.restart(Stop::ShutdownSave);
    check_records(&mut s.conn(), "", t, "SHUTDOWN SAVE and restart");
}

fn ids_survive_aof_restart(preamble: &str) {
    let how = format!("AOF restart (aof-use-rdb-preamble {preamble})");
    let mut s = Server::start_aof(preamble);
    let mut c = s.conn();
    let t1 = make_records(&mut c, "before-");
    let _: Value = redis::cmd("BGREWRITEAOF").query(&mut c).expect("BGREWRITEAOF");
    s.wait_aof_rewrite();
    let t2 = make_records(&mut c, "after-");
    drop(c);
    s.restart(Stop::Kill);
    let mut c = s.conn();
    // Without the RDB preamble the rewrite has no place for the IDs of free
    // locks, which have no key (as for the highest token: docs/durability.md).
    let free_kept = preamble == "yes";
    check_records_but(&mut c, "before-", t1, &format!("{how}: from the rewritten AOF"), free_kept);
    check_records(&mut c, "after-", t2, &format!("{how}: from the incremental AOF"));
}

#[test]
fn ids_survive_an_aof_restart_with_rdb_preamble() {
    ids_survive_aof_restart("yes");
}

#[test]
fn ids_survive_an_aof_restart_without_rdb_preamble() {
    ids_survive_aof_restart("no");
}

#[test]
fn ids_reach_a_replica_and_a_promoted_replica_recognises_a_repeat() {
    let master = Server::start();
    let mut mc = master.conn();
    let t1 = make_records(&mut mc, "sync-");
    let replica = Server::replica_of(&master);
    let t2 = make_records(&mut mc, "stream-");
    let n: i64 = redis::cmd("WAIT").arg(1).arg(2_000).query(&mut mc).unwrap();
    assert_eq!(n, 1);
    let mut rc = replica.conn();
    assert_eq!(token(&mut rc, "stream-held"), Some(t2));
    let ok: String = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut rc).unwrap();
    assert_eq!(ok, "OK");
    check_records(&mut rc, "sync-", t1, "promoted replica, IDs from the initial sync");
    check_records(&mut rc, "stream-", t2, "promoted replica, IDs from the replication stream");
}
