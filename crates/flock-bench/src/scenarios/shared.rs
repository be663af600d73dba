//! `rwlock` and `semaphore`: every client on one read-write lock (one
//! acquisition in ten a write) or on one semaphore of `LIMIT` permits (one
//! each), holding it for a while each time: grant rate, hand-off gap, FIFO
//! order and fairness, as `contended` measures them for one holder.

use std::time::Duration;

use redis::RedisResult;

use super::contended::{self, hold_for, out_of_order, spread, Hold, ORDER_MARGIN_NS};
use crate::client::Client;
use crate::methods::{Shared, SharedKind, Want};
use crate::results::Metric;
use crate::runner::{run_clients, Run};
use crate::server::{measure_busy, Server};
use crate::stats::{latency_us, us};
use crate::stop::Stop;

pub const WRITES: Metric = Metric::median("writes %");
pub const WAIT_MAX: Metric = Metric::worst("wait max ms");
pub const BROKEN: Metric = Metric::worst("exclusion broken");
pub const TOKEN_ORDER: Metric = Metric::worst("out of order by token");

const KEY: &str = "shared";
const LEASE_MS: u64 = 30_000;
pub const HOLD_NS: u64 = 100_000;
/// One acquisition in this many is a write.
pub const WRITE_EVERY: usize = 10;
/// The semaphore's permits.
pub const LIMIT: u32 = 4;

/// The two scenarios.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    ReadWrite,
    Semaphore,
}

impl Shape {
    pub fn label(self) -> String {
        match self {
            Shape::ReadWrite => format!("rwlock writes=1/{WRITE_EVERY}"),
            Shape::Semaphore => format!("semaphore limit={LIMIT}"),
        }
    }

    /// What client `i` asks for in its acquisition `turn`: the writes
    /// staggered across clients, so that each client writes as often.
    fn want(self, i: usize, turn: usize) -> Want {
        match self {
            Shape::ReadWrite if (turn + i).is_multiple_of(WRITE_EVERY) => Want::Write,
            Shape::ReadWrite => Want::Read,
            Shape::Semaphore => Want::Permit { limit: LIMIT },
        }
    }
}

/// One grant, whether it was a write, and its fencing token if the method has them.
struct Grant {
    hold: Hold,
    write: bool,
    token: Option<u64>,
}

pub fn run(
    server: &Server,
    kind: SharedKind,
    shape: Shape,
    clients: usize,
    duration: Duration,
) -> RedisResult<Vec<(Metric, f64)>> {
    let (run, busy) = measure_busy(server, || {
        run_clients(
            server,
            clients,
            duration,
            |_| kind.client(server),
            |i, c, method, stop| take_turns(i, c, method.as_mut(), stop, shape),
        )
    })?;
    Ok(analyze(run, shape, clients, busy))
}

/// Client `i`: acquire, hold, release, again until the stop.
fn take_turns(i: usize, c: &mut Client, method: &mut dyn Shared, stop: &Stop, shape: Shape) -> RedisResult<Vec<Grant>> {
    let owner = format!("c{i}");
    method.prepare(c, KEY, shape.want(i, 0))?;
    let mut grants = Vec::new();
    while !stop.is_set() {
        let want = shape.want(i, grants.len());
        c.mark();
        if !method.acquire(c, KEY, &owner, want, LEASE_MS, stop)? {
            break;
        }
        let hold = hold_for(i, c, HOLD_NS);
        method.release(c, KEY, &owner, want)?;
        grants.push(Grant {
            hold: Hold { requests: c.sent().requests, ..hold },
            write: want == Want::Write,
            token: method.last_token(),
        });
    }
    Ok(grants)
}

