//! Turns what a core operation did (its `Outcome`s) into its effects in
//! Redis, each through the one table `effects::effects`: counters, keyspace
//! events, replication, the lease timer, session bindings, replies to
//! blocked clients, and the key removed once the lock is free.

use std::ffi::CStr;
use std::sync::OnceLock;
use std::time::Instant;

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, RedisString};

use crate::clock;
use crate::config;
use crate::ffi::{self, MAX_ARGS};
use crate::observed::held_ms;
use crate::place::Place;
use crate::propagation;
use crate::state::{Lease, Scratch, Send, Shadow, State, DELAY_ENDS};
use crate::timers;
use crate::value::{lock_value, with_args, LockValue, FREE_COMMAND, HOLDER_COMMAND, ID_COMMAND, REMOTE_SESSION};
use crate::waiters::{self, WaitId};
use flock_core::clock::Now;
use flock_core::deadlines::DeadlineId;
use flock_core::distributions::WaitEnd;
use flock_core::effects::{effects, Leave, Outcome, Reply, Sent};
use flock_core::holders::{Holder, Terms};
use flock_core::lock::{Lock, Outcomes};
use flock_core::record::{holder_set_words, mode_words, request_words, Word, REQUEST_MARK};
use flock_core::requests::{Record, Requests};

/// The callbacks of the timers this module sets: they run work above it
/// (`expiry`: the lease wheel's tick and the end of a pause; `grants`:
/// waits for several keys), so the module's entry hands them in at load.
pub struct Wakeups {
    pub tick: fn(&Context, ()),
    pub drain: fn(&Context, ()),
    pub resume: fn(&Context, ()),
}

static WAKEUPS: OnceLock<Wakeups> = OnceLock::new();

/// At load, before any timer is set.
pub fn set_wakeups(wakeups: Wakeups) {
    let _ = WAKEUPS.set(wakeups);
}

fn wakeups() -> &'static Wakeups {
    WAKEUPS.get().expect("the module's entry sets the wake-ups at load")
}

/// Applies each outcome's effects (the table) to the state: counters, the
/// lease timer, session bindings, replies; gathers in `scratch` what to
/// send and notify when the operation is done. Takes the outcomes out of
/// `scratch.outcomes`.
/// `replica`: this server follows a master, whose grants it does not time.
fn follow(s: &mut State, place: &Place, lock: &mut Lock<WaitId>, now: u64, replica: bool, scratch: &mut Scratch) {
    for outcome in scratch.outcomes.drain(..) {
        let e = effects(&outcome);
        let send = match outcome {
            // Counted only if it was still waiting (`answer_left`).
            Outcome::Left { waiter, why } => {
                answer_left(s, waiter, why);
                continue;
            }
            Outcome::Delayed { until_ms } => {
                file_delay(s, place, until_ms, now);
                None
            }
            Outcome::Granted { token, waiter } => {
                file(s, place, lock, token, None, now);
                if waiter.is_some() {
                    s.observed.handed_off(place);
                }
                // A new grant: an older loss of its owner explains nothing now.
                if let Some((holder, _)) = lock.holders().get(token).filter(|_| !s.losses.is_empty()) {
                    s.losses.forget(&(place.clone(), holder.owner.clone()));
                }
                // A wait for several keys is answered once all are granted.
                if let Some(wait) = waiter.filter(|&w| !s.waiters.is_group(w)) {
                    let until_ms =
                        lock.holders().get(token).filter(|(_, terms)| !terms.session_lease).map(|(h, _)| h.deadline_ms);
                    let place = place.clone();
                    let reply =
                        waiters::Reply::Granted { token, place, until_ms, delivered: false, at: Instant::now() };
                    let (waiters, ends) = s.ends();
                    waiters.answer(ends, wait, reply, WaitEnd::Granted);
                }
                Some(Send::Holder(token))
            }
            Outcome::Changed { token, old_session, .. } => {
                file(s, place, lock, token, old_session, now);
                Some(Send::Holder(token))
            }
            Outcome::Ended { holder, terms, why } => {
                unfile(s, place, &holder, terms);
                if !replica {
                    s.observed.hold_ended(place, &holder.owner, held_ms(holder.token, now), why);
                }
                s.sessions.ended(holder.token, e.lost);
                if let Some(loss) = e.lost {
                    s.losses.record((place.clone(), holder.owner.clone()), loss, now, config::retry_window_ms());
                }
                Some(Send::Gone(holder.owner))
            }
        };
        e.counters.iter().for_each(|&c| s.counters.bump(c, 1));
        if let Some(event) = e.event.filter(|ev| !(e.event_once && scratch.events.contains(ev))) {
            scratch.events.push(event);
        }
        if let Some(send) = send.filter(|_| e.sent != Sent::Nothing) {
            scratch.sends.push(send);
        }
    }
}

