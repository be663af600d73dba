//! Server and keyspace events that change where locks live or who holds
//! them: FLUSHDB/FLUSHALL, SWAPDB, RENAME/MOVE, closed connections
//! (SESSION locks), demotion to replica (waiters), and CONFIG SET
//! (eviction).

use redis_module::{Context, NotifyEvent};

use crate::ffi::{self, ServerEvents};
use crate::state;
use crate::value::lock_value;
use crate::{blocking, engine, eviction, inbox, legacy, moves, propagation};
use flock_core::effects::{Leave, Loss};

pub struct Events;

impl ServerEvents for Events {
    /// FLUSHDB and FLUSHALL (also ASYNC, which frees values on another
    /// thread) skip the type's unlink callback: answer the flushed waiters
    /// and drop the flushed leases here, before any value is freed.
    fn flush_starting(_: &Context, dbnum: i32) {
        state::with(|s| {
            let dbs = &s.dbs;
            let flushed = |ident: u32| dbnum == -1 || dbs.db(ident) == dbnum;
            let gone = s.waiters.in_dbs(flushed);
            let lost = s.sessions.watched_in(flushed);
            // Their leases would only wake the timer for locks that are gone.
            s.leases.retain(|lease| !flushed(lease.place.ident()));
            for places in s.bindings.values_mut() {
                places.retain(|(p, _)| !flushed(p.ident()));
            }
            s.bindings.retain(|_, places| !places.is_empty());
            s.remembered.forget_where(|place| flushed(place.ident()));
            // Their waiters are among `gone`, answered below.
            s.shadows.retain(|place, _| !flushed(place.ident()));
            for wait in gone {
                engine::answer_left(s, wait, Leave::Deleted);
            }
            for token in lost {
                s.sessions.ended(token, Some(Loss::Deleted));
            }
        });
    }

    fn swapdb(_: &Context, first: i32, second: i32) {
        state::with(|s| s.dbs.swap(first, second));
    }

    /// A closed connection ends its session, and releases the SESSION grants
    /// it holds, and only those.
    fn client_disconnected(ctx: &Context, client: u64) {
        state::with(|s| inbox::end(ctx, s, client));
    }

    /// REPLICAOF or a failover made this master a replica: grants can only
    /// come from the new master, so no waiter may stay blocked here.
    fn now_replica(ctx: &Context) {
        state::with(|s| {
            blocking::demote_all(ctx, s);
            // The grants stay, as replicated state: the new master keeps or
            // ends them. Their sessions hear that this node no longer can.
            for token in s.sessions.watched_in(|_| true) {
                s.sessions.ended(token, Some(Loss::Demoted));
            }
        });
    }

    fn config_changed(ctx: &Context) {
        state::with(|s| eviction::refresh(ctx, s));
        propagation::look_again();
    }

    fn replication_changed() {
        propagation::look_again();
    }

    fn stream_may_start() {
        propagation::assume_read();
    }

    fn cron(hz: i32) {
        propagation::cron(hz);
    }
}

/// Keys that locks of other clients hold and FLOCK waiters wait on go with
/// `del`, `expired`, `evicted`, `rename_from` and `move_from`, or change
/// with `rename_to` and `move_to` (`legacy`).
/// RENAME and MOVE fire the type's unlink callback on the source, which
/// takes its leases and session bindings, and keeps its request IDs as a
/// free lock's; they follow the lock here. Redis notifies the source
/// (`rename_from`, `move_from`) just before the destination.
pub fn on_keyspace_event(ctx: &Context, _: NotifyEvent, event: &str, key: &[u8]) {
    match event {
        "rename_from" | "move_from" => {
            state::with(|s| {
                let place = s.place(ffi::selected_db(ctx), key);
                s.moving_from = Some(place);
            });
            legacy::key_event(ctx, key);
        }
        // A lock of another client may have let go of the key.
        "del" | "expired" | "evicted" => legacy::key_event(ctx, key),
        "rename_to" | "move_to" => {
            let name = ffi::key_name(ctx, key);
            let handle = ctx.open_key_writable(&name);
            state::with(|s| {
                let from = s.moving_from.take();
                if let Ok(Some(value)) = lock_value(&handle) {
                    moves::attach(ctx, s, value, ffi::selected_db(ctx), key, from);
                }
            });
            // It may land on a name that FLOCK waiters wait on.
            legacy::key_event(ctx, key);
        }
        _ => {}
    }
}
