//! Whether anything reads what FLOCK propagates (`engine::replicate`).
//!
//! Redis itself drops a propagated command when there is no AOF, no replica
//! and no replication backlog (`shouldPropagate`), but only after
//! `RedisModule_Replicate` looked the command up by name and built its
//! arguments: on such a server (a lone lock server without persistence, or
//! with RDB snapshots only), a quarter to a third of what an uncontended `ACQUIRE`
//! and `RELEASE` cost it. So FLOCK asks first.
//!
//! A replication stream starts with a replica's full sync, which forks (to
//! disk or diskless) before the first command the new replica must be sent:
//! from a fork on, commands are propagated. So they are after a load (a
//! restart from an RDB with replication data keeps a backlog for partial
//! resyncs, made after the load's end event). A backlog kept without a
//! replica is seen in INFO replication, read again before the next
//! propagation after a replica connected or left or the role changed, and
//! once a second while something reads (a backlog is freed after
//! `repl-backlog-ttl`; a fork's or a load's turn ends so). The AOF is read
//! with it, and again after every CONFIG SET (`appendonly`).

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use redis_module::Context;

use crate::ffi;

/// The AOF and INFO replication must be read again.
const UNKNOWN: u8 = 0;
const UNREAD: u8 = 1;
const READ: u8 = 2;

static PROPAGATED: AtomicU8 = AtomicU8::new(UNKNOWN);
/// Cron runs since something was last found or assumed to read.
static CRONS: AtomicU32 = AtomicU32::new(0);

/// Whether a command propagated now would reach an AOF, a replica or a
/// replication backlog.
pub fn read(ctx: &Context) -> bool {
    match PROPAGATED.load(Ordering::Relaxed) {
        UNREAD => false,
        READ => true,
        _ => {
            let read = ffi::aof_on() || ffi::replication_stream(ctx);
            PROPAGATED.store(if read { READ } else { UNREAD }, Ordering::Relaxed);
            CRONS.store(0, Ordering::Relaxed);
            read
        }
    }
}

/// A stream or the AOF may have started or ended: both are read again.
pub fn look_again() {
    PROPAGATED.store(UNKNOWN, Ordering::Relaxed);
}

/// A fork (perhaps a full sync's snapshot, which the new replica's stream
/// continues from now on) or a load's end: propagated until the cron looks
/// again.
pub fn assume_read() {
    PROPAGATED.store(READ, Ordering::Relaxed);
    CRONS.store(0, Ordering::Relaxed);
}

/// The server's cron (`hz` runs a second): once a second while something
/// reads, the AOF and INFO replication are read again.
pub fn cron(hz: i32) {
    if PROPAGATED.load(Ordering::Relaxed) != READ {
        return;
    }
    let runs = CRONS.load(Ordering::Relaxed) + 1;
    if runs >= hz.max(1).unsigned_abs() {
        look_again();
    } else {
        CRONS.store(runs, Ordering::Relaxed);
    }
}
