//! The Rust client's read-write lock and semaphore (crate `flock-client`)
//! against a real server: shared and exclusive guards, permits, the server's
//! refusals as error codes, the watchdog of a shared holder.

use crate::common::*;

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use flock_client::{LeaseLost, Mode, RwLock, Semaphore, FOREVER};

const MS: Duration = Duration::from_millis(1);

fn client(s: &Server) -> redis::Client {
    redis::Client::open(s.url()).expect("client")
}

/// Waits until `n` clients are blocked in the server (waiters queued).
fn wait_blocked(s: &Server, n: i64) {
    wait_until(&format!("{n} blocked clients"), 5 * SECOND, || s.blocked_clients() == n);
}

#[test]
fn readers_hold_together_with_their_own_tokens_and_a_writer_waits_for_both() {
    let s = Server::start();
    let lock = RwLock::new("RW", 10 * SECOND);
    let r1 = lock.clone().with_owner("r1").read(s.conn(), None).unwrap().expect("first reader");
    let r2 = lock.clone().with_owner("r2").read(s.conn(), None).unwrap().expect("second reader, at once");
    assert_eq!((r1.mode(), r2.mode()), (Mode::Shared, Mode::Shared));
    assert!(r2.token() > r1.token(), "every grant a new token: {} then {}", r1.token(), r2.token());

    let writer = lock.clone().with_owner("w");
    assert!(writer.write(s.conn(), None).unwrap().is_none(), "a write try while read");
    let waiting = {
        let (writer, c) = (writer.clone(), s.conn());
        std::thread::spawn(move || writer.write(c, Some(FOREVER)).unwrap().map(|g| (g.mode(), g.token())))
    };
    wait_blocked(&s, 1);
    // A reader that comes after a queued writer does not overtake it.
    assert!(lock.clone().with_owner("r3").read(s.conn(), None).unwrap().is_none());

    let newest = r2.token();
    assert_eq!(r1.release().unwrap(), 0);
    assert_eq!(s.blocked_clients(), 1, "one reader left: the writer still waits");
    drop(r2);
    let (mode, token) = waiting.join().unwrap().expect("the writer is handed the lock");
    assert_eq!(mode, Mode::Exclusive);
    assert!(token > newest, "the writer's token {token} is newer than the readers' ({newest})");
}

#[test]
fn a_reader_asking_to_write_gets_upgrade_and_keeps_its_read_hold() {
    let s = Server::start();
    let lock = RwLock::new("RW", 10 * SECOND);
    let read = lock.read(s.conn(), None).unwrap().expect("read");
    let e = expect_err(lock.write(s.conn(), None), "write while reading");
    assert_eq!(error_code(&e), "UPGRADE");
    // Nothing changed: the read hold is still there and still alone.
    assert!(lock.clone().with_owner("w").write(s.conn(), None).unwrap().is_none());
    assert_eq!(read.release().unwrap(), 0);
    assert!(lock.clone().with_owner("w").write(s.conn(), None).unwrap().is_some(), "free after the release");
}

#[test]
fn a_writer_may_also_read_on_its_write_grant() {
    let s = Server::start();
    let lock = RwLock::new("RW", 10 * SECOND);
    let write = lock.write(s.conn(), None).unwrap().expect("write");
    let read = lock.read(s.conn(), None).unwrap().expect("the writer reads too");
    assert_eq!(read.token(), write.token(), "one more hold on the write grant");
    assert_eq!(read.release().unwrap(), 1);
    assert!(lock.clone().with_owner("other").read(s.conn(), None).unwrap().is_none(), "still written");
    assert_eq!(write.release().unwrap(), 0);
}

