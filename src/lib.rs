//! FLOCK: a fair, reentrant, fenced distributed lock inside Redis.
//!
//! The pure core (no Redis API: the lock, its holders and queue, the outcomes
//! of its operations and the table of their effects, the record format,
//! argument parsing) is the crate `flock-core` (crates/flock-core) with its
//! tests, named `flock_core::...` here. This crate is the Redis layer, in levels; a
//! module imports only from lower levels (`make layers` checks it and
//! prints them). docs/internals.md follows a command through them.
//! 0. `ffi`: the raw module API behind typed helpers, and thin trampolines
//!    for every callback Redis calls; `place` (where a lock lives); `config`;
//!    `errors` (every error code and text).
//! 1. `clock` (where time enters: the lease clock every deadline is on, and
//!    the wall-clock steps it saw).
//! 2. `timers` (timers on the monotonic clock, which no wall-clock step
//!    makes early or late), `observed` (what the operator's view reads:
//!    the contended locks, the distributions, the long holds and waits).
//! 3. `sessions` (each session's inbox, reader and watched grants).
//! 4. `waiters` (the registry of waiters, each answered exactly once: a
//!    blocked client, or an event in its session's inbox).
//! 5. `value` (the stored lock value).
//! 6. `state` (connection state: waiters, sessions, lease deadlines,
//!    counters, shadow locks, free locks' request IDs; borrowed once per
//!    callback).
//! 7. `engine` (outcomes to effects: hand-offs, leases filed in the wheel
//!    and its timer, session bindings and watches, counters, events,
//!    replication, key removal), `eviction`, `info`, `filter`, `deadlocks`
//!    (a new wait's walk of the wait-for graph).
//! 8. `grants` (waits for several keys, granted every key at once),
//!    `legacy` (keys that locks of other clients hold: their shadow locks),
//!    `moves` (a lock's key deleted, renamed, moved or put there by Redis).
//! 9. Callbacks: `blocking` (WAIT), `expiry` (the lease wheel's tick, the
//!    end of a pause of writes), `keytype` (the key type's callbacks).
//! 10. `inbox` (a session's blocked read, and its end).
//! 11. Callbacks: `commands` (the FLOCK.* handlers), `events` (server and
//!     keyspace events).
//! 12. `multi` (the handlers of the commands on several keys), `fenced`
//!     (a command run only while a token holds its lock), `inspect` (the
//!     operator's view: FLOCK.TOP, FLOCK.OWNER, FLOCK.LONGLOG).
//! 13. `command_table` (every command declared once: handler, flags, keys,
//!     ACL categories, COMMAND DOCS; the module's entry creates them all).

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod blocking;
mod clock;
mod command_table;
mod commands;
mod config;
mod deadlocks;
mod engine;
mod errors;
mod events;
mod eviction;
mod expiry;
mod fenced;
mod ffi;
mod filter;
mod grants;
mod inbox;
mod info;
mod inspect;
mod keytype;
mod legacy;
mod moves;
mod multi;
mod observed;
mod place;
mod propagation;
mod sessions;
mod state;
mod timers;
mod value;
mod waiters;

mod module {
    use redis_module::configuration::ConfigurationFlags;
    use redis_module::{redis_module, Context, RedisString, Status};

    use crate::config::{
        LegacyLocks, ALLOW_EVICTION, DEFAULT_LONGLOG_HOLD_MS, DEFAULT_LONGLOG_MAX_LEN, DEFAULT_LONGLOG_WAIT_MS,
        DEFAULT_MAX_WAITERS, DEFAULT_RETRY_WINDOW_MS, DEFAULT_SESSION_TIMEOUT_MS, LEGACY_LOCKS, LOCK_DELAY_MS,
        LONGLOG_HOLD_MS, LONGLOG_MAX_LEN, LONGLOG_WAIT_MS, MAX_LEASE_MS, MAX_LONGLOG_LEN, MAX_WAITERS, RETRY_WINDOW_MS,
        SESSION_TIMEOUT_MS,
    };
    use flock_core::args::SESSION_TIMEOUTS;
    use flock_core::limits::{MAX_LOCK_DELAY_MS, MAX_MS};

    use crate::keytype::FLOCK_TYPE;

    // Redis's allocator, so that INFO memory and maxmemory count the locks.
    use crate::command_table::Commands;
    use crate::{events, eviction, ffi, filter, value};
    use redis_module::alloc::RedisAlloc;

