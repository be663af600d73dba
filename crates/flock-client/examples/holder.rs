//! The Rust holder of `clients/python/bench/silences.py` (`make
//! bench-clients`, no false expiry), as `bench/holder.py` is Python's:
//!
//! ```text
//! cargo run --release -p flock-client --example holder -- PORT session MS KEYS PREFIX
//! ```
//!
//! (the arguments of every holder; this one holds session grants only):
//! holds KEYS session grants (`Lock::new(key, ..).session_timeout(MS)`)
//! through one `redis::Client`, prints `held`, and on the line `report` on
//! its stdin prints `{"lost": {key: reason, ...}}`: the guards' own verdict,
//! checked against the clock when read.

use std::io::BufRead;
use std::time::Duration;

use flock_client::Lock;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [port, mode, ms, keys, prefix] = args.as_slice() else {
        return Err("usage: holder PORT session MS KEYS PREFIX".into());
    };
    if mode != "session" {
        return Err(format!("holds session grants only, not {mode}").into());
    }
    let timeout = Duration::from_millis(ms.parse()?);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut guards = Vec::new();
    for i in 0..keys.parse::<usize>()? {
        let key = format!("{prefix}:{i}");
        let lock = Lock::new(key.clone(), timeout).session_timeout(timeout);
        let guard = lock.acquire_on(&client, Some(Duration::from_secs(10)))?.ok_or("not granted")?;
        guards.push((key, guard));
    }
    println!("held");
    for line in std::io::stdin().lock().lines() {
        if line?.trim() == "report" {
            let lost: Vec<String> = guards
                .iter()
                .filter_map(|(key, guard)| guard.lost_reason().map(|reason| format!("\"{key}\": \"{reason}\"")))
                .collect();
            println!("{{\"lost\": {{{}}}}}", lost.join(", "));
            break;
        }
    }
    Ok(())
}
