//! The operator's view, as commands: `FLOCK.TOP` (the contended locks),
//! `FLOCK.OWNER` (who an owner blocks and who blocks it) and
//! `FLOCK.LONGLOG` (long holds and waits). Each reads the index and records
//! of `observed`, and opens only the keys they name.

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use crate::clock;
use crate::commands::heard_from;
use crate::config;
use crate::errors::arg_error;
use crate::ffi;
use crate::observed::held_ms;
use crate::place::Place;
use crate::state::{self, read_lock, State};
use crate::value::mode_name;
use flock_core::args::{self, LongLogArgs, TopOrder};
use flock_core::glob;
use flock_core::holders::{Holder, Terms};

/// One holder as the operator's view shows it.
struct Holding {
    owner: Box<[u8]>,
    held_ms: u64,
    ttl_ms: u64,
    session: bool,
    token: u64,
}

/// One contended lock as FLOCK.TOP shows it.
struct Row {
    key: Box<[u8]>,
    mode: &'static str,
    waiters: usize,
    /// When the head of its queue queued (monotonic microseconds).
    oldest_since_us: u64,
    /// Earliest grant first.
    holders: Vec<Holding>,
}

impl Row {
    fn held_ms(&self) -> u64 {
        self.holders.first().map_or(0, |h| h.held_ms)
    }

    /// The earliest grant's token: tokens rise with every grant, so the
    /// lowest is the longest held, to the grant, however close in time.
    fn first_token(&self) -> u64 {
        self.holders.first().map_or(u64::MAX, |h| h.token)
    }
}

/// `FLOCK.TOP [COUNT n] [MATCH pattern] [BY waiters|wait|hold]`.
pub fn top(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let words: Vec<&[u8]> = args.iter().skip(1).map(RedisString::as_slice).collect();
    let asked = args::top(&words).map_err(arg_error)?;
    heard_from(ctx);
    let (now_ms, now_us) = (clock::now_ms(), clock::monotonic_us());
    let mut rows = state::with(|s| {
        let ident = s.dbs.ident(ffi::selected_db(ctx));
        let s: &State = s;
        let matching = s
            .observed
            .contended
            .keys()
            .filter(|p| p.ident() == ident && asked.pattern.is_none_or(|pattern| glob::matches(pattern, p.key())));
        matching.filter_map(|p| row(ctx, s, p, now_ms, now_us)).collect::<Vec<Row>>()
    });
    rows.sort_unstable_by(|a, b| {
        let first = match asked.by {
            TopOrder::Waiters => b.waiters.cmp(&a.waiters),
            TopOrder::Wait => std::cmp::Ordering::Equal,
            TopOrder::Hold => a.first_token().cmp(&b.first_token()),
        };
        first.then(a.oldest_since_us.cmp(&b.oldest_since_us)).then_with(|| a.key.cmp(&b.key))
    });
    rows.truncate(asked.count.unwrap_or(usize::MAX));
    ffi::reply_array(ctx, rows.len());
    for row in &rows {
        ffi::reply_map(ctx, 6);
        bytes_field(ctx, "key", &row.key);
        bytes_field(ctx, "mode", row.mode.as_bytes());
        int_field(ctx, "waiters", row.waiters as u64);
        int_field(ctx, "oldest-wait-ms", now_us.saturating_sub(row.oldest_since_us) / 1000);
        int_field(ctx, "held-ms", row.held_ms());
        ffi::reply_bytes(ctx, b"holders");
        ffi::reply_array(ctx, row.holders.len());
        for h in &row.holders {
            ffi::reply_map(ctx, 5);
            bytes_field(ctx, "owner", &h.owner);
            int_field(ctx, "held-ms", h.held_ms);
            int_field(ctx, "ttl-ms", h.ttl_ms);
            int_field(ctx, "session", u64::from(h.session));
            int_field(ctx, "token", h.token);
        }
    }
    Ok(RedisValue::NoReply)
}

/// The lock at `place` as FLOCK.TOP shows it; `None` if it is gone.
fn row(ctx: &Context, s: &State, place: &Place, now_ms: u64, now_us: u64) -> Option<Row> {
    read_lock(ctx, s, place, |lock| {
        let mut holders: Vec<Holding> = lock.holders().iter().map(|(h, terms)| holding(h, terms, now_ms)).collect();
        holders.sort_unstable_by_key(|h| h.token);
        Row {
            key: place.key().into(),
            mode: mode_name(lock),
            waiters: lock.waiter_count(),
            oldest_since_us: s.waiters.first_queued_us(lock).unwrap_or(now_us),
            holders,
        }
    })
}

fn holding(h: &Holder, terms: Terms, now_ms: u64) -> Holding {
    Holding {
        owner: h.owner.clone(),
        held_ms: held_ms(h.token, now_ms),
        ttl_ms: h.deadline_ms.saturating_sub(now_ms),
        session: terms.session.is_some(),
        token: h.token,
    }
}

