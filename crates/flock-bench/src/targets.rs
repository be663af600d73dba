//! Where FLOCK stands against the targets of issues 4, 13, 23, 30 and 31, from the samples of
//! this run. Targets whose runs were not chosen are left out.

use crate::results::{Metric, Sample};
use crate::scenarios::shared::{self, Shape};
use crate::scenarios::{
    contended, contended_label, expiry, fenced, philosophers, ping, scale, uncontended, vanished, waiters,
};
use crate::stats::median;

pub struct Check {
    pub target: String,
    pub measured: String,
    pub met: bool,
}

/// One measurement: scenario, method, metric.
#[derive(Clone, Copy)]
struct At<'a>(&'a str, &'a str, Metric);

/// The median over repeats of `a / b`, both at `clients` in the same repeat.
fn paired(samples: &[Sample], clients: usize, a: At, b: At) -> Option<f64> {
    let find = |at: At, repeat: usize| {
        samples
            .iter()
            .find(|s| s.scenario == at.0 && s.method == at.1 && s.clients == clients && s.repeat == repeat)?
            .get(at.2)
    };
    let repeats = samples.iter().map(|s| s.repeat + 1).max().unwrap_or(0);
    let ratios: Vec<f64> = (0..repeats).filter_map(|r| Some(find(a, r)? / find(b, r)?)).collect();
    (!ratios.is_empty()).then(|| median(&ratios))
}

/// FLOCK's combined value.
fn flock(rows: &[Sample], scenario: &str, clients: usize, metric: Metric) -> Option<f64> {
    rows.iter().find(|r| r.scenario == scenario && r.method == "flock" && r.clients == clients)?.get(metric)
}

/// The `flock-session` row of a scenario, if it ran.
fn session_row<'a>(rows: &'a [Sample], scenario: &str, clients: usize) -> Option<&'a Sample> {
    rows.iter().find(|r| r.scenario == scenario && r.method == "flock-session" && r.clients == clients)
}

fn clients_of(rows: &[Sample], scenario: &str) -> Vec<usize> {
    let mut clients: Vec<usize> =
        rows.iter().filter(|r| r.scenario == scenario && r.method == "flock").map(|r| r.clients).collect();
    clients.dedup();
    clients
}

