//! Runs N clients at once, one thread and one connection each, from a
//! common start for a fixed time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use redis::RedisResult;

use crate::client::{now_ns, Client};
use crate::methods::{Kind, Method};
use crate::server::Server;
use crate::stop::Stop;

/// What the clients of one run returned, and when the run was timed.
pub struct Run<T> {
    pub results: Vec<T>,
    pub start: u64,
    pub end: u64,
}

impl<T> Run<T> {
    pub fn seconds(&self) -> f64 {
        (self.end - self.start) as f64 / 1e9
    }
}

/// Decrements a count when a client thread ends, however it ends.
struct Finished<'a>(&'a AtomicUsize);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// Runs `n` clients for `duration`. Each opens a connection and makes its
/// state with `setup` before the common start, then runs `body` until it
/// sees the stop (or returns earlier).
pub fn run_clients<S, T: Send>(
    server: &Server,
    n: usize,
    duration: Duration,
    setup: impl Fn(usize) -> RedisResult<S> + Sync,
    body: impl Fn(usize, &mut Client, &mut S, &Stop) -> RedisResult<T> + Sync,
) -> RedisResult<Run<T>> {
    let stop = Stop::default();
    let barrier = Barrier::new(n + 1);
    let ids = Mutex::new(Vec::new());
    let running = AtomicUsize::new(n);
    let mut control = server.connect()?;
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let (stop, barrier, ids, running, setup, body) = (&stop, &barrier, &ids, &running, &setup, &body);
                scope.spawn(move || {
                    let _finished = Finished(running);
                    let ready = Client::open(server).and_then(|mut client| {
                        let id: i64 = redis::from_owned_redis_value(client.request(redis::cmd("CLIENT").arg("ID"))?)?;
                        ids.lock().expect("client ids").push(id);
                        Ok((client, setup(i)?))
                    });
                    // Wait at the start line also after a failed setup, or the run never starts.
                    barrier.wait();
                    let (mut client, mut state) = ready?;
                    body(i, &mut client, &mut state, stop)
                })
            })
            .collect();
        stop.plan(duration);
        barrier.wait();
        let start = now_ns();
        std::thread::sleep(duration);
        stop.set();
        let end = now_ns();
        // A client blocked in the server (FLOCK.ACQUIRE ... WAIT 0) only
        // returns when answered: CLIENT UNBLOCK answers nil. Repeat until all
        // are done, as one may block again just after being unblocked.
        while running.load(Ordering::Acquire) > 0 {
            for id in ids.lock().expect("client ids").iter() {
                redis::cmd("CLIENT").arg("UNBLOCK").arg(id).query::<i64>(&mut control)?;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let results = threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect::<RedisResult<Vec<T>>>()?;
        Ok(Run { results, start, end })
    })
}

/// `run_clients` where every client uses the lock method `kind`.
pub fn run_method<T: Send>(
    server: &Server,
    kind: Kind,
    n: usize,
    duration: Duration,
    body: impl Fn(usize, &mut Client, &mut dyn Method, &Stop) -> RedisResult<T> + Sync,
) -> RedisResult<Run<T>> {
    run_clients(server, n, duration, |_| kind.client(server), |i, c, method, stop| body(i, c, method.as_mut(), stop))
}
