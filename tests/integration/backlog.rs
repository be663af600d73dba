//! A backlog of due leases (the event loop was busy while they ran out, here
//! with DEBUG SLEEP, or they ran out before an RDB load) ends in slices:
//! every lease ends, each lock passes to the head of its queue, the events
//! are all sent, earliest deadline first, and clients are served while the
//! rest of the backlog waits.
use crate::common::*;

/// Enough leases that their catch-up takes far longer than a round trip
/// (tens of milliseconds at 50,000), and in `make soak` three times that.
fn locks() -> usize {
    if soak() {
        150_000
    } else {
        50_000
    }
}
/// Long enough to queue waiters before anything falls due.
const LEASE_MS: u64 = 1_500;
/// The bulk's leases are this much longer than the contended locks' (taken
/// just before): leases due in the same millisecond end in any order, and
/// the first of the bulk can be taken within a millisecond of the last
/// contended lock.
const BULK_LATER_MS: u64 = 50;

/// Takes [`locks`] locks with `LEASE_MS + BULK_LATER_MS` leases in one
/// script, so that no lease can end before the last is taken, then sleeps
/// the server past all of them, then runs `after` in the same pipeline:
/// when this returns, the whole backlog was due at once.
fn take_then_sleep_past(c: &mut Connection, after: &[&str]) {
    let fill = "for i = 1, tonumber(ARGV[1]) do redis.call('FLOCK.ACQUIRE', 'bulk:' .. i, 'o', ARGV[2]) end";
    let lease_ms = LEASE_MS + BULK_LATER_MS;
    let sleep_s = (lease_ms + 200) as f64 / 1000.0;
    let mut pipe = redis::pipe();
    pipe.cmd("EVAL").arg(fill).arg(0).arg(locks()).arg(lease_ms).ignore();
    pipe.cmd("DEBUG").arg("SLEEP").arg(sleep_s).ignore();
    if !after.is_empty() {
        pipe.cmd(after[0]).arg(&after[1..]).ignore();
    }
    pipe.query::<()>(c).expect("fill and sleep");
}

/// The first slice of the backlog has run when the pipeline's reply comes:
/// PING on another connection is answered while leases are left.
fn assert_served_during_catch_up(s: &Server) {
    let pong: String = redis::cmd("PING").query(&mut s.conn()).unwrap();
    assert_eq!(pong, "PONG");
    let left = s.stat("locks");
    assert!(left > 0, "PING was answered only after the whole backlog had ended");
    eprintln!("{left} of {} leases still to end when PING was answered", locks());
}

fn wait_all_ended(s: &Server, expiries: usize) {
    wait_until("every lease of the backlog to end", 60 * SECOND, || s.stat("locks") == 0);
    assert_eq!(s.stat("lease_expiries"), expiries as i64);
}

#[test]
fn a_backlog_of_due_leases_all_end_in_deadline_order_and_hand_off_in_fifo_order() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, &[("notify-keyspace-events", "Ed")]);
    let mut sub_conn = s.conn();
    sub_conn.set_read_timeout(Some(60 * SECOND)).unwrap();
    let mut sub = sub_conn.as_pubsub();
    sub.subscribe("__keyevent@0__:flock.expired").unwrap();

    // Three contended locks that fall due a few ms before the bulk, each
    // with three waiters whose own short leases end in turn.
    let contended = ["c:1", "c:2", "c:3"];
    let mut waiters = Vec::new();
    for key in contended {
        acquire(&mut c, key, "h", LEASE_MS).unwrap().expect("granted");
        let mut queued = Vec::new();
        for w in ["w1", "w2", "w3"] {
            waiters.push((key, w, spawn_waiter(&s, key, w, 50, 60_000)));
            queued.push(w);
            wait_queue(&mut c, key, &queued);
        }
    }
    take_then_sleep_past(&mut c, &[]);

    let expected = locks() + contended.len() * 4;
    let mut expired = Vec::with_capacity(expected);
    while expired.len() < expected {
        let message = sub.get_message().expect("a flock.expired event");
        expired.push(message.get_payload::<String>().unwrap());
    }
    wait_all_ended(&s, expected);

    // Earliest deadline first: the contended locks' first leases end before
    // any of the bulk's.
    let mut first: Vec<&str> = expired[..contended.len()].iter().map(String::as_str).collect();
    first.sort_unstable();
    assert_eq!(first, contended, "the first events: {:?}", &expired[..10]);
    let bulk = expired.iter().filter(|k| k.starts_with("bulk:")).collect::<std::collections::HashSet<_>>();
    assert_eq!(bulk.len(), locks(), "one flock.expired event per bulk lock");
    for key in contended {
        assert_eq!(expired.iter().filter(|k| *k == key).count(), 4, "{key}: the holder's and each waiter's lease");
    }
    // Each lock went to its waiters in the order they queued: fencing
    // tokens rise with every grant.
    for key in contended {
        let tokens: Vec<i64> = waiters
            .iter_mut()
            .filter(|(k, _, _)| *k == key)
            .map(|(_, w, handle)| {
                let taken = std::mem::replace(handle, std::thread::spawn(|| Ok(None)));
                taken.join().unwrap().unwrap().unwrap_or_else(|| panic!("{key}: {w} was never granted"))
            })
            .collect();
        assert!(tokens.windows(2).all(|t| t[0] < t[1]), "{key}: grants out of queue order: {tokens:?}");
    }
    assert_eq!(s.stat("waiters"), 0);
    assert_eq!(s.blocked_clients(), 0);
}

#[test]
fn clients_are_served_while_a_backlog_of_due_leases_ends() {
    let s = Server::start();
    let mut c = s.conn();
    take_then_sleep_past(&mut c, &[]);
    assert_served_during_catch_up(&s);
    // Commands meanwhile work as usual, and a new lease ends in its turn.
    acquire(&mut c, "fresh", "f", 20).unwrap().expect("granted");
    wait_all_ended(&s, locks() + 1);
}

#[test]
fn leases_that_ran_out_before_an_rdb_load_end_while_clients_are_served() {
    let s = Server::start();
    let mut c = s.conn();
    take_then_sleep_past(&mut c, &["DEBUG", "RELOAD"]);
    assert_served_during_catch_up(&s);
    wait_all_ended(&s, locks());
}
