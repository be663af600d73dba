//! Commands seen before they run, for what FLOCK cannot learn once they do:
//! which client a `CLIENT UNBLOCK` may still reach, which keys a `MIGRATE`
//! takes away whole (their locks go on on the other server), and a `CONFIG
//! RESETSTAT` (no server event tells a module of it).

use std::cell::RefCell;

use crate::ffi::{CommandFilter, FilterArgs};
use crate::state;
use flock_core::effects::Counters;

thread_local! {
    /// The keys the `MIGRATE` running now moves (no `COPY`): until the next
    /// command, a lock unlinked under one of these names moved, and was not
    /// deleted. Commands and unlinks both run on the main thread.
    static MOVING: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

/// True while the `MIGRATE` that runs now moves `key` to another server.
pub fn is_moving(key: &[u8]) -> bool {
    MOVING.with_borrow(|moving| moving.iter().any(|k| **k == *key))
}

pub struct Filter;

impl CommandFilter for Filter {
    fn filter(args: &mut FilterArgs) {
        if args.len() == 0 {
            return;
        }
        MOVING.with_borrow_mut(|moving| {
            moving.clear();
            if args.get(0).eq_ignore_ascii_case(b"migrate") {
                moving.extend(migrated_keys(args));
            }
        });
        unblock_only_the_blocked(args);
        reset_stats(args);
    }
}

/// `CONFIG RESETSTAT` empties FLOCK's statistics as it does Redis's own:
/// the counters and distributions of `INFO flock` (its gauges are state).
/// Seen before it runs: one that the ACL refuses resets them too.
fn reset_stats(args: &FilterArgs) {
    if args.len() == 2 && args.get(0).eq_ignore_ascii_case(b"config") && args.get(1).eq_ignore_ascii_case(b"resetstat")
    {
        state::try_with(|s| {
            s.counters = Counters::default();
            s.observed.reset_stats();
        });
    }
}

/// `MIGRATE host port key|"" db timeout [COPY] [REPLACE] [AUTH password]
/// [AUTH2 username password] [KEYS key ...]`: the keys it takes from here,
/// none with COPY (the lock stays here too: docs/commands.md says not to).
fn migrated_keys(args: &FilterArgs) -> Vec<Box<[u8]>> {
    let mut keys = Vec::new();
    if args.len() > 3 && !args.get(3).is_empty() {
        keys.push(args.get(3).into());
    }
    let mut at = 6;
    while at < args.len() {
        let option = args.get(at).to_ascii_lowercase();
        match option.as_slice() {
            b"copy" => return Vec::new(),
            b"auth" => at += 1,
            b"auth2" => at += 2,
            b"keys" => {
                keys.extend((at + 1..args.len()).map(|i| args.get(i).into()));
                break;
            }
            _ => {}
        }
        at += 1;
    }
    keys
}

/// Redis 7.0 loses the reply of a client that is unblocked by the module and
/// then, in the same event-loop turn, by CLIENT UNBLOCK. Such a client is no
/// longer waiting, so CLIENT UNBLOCK is pointed at no client (id 0) and
/// answers 0, as for any client that is not blocked.
fn unblock_only_the_blocked(args: &mut FilterArgs) {
    if args.len() < 3 || !args.get(0).eq_ignore_ascii_case(b"client") || !args.get(1).eq_ignore_ascii_case(b"unblock") {
        return;
    }
    let Some(id) = std::str::from_utf8(args.get(2)).ok().and_then(|a| a.parse::<u64>().ok()) else { return };
    // Borrowed: a command another module runs from inside FLOCK's own
    // (a keyspace event handler); FLOCK answers no one meanwhile.
    if state::try_with(|s| s.waiters.is_answered(id) || s.sessions.is_answered(id)).unwrap_or(false) {
        args.replace(2, b"0");
    }
}
