//! Turns a change of one lock's core state into its effects in Redis: grants
//! delivered to blocked clients, the lease timer moved, session bindings
//! kept in step, keyspace events sent, and the key removed once idle.

use std::time::{Duration, Instant};

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, NotifyEvent};

use crate::deadlines::{DeadlineId, Pop};
use crate::ffi::{self, BlockedId};
use crate::lock::{Grant, Holder, Member, Mode, TableChange};
use crate::place::Place;
use crate::requests::Requests;
use crate::state::{self, Lease, State};
use crate::value::{
    lock_value, member_numbers, mode_args, request_numbers, state_numbers, LockValue, HOLDER_COMMAND, ID_COMMAND,
    REMOTE_SESSION, STATE_COMMAND,
};
use crate::waiters::Outcome;

pub const ACQUIRED: &str = "flock.acquired";
pub const RELEASED: &str = "flock.released";
pub const EXPIRED: &str = "flock.expired";

/// What one operation did to a lock, gathered while the state is borrowed
/// and applied when it is done.
pub struct Changes {
    before: Option<Snapshot>,
    /// Free, with only remembered request IDs keeping the key (and its TTL).
    lingering_before: bool,
    /// `Requests::made` before the operation: the records it adds are sent on.
    requests_made: u64,
    grants: Vec<Grant<BlockedId>>,
    events: Vec<&'static str>,
    /// Shared or semaphore holders changed, in order, to send on.
    members: Vec<MemberChange>,
    pub now: u64,
    /// A replica follows its master and never ends a lease itself.
    pub replica: bool,
}

/// A shared or semaphore holder to send to replicas and the AOF.
enum MemberChange {
    /// Its grant (by token) as it is now, if it still exists.
    Set(u64),
    /// This owner holds nothing any more.
    Gone(Box<[u8]>),
}

impl Changes {
    /// Grants made to waiters: each is delivered and has its own event.
    pub fn grant(&mut self, grants: Vec<Grant<BlockedId>>) {
        for grant in grants {
            self.grants.push(grant);
            self.events.push(ACQUIRED);
        }
    }

    pub fn event(&mut self, event: &'static str) {
        self.events.push(event);
    }
}

/// A holder as far as a change to it matters, without copying its owner: a
/// new owner always comes with a new token.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Snapshot {
    token: u64,
    holds: u32,
    deadline_ms: u64,
    session: Option<u64>,
    deadline_id: Option<DeadlineId>,
}

impl Snapshot {
    fn of(value: &LockValue) -> Option<Self> {
        value.lock.holder().map(|h| Snapshot {
            token: h.token,
            holds: h.holds,
            deadline_ms: h.deadline_ms,
            session: value.lock.session(),
            deadline_id: h.deadline_id,
        })
    }

    /// What replicas and the AOF see: the session flag, not the connection.
    fn replicated(this: Option<Self>) -> Option<(u64, u32, u64, bool)> {
        this.map(|h| (h.token, h.holds, h.deadline_ms, h.session.is_some()))
    }
}

/// Runs `op` on `value`, the lock stored in `key` at `place`, after ending
/// a lease that has run out, then applies every effect. The key is deleted
/// when the lock is left idle.
pub fn update<R>(
    ctx: &Context,
    key: &RedisKeyWritable,
    key_name: &redis_module::RedisString,
    place: &Place,
    value: &mut LockValue,
    op: impl FnOnce(&mut State, &mut LockValue, &mut Changes) -> R,
) -> R {
    let now = ffi::now_ms();
    let replica = ffi::is_replica();
    let (result, changes, unused, exclusive) = state::with(|s| {
        let mut changes = Changes {
            before: Snapshot::of(value),
            lingering_before: is_lingering(value),
            requests_made: value.lock.requests().map_or(0, Requests::made),
            grants: Vec::new(),
            events: Vec::new(),
            members: Vec::new(),
            now,
            replica,
        };
        if !replica {
            if let Some((_, grants)) = value.lock.expire_due(now, &mut s.tokens) {
                expired(s, &mut changes, grants);
            }
        }
        let result = op(s, value, &mut changes);
        apply(s, place, value, &mut changes);
        let exclusive = Snapshot::replicated(changes.before) != Snapshot::replicated(Snapshot::of(value));
        (result, changes, value.lock.is_unused(), exclusive)
    });
    let state = exclusive || !changes.members.is_empty();
    let recorded = propagate_requests(ctx, key_name, value, changes.requests_made);
    if unused {
        // Replicas never forget request IDs on their own, so a key the
        // master drops is dropped there by name, whatever they remember.
        ctx.replicate("DEL", &[key_name.as_slice()]);
        // The value is already detached from timers and sessions, so the
        // unlink callback this triggers has nothing left to do.
        let _ = key.delete();
        return finish(ctx, key_name, changes.events, result);
    }
    if state {
        propagate_members(ctx, key_name, value, &changes.members);
        if exclusive {
            propagate(ctx, key_name, value);
        }
    }
    if is_lingering(value) && (state || recorded) {
        linger(ctx, key, key_name, value, now);
    } else if changes.lingering_before && !value.lock.is_idle() {
        // In use again: the TTL that kept its request IDs must not end it.
        let _ = key.remove_expire();
        ctx.replicate("PERSIST", &[key_name.as_slice()]);
    }
    finish(ctx, key_name, changes.events, result)
}

