//! Durable grants in the Rust client (crate `flock-client`, `.durable(replicas,
//! timeout)`) against a real master with one replica: a grant counts once
//! that many replicas acknowledged it (RENEW then WAIT on the key's node);
//! asked for more replicas than there are, the acquire fails with
//! `NOTDURABLE` within about the timeout and the hold is given back, for a
//! try, a grant pushed to a waiter through the session, a reentry, the
//! blocking path and a semaphore.

use crate::common::proxy::Proxy;
use crate::common::*;

use std::time::{Duration, Instant};

use flock_client::{Lock, RwLock, Semaphore};

/// The timeout of the grants that cannot be durable: short, the tests wait it out.
const SHORT: Duration = Duration::from_millis(300);

fn client(s: &Server) -> redis::Client {
    redis::Client::open(s.url()).expect("client")
}

/// Asserts `e` is a NOTDURABLE error naming `key` and "`reached` of `asked`".
fn assert_not_durable(e: &redis::RedisError, key: &str, reached: i64, asked: usize) {
    assert_eq!(e.code(), Some("NOTDURABLE"), "{e}");
    let text = e.to_string();
    assert!(text.contains(key) && text.contains(&format!("{reached} of {asked}")), "{text}");
}

/// A master and its replica, synced.
fn pair() -> (Server, Server) {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    (master, replica)
}

#[test]
fn durable_grants_with_one_replica_succeed_for_a_try_a_session_wait_a_read_and_permits() {
    let (master, replica) = pair();
    let c = client(&master);

    // A try, durable on the one replica: held, and the replica has it.
    let lock = Lock::new("d:try", 10 * SECOND).durable(1, 5 * SECOND);
    let g = lock.acquire_on(&c, None).unwrap().expect("granted");
    assert_eq!(owner_of(&mut master.conn(), "d:try").as_deref(), Some(g.owner()));
    assert_eq!(token_of(&mut replica.conn(), "d:try") as u64, g.token(), "the replica has the grant");
    assert_eq!(g.node(), Some(format!("127.0.0.1:{}", master.port).as_str()), "confirmed on the master");
    assert_eq!(g.release().unwrap(), 0);

    // A wait through the session: the grant is pushed, then confirmed.
    let holder = Lock::new("d:wait", 10 * SECOND).with_owner("holder").acquire_on(&c, None).unwrap().expect("held");
    let waiter = {
        let (lock, c) = (Lock::new("d:wait", 10 * SECOND).with_owner("waiter").durable(1, 5 * SECOND), c.clone());
        std::thread::spawn(move || {
            let g = lock.acquire_on(&c, Some(10 * SECOND)).unwrap().expect("granted");
            (g.token(), g)
        })
    };
    wait_queue(&mut master.conn(), "d:wait", &["waiter"]);
    holder.release().unwrap();
    let (token, g) = waiter.join().unwrap();
    assert_eq!(owner_of(&mut replica.conn(), "d:wait").as_deref(), Some("waiter"));
    assert_eq!(token_of(&mut replica.conn(), "d:wait") as u64, token);
    assert_eq!(g.release().unwrap(), 0);

    // A read hold and semaphore permits, through a route.
    let r = RwLock::new("d:rw", 10 * SECOND).durable(1, 5 * SECOND).read_in(&c, None).unwrap().expect("read");
    assert_eq!(r.release().unwrap(), 0);
    let p = Semaphore::new("d:sem", 3, 10 * SECOND).durable(1, 5 * SECOND).acquire_in(&c, 2, None).unwrap().expect("2");
    assert_eq!(p.release().unwrap(), 0);

    // The blocking path on a bare connection: RENEW and WAIT on that connection.
    let g = Lock::new("d:bare", 10 * SECOND).durable(1, 5 * SECOND).acquire(master.conn(), Some(SECOND)).unwrap();
    assert_eq!(g.expect("granted").release().unwrap(), 0);
}

#[test]
fn durable_grants_asking_more_replicas_than_there_are_fail_notdurable_and_give_the_hold_back() {
    let (master, _replica) = pair();
    let c = client(&master);

    // A try: NOTDURABLE after about the timeout, and not held.
    let started = Instant::now();
    let e = Lock::new("n:try", 10 * SECOND).durable(2, SHORT).acquire_on(&c, None).expect_err("not durable");
    let took = started.elapsed();
    assert_not_durable(&e, "n:try", 1, 2);
    assert!(took >= SHORT && took < SHORT + 2 * SECOND, "failed after {took:?}");
    assert_eq!(info(&mut master.conn(), "n:try"), None, "the hold was given back");

    // The same on the blocking path of a bare connection, and for permits.
    let e = Lock::new("n:bare", 10 * SECOND).durable(2, SHORT).acquire(master.conn(), Some(SECOND)).expect_err("bare");
    assert_not_durable(&e, "n:bare", 1, 2);
    assert_eq!(info(&mut master.conn(), "n:bare"), None);
    let e = Semaphore::new("n:sem", 3, 10 * SECOND).durable(2, SHORT).acquire_on(&c, 1, None).expect_err("permits");
    assert_not_durable(&e, "n:sem", 1, 2);
    assert_eq!(info(&mut master.conn(), "n:sem"), None);
}