/// Follows `out` on its own: what it would send or notify is dropped (only
/// restored, deleted or replaced holders and leaving waiters come here).
pub fn follow_quietly(s: &mut State, place: &Place, lock: &mut Lock<WaitId>, out: Outcomes<WaitId>) {
    let scratch = &mut Scratch { outcomes: out, ..Scratch::default() };
    follow(s, place, lock, clock::now_ms(), ffi::is_replica(), scratch);
}

/// Answers a waiter that leaves without a grant, and counts it if it was
/// still waiting.
pub fn answer_left(s: &mut State, waiter: WaitId, why: Leave) {
    let e = effects(&Outcome::Left { waiter, why });
    let reply = match e.reply {
        Reply::Nil => waiters::Reply::Nil,
        Reply::Cancelled => waiters::Reply::Cancelled,
        Reply::Error(why) => waiters::Reply::Error(why),
        Reply::None => waiters::Reply::Silent,
    };
    let (waiters, ends) = s.ends();
    if waiters.answer(ends, waiter, reply, WaitEnd::Left(why)) {
        e.counters.iter().for_each(|&c| s.counters.bump(c, 1));
    }
    arm_drain(s);
}

/// Files the lease of the holder with `token` (again) and binds its
/// session, unbinding the one it had before.
pub fn file(s: &mut State, place: &Place, lock: &mut Lock<WaitId>, token: u64, old_session: Option<u64>, now: u64) {
    let Some((_, terms)) = lock.holders().get(token) else { return };
    if terms.session != old_session {
        if let Some(client) = old_session.filter(|&c| c != REMOTE_SESSION) {
            s.unbind_session(client, place, token);
        }
        if let Some(client) = terms.session.filter(|&c| c != REMOTE_SESSION) {
            s.bind_session(client, place, token);
        }
    }
    let session_lease = lock.session_lease_of(token);
    if let Some(holder) = lock.holder_mut(token) {
        file_lease(s, holder, session_lease, place, now);
    }
}

/// A holder is gone from this key: its lease and session binding go too.
fn unfile(s: &mut State, place: &Place, holder: &Holder, terms: Terms) {
    cancel_lease(s, holder.token, holder.deadline_id);
    if let Some(client) = terms.session.filter(|&c| c != REMOTE_SESSION) {
        s.unbind_session(client, place, holder.token);
    }
}

/// A key opened for one operation.
pub struct Key<'a> {
    pub ctx: &'a Context,
    pub key: &'a RedisKeyWritable,
    pub name: &'a RedisString,
    pub place: &'a Place,
}

/// Runs `op` on the lock in `k` after ending the leases a command about
/// `owner` must not see past their end, then applies every effect. The key
/// is deleted when the lock is left free.
pub fn update<R>(
    s: &mut State,
    k: &Key,
    value: &mut LockValue,
    owner: Option<&[u8]>,
    op: impl FnOnce(&mut State, &mut Lock<WaitId>, &mut Outcomes<WaitId>, u64) -> R,
) -> R {
    // One reading for the operation and the records it sends.
    let clocks = clock::now();
    let now = clocks.lease_ms;
    let requests_made = value.lock.requests().map_or(0, Requests::made);
    let mut scratch = std::mem::take(&mut s.scratch);
    // A replica follows its master and never ends a lease itself.
    let replica = ffi::is_replica();
    if !replica {
        value.lock.expire(owner, now, &mut s.tokens, &mut scratch.outcomes);
    }
    let result = op(s, &mut value.lock, &mut scratch.outcomes, now);
    settle_gated_head(s, &mut value.lock, now, &mut scratch.outcomes);
    follow(s, k.place, &mut value.lock, now, replica, &mut scratch);
    if value.lock.is_idle() {
        // Replicas and the AOF see the key deleted by name, as a DEL would.
        let rider = propagate_requests(k, value, requests_made, true, clocks);
        replicate(k, FREE_COMMAND, &[], rider, clocks);
        remove_if_free(s, k, value);
    } else {
        let rider = propagate_requests(k, value, requests_made, !scratch.sends.is_empty(), clocks);
        for (i, send) in scratch.sends.iter().enumerate() {
            propagate(k, &value.lock, send, if i == 0 { rider } else { None }, clocks);
        }
    }
    for event in scratch.events.drain(..) {
        ffi::notify_module_event(k.ctx, event.name(), k.name);
    }
    scratch.sends.clear();
    s.scratch = scratch;
    result
}

