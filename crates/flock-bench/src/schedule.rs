//! The order in which a benchmark runs the scenarios that the options
//! choose, each run on an emptied server.

use std::error::Error;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::client::Client;
use crate::config::Config;
use crate::methods::{self, SharedKind};
use crate::results::{Metric, Sample};
use crate::scenarios::{
    backlog, contended, contended_label, expiry, fenced, philosophers, ping, scale, shared, uncontended, vanished,
    waiters, Scenario,
};
use crate::server::{flushall, Server};

/// Enough for two hand-offs at expiry's lease.
const EXPIRY_MIN_RUN: Duration = Duration::from_millis(expiry::LEASE_MS * 9 / 4);

/// Keeps the samples, each measured on an emptied server.
struct Recorder {
    control: Connection,
    samples: Vec<Sample>,
    repeat: usize,
    repeats: usize,
    started: Instant,
}

impl Recorder {
    fn measure<E: Into<Box<dyn Error>>>(
        &mut self,
        scenario: &str,
        method: &'static str,
        clients: usize,
        run: impl FnOnce() -> Result<Vec<(Metric, f64)>, E>,
    ) -> Result<(), Box<dyn Error>> {
        flushall(&mut self.control)?;
        let values = run().map_err(Into::into)?;
        let shown: Vec<String> = values.iter().map(|(m, v)| format!("{}={v:.1}", m.name)).collect();
        let elapsed = self.started.elapsed().as_secs_f64();
        eprintln!(
            "[{}/{} {elapsed:.0}s] {scenario} {method} x{clients}: {}",
            self.repeat + 1,
            self.repeats,
            shown.join(", ")
        );
        self.samples.push(Sample { scenario: scenario.to_string(), method, clients, repeat: self.repeat, values });
        Ok(())
    }
}

/// Runs the chosen scenarios `repeats` times. Within a repeat the methods
/// run back to back for each client count, so their ratios pair up repeat
/// by repeat whatever else loads the machine. `scale` and `waiters` run
/// once, last, each on servers of its own.
pub fn run_all(server: &Server, config: &Config) -> Result<Vec<Sample>, Box<dyn Error>> {
    let mut client = Client::open(server)?;
    methods::load_scripts(&mut client)?;
    let flock_shared = methods::supports_shared(&mut client)?;
    if !flock_shared && config.methods.contains(&methods::Kind::Flock) {
        eprintln!("the module has no FLOCK.ACQUIRE ... SHARED: rwlock and semaphore run without flock");
    }
    let mut rec = Recorder {
        control: server.connect()?,
        samples: Vec::new(),
        repeat: 0,
        repeats: config.repeats,
        started: Instant::now(),
    };
    let d = config.duration;
    for repeat in 0..config.repeats {
        rec.repeat = repeat;
        for &scenario in config.scenarios.iter().filter(|&&s| s != Scenario::Scale && s != Scenario::Waiters) {
            if scenario == Scenario::Backlog {
                for &leases in &config.backlog {
                    for &kind in config.methods.iter().filter(|&&k| backlog::covers(k)) {
                        rec.measure(&backlog::label(leases), kind.name(), 1, || backlog::run(server, kind, leases))?;
                    }
                }
                continue;
            }
            if scenario == Scenario::Vanished {
                rec.measure("vanished", "flock-session", 1, || vanished::run(server))?;
                continue;
            }
            if scenario == Scenario::Philosophers {
                for n in philosophers::CLIENTS {
                    for way in philosophers::Way::ALL {
                        rec.measure("philosophers", way.name(), n, || philosophers::run(server, way, n, d))?;
                    }
                }
                continue;
            }
            if let Some(shape) = match scenario {
                Scenario::RwLock => Some(shared::Shape::ReadWrite),
                Scenario::Semaphore => Some(shared::Shape::Semaphore),
                _ => None,
            } {
                let kinds = SharedKind::of(&config.methods, shape == shared::Shape::Semaphore, flock_shared);
                // One client contends with no one.
                for &n in config.clients.iter().filter(|&&n| n > 1) {
                    for &kind in &kinds {
                        rec.measure(&shape.label(), kind.name, n, || shared::run(server, kind, shape, n, d))?;
                    }
                }
                continue;
            }
            let holds: &[u64] = if scenario == Scenario::Contended { &config.hold_us } else { &[0] };
            for &hold in holds {
                let label = match scenario {
                    Scenario::Contended => contended_label(hold),
                    _ => scenario.name().to_string(),
                };
                for &n in &config.clients {
                    if scenario == Scenario::Ping {
                        rec.measure(&label, "ping", n, || ping::run(server, n, d))?;
                        continue;
                    }
                    if scenario == Scenario::Fenced {
                        for way in fenced::WAYS {
                            rec.measure(&label, way, n, || fenced::run(server, way, n, d))?;
                        }
                        continue;
                    }
                    for &kind in &config.methods {
                        rec.measure(&label, kind.name(), n, || match scenario {
                            Scenario::Contended => contended::run(server, kind, n, d, Duration::from_micros(hold)),
                            Scenario::Expiry => expiry::run(server, kind, n, d.max(EXPIRY_MIN_RUN)),
                            _ => uncontended::run(server, kind, n, d),
                        })?;
                    }
                }
            }
        }
    }
    if config.scenarios.contains(&Scenario::Scale) {
        rec.repeat = 0;
        rec.repeats = 1;
        // A session's waiters are measured by `waiters`, beside the others.
        for &kind in config.methods.iter().filter(|&&k| k != methods::Kind::FlockSession) {
            // On servers of its own: what one method leaves behind must not
            // count for the next (Redis frees the clients it pooled for
            // blocked module commands at 500 a second).
            rec.measure("scale", kind.name(), 1, || scale::run(&config.module, kind, config.size))?;
        }
    }
    if config.scenarios.contains(&Scenario::Waiters) {
        rec.repeat = 0;
        rec.repeats = 1;
        for way in waiters::Way::ALL {
            rec.measure("waiters", way.name(), 1, || waiters::run(&config.module, way, config.size.waiters))?;
        }
    }
    Ok(rec.samples)
}
