//! Command-line options.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use crate::methods::Kind;
use crate::scenarios::scale::Size;
use crate::scenarios::Scenario;

pub const USAGE: &str = "\
usage: flock-bench [options]
  --quick                 smoke run, under a minute: 0.2 s runs, 1 repeat, 100k locks, 1k waiters,
                          backlogs of 10k and 100k leases
  --clients LIST          client counts (default 1,8,32)
  --duration-s SECONDS    length of each run (default 2; expiry runs at least 0.45 s)
  --repeats N             repeats of every run; tables show medians (default 3)
  --methods LIST          of flock,setnx,listpoll,redisson (default all)
  --scenarios LIST        of ping,uncontended,contended,expiry,vanished,backlog,rwlock,semaphore,scale,waiters,
                          philosophers,fenced
                          (default all)
  --hold-us LIST          contended hold times in µs (default 100,0)
  --locks N               idle locks for scale (default 1000000)
  --waiters N             waiters for scale and waiters, capped by open files (default 10000)
  --backlog LIST          due leases for backlog (default 100000,1000000)
  --module PATH           the module (default target/release/libredis_flock.so)
  --out DIR               where CSV, SVG and the tables go (default target/bench)";

pub struct Config {
    pub clients: Vec<usize>,
    pub duration: Duration,
    pub repeats: usize,
    pub methods: Vec<Kind>,
    pub scenarios: Vec<Scenario>,
    pub hold_us: Vec<u64>,
    pub size: Size,
    pub backlog: Vec<usize>,
    pub module: PathBuf,
    pub out: PathBuf,
}

fn list<T>(value: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    value.split(',').map(|item| parse(item.trim())).collect()
}

fn number<T: FromStr>(value: &str) -> Result<T, String> {
    value.parse().map_err(|_| format!("not a number: {value:?}"))
}

impl Config {
    /// The options given; `None` for `--help`.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Option<Config>, String> {
        // The workspace root, where `make build` puts the module.
        let root =
            Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).expect("crates/flock-bench is two levels deep");
        let args: Vec<String> = args.into_iter().collect();
        if args.iter().any(|a| a == "-h" || a == "--help") {
            return Ok(None);
        }
        // --quick changes the defaults that the other options then override.
        let quick = args.iter().any(|a| a == "--quick");
        let mut config = Config {
            clients: vec![1, 8, 32],
            duration: Duration::from_secs_f64(if quick { 0.2 } else { 2.0 }),
            repeats: if quick { 1 } else { 3 },
            methods: Kind::ALL.to_vec(),
            scenarios: Scenario::ALL.to_vec(),
            hold_us: vec![100, 0],
            size: Size {
                locks: if quick { 100_000 } else { 1_000_000 },
                waiters: if quick { 1_000 } else { 10_000 },
                probe: Duration::from_secs_f64(if quick { 0.15 } else { 1.0 }),
            },
            backlog: if quick { vec![10_000, 100_000] } else { vec![100_000, 1_000_000] },
            module: root.join("target/release/libredis_flock.so"),
            out: root.join("target/bench"),
        };
        let mut args = args.into_iter().filter(|a| a != "--quick");
        while let Some(arg) = args.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name.to_string(), Some(value.to_string())),
                None => (arg, None),
            };
            let mut value = || inline.clone().or_else(|| args.next()).ok_or_else(|| format!("{name} needs a value"));
            match name.as_str() {
                "--clients" => config.clients = list(&value()?, number)?,
                "--duration-s" => {
                    let value = value()?;
                    config.duration = Duration::try_from_secs_f64(number(&value)?)
                        .map_err(|_| format!("--duration-s {value}: not a duration"))?
                }
                "--repeats" => config.repeats = number(&value()?)?,
                "--methods" => config.methods = list(&value()?, Kind::parse)?,
                "--scenarios" => config.scenarios = list(&value()?, Scenario::parse)?,
                "--hold-us" => config.hold_us = list(&value()?, number)?,
                "--locks" => config.size.locks = number(&value()?)?,
                "--waiters" => config.size.waiters = number(&value()?)?,
                "--backlog" => config.backlog = list(&value()?, number)?,
                // Absolute: redis-server moves to its --dir before it loads modules.
                "--module" => {
                    let value = value()?;
                    config.module = std::path::absolute(&value).map_err(|e| format!("--module {value}: {e}"))?
                }
                "--out" => config.out = value()?.into(),
                _ => return Err(format!("unknown option {name:?}")),
            }
        }
        if config.clients.contains(&0)
            || config.repeats == 0
            || config.size.locks == 0
            || config.size.waiters == 0
            || config.backlog.contains(&0)
        {
            return Err("clients, repeats, locks, waiters and backlogs must be at least 1".into());
        }
        Ok(Some(config))
    }
}