/// A wait for several keys first in this lock's queue: if its wait ended
/// (its entries here are stale) it leaves, and the queue goes on; if it
/// could be granted here, it is ready (`drain` sees whether every key is).
fn settle_gated_head(s: &mut State, lock: &mut Lock<WaitId>, now: u64, out: &mut Outcomes<WaitId>) {
    while let Some((&wait, fits)) = lock.gated_head() {
        if s.waiters.get(wait).is_some() || s.forming == Some(wait) {
            if fits && !s.ready.contains(&wait) {
                s.ready.push(wait);
                arm_drain(s);
            }
            return;
        }
        lock.remove_head(out);
        lock.grant_waiters(now, &mut s.tokens, out);
    }
}

/// Makes sure `drain` runs soon for what callbacks other than commands
/// (which drain before they return) leave behind: a timer due at once,
/// which runs in the same event-loop turn.
fn arm_drain(s: &mut State) {
    if s.drain_timer.is_none() && !s.draining && (!s.ready.is_empty() || !s.waiters.stale.is_empty()) {
        s.drain_timer = Some(timers::create_timer(0, wakeups().drain, ()));
    }
}

/// Runs `op` on the lock in `k` as replicated or loaded state says: its
/// effects on leases and sessions, nothing counted, sent or notified. The
/// key is deleted when the lock is left free.
pub fn restore(
    s: &mut State,
    k: &Key,
    value: &mut LockValue,
    op: impl FnOnce(&mut Lock<WaitId>, &mut Outcomes<WaitId>),
) {
    let mut out = Vec::new();
    op(&mut value.lock, &mut out);
    follow_quietly(s, k.place, &mut value.lock, out);
    remove_if_free(s, k, value);
}

/// A free lock leaves no key, so that any client finds the name free (an
/// old client's `SET NX` too); its request IDs stay in the state until they
/// expire.
fn remove_if_free(s: &mut State, k: &Key, value: &mut LockValue) {
    if !value.lock.is_idle() {
        return;
    }
    remember(s, k.place, value.lock.take_requests());
    // Detached from timers and sessions already: the unlink callback this
    // runs has nothing left to do.
    let _ = k.key.delete();
}

/// Keeps the request IDs of a lock that leaves its key, and wakes up to
/// forget them when they expire.
pub fn remember(s: &mut State, place: &Place, requests: Option<Requests>) {
    let Some(requests) = requests else { return };
    s.remembered.keep(place.clone(), requests);
    wake_for_remembered(s);
}

/// A lock made again under `place` (or arrived from it) takes back the
/// request IDs it remembered while it had no key there.
pub fn reclaim_requests(s: &mut State, place: &Place, value: &mut LockValue) {
    if let Some(requests) = s.remembered.take(place) {
        value.lock.adopt_requests(requests);
    }
}

pub fn wake_for_remembered(s: &mut State) {
    if let Some(at) = s.remembered.next_expiry().and_then(|at| s.leases.wake_for(at)) {
        set_timer(s, at, clock::now_ms());
    }
}

/// A request ID that rides on a `FLOCK.HOLDER` or `FLOCK.FREE`: each
/// command sent costs the server far more than its words.
type Rider<'a> = Option<(&'a [u8], Record)>;

