//! flock-bench: FLOCK against the locks people build on plain Redis today
//! (`setnx`, `listpoll`, `redisson`), side by side in one run against one
//! redis-server started here, through the same client code (synchronous
//! connections, one thread per client), so that the ratios between methods
//! hold on a noisy machine. `--help` lists the options; docs/benchmark.md
//! explains the results.

mod chart;
mod client;
mod config;
mod methods;
mod report;
mod results;
mod runner;
mod scenarios;
mod schedule;
mod server;
mod stats;
mod stop;
mod targets;

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use config::{Config, USAGE};
use report::Machine;
use server::Server;

fn main() -> ExitCode {
    let config = match Config::from_args(std::env::args().skip(1)) {
        Ok(Some(config)) => config,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("flock-bench: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flock-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(config: &Config) -> Result<(), Box<dyn Error>> {
    let server = Server::start(&config.module)?;
    let started = Instant::now();
    let samples = schedule::run_all(&server, config)?;
    let machine = Machine::describe(&server)?;
    let report = report::render(config, &machine, &samples, started.elapsed());
    print!("{report}");
    report::write_files(&config.out, &samples, &report)
}