/// One lock an owner waits at, as FLOCK.OWNER shows it.
struct WaitAt<'a> {
    place: &'a Place,
    waited_ms: u64,
    /// 1 for the head of the queue.
    position: usize,
    /// Its holders, then those queued ahead whose grants exclude its own.
    blockers: Vec<Box<[u8]>>,
}

/// `FLOCK.OWNER owner`: the contended locks it holds, and where it waits,
/// behind whom.
pub fn owner(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let words: Vec<&[u8]> = args.iter().skip(1).map(RedisString::as_slice).collect();
    let owner = args::owner(&words).map_err(arg_error)?;
    heard_from(ctx);
    state::with(|s| {
        let ident = s.dbs.ident(ffi::selected_db(ctx));
        let (now_ms, now_us) = (clock::now_ms(), clock::monotonic_us());
        let holds: Vec<(&Place, Holding, usize)> = s
            .observed
            .contended
            .keys()
            .filter(|p| p.ident() == ident)
            .filter_map(|p| {
                read_lock(ctx, s, p, |lock| {
                    let holders = lock.holders();
                    let (h, terms) = holders.get(holders.token_of(owner)?)?;
                    Some((p, holding(h, terms, now_ms), lock.waiter_count()))
                })
                .flatten()
            })
            .collect();
        let waits: Vec<WaitAt> = s
            .waiters
            .waits_of(owner)
            .flat_map(|w| w.places().map(move |p| (p, w.since_us)))
            .filter(|(p, _)| p.ident() == ident)
            .filter_map(|(place, since)| {
                read_lock(ctx, s, place, |lock| WaitAt {
                    place,
                    waited_ms: now_us.saturating_sub(since) / 1000,
                    position: lock.waiters().position(|w| *w.owner == *owner).map_or(0, |at| at + 1),
                    blockers: lock.blockers(owner, None, true),
                })
            })
            .collect();
        ffi::reply_map(ctx, 2);
        ffi::reply_bytes(ctx, b"holds");
        ffi::reply_array(ctx, holds.len());
        for (place, h, waiters) in &holds {
            ffi::reply_map(ctx, 5);
            bytes_field(ctx, "key", place.key());
            int_field(ctx, "token", h.token);
            int_field(ctx, "held-ms", h.held_ms);
            int_field(ctx, "ttl-ms", h.ttl_ms);
            int_field(ctx, "waiters", *waiters as u64);
        }
        ffi::reply_bytes(ctx, b"waits");
        ffi::reply_array(ctx, waits.len());
        for w in &waits {
            ffi::reply_map(ctx, 4);
            bytes_field(ctx, "key", w.place.key());
            int_field(ctx, "waited-ms", w.waited_ms);
            int_field(ctx, "position", w.position as u64);
            ffi::reply_bytes(ctx, b"blocked-by");
            ffi::reply_array(ctx, w.blockers.len());
            w.blockers.iter().for_each(|b| ffi::reply_bytes(ctx, b));
        }
    });
    Ok(RedisValue::NoReply)
}

/// `FLOCK.LONGLOG GET [count] | LEN | RESET`.
pub fn longlog(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let words: Vec<&[u8]> = args.iter().skip(1).map(RedisString::as_slice).collect();
    let asked = args::longlog(&words).map_err(arg_error)?;
    heard_from(ctx);
    state::with(|s| {
        let log = &mut s.observed.longlog;
        // A lower flock.longlog-max-len drops the oldest before anyone looks.
        log.shorten(config::longlog_limits().max_len);
        match asked {
            LongLogArgs::Len => Ok(RedisValue::Integer(log.len() as i64)),
            LongLogArgs::Reset => {
                log.reset();
                Ok(RedisValue::SimpleStringStatic("OK"))
            }
            LongLogArgs::Get(n) => {
                let entries = log.newest(n);
                ffi::reply_array(ctx, entries.len());
                for e in entries {
                    ffi::reply_map(ctx, 7);
                    int_field(ctx, "id", e.id);
                    int_field(ctx, "time-unix-ms", e.at_unix_ms);
                    bytes_field(ctx, "kind", e.kind.name().as_bytes());
                    bytes_field(ctx, "key", &e.key);
                    bytes_field(ctx, "owner", &e.owner);
                    int_field(ctx, "duration-ms", e.duration_ms);
                    bytes_field(ctx, "ended", e.ended.as_bytes());
                }
                Ok(RedisValue::NoReply)
            }
        }
    })
}

fn int_field(ctx: &Context, name: &str, n: u64) {
    ffi::reply_bytes(ctx, name.as_bytes());
    ctx.reply(Ok(RedisValue::Integer(i64::try_from(n).unwrap_or(i64::MAX))));
}

fn bytes_field(ctx: &Context, name: &str, value: &[u8]) {
    ffi::reply_bytes(ctx, name.as_bytes());
    ffi::reply_bytes(ctx, value);
}