/// Sends the request IDs an operation recorded to replicas and the AOF,
/// before the state they belong to. The first one rides on the state
/// command that follows, if one does (`carried`): it is returned, not sent.
fn propagate_requests<'a>(k: &Key, value: &'a LockValue, since: u64, carried: bool, now: Now) -> Rider<'a> {
    let requests = value.lock.requests().filter(|r| r.made() > since)?;
    let mut made = requests.made_since(since);
    let rider = if carried { made.next() } else { None };
    for (id, record) in made {
        replicate(k, ID_COMMAND, &request_words(id, record, now), None, now);
    }
    rider
}

/// Sends one holder as it is now, or that its owner holds nothing, as one
/// deterministic command with absolute times (never the blocking ACQUIRE),
/// with the request ID that rides on it; deadlines as unix time at `now`.
fn propagate(k: &Key, lock: &Lock<WaitId>, send: &Send, rider: Rider, now: Now) {
    match send {
        Send::Holder(token) => {
            let Some((holder, terms)) = lock.holders().get(*token) else { return };
            let words = holder_set_words(lock.mode(), holder, terms.session.is_some(), terms.permits, now);
            replicate(k, HOLDER_COMMAND, &words, rider, now);
        }
        Send::Gone(owner) => {
            let [mode, limit] = mode_words(lock.mode());
            replicate(k, HOLDER_COMMAND, &[mode, limit, Word::Bytes(owner)], rider, now);
        }
    }
}

/// Sends `cmd key words... [ID request-words...]` to replicas and the AOF,
/// if anything reads them (`propagation`).
fn replicate(k: &Key, cmd: &CStr, words: &[Word], rider: Rider, now: Now) {
    if !propagation::read(k.ctx) {
        return;
    }
    let mut argv = [Word::Number(0); MAX_ARGS];
    argv[..words.len()].copy_from_slice(words);
    let mut len = words.len();
    if let Some((id, record)) = rider {
        argv[len] = Word::Bytes(REQUEST_MARK);
        argv[len + 1..len + 5].copy_from_slice(&request_words(id, record, now));
        len += 5;
    }
    with_args(&argv[..len], |args| ffi::replicate(k.ctx, cmd, k.name, args));
}

const REPLICA_RECHECK_MS: u64 = 50;

/// Files a holder's lease deadline in the wheel, in place of the entry it
/// had, and makes sure the timer wakes up for it.
pub fn file_lease(s: &mut State, holder: &mut Holder, session_lease: Option<u64>, place: &Place, now: u64) {
    cancel_lease(s, holder.token, holder.deadline_id.take());
    let mut at = holder.deadline_ms;
    let replica = ffi::is_replica();
    if at <= now && replica {
        // The master's expiry is on its way; look again in case this replica
        // is promoted before it arrives.
        at = now + REPLICA_RECHECK_MS;
    }
    // A grant that lives with its session is moved on (`follow_session`) a
    // third of the session's timeout before the deadline replicas and the
    // disk see, so that a replica promoted at any moment still holds it for
    // that long at least: time for its holder's client to watch it on the
    // new master. Not heard from since, it is looked at again at the
    // deadline itself.
    if let Some(session) = session_lease.filter(|_| !replica).and_then(|client| s.sessions.get(client)) {
        let early = at.saturating_sub(session.timeout_ms() / 3);
        // Due (its session's timer ends it): looked at again in a moment.
        at = if early > now { early } else { at.max(now + 1) };
    }
    holder.deadline_id = Some(file_at(s, at, Lease { token: holder.token, place: place.clone() }, now));
}

/// Files `lease` in the wheel, due at `at`, and sets the timer if it must
/// wake earlier for it.
fn file_at(s: &mut State, at: u64, lease: Lease, now: u64) -> DeadlineId {
    let (id, wake) = s.leases.file(at, lease);
    if let Some(at) = wake {
        set_timer(s, at, now);
    }
    id
}

/// Files the end of a lock's lock-delay: the tick lifts it then.
pub fn file_delay(s: &mut State, place: &Place, until_ms: u64, now: u64) {
    file_at(s, until_ms, Lease { token: DELAY_ENDS, place: place.clone() }, now);
}