#[test]
fn durable_grant_pushed_to_a_session_waiter_is_given_back_to_the_next_waiter_when_not_durable() {
    let (master, _replica) = pair();
    let c = client(&master);
    let key = "n:wait";
    let holder = Lock::new(key, 10 * SECOND).with_owner("holder").acquire_on(&c, None).unwrap().expect("held");
    let durable = {
        let (lock, c) = (Lock::new(key, 10 * SECOND).with_owner("durable").durable(2, SHORT), c.clone());
        std::thread::spawn(move || lock.acquire_on(&c, Some(10 * SECOND)).map(|g| g.map(|g| g.token())))
    };
    wait_queue(&mut master.conn(), key, &["durable"]);
    let next = {
        let (lock, c) = (Lock::new(key, 10 * SECOND).with_owner("next"), c.clone());
        std::thread::spawn(move || {
            let g = lock.acquire_on(&c, Some(10 * SECOND)).unwrap().expect("the next waiter is granted");
            (g.token(), g.release().unwrap())
        })
    };
    wait_queue(&mut master.conn(), key, &["durable", "next"]);
    let released = Instant::now();
    assert_eq!(holder.release().unwrap(), 0);
    let e = durable.join().unwrap().expect_err("not durable");
    assert_not_durable(&e, key, 1, 2);
    let (token, holds_left) = next.join().unwrap();
    assert!(released.elapsed() >= SHORT, "the next waiter waited for the durable one's timeout");
    assert_eq!(holds_left, 0);
    // holder 1, durable 2 (given back), next 3.
    assert!(token >= 3, "token {token}");
    assert_eq!(info(&mut master.conn(), key), None);
}

/// A promoted replica that never got the grant, but kept an older grant of
/// the same owner (its release was lost with the old master), answers the
/// durable check with that grant's token: this grant is gone. Here the grant
/// is replaced while its reply waits behind a partition; the replica has
/// every write, so WAIT alone would confirm it. Both checks: a session
/// grant's reentry, and the RENEW of a grant with a lease of its own (the
/// blocking path of a bare connection).
#[test]
fn durable_grant_whose_check_finds_another_grant_of_its_owner_is_not_durable_and_is_given_back() {
    let (master, _replica) = pair();
    let proxy = Proxy::start(master.port);
    let behind = redis::Client::open(proxy.url()).expect("client");
    for (key, session) in [("n:replaced:session", true), ("n:replaced:bare", false)] {
        let holder =
            Lock::new(key, 10 * SECOND).with_owner("holder").acquire_on(&client(&master), None).unwrap().expect("held");
        let durable = {
            let (lock, behind) =
                (Lock::new(key, 10 * SECOND).with_owner("durable").durable(1, 5 * SECOND), behind.clone());
            // Whether it was granted: the two ways' guards are of different types.
            std::thread::spawn(move || match session {
                true => lock.acquire_on(&behind, Some(10 * SECOND)).map(|g| g.is_some()),
                false => lock.acquire(behind.get_connection()?, Some(10 * SECOND)).map(|g| g.is_some()),
            })
        };
        wait_queue(&mut master.conn(), key, &["durable"]);
        proxy.partition();
        assert_eq!(holder.release().unwrap(), 0);
        let granted = token_of(&mut master.conn(), key);
        let _: i64 = redis::cmd("FLOCK.FORCERELEASE").arg(key).query(&mut master.conn()).unwrap();
        let older: i64 =
            redis::cmd("FLOCK.ACQUIRE").arg(key).arg("durable").arg(10_000).query(&mut master.conn()).unwrap();
        proxy.heal();
        let e = durable.join().unwrap().expect_err("not durable");
        assert_eq!(e.code(), Some("NOTDURABLE"), "{key}: {e}");
        let text = e.to_string();
        let why = match session {
            true => "the session grant ended".to_string(),
            false => format!(
                "the grant (token {granted}) was gone, the server holds another grant of this owner (token {older})"
            ),
        };
        assert!(text.contains(&why), "{key}: {text}");
        assert_eq!(info(&mut master.conn(), key), None, "{key}: the hold was given back");
    }
}

#[test]
fn durable_reentry_that_is_not_durable_gives_back_only_its_own_hold() {
    let (master, _replica) = pair();
    let c = client(&master);
    let key = "n:reentry";
    let first = Lock::new(key, 10 * SECOND).with_owner("me").acquire_on(&c, None).unwrap().expect("first");
    let e = Lock::new(key, 10 * SECOND)
        .with_owner("me")
        .durable(2, SHORT)
        .acquire_on(&c, None)
        .expect_err("the reentry is not durable");
    assert_not_durable(&e, key, 1, 2);
    assert_eq!(owner_of(&mut master.conn(), key).as_deref(), Some("me"), "the first hold stays");
    assert_eq!(holds(&mut master.conn(), key), 1);
    assert!(!first.lost());
    assert_eq!(first.release().unwrap(), 0);
    assert_eq!(info(&mut master.conn(), key), None);
}

#[test]
fn a_hold_whose_give_back_was_refused_is_released_when_its_owner_reenters_it() {
    let (master, _replica) = pair();
    let c = client(&master);
    let mut admin = master.conn();
    let key = "n:refused";
    let acl = |rule: &str| {
        let _: () = redis::cmd("ACL").arg("SETUSER").arg("default").arg(rule).query(&mut master.conn()).expect("ACL");
    };
    // The give-back is refused (as NOREPLICAS or READONLY would in a
    // failover): the hold stays on the server.
    acl("-flock.release");
    let e = Lock::new(key, 10 * SECOND).with_owner("me").durable(2, SHORT).acquire_on(&c, None).expect_err("refused");
    assert_not_durable(&e, key, 1, 2);
    assert_eq!(owner_of(&mut admin, key).as_deref(), Some("me"), "the refused give-back left the hold");
    acl("+flock.release");
    // The owner's next grant reenters that hold (same token): the client
    // gives the stale hold back, so one release frees the lock.
    let g =
        Lock::new(key, 10 * SECOND).with_owner("me").durable(1, 5 * SECOND).acquire_on(&c, None).unwrap().expect("g");
    assert_eq!(holds(&mut admin, key), 1, "the stale hold was given back");
    assert_eq!(g.release().unwrap(), 0);
    assert_eq!(info(&mut admin, key), None);
}
