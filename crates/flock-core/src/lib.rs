//! FLOCK's pure core: what a lock is and how it changes, with no Redis API,
//! so that it is tested on its own (unit and property tests) and the module
//! crate (`redis-flock`) only translates between it and the server.
//!
//! `queue` (the waiters of one lock, in order), `lock` (holder, reentrancy,
//! fencing tokens, handoff), `holders` (the shared or semaphore holders of
//! one key), `requests` (request IDs a resend is answered
//! from), `deadlines` (lease and wait expiries, soonest first) and `args`
//! (command arguments and their limits).

pub mod args;
pub mod deadlines;
pub mod holders;
pub mod lock;
pub mod queue;
pub mod requests;