/// Ends `owner`'s shared or semaphore lease if it has run out, before a
/// command about that owner (the exclusive one `update` ends itself).
pub fn expire_owner(s: &mut State, value: &mut LockValue, changes: &mut Changes, owner: &[u8]) {
    if changes.replica {
        return;
    }
    if let Some((_, grants)) = value.lock.expire_owner(owner, changes.now, &mut s.tokens) {
        expired(s, changes, grants);
    }
}

/// A lease ran out: counted, announced, and the grants it made delivered.
pub fn expired(s: &mut State, changes: &mut Changes, grants: Vec<Grant<BlockedId>>) {
    s.stats.expiries += 1;
    changes.event(EXPIRED);
    changes.grant(grants);
}

/// Sends the keyspace events of a change, last: the key is in its new state.
fn finish<R>(ctx: &Context, key_name: &redis_module::RedisString, events: Vec<&'static str>, result: R) -> R {
    for event in events {
        ctx.notify_keyspace_event(NotifyEvent::MODULE, event, key_name);
    }
    result
}

/// Free, kept only by the request IDs it remembers.
fn is_lingering(value: &LockValue) -> bool {
    value.lock.is_idle() && !value.lock.is_unused()
}

/// A free lock stays as long as it remembers request IDs, so that a resent
/// command still finds its first reply; then Redis expires the key, and
/// replicas and the AOF see that as for any key with a TTL.
fn linger(ctx: &Context, key: &RedisKeyWritable, key_name: &redis_module::RedisString, value: &LockValue, now: u64) {
    let Some(until) = value.lock.requests().map(Requests::latest_expiry) else { return };
    let _ = key.set_expire(Duration::from_millis(until.saturating_sub(now).max(1)));
    ctx.replicate("PEXPIREAT", &[key_name.as_slice(), until.to_string().as_bytes()]);
}

/// Sends the request IDs an operation recorded to replicas and the AOF,
/// before the state they belong to; true if there were any.
fn propagate_requests(ctx: &Context, key_name: &redis_module::RedisString, value: &LockValue, since: u64) -> bool {
    let Some(requests) = value.lock.requests().filter(|r| r.made() > since) else { return false };
    for (id, record) in requests.made_since(since) {
        replicate(ctx, ID_COMMAND, key_name, &[id], &request_numbers(record));
    }
    true
}

/// Sends `cmd key words... numbers...` (FLOCK.STATE, FLOCK.ID, FLOCK.HOLDER)
/// to replicas and the AOF.
fn replicate(
    ctx: &Context,
    cmd: &str,
    key_name: &redis_module::RedisString,
    words: &[&[u8]],
    numbers: &[impl ToString],
) {
    let numbers: Vec<String> = numbers.iter().map(ToString::to_string).collect();
    let mut args: Vec<&[u8]> = vec![key_name.as_slice()];
    args.extend(words);
    args.extend(numbers.iter().map(String::as_bytes));
    ctx.replicate(cmd, args.as_slice());
}