/// `busy`: µs the server spent in the run's commands.
fn analyze(run: Run<Vec<Grant>>, shape: Shape, clients: usize, busy: f64) -> Vec<(Metric, f64)> {
    let seconds = run.seconds();
    let mut grants: Vec<Grant> = run.results.into_iter().flatten().filter(|g| g.hold.granted <= run.end).collect();
    grants.sort_by_key(|g| g.hold.granted);
    let writes = grants.iter().filter(|g| g.write).count() as f64;
    let broken = exclusion_broken(&grants, shape) as f64;
    let late_by_token = out_of_token_order(&mut grants);
    let mut holds: Vec<Hold> = grants.into_iter().map(|g| g.hold).collect();
    holds.sort_by_key(|h| h.granted);
    let n = holds.len() as f64;
    let mut releases: Vec<u64> = holds.iter().map(|h| h.released).collect();
    releases.sort_unstable();
    // Holds overlap: a grant's hand-off runs from the last release sent
    // before it, for a client that was waiting then (it had joined before).
    let gaps = holds
        .iter()
        .filter_map(|h| {
            let before = releases.partition_point(|&r| r < h.granted);
            let release = *releases.get(before.checked_sub(1)?)?;
            (h.joined.end < release).then(|| h.granted - release)
        })
        .collect();
    let [p50, p99, max] = latency_us(gaps);
    let late = out_of_order(&holds, ORDER_MARGIN_NS) as f64;
    let held: u64 = holds.iter().map(|h| h.released - h.granted).sum();
    let requests: u64 = holds.iter().map(|h| h.requests).sum();
    let longest_wait = holds.iter().map(|h| h.granted - h.joined.start).max().unwrap_or(0);
    let mut metrics = vec![
        (contended::GRANTS, n / seconds),
        (WRITES, 100.0 * writes / n),
        (contended::HOLD, us(held as f64 / n)),
        (contended::GAP_P50, p50),
        (contended::GAP_P99, p99),
        (contended::GAP_MAX, max),
        (WAIT_MAX, longest_wait as f64 / 1e6),
        (BROKEN, broken),
        (contended::OUT_OF_ORDER, late),
        (contended::OUT_OF_ORDER_PCT, 100.0 * late / n),
        (TOKEN_ORDER, late_by_token),
        (contended::SPREAD, spread(&holds, clients)),
        (contended::REQUESTS, requests as f64 / n),
        (contended::SERVER, busy / n),
    ];
    if shape == Shape::Semaphore {
        metrics.retain(|&(m, _)| m.name != WRITES.name);
    }
    metrics
}

/// Grants seen while the holds already seen excluded them: a write while
/// anyone held, anything while a writer held, a permit while all `LIMIT`
/// were held. A client sees its hold start after the server granted it and
/// end before it sends the release, so an overlap seen is a real one.
fn exclusion_broken(grants_in_grant_order: &[Grant], shape: Shape) -> usize {
    let mut ends: Vec<(u64, bool)> = grants_in_grant_order.iter().map(|g| (g.hold.released, g.write)).collect();
    ends.sort_unstable();
    let (mut ended, mut holders, mut writers, mut broken) = (0, 0usize, 0usize, 0);
    for g in grants_in_grant_order {
        while let Some(&(_, write)) = ends.get(ended).filter(|&&(end, _)| end <= g.hold.granted) {
            holders -= 1;
            writers -= usize::from(write);
            ended += 1;
        }
        let full = match shape {
            Shape::ReadWrite => writers > 0 || (g.write && holders > 0),
            Shape::Semaphore => holders >= LIMIT as usize,
        };
        broken += usize::from(full);
        holders += 1;
        writers += usize::from(g.write);
    }
    broken
}

/// Out-of-order grants in the order the server granted them, when every
/// grant has a fencing token (NaN otherwise): the clients see grants of
/// overlapping holds late by as long as the scheduler keeps them off a core,
/// often over a millisecond on a busy machine; tokens are not late. Leaves
/// `grants` in token order.
fn out_of_token_order(grants: &mut [Grant]) -> f64 {
    if grants.iter().any(|g| g.token.is_none()) {
        return f64::NAN;
    }
    grants.sort_by_key(|g| g.token);
    // The rank in token order stands for the grant time: no margin needed.
    let ranked: Vec<Hold> = grants.iter().enumerate().map(|(k, g)| Hold { granted: k as u64, ..g.hold }).collect();
    out_of_order(&ranked, 0) as f64
}
