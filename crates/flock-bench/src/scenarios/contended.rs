//! `contended`: every client on one key, holding it for a while each time:
//! grant rate, hand-off gap, FIFO order and fairness.

use std::time::Duration;

use redis::RedisResult;

use crate::client::{now_ns, Client, Span};
use crate::methods::{Kind, Method};
use crate::results::Metric;
use crate::runner::{run_method, Run};
use crate::server::{measure_busy, Server};
use crate::stats::{latency_us, us};
use crate::stop::Stop;

pub const GRANTS: Metric = Metric::median("grants/s");
pub const HOLD: Metric = Metric::median("hold us");
pub const GAP_P50: Metric = Metric::median("handoff p50 us");
pub const GAP_P99: Metric = Metric::median("handoff p99 us");
pub const GAP_MAX: Metric = Metric::worst("handoff max us");
pub const OUT_OF_ORDER: Metric = Metric::worst("out of order");
pub const OUT_OF_ORDER_PCT: Metric = Metric::worst("out of order %");
pub const SPREAD: Metric = Metric::worst("max/min grants");
pub const REQUESTS: Metric = Metric::worst("req/grant");
pub const SERVER: Metric = Metric::median("server us/grant");

const KEY: &str = "contended";
const LEASE_MS: u64 = 30_000;
/// Joins closer together than this are not ordered. Redis reads the
/// sockets that became readable during one event-loop turn in its own
/// order, and loopback delivery can lag the write under load: FLOCK, FIFO
/// in the server, shows such "inversions" of up to ~0.1 ms with no hold.
pub const ORDER_MARGIN_NS: u64 = 1_000_000;

/// One grant as its client saw it.
pub struct Hold {
    pub client: usize,
    /// The write of the acquire's first request: when it joined the line.
    pub joined: Span,
    pub granted: u64,
    /// Just before the release request was written.
    pub released: u64,
    pub requests: u64,
}

/// The grant `c` just saw, held for `hold_ns`: busy, as work under a lock
/// is (a sleep would last tens of µs longer than asked). Returns the hold
/// but for `released` and `requests`, which the caller fills in.
pub fn hold_for(i: usize, c: &Client, hold_ns: u64) -> Hold {
    let granted = now_ns();
    let joined = c.sent().first.expect("every acquire sends a request");
    while now_ns() - granted < hold_ns {
        std::hint::spin_loop();
    }
    Hold { client: i, joined, granted, released: now_ns(), requests: 0 }
}

/// Most over fewest grants per client.
pub fn spread(holds: &[Hold], clients: usize) -> f64 {
    let mut per_client = vec![0u64; clients];
    for h in holds {
        per_client[h.client] += 1;
    }
    let most = per_client.iter().max().copied().unwrap_or(0) as f64;
    let least = per_client.iter().min().copied().unwrap_or(0) as f64;
    most / least
}

pub fn run(
    server: &Server,
    kind: Kind,
    clients: usize,
    duration: Duration,
    hold: Duration,
) -> RedisResult<Vec<(Metric, f64)>> {
    let hold_ns = hold.as_nanos() as u64;
    let (run, busy) = measure_busy(server, || {
        run_method(server, kind, clients, duration, |i, c, method, stop| take_turns(i, c, method, stop, hold_ns))
    })?;
    Ok(analyze(run, clients, busy))
}

/// Client `i`: acquire, hold for `hold_ns`, release, again until the stop.
fn take_turns(i: usize, c: &mut Client, method: &mut dyn Method, stop: &Stop, hold_ns: u64) -> RedisResult<Vec<Hold>> {
    let owner = format!("c{i}");
    let mut holds = Vec::new();
    while !stop.is_set() {
        c.mark();
        if !method.acquire(c, KEY, &owner, LEASE_MS, stop)? {
            break;
        }
        let hold = hold_for(i, c, hold_ns);
        method.release(c, KEY, &owner)?;
        holds.push(Hold { requests: c.sent().requests, ..hold });
    }
    Ok(holds)
}

/// `busy`: µs the server spent in the run's commands.
fn analyze(run: Run<Vec<Hold>>, clients: usize, busy: f64) -> Vec<(Metric, f64)> {
    let seconds = run.seconds();
    let mut holds: Vec<Hold> = run.results.into_iter().flatten().filter(|h| h.granted <= run.end).collect();
    // Holds of a lock do not overlap, so the times the grants were seen
    // are in grant order.
    holds.sort_by_key(|h| h.granted);
    let n = holds.len() as f64;
    // From the release being sent to the next holder seeing its grant: the
    // next grant may arrive before the releaser reads its own reply.
    let gaps = holds.windows(2).map(|w| w[1].granted.saturating_sub(w[0].released)).collect();
    let [p50, p99, max] = latency_us(gaps);
    let late = out_of_order(&holds, 0) as f64;
    let held: u64 = holds.iter().map(|h| h.released - h.granted).sum();
    let requests: u64 = holds.iter().map(|h| h.requests).sum();
    vec![
        (GRANTS, n / seconds),
        (HOLD, us(held as f64 / n)),
        (GAP_P50, p50),
        (GAP_P99, p99),
        (GAP_MAX, max),
        (OUT_OF_ORDER, late),
        (OUT_OF_ORDER_PCT, 100.0 * late / n),
        (SPREAD, spread(&holds, clients)),
        (REQUESTS, requests as f64 / n),
        (SERVER, busy / n),
    ]
}

/// Grants made while a client that had joined earlier was still waiting:
/// its join had been written `ORDER_MARGIN_NS` before this one's began, and
/// its grant came over `grant_margin_ns` after this one (grants of one turn
/// to several holders reach them in some order).
pub fn out_of_order(holds_in_grant_order: &[Hold], grant_margin_ns: u64) -> usize {
    // The earliest join among the grants from each one on.
    let mut earliest_join = vec![u64::MAX; holds_in_grant_order.len() + 1];
    for (k, h) in holds_in_grant_order.iter().enumerate().rev() {
        earliest_join[k] = earliest_join[k + 1].min(h.joined.end);
    }
    holds_in_grant_order
        .iter()
        .filter(|h| {
            let later =
                holds_in_grant_order.partition_point(|l| l.granted <= h.granted.saturating_add(grant_margin_ns));
            earliest_join[later].saturating_add(ORDER_MARGIN_NS) < h.joined.start
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(joined: u64, granted: u64) -> Hold {
        Hold { client: 0, joined: Span { start: joined, end: joined }, granted, released: granted, requests: 2 }
    }

    #[test]
    fn a_grant_is_out_of_order_only_when_an_earlier_join_is_granted_later_beyond_the_margins() {
        const MS: u64 = 1_000_000;
        // The first joined 5 ms before the second but was granted 0.5 ms after it.
        let holds = [hold(10 * MS, 20 * MS), hold(5 * MS, 20 * MS + MS / 2)];
        assert_eq!(out_of_order(&holds, 0), 1, "one holder: any later grant counts");
        assert_eq!(out_of_order(&holds, MS), 0, "shared: grants within 1 ms are one turn");
        let holds = [hold(10 * MS, 20 * MS), hold(5 * MS, 22 * MS)];
        assert_eq!(out_of_order(&holds, MS), 1);
        // Joins within the margin are not ordered.
        let holds = [hold(10 * MS, 20 * MS), hold(10 * MS - MS / 2, 30 * MS)];
        assert_eq!(out_of_order(&holds, 0), 0);
    }
}