/// Applies gathered effects.
fn apply(s: &mut State, place: &Place, value: &mut LockValue, changes: &mut Changes) {
    for grant in changes.grants.drain(..) {
        deliver(s, place, grant);
    }
    let (before, after) = (changes.before, Snapshot::of(value));
    let binding = |h: Option<Snapshot>| h.map(|h| (h.token, h.session));
    if binding(before) != binding(after) {
        if let Some((token, Some(client))) = binding(before) {
            s.unbind_session(client, place, token);
        }
        if let Some((token, Some(client))) = binding(after) {
            s.bind_session(client, place, token);
        }
    }
    if let Some(old) = before.filter(|h| after.is_none_or(|a| a.token != h.token)) {
        cancel_lease(s, old.token, old.deadline_id);
    }
    let lease = |h: Option<Snapshot>| h.map(|h| (h.token, h.deadline_ms));
    if lease(before) != lease(after) || after.is_some_and(|h| h.deadline_id.is_none()) {
        schedule_lease(s, value, place, changes.now);
    }
    changes.members.extend(settle_members(s, place, value, changes.now));
}

/// Follows the changes to the shared or semaphore holders with their
/// leases and session bindings; what replicas and the AOF must hear.
fn settle_members(s: &mut State, place: &Place, value: &mut LockValue, now: u64) -> Vec<MemberChange> {
    let mut sent = Vec::new();
    for change in value.lock.take_changes() {
        match change {
            TableChange::Set { token, old_session } => {
                let Some(member) = value.lock.member_mut(token) else { continue };
                if let Some(client) = old_session.filter(|&c| Some(c) != member.session) {
                    s.unbind_session(client, place, token);
                }
                if let Some(client) = member.session.filter(|&c| c != REMOTE_SESSION) {
                    s.bind_session(client, place, token);
                }
                file_lease(s, &mut member.holder, place, now);
                sent.push(MemberChange::Set(token));
            }
            TableChange::Gone(member) => {
                cancel_lease(s, member.holder.token, member.holder.deadline_id);
                if let Some(client) = member.session {
                    s.unbind_session(client, place, member.holder.token);
                }
                sent.push(MemberChange::Gone(member.holder.owner));
            }
        }
    }
    sent
}

/// Sends the shared or semaphore holders that changed (FLOCK.HOLDER), each
/// as it is now, or gone.
fn propagate_members(ctx: &Context, key_name: &redis_module::RedisString, value: &LockValue, sent: &[MemberChange]) {
    let (mode, limit) = mode_args(value.lock.mode());
    let (mode, limit) = (mode.to_bytes(), limit.to_string());
    for change in sent {
        match change {
            MemberChange::Set(token) => {
                let Some(member) = value.lock.member(*token) else { continue };
                let words = [mode, limit.as_bytes(), &member.holder.owner];
                replicate(ctx, HOLDER_COMMAND, key_name, &words, &member_numbers(member));
            }
            MemberChange::Gone(owner) => {
                replicate(ctx, HOLDER_COMMAND, key_name, &[mode, limit.as_bytes(), owner], &[] as &[u64])
            }
        }
    }
}

/// Sends the lock's new state to replicas and the AOF as one deterministic
/// command with absolute times (never the blocking ACQUIRE itself). Without
/// a holder the key stays (it remembers request IDs).
fn propagate(ctx: &Context, key_name: &redis_module::RedisString, value: &LockValue) {
    match value.lock.holder() {
        None => ctx.replicate(STATE_COMMAND, &[key_name.as_slice()]),
        Some(holder) => {
            let numbers = state_numbers(holder, value.lock.session().is_some());
            replicate(ctx, STATE_COMMAND, key_name, &[&holder.owner], &numbers)
        }
    };
}

fn deliver(s: &mut State, place: &Place, grant: Grant<BlockedId>) {
    s.stats.grants += 1;
    s.stats.handoffs += 1;
    let outcome = Outcome::Granted { token: grant.token, place: place.clone(), delivered: false, at: Instant::now() };
    s.waiters.answer(grant.payload, outcome);
}

const REPLICA_RECHECK_MS: u64 = 50;

/// Files the exclusive holder's lease deadline in the wheel.
fn schedule_lease(s: &mut State, value: &mut LockValue, place: &Place, now: u64) {
    if let Some(holder) = value.lock.holder_mut() {
        file_lease(s, holder, place, now);
    }
}

