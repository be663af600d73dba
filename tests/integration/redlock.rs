//! The Redlock example (examples/redlock.rs) against 3 independent local
//! servers with the module: a majority is enough, a minority is not and
//! leaves nothing behind, a second client is kept out while the lock is
//! held, partial grants are given back, an attempt that outlives its lease
//! fails, and tokens come back per server.
use crate::common::*;

#[path = "../../examples/redlock.rs"]
mod redlock_example;
use redlock_example::{Redlock, Reply};

use std::time::{Duration, Instant};

const KEY: &str = "redlock:resource";

fn three() -> Vec<Server> {
    (0..3).map(|_| Server::start()).collect()
}

fn redlock(servers: &[Server]) -> Redlock {
    let urls: Vec<String> = servers.iter().map(Server::url).collect();
    Redlock::new(&urls).expect("redlock client")
}

/// The owner of KEY on each server (`None`: no lock there).
fn owners(servers: &[Server]) -> Vec<Option<String>> {
    servers.iter().map(|s| owner_of(&mut s.conn(), KEY)).collect()
}

#[test]
fn majority_with_one_server_down() {
    let mut servers = three();
    let mut rl = redlock(&servers);
    drop(servers.pop()); // the third server is stopped
    assert_eq!(rl.quorum(), 2);

    let lease = Duration::from_secs(10);
    let t = Instant::now();
    let lock = rl.try_lock(KEY, "alice", lease).unwrap_or_else(|e| panic!("2 of 3 servers up must be enough: {e}"));
    eprintln!("acquired on 2 of 3 in {:?}", t.elapsed());
    assert_eq!(lock.granted(), 2, "two servers granted");
    assert!(lock.tokens[0].is_some() && lock.tokens[1].is_some(), "tokens from the live servers: {:?}", lock.tokens);
    assert_eq!(lock.tokens[2], None, "no token from the stopped server");
    assert!(
        lock.validity > Duration::ZERO && lock.validity <= lease - redlock_example::DRIFT_FIXED,
        "validity {:?} for lease {lease:?}",
        lock.validity
    );
    assert!(lock.is_valid());
    for (i, s) in servers.iter().enumerate() {
        let mut c = s.conn();
        assert_eq!(owner_of(&mut c, KEY).as_deref(), Some("alice"), "server {i} holds the lock for alice");
        assert_eq!(
            info_field(&mut c, KEY, "token").map(|v| redis::from_redis_value::<i64>(&v).unwrap()),
            lock.tokens[i]
        );
    }

    assert_eq!(rl.unlock(&lock), 2, "released on both live servers");
    assert_eq!(owners(&servers), vec![None, None], "release frees every server");
}

#[test]
fn no_majority_with_two_servers_down() {
    let mut servers = three();
    let mut rl = redlock(&servers);
    rl.retry_count = 1;
    rl.retry_delay = Duration::from_millis(20);
    servers.truncate(1); // two of three stopped

    let e = rl.lock(KEY, "alice", Duration::from_secs(10)).expect_err("1 of 3 servers is not a majority");
    assert_eq!((e.granted, e.quorum), (1, 2), "{e}");
    assert!(matches!(e.replies[0], Reply::Granted(_)), "the live server granted: {:?}", e.replies[0]);
    assert!(
        matches!(e.replies[1], Reply::Unreachable(_)) && matches!(e.replies[2], Reply::Unreachable(_)),
        "{:?}",
        e.replies
    );
    assert_eq!(owners(&servers), vec![None], "a failed attempt leaves no lock on the surviving server");
}

#[test]
fn second_client_is_kept_out_until_release() {
    let servers = three();
    let mut a = redlock(&servers);
    let mut b = redlock(&servers);
    b.retry_count = 2;
    b.retry_delay = Duration::from_millis(20);
    let lease = Duration::from_secs(10);

    let held = a.try_lock(KEY, "alice", lease).expect("alice takes the free lock");
    assert_eq!(held.granted(), 3);
    let e = b.lock(KEY, "bob", lease).expect_err("bob must not get the lock alice holds");
    assert_eq!(e.granted, 0, "{e}");
    assert!(e.replies.iter().all(|r| matches!(r, Reply::Refused)), "every server refuses bob: {:?}", e.replies);
    let alice = Some("alice".to_string());
    assert_eq!(
        owners(&servers),
        vec![alice.clone(), alice.clone(), alice],
        "bob's failed tries leave alice's lock intact"
    );
    for s in &servers {
        assert_eq!(info_field(&mut s.conn(), KEY, "holds"), Some(Value::Int(1)), "bob's tries do not add holds");
    }

    assert_eq!(a.unlock(&held), 3, "alice releases on all servers");
    assert_eq!(owners(&servers), vec![None, None, None], "release frees every server");

    let next = b.try_lock(KEY, "bob", lease).expect("bob gets it after alice released");
    for i in 0..3 {
        let (old, new) = (held.tokens[i].unwrap(), next.tokens[i].unwrap());
        assert!(new > old, "server {i}: bob's token {new} must exceed alice's {old}");
    }
    assert_eq!(b.unlock(&next), 3);
}

