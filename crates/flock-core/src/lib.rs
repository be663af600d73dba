//! FLOCK's pure core: what a lock is and how it changes, with no Redis API,
//! so that it is tested on its own (unit and property tests) and the module
//! crate (`redis-flock`) only translates between it and the server.
//!
//! In levels (`make layers` checks that no module imports one above it):
//! 0. `limits`, `clock` (the lease clock, and deadlines between it and the
//!    wall clock), `queue` (the waiters of one lock, in order), `deadlines`
//!    (lease expiries, soonest first), `requests` (request IDs a resend is
//!    answered from), `deadlock` (cycles in the wait-for graph), `glob`
//!    (`MATCH` patterns), `longlog` (the record of long holds and waits).
//! 1. `wheel` (the lease wheel: deadlines the server acts on, and when its
//!    timer wakes, over a clock tests drive), `holders` (who holds a key:
//!    one table, a plain lock's holder inline),
//!    `tokens` (fencing tokens), `args` (command arguments).
//! 2. `effects` (what operations report, and the one table of what each
//!    report means outside the lock), `record` (the one persisted and
//!    replicated format), `losses` (why recent grants ended, for NOTOWNER),
//!    `distributions` (wait, hold and hand-off times by how they ended).
//! 3. `lock` (holders, reentrancy, the queue and hand-off).

pub mod args;
mod chunked;
pub mod clock;
pub mod deadlines;
pub mod deadlock;
pub mod distributions;
pub mod effects;
pub mod glob;
pub mod holders;
pub mod limits;
pub mod lock;
pub mod longlog;
pub mod losses;
pub mod queue;
pub mod record;
pub mod requests;
pub mod tokens;
pub mod wheel;