/// Files a holder's lease deadline in the wheel, in place of the entry it
/// had, and makes sure the timer wakes up for it.
fn file_lease(s: &mut State, holder: &mut Holder, place: &Place, now: u64) {
    cancel_lease(s, holder.token, holder.deadline_id.take());
    let mut at = holder.deadline_ms;
    if at <= now && ffi::is_replica() {
        // The master's expiry is on its way; look again in case this replica
        // is promoted before it arrives.
        at = now + REPLICA_RECHECK_MS;
    }
    holder.deadline_id = Some(s.deadlines.insert(at, Lease { token: holder.token, place: place.clone() }));
    wake_at(s, at, now);
}

/// Takes a holder's lease out of the wheel, if `id` is still its entry.
fn cancel_lease(s: &mut State, token: u64, id: Option<DeadlineId>) {
    if let Some(id) = id.filter(|&id| s.deadlines.get(id).is_some_and(|lease| lease.token == token)) {
        s.deadlines.remove(id);
    }
}

/// Sets the one timer for `at` unless it already fires by then. Entries
/// that leave the wheel leave it as it is: waking up once for nothing is
/// cheaper than a timer per change.
fn wake_at(s: &mut State, at: u64, now: u64) {
    if s.tick.as_ref().is_some_and(|&(_, set_for)| set_for <= at) {
        return;
    }
    if let Some((timer, _)) = s.tick.take() {
        ffi::stop_timer(timer);
    }
    s.tick = Some((ffi::create_timer(at.saturating_sub(now), on_tick, ()), at));
}

/// Work per tick: a backlog of due leases (after a slow command, a fork, a
/// load or a promotion) ends in slices this long, so that clients are
/// served in between instead of after all of it.
const SLICE: Duration = Duration::from_millis(1);
/// Leases ended (or steps of moving deadlines down the wheel) between
/// looks at the clock: each takes a few µs.
const CLOCK_EVERY: u64 = 64;

/// Ends the leases that are due, earliest first, for about `SLICE` at most
/// (`update` passes each lock on), then sets the timer for the next
/// deadline: at once if some are still due, so the event loop serves
/// clients before the next slice.
fn on_tick(ctx: &Context, (): ()) {
    state::with(|s| s.tick = None);
    let now = ffi::now_ms();
    let started = Instant::now();
    for ended in 1.. {
        if ended % CLOCK_EVERY == 0 && started.elapsed() >= SLICE {
            break;
        }
        let (id, lease) = match state::with(|s| s.deadlines.pop_due(now)) {
            Pop::Due(id, lease) => (id, lease),
            Pop::Moved => continue,
            Pop::Idle => break,
        };
        open_lock_at(ctx, &lease.place, |key, name, value| {
            if let Some(holder) = value.lock.holder_mut().filter(|h| h.token == lease.token) {
                if holder.deadline_id == Some(id) {
                    holder.deadline_id = None;
                    // Ends the lease, or files it again if it is not due here.
                    update(ctx, key, name, &lease.place, value, |_, _, _| ());
                }
                return;
            }
            let Some(member) = value.lock.member_mut(lease.token).filter(|m| m.holder.deadline_id == Some(id)) else {
                return;
            };
            member.holder.deadline_id = None;
            update(ctx, key, name, &lease.place, value, |s, value, changes| {
                if !changes.replica {
                    if let Some((_, grants)) = value.lock.expire_token(lease.token, changes.now, &mut s.tokens) {
                        expired(s, changes, grants);
                        return;
                    }
                }
                if let Some(member) = value.lock.member_mut(lease.token) {
                    file_lease(s, &mut member.holder, &lease.place, changes.now);
                }
            });
        });
    }
    state::with(|s| {
        if let Some(next) = s.deadlines.next_deadline() {
            wake_at(s, next, ffi::now_ms());
        }
    });
}

/// Files the lease of a lock just loaded as due now, not at its deadline:
/// Redis may still drop the value it is loading (RESTORE with a TTL that has
/// passed, a key of an expired TTL on startup) without telling the type, and
/// a stale entry would stay until the deadline, up to 2^41 ms away. The next
/// tick, within the event loop's next pass, finds the key or drops the entry;
/// a kept lock is expired there or filed again at its deadline.
pub fn schedule_lease_now(value: &mut LockValue, place: &Place) {
    let holders = value.lock.holders_mut();
    state::with(|s| {
        let now = ffi::now_ms();
        for holder in holders {
            holder.deadline_id = Some(s.deadlines.insert(now, Lease { token: holder.token, place: place.clone() }));
            wake_at(s, now, now);
        }
    });
}