pub fn check(samples: &[Sample], rows: &[Sample]) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut add = |target: String, value: Option<f64>, shown: &dyn Fn(f64) -> String, met: &dyn Fn(f64) -> bool| {
        if let Some(v) = value {
            checks.push(Check { target, measured: shown(v), met: met(v) });
        }
    };
    let times = |v: f64| format!("{v:.2}x");
    let plain = |v: f64| format!("{v:.2}");

    for n in clients_of(rows, "uncontended") {
        let flock_pairs = At("uncontended", "flock", uncontended::PAIRS);
        let vs = |method| paired(samples, n, flock_pairs, At("uncontended", method, uncontended::PAIRS));
        add(format!("uncontended x{n}: pairs/s within 5% of setnx"), vs("setnx"), &times, &|r| r >= 0.95);
        add(format!("uncontended x{n}: pairs/s ahead of redisson"), vs("redisson"), &times, &|r| r > 1.0);
        let session = At("uncontended", "flock-session", uncontended::PAIRS);
        add(
            format!("uncontended x{n}: pairs/s through a session within 5% of flock"),
            paired(samples, n, session, flock_pairs),
            &times,
            &|r| r >= 0.95,
        );
    }

    let hold = contended_label(100);
    for n in clients_of(rows, &hold).into_iter().filter(|&n| n > 1) {
        let at = |metric| flock(rows, &hold, n, metric);
        add(format!("contended x{n}: no grant out of FIFO order"), at(contended::OUT_OF_ORDER), &plain, &|v| v == 0.0);
        add(format!("contended x{n}: max/min grants per client <= 1.1"), at(contended::SPREAD), &plain, &|v| v <= 1.1);
        add(format!("contended x{n}: exactly 2 requests per grant"), at(contended::REQUESTS), &plain, &|v| v == 2.0);
        let floor = match n {
            8 => Some(2.0),
            32 => Some(3.0),
            _ => None,
        };
        if let Some(floor) = floor {
            let grants = |method| At(&hold, method, contended::GRANTS);
            add(
                format!("contended x{n}: grants/s at least {floor}x redisson"),
                paired(samples, n, grants("flock"), grants("redisson")),
                &times,
                &move |r| r >= floor,
            );
        }
        add(
            format!("contended x{n}: hand-off p99 at most PING p99"),
            paired(samples, n, At(&hold, "flock", contended::GAP_P99), At("ping", "ping", ping::P99)),
            &times,
            &|r| r <= 1.0,
        );
        let session = |metric| session_row(rows, &hold, n)?.get(metric);
        add(
            format!("contended x{n}: through a session, no grant out of FIFO order"),
            session(contended::OUT_OF_ORDER),
            &plain,
            &|v| v == 0.0,
        );
        add(
            format!("contended x{n}: through a session, hand-off p50 at most PING p50"),
            paired(samples, n, At(&hold, "flock-session", contended::GAP_P50), At("ping", "ping", ping::P50)),
            &times,
            &|r| r <= 1.0,
        );
    }

    for shape in [Shape::ReadWrite, Shape::Semaphore] {
        let label = shape.label();
        for n in clients_of(rows, &label) {
            let at = |metric| flock(rows, &label, n, metric);
            add(
                format!("{label} x{n}: no grant out of FIFO order (by fencing token)"),
                at(shared::TOKEN_ORDER),
                &plain,
                &|v| v == 0.0,
            );
            add(format!("{label} x{n}: exactly 2 requests per grant"), at(contended::REQUESTS), &plain, &|v| v == 2.0);
            let baselines =
                rows.iter().filter(|r| r.scenario == label && r.clients == n && r.method != "flock").map(|r| r.method);
            for baseline in baselines {
                let grants = |method| At(&label, method, contended::GRANTS);
                add(
                    format!("{label} x{n}: grants/s ahead of {baseline}"),
                    paired(samples, n, grants("flock"), grants(baseline)),
                    &times,
                    &|r| r > 1.0,
                );
            }
        }
    }

    for n in clients_of(rows, "expiry") {
        let at = |metric| flock(rows, "expiry", n, metric);
        let ms = |v: f64| format!("{v:.2} ms");
        add(format!("expiry x{n}: delay p50 within 2 ms"), at(expiry::DELAY_P50), &ms, &|v| v <= 2.0);
        add(format!("expiry x{n}: delay never over 10 ms"), at(expiry::DELAY_MAX), &ms, &|v| v <= 10.0);
        add(format!("expiry x{n}: no request while waiting"), at(expiry::WAITING_REQUESTS), &plain, &|v| v == 0.0);
    }

    if let Some(row) = rows.iter().find(|r| r.scenario == "vanished") {
        let ms = |v: f64| format!("{v:.1} ms");
        let late = row.get(vanished::LATE_MAX);
        add("vanished: freed within 100 ms of the session timeout".into(), late, &ms, &|v| v <= 100.0);
        let left = row.get(vanished::WAITS_LEFT);
        add("vanished: its waits left with it".into(), left, &plain, &|v| v == vanished::TRIALS as f64);
    }

    if let Some(row) = rows.iter().find(|r| r.scenario == "scale" && r.method == "flock") {
        let get = |metric| row.get(metric);
        let bytes = |v: f64| format!("{v:.0} B");
        let beyond_key = get(scale::LOCK_BYTES).zip(get(scale::KEY_BYTES)).map(|(b, k)| b - k);
        add("scale: at most 200 bytes per idle lock beyond the key name".into(), beyond_key, &bytes, &|v| v <= 200.0);
        add(
            "scale: at most 150 bytes per waiter beyond the connection".into(),
            get(scale::WAITER_BYTES),
            &bytes,
            &|v| v <= 150.0,
        );
        add(
            "scale: server cost of a pair with the idle locks within 10%".into(),
            get(scale::WITH_LOCKS),
            &times,
            &|v| v <= 1.1,
        );
        add(
            "scale: server cost of a pair with the waiters within 10%".into(),
            get(scale::WITH_WAITERS),
            &times,
            &|v| v <= 1.1,
        );
    }

    if let Some(row) = rows.iter().find(|r| r.scenario == "waiters" && r.method == waiters::Way::Session.name()) {
        let get = |metric| row.get(metric);
        add(
            "waiters: one process's waiters add at most 4 connections through a session".into(),
            get(waiters::CONNECTIONS),
            &plain,
            &|v| v <= 4.0,
        );
        add(
            "waiters: at most 2 KB of server memory per waiter through a session".into(),
            get(waiters::WAITER_BYTES),
            &|v: f64| format!("{v:.0} B"),
            &|v| v <= 2048.0,
        );
        add("waiters: grants through a session in queue order".into(), get(waiters::OUT_OF_ORDER), &plain, &|v| {
            v == 0.0
        });
        // O(1) in the waiters: the last waits queue behind 9,000 others.
        add(
            "waiters: a wait queued last costs the server what one queued first does (within 50%)".into(),
            get(waiters::QUEUE_LAST).zip(get(waiters::QUEUE_FIRST)).map(|(last, first)| last / first),
            &times,
            &|v| v <= 1.5,
        );
        // In PINGs on the same connection at the same moments, so that the
        // two runs' loads cancel out.
        let in_pings = |row: &Sample| row.get(waiters::HANDOFF).zip(row.get(waiters::PING)).map(|(h, p)| h / p);
        let blocking = rows.iter().find(|r| r.scenario == "waiters" && r.method == waiters::Way::Blocking.name());
        let ratio = in_pings(row).zip(blocking.and_then(in_pings)).map(|(s, b)| s / b);
        add(
            "waiters: hand-off p50 through a session (in PINGs) within 10% of the blocking WAIT's".into(),
            ratio,
            &times,
            &|v| v <= 1.1,
        );
    }
    for n in philosophers::CLIENTS {
        let all = philosophers::Way::AcquireAll.name();
        let row = rows.iter().find(|r| r.scenario == "philosophers" && r.method == all && r.clients == n);
        let Some(row) = row else { continue };
        for other in [philosophers::Way::KeyOrder, philosophers::Way::MultiLock] {
            let ratio = paired(
                samples,
                n,
                At("philosophers", all, philosophers::GRANTS),
                At("philosophers", other.name(), philosophers::GRANTS),
            );
            add(format!("philosophers x{n}: grants/s ahead of {}", other.name()), ratio, &times, &|v| v > 1.0);
        }
        for (metric, what) in [(philosophers::TIMEOUTS, "timeouts"), (philosophers::RETRIES, "retries")] {
            add(format!("philosophers x{n}: 0 {what} (acquireall)"), row.get(metric), &plain, &|v| v == 0.0);
        }
    }
    let mut fenced_clients: Vec<usize> =
        rows.iter().filter(|r| r.scenario == "fenced" && r.method == "fenced").map(|r| r.clients).collect();
    fenced_clients.dedup();
    for n in fenced_clients {
        add(
            format!("fenced x{n}: FLOCK.FENCED SET costs at most 1.1x SET (ops/s, one per round trip)"),
            paired(samples, n, At("fenced", "set", fenced::OPS), At("fenced", "fenced", fenced::OPS)),
            &times,
            &|r| r <= 1.1,
        );
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(scenario: &str, method: &'static str, values: Vec<(Metric, f64)>) -> Sample {
        Sample { scenario: scenario.into(), method, clients: 8, repeat: 0, values }
    }

    /// The flock rows of the shared scenarios, which the bench can only
    /// measure with a module that has SHARED, turn into issue 13's checks.
    #[test]
    fn shared_scenarios_are_checked_against_every_baseline() {
        let label = Shape::Semaphore.label();
        let run = |grants, late, requests| {
            vec![(contended::GRANTS, grants), (shared::TOKEN_ORDER, late), (contended::REQUESTS, requests)]
        };
        let samples = vec![
            sample(&label, "flock", run(9000.0, 0.0, 2.0)),
            sample(&label, "redisson", run(6000.0, f64::NAN, 9.0)),
            sample(&label, "redisson-expirable", run(10000.0, f64::NAN, 9.0)),
        ];
        let checks: Vec<(String, bool)> =
            check(&samples, &crate::results::combine(&samples)).into_iter().map(|c| (c.target, c.met)).collect();
        assert_eq!(
            checks,
            [
                (format!("{label} x8: no grant out of FIFO order (by fencing token)"), true),
                (format!("{label} x8: exactly 2 requests per grant"), true),
                (format!("{label} x8: grants/s ahead of redisson"), true),
                (format!("{label} x8: grants/s ahead of redisson-expirable"), false),
            ]
        );
    }
}