/// Takes a holder's lease out of the wheel, if `id` is still its entry.
fn cancel_lease(s: &mut State, token: u64, id: Option<DeadlineId>) {
    if let Some(id) = id.filter(|&id| s.leases.get(id).is_some_and(|lease| lease.token == token)) {
        s.leases.remove(id);
    }
}

/// Sets the one timer for `at`, in place of the one set (the wheel says
/// when it must move).
pub fn set_timer(s: &mut State, at: u64, now: u64) {
    if let Some(timer) = s.tick.take() {
        timers::stop_timer(timer);
    }
    s.tick = Some(timers::create_timer(at.saturating_sub(now), wakeups().tick, ()));
}

/// How often, while writes are paused, FLOCK looks whether the pause ended.
/// Asking ends a pause whose time is up, so put-off work runs at most this
/// long after the end of a `CLIENT PAUSE`.
const PAUSE_RECHECK_MS: u64 = 10;

/// True while writes are paused (`ffi::writes_paused`: `CLIENT PAUSE`, a
/// failover): work that would change a lock outside a command must not run
/// now (it would be sent to replicas, or lost to them). The caller puts it
/// off (`put_off`); leases that fall due meanwhile stay in the wheel, and
/// waits for several keys stay ready. Makes sure the end of the pause is
/// looked for, which does all of that (`expiry::on_resume`).
///
/// Commands need not ask: the server runs no write command during a pause
/// (it holds them back, scripts and MULTI with them too), except those of
/// a MULTI that paused itself, which it lets replicate. The FLOCK commands
/// not flagged `write` (SESSION, INBOX, INFO) change no lock, and drain
/// asks for itself.
pub fn paused(s: &mut State) -> bool {
    if !ffi::writes_paused() {
        return false;
    }
    if s.resume.is_none() {
        s.resume = Some(timers::create_timer(PAUSE_RECHECK_MS, wakeups().resume, ()));
    }
    true
}

/// Runs `job` once writes are no longer paused, after the work put off
/// before it. Call it only while `paused` says so.
pub fn put_off(s: &mut State, job: impl FnOnce(&Context, &mut State) + 'static) {
    s.put_off.push(Box::new(job));
}

/// Files the leases of a lock just loaded as due now, not at their
/// deadlines: Redis may still drop the value it is loading (RESTORE with a
/// TTL that has passed, a key of an expired TTL on startup) without telling
/// the type, and a stale entry would stay until the deadline, up to 2^41 ms
/// away. The next tick, within the event loop's next pass, finds the key or
/// drops the entry; a kept lock is expired there or filed again.
pub fn file_leases_now(s: &mut State, value: &mut LockValue, place: &Place) {
    let now = clock::now_ms();
    for holder in value.lock.holders_mut() {
        holder.deadline_id = Some(file_at(s, now, Lease { token: holder.token, place: place.clone() }, now));
    }
    if value.lock.delayed_until().is_some() {
        file_delay(s, place, now, now);
    }
}

/// Opens the lock at `place` in its current database, if there is one (the
/// key's, or the shadow its waiters queue on while a lock of another client
/// holds the key), and runs `f` on it.
pub fn open_lock_at(ctx: &Context, s: &mut State, place: &Place, f: impl FnOnce(&mut State, &Key, &mut LockValue)) {
    let db = s.dbs.db(place.ident());
    ffi::with_db(ctx, db, || {
        let name = ffi::key_name(ctx, place.key());
        let key = ctx.open_key_writable(&name);
        let k = Key { ctx, key: &key, name: &name, place };
        match lock_value(&key) {
            Ok(Some(value)) => f(s, &k, value),
            _ => {
                if let Some(shadow) = s.shadows.remove(place) {
                    on_shadow(s, &k, shadow, f);
                }
            }
        }
    });
}

/// Runs `f` on a shadow lock, kept as long as anyone waits on it.
pub fn on_shadow<R>(
    s: &mut State,
    k: &Key,
    mut shadow: Shadow,
    f: impl FnOnce(&mut State, &Key, &mut LockValue) -> R,
) -> R {
    let result = f(s, k, &mut shadow.value);
    if shadow.value.lock.waiter_count() > 0 {
        s.shadows.insert(k.place.clone(), shadow);
    }
    result
}
