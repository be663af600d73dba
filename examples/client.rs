//! The Rust client API (crate `flock-client`) against a
//! running server with FLOCK loaded (`make run`):
//!
//! ```text
//! cargo run --release --example client -- redis://127.0.0.1:6379/
//! ```
//!
//! It takes a lock as a new user does (a session grant: it lives with the
//! process's session, with no renewal traffic), lets a second thread queue
//! for it through that session, hands the lock over on release, and shows
//! how a holder learns that it lost the lock (the session pushes the loss).
//! `tests/integration/examples.rs` runs it too.
#![allow(dead_code)]

use std::thread;
use std::time::Duration;

use flock_client::{LeaseLost, Lock};
use redis::RedisResult;

const KEY: &str = "example:orders";

fn main() {
    let url = std::env::args().nth(1).unwrap_or_else(|| "redis://127.0.0.1:6379/".to_string());
    if let Err(e) = run(&url) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

pub fn run(url: &str) -> RedisResult<()> {
    let client = redis::Client::open(url)?;
    // Taken through the client, a lock is a session grant: it lives while
    // the process's session does (its reader's heartbeat keeps it), and the
    // server pushes a loss to the guard. The lease is for grants taken
    // without a session (`acquire` on a plain connection, with a watchdog).
    let lock = Lock::new(KEY, Duration::from_secs(30)).session_timeout(Duration::from_secs(1));

    let Some(guard) = lock.acquire_on(&client, None)? else {
        println!("{KEY} is busy (another run still holds it?)");
        return Ok(());
    };
    println!("1. {} holds {KEY} with fencing token {}", guard.owner(), guard.token());
    let lost = guard.lost_channel();

    // Another thread (so another owner) queues for the lock, up to 5 s,
    // over the process's session.
    let waiter = {
        let (client, lock) = (client.clone(), lock.clone());
        thread::spawn(move || -> RedisResult<u64> {
            let guard = lock.acquire_on(&client, Some(Duration::from_secs(5)))?.expect("handed the lock within 5 s");
            let token = guard.token();
            guard.release()?;
            Ok(token)
        })
    };

    // Work for longer than the session's timeout: its heartbeat keeps the
    // lock, with no command per lock.
    thread::sleep(Duration::from_millis(1500));
    println!("2. after 1.5 s (a 1 s session) the lock is still held: lost = {}", guard.lost());
    assert!(!guard.lost(), "the session's heartbeat keeps it");

    // Release: the queued thread is handed the lock with a larger token.
    let first = guard.token();
    guard.release()?;
    assert!(lost.recv().is_err(), "a released guard reports no loss");
    let second = waiter.join().expect("waiter thread")?;
    println!("3. released; the waiting thread was handed the lock with token {second} (> {first})");

    // Lease loss: an administrator takes the lock away; the session hears
    // of it at once and the holder with it.
    let guard = lock.acquire_on(&client, None)?.expect("free again");
    let lost = guard.lost_channel();
    redis::cmd("FLOCK.FORCERELEASE").arg(KEY).query::<i64>(&mut client.get_connection()?)?;
    let reason = lost.recv_timeout(Duration::from_secs(2)).ok();
    println!("4. after FLOCK.FORCERELEASE the session reports {reason:?}; lost = {}", guard.lost());
    assert_eq!(reason, Some(LeaseLost::ForceReleased));
    // Its release now fails with NOTOWNER: the lock is not ours any more.
    if let Err(e) = guard.release() {
        println!("5. release after the loss: {e}");
    }
    // Close this process's session with the server (its thread ends).
    flock_client::close_session(&client)?;
    Ok(())
}