    fn init(ctx: &Context, args: &[RedisString]) -> Status {
        if let Some(api) = ffi::missing_api() {
            // The name is a static identifier: no byte in it can upset the log.
            ctx.log_warning(&format!(
                "FLOCK cannot load: this server lacks the module API {api} (Redis 7.0 or newer is needed)"
            ));
            return Status::Err;
        }
        ffi::init_module_ctx(ctx.ctx);
        crate::engine::set_wakeups(crate::engine::Wakeups {
            tick: crate::expiry::on_tick,
            drain: crate::grants::on_drain,
            resume: crate::expiry::on_resume,
        });
        if let Err(e) = crate::timers::start() {
            ffi::log(c"warning", &format!("FLOCK cannot load: its timers cannot wake the event loop ({e})"));
            return Status::Err;
        }
        value::register_type(&FLOCK_TYPE);
        let args: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
        if let Err(e) = crate::config::check_load_args(&args) {
            ffi::log(c"warning", &e);
            return Status::Err;
        }
        log_panics();
        ffi::subscribe::<events::Events>(ctx);
        crate::state::with(|s| eviction::refresh(ctx, s));
        ffi::register_filter::<filter::Filter>(ctx);
        // `-@flock` needs Redis 8.0's AddACLCategory; `-@write` and the like
        // need 7.2's SetCommandACLCategories. Either missing: rules name the
        // commands (docs/commands.md, "Loading").
        let own_category = ffi::add_acl_category(ctx, c"flock").then_some("flock");
        if let Err(e) = ffi::create_commands::<Commands>(ctx, own_category, "1.0.0") {
            ctx.log_warning(&format!("FLOCK cannot load: {e}"));
            return Status::Err;
        }
        Status::Ok
    }

    /// A panic in a module aborts redis-server; without this, the server's
    /// log would not say why.
    fn log_panics() {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |panic| {
            ffi::log(c"warning", &format!("FLOCK panicked, the server will abort: {panic}"));
            previous(panic);
        }));
    }

    redis_module! {
        name: "flock",
        version: 1,
        allocator: (RedisAlloc, RedisAlloc),
        data_types: [FLOCK_TYPE],
        init: init,
        event_handlers: [
            [@GENERIC @EXPIRED @EVICTED: events::on_keyspace_event],
        ],
        configurations: [
            i64: [
                ["max-waiters", &MAX_WAITERS, DEFAULT_MAX_WAITERS, 1, i64::MAX, ConfigurationFlags::DEFAULT, None],
                ["max-lease-ms", &MAX_LEASE_MS, MAX_MS as i64, 1, MAX_MS as i64, ConfigurationFlags::DEFAULT, None],
                ["retry-window-ms", &RETRY_WINDOW_MS, DEFAULT_RETRY_WINDOW_MS, 1, MAX_MS as i64, ConfigurationFlags::DEFAULT, None],
                ["lock-delay-ms", &LOCK_DELAY_MS, 0, 0, MAX_LOCK_DELAY_MS as i64, ConfigurationFlags::DEFAULT, None],
                ["longlog-hold-ms", &LONGLOG_HOLD_MS, DEFAULT_LONGLOG_HOLD_MS, 0, MAX_MS as i64, ConfigurationFlags::DEFAULT, None],
                ["longlog-wait-ms", &LONGLOG_WAIT_MS, DEFAULT_LONGLOG_WAIT_MS, 0, MAX_MS as i64, ConfigurationFlags::DEFAULT, None],
                ["longlog-max-len", &LONGLOG_MAX_LEN, DEFAULT_LONGLOG_MAX_LEN, 0, MAX_LONGLOG_LEN, ConfigurationFlags::DEFAULT, None],
                ["session-timeout-ms", &SESSION_TIMEOUT_MS, DEFAULT_SESSION_TIMEOUT_MS, *SESSION_TIMEOUTS.start() as i64, *SESSION_TIMEOUTS.end() as i64, ConfigurationFlags::DEFAULT, None],
            ],
            // The macro needs every kind listed to accept module arguments.
            string: [],
            bool: [
                ["allow-eviction", &ALLOW_EVICTION, false, ConfigurationFlags::DEFAULT, None],
            ],
            enum: [
                ["legacy-locks", &LEGACY_LOCKS, LegacyLocks::ttl, ConfigurationFlags::DEFAULT, None],
            ],
            module_args_as_configuration: true,
        ]
    }
}