#[test]
fn split_votes_give_back_partial_grants() {
    let servers = three();
    let mut rl = redlock(&servers);
    let lease = Duration::from_secs(10);
    // Someone else holds the lock on servers 0 and 1 (e.g. a client that
    // won a race there).
    for s in &servers[..2] {
        assert!(acquire(&mut s.conn(), KEY, "xavier", 10_000).unwrap().is_some());
    }

    let e = rl.try_lock(KEY, "alice", lease).expect_err("1 of 3 grants is not a majority");
    assert_eq!(e.granted, 1, "{e}");
    assert!(matches!(e.replies[2], Reply::Granted(_)), "server 2 granted alice: {:?}", e.replies);
    let x = Some("xavier".to_string());
    assert_eq!(owners(&servers), vec![x.clone(), x.clone(), None], "alice's grant on server 2 is released at once");

    assert_eq!(release(&mut servers[1].conn(), KEY, "xavier").unwrap(), 0);
    let lock = rl.try_lock(KEY, "alice", lease).expect("2 of 3 now");
    assert_eq!(lock.tokens[0], None);
    assert!(lock.tokens[1].is_some() && lock.tokens[2].is_some(), "{:?}", lock.tokens);
    assert_eq!(rl.unlock(&lock), 2, "released where it was held (server 0 answers NOTOWNER)");
    assert_eq!(owners(&servers), vec![x, None, None], "xavier's own lock is untouched");
}

#[test]
fn attempt_longer_than_the_lease_fails_and_releases() {
    let servers = three();
    let mut rl = redlock(&servers);
    rl.io_timeout = Duration::from_secs(2);
    // Server 0 holds back every command for 400 ms, so the first try alone
    // outlasts a 100 ms lease.
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(400).query(&mut servers[0].conn()).expect("CLIENT PAUSE");

    let e = rl.try_lock(KEY, "alice", Duration::from_millis(100)).expect_err("no validity left: must fail");
    assert_eq!(e.granted, 3, "all servers granted, but too late: {e}");
    assert!(e.elapsed >= Duration::from_millis(100), "{e}");
    // Servers 1 and 2 granted just now with a 100 ms lease, server 0 too:
    // only the release can have removed the lock already.
    assert_eq!(owners(&servers), vec![None, None, None], "a late majority is given back at once");

    // A lease shorter than the drift allowance can never be valid.
    let e = rl.try_lock(KEY, "alice", Duration::from_millis(2)).expect_err("2 ms lease < drift allowance");
    assert_eq!(owners(&servers), vec![None, None, None], "{e}");
}

#[test]
fn extend_renews_on_the_majority() {
    let mut servers = three();
    let mut rl = redlock(&servers);
    let mut lock = rl.try_lock(KEY, "alice", Duration::from_millis(1000)).expect("lock");
    drop(servers.pop());
    assert!(rl.extend(&mut lock, Duration::from_secs(20)), "2 of 3 renew: extended");
    assert!(lock.validity > Duration::from_secs(19), "new validity {:?}", lock.validity);
    for s in &servers {
        let ttl: i64 = redis::from_redis_value(&info_field(&mut s.conn(), KEY, "ttl-ms").unwrap()).unwrap();
        assert!(ttl > 19_000, "lease renewed on the live servers, ttl-ms {ttl}");
    }
    assert_eq!(lock.tokens[2], None, "the stopped server no longer counts");
    // Lost on a second server: no majority any more.
    force_release(&mut servers[1].conn(), KEY).unwrap();
    assert!(!rl.extend(&mut lock, Duration::from_secs(20)), "1 of 3 renewed: the lock is lost");
    assert_eq!(rl.unlock(&lock), 1);
    assert_eq!(owners(&servers), vec![None, None]);
}