#[test]
fn semaphore_grants_permits_up_to_its_limit_and_hands_them_to_a_waiter() {
    let s = Server::start();
    let sem = Semaphore::new("S", 3, 10 * SECOND);
    assert_eq!(sem.limit(), 3);
    let two = sem.clone().with_owner("a").acquire(s.conn(), 2, None).unwrap().expect("2 of 3");
    assert_eq!(two.mode(), Mode::Permits { permits: 2, limit: 3 });
    let one = sem.clone().with_owner("b").acquire(s.conn(), 1, None).unwrap().expect("the third");
    assert!(sem.clone().with_owner("c").acquire(s.conn(), 1, None).unwrap().is_none(), "none left");

    let waiting = {
        let (sem, c) = (sem.clone().with_owner("c"), s.conn());
        std::thread::spawn(move || sem.acquire(c, 2, Some(10 * SECOND)).unwrap().map(|g| g.token()))
    };
    wait_blocked(&s, 1);
    let last = two.token().max(one.token());
    assert_eq!(one.release().unwrap(), 0);
    assert_eq!(s.blocked_clients(), 1, "one permit free: the request for 2 still waits");
    drop(two);
    let token = waiting.join().unwrap().expect("handed 2 permits");
    assert!(token > last);
}

#[test]
fn semaphore_refusals_come_back_as_wrongmode() {
    let s = Server::start();
    let _lock = flock_client::Lock::new("L", 10 * SECOND).acquire(s.conn(), None).unwrap().expect("lock");
    let e = expect_err(Semaphore::new("L", 2, SECOND).acquire(s.conn(), 1, None), "a semaphore on a lock");
    assert_eq!(error_code(&e), "WRONGMODE");

    let _held = Semaphore::new("S", 2, 10 * SECOND).with_owner("a").acquire(s.conn(), 1, None).unwrap();
    let e = expect_err(Semaphore::new("S", 3, SECOND).acquire(s.conn(), 1, None), "another limit");
    assert_eq!(error_code(&e), "WRONGMODE");
    let e = expect_err(RwLock::new("S", SECOND).read(s.conn(), None), "a read on a semaphore");
    assert_eq!(error_code(&e), "WRONGMODE");
    // More permits than the limit is bad input.
    assert!(Semaphore::new("T", 2, SECOND).acquire(s.conn(), 3, None).is_err());
}

#[test]
fn watchdog_keeps_a_reader_and_a_permit_alive_and_reports_forcerelease() {
    let s = Server::start();
    let mut admin = s.conn();
    // Long enough for a loaded machine's renewals while this test connects
    // twice a round.
    let lease = 1200 * MS;
    let mut read = RwLock::new("RW", lease).read(s.conn(), None).unwrap().expect("read");
    let mut permit = Semaphore::new("S", 1, lease).acquire(s.conn(), 1, None).unwrap().expect("permit");
    let read_lost = read.watchdog(&client(&s)).unwrap();
    let permit_lost = permit.watchdog(&client(&s)).unwrap();

    // Six renewals each, a third of a lease apart: two lease periods,
    // without renewals both would have ended.
    let started = std::time::Instant::now();
    while renew_calls(&mut admin) < 12 {
        assert!(RwLock::new("RW", SECOND).with_owner("w").write(s.conn(), None).unwrap().is_none());
        assert!(Semaphore::new("S", 1, SECOND).with_owner("x").acquire(s.conn(), 1, None).unwrap().is_none());
        assert!(started.elapsed() < 10 * lease, "only {} renewals", renew_calls(&mut admin));
        std::thread::sleep(20 * MS);
    }
    assert_eq!(s.stat("lease_expiries"), 0);

    // Released: the watchdog stops without a loss.
    assert_eq!(permit.release().unwrap(), 0);
    assert_eq!(permit_lost.recv_timeout(SECOND), Err(RecvTimeoutError::Disconnected));
    // Taken away: the reader's watchdog reports it.
    assert_eq!(force_release(&mut admin, "RW").unwrap(), 1);
    assert_eq!(read_lost.recv_timeout(2 * SECOND), Ok(LeaseLost::NotOwner));
    assert!(read.lost());
    assert_eq!(error_code(&read.release().unwrap_err()), "NOTOWNER");
}