/// Sets the holder (and its session flag) as its master or the AOF
/// recorded it (FLOCK.STATE), or none.
pub fn replace_holder(value: &mut LockValue, place: &Place, holder: Option<(Holder, Option<u64>)>) {
    if let Some(old) = value.lock.holder_mut() {
        let (token, id) = (old.token, old.deadline_id.take());
        state::with(|s| cancel_lease(s, token, id));
    }
    let (holder, session) = holder.unzip();
    value.lock.set_holder(holder, session.flatten());
    state::with(|s| {
        schedule_lease(s, value, place, ffi::now_ms());
        settle_members(s, place, value, ffi::now_ms());
    });
}

/// Sets the key's mode and one owner's shared or semaphore grant (or that
/// it holds none) as its master or the AOF recorded it (FLOCK.HOLDER).
pub fn replace_member(value: &mut LockValue, place: &Place, mode: Mode, member: Option<(&[u8], Option<Member>)>) {
    match member {
        None => value.lock.set_mode(mode),
        Some((owner, None)) => {
            value.lock.set_mode(mode);
            value.lock.unset_member(owner);
        }
        Some((_, Some(member))) => {
            if let Some(old) = value.lock.holder_mut() {
                let (token, id) = (old.token, old.deadline_id.take());
                state::with(|s| cancel_lease(s, token, id));
            }
            value.lock.set_member(member, mode);
        }
    }
    state::with(|s| settle_members(s, place, value, ffi::now_ms()));
}

/// Opens the lock at `place` in its current database, if there is one, and
/// runs `f` on it.
pub fn open_lock_at(
    ctx: &Context,
    place: &Place,
    f: impl FnOnce(&RedisKeyWritable, &redis_module::RedisString, &mut LockValue),
) {
    let db = state::with(|s| s.dbs.db(place.ident()));
    ffi::with_db(ctx, db, || {
        let name = ffi::key_name(ctx, place.key());
        let key = ctx.open_key_writable(&name);
        if let Ok(Some(value)) = lock_value(&key) {
            f(&key, &name, value);
        }
    });
}

/// The lock leaves its key (deleted, overwritten, expired, renamed or moved
/// away): its waiters get LOCKDELETED, its timer and session binding go.
pub fn detach(value: &mut LockValue, db: i32, key: &[u8]) {
    let bound = value.lock.session();
    let filed = value.lock.holder_mut().and_then(|h| h.deadline_id.take().map(|id| (h.token, id)));
    if value.lock.waiter_count() == 0 && filed.is_none() && bound.is_none() && value.lock.member_count() == 0 {
        return;
    }
    let waiters = value.lock.drain_waiters();
    state::with(|s| {
        if let Some((token, id)) = filed {
            cancel_lease(s, token, Some(id));
        }
        let place = s.place(db, key);
        if let (Some(client), Some(holder)) = (bound, value.lock.holder()) {
            s.unbind_session(client, &place, holder.token);
        }
        for member in value.lock.members_mut() {
            cancel_lease(s, member.holder.token, member.holder.deadline_id.take());
            if let Some(client) = member.session {
                s.unbind_session(client, &place, member.holder.token);
            }
        }
        s.stats.deletions += value.lock.holder_count() as u64;
        for waiter in waiters {
            // A waiter missing from the registry is leaving right now (its
            // removal opened the key, which expired it): its leaver answers it.
            if s.waiters.answer(waiter.payload, Outcome::Deleted) {
                s.stats.waiters_deleted += 1;
            }
        }
    });
}

/// The lock arrived under a new name or database (RENAME, MOVE): its lease
/// timer and session binding follow it.
pub fn attach(value: &mut LockValue, db: i32, key: &[u8]) {
    state::with(|s| {
        let place = s.place(db, key);
        let now = ffi::now_ms();
        if let (Some(client), Some(holder)) = (value.lock.session(), value.lock.holder()) {
            s.bind_session(client, &place, holder.token);
        }
        for member in value.lock.members_mut() {
            if let Some(client) = member.session.filter(|&c| c != REMOTE_SESSION) {
                s.bind_session(client, &place, member.holder.token);
            }
            file_lease(s, &mut member.holder, &place, now);
        }
        s.stats.deletions = s.stats.deletions.saturating_sub(value.lock.holder_count() as u64);
        schedule_lease(s, value, &place, now);
    });
}
