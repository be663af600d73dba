//! What the server does on its own time: the lease wheel's tick (leases
//! and lock-delays that end, a session's grant moved on with its session),
//! and the end of a pause of writes (the work put off meanwhile).

use redis_module::Context;

use crate::clock::{self, ServerClock};
use crate::engine::{file_delay, file_lease, open_lock_at, paused, set_timer, update};
use crate::ffi;
use crate::grants;
use crate::state::{self, State, DELAY_ENDS};
use crate::waiters::WaitId;
use flock_core::effects::End;
use flock_core::lock::{Lock, Outcomes};

/// Ends the leases that are due, earliest first, for a slice of work at
/// most (`LeaseWheel::next_due`; `update` passes each lock on), then sets
/// the timer for the next deadline: at once if some are still due, so the
/// event loop serves clients before the next slice.
pub fn on_tick(ctx: &Context, (): ()) {
    state::with(|s| {
        s.tick = None;
        tick(ctx, s);
    });
}

/// The work of `on_tick`, with no timer set (`s.tick` is `None`). While
/// writes are paused the due leases stay in the wheel, and the end of the
/// pause ticks (`on_resume`): a lease ends late then, never early.
fn tick(ctx: &Context, s: &mut State) {
    let mut tick = s.leases.tick(&ServerClock);
    if paused(s) {
        return;
    }
    while let Some((id, lease)) = s.leases.next_due(&mut tick, &ServerClock) {
        if lease.token == DELAY_ENDS {
            open_lock_at(ctx, s, &lease.place, |s, k, value| {
                update(s, k, value, None, |s, lock, out, now| {
                    // A later delay, begun since, is filed again for its own end.
                    if !lock.lift_delay(now, &mut s.tokens, out) {
                        if let Some(until) = lock.delayed_until() {
                            file_delay(s, k.place, until, now);
                        }
                    }
                });
            });
            continue;
        }
        open_lock_at(ctx, s, &lease.place, |s, k, value| {
            let token = lease.token;
            let Some(holder) = value.lock.holder_mut(token).filter(|h| h.deadline_id == Some(id)) else { return };
            holder.deadline_id = None;
            update(s, k, value, None, |s, lock, out, now| {
                let replica = ffi::is_replica();
                // A grant moved on or ended is filed again by its outcome.
                let session_lease = lock.session_lease_of(token).filter(|_| !replica);
                let refile = match session_lease {
                    Some(client) => !follow_session(s, lock, token, client, now, out),
                    None => replica || !lock.expire_token(token, now, &mut s.tokens, out),
                };
                if refile {
                    // Filed again (a replica looks again soon).
                    if let Some(holder) = lock.holder_mut(token) {
                        file_lease(s, holder, session_lease, k.place, now);
                    }
                }
            });
        });
    }
    s.remembered.prune(tick.now_ms);
    if let Some(at) = s.leases.after_tick(&tick, s.remembered.next_expiry()) {
        set_timer(s, at, clock::now_ms());
    }
}

/// A grant that lives with its session came up (a third of the session's
/// timeout before its deadline, or at it: `file_lease`): its deadline moves
/// to the session's own (what replicas and the disk see, so that there it
/// ends within the session's timeout of its last renewal). False if the
/// session is due: its own timer, due now too, ends it with all its grants
/// and waits at once (ended here alone, the grant would pass on while the
/// session's waits still queued), and the grant is looked at again in a
/// moment. Without a session, the grant ends.
fn follow_session(
    s: &mut State,
    lock: &mut Lock<WaitId>,
    token: u64,
    client: u64,
    now: u64,
    out: &mut Outcomes<WaitId>,
) -> bool {
    match s.sessions.left_us(client, clock::monotonic_us()) {
        Some(0) => return false,
        Some(left_us) => {
            lock.extend(token, now + left_us.div_ceil(1000), out);
        }
        None => {
            lock.end(token, End::SessionClosed, now, &mut s.tokens, out);
        }
    }
    true
}

/// The end of a pause, looked for every `PAUSE_RECHECK_MS`: the work put
/// off runs in the order it came, then the leases that fell due meanwhile
/// end, earliest first, then the waits for several keys whose turn came are
/// granted. A node that became a replica meanwhile (the failover the pause
/// was for) changes nothing itself: its new master has the grants and ends
/// each with its lease, and its own leases wait for the master's word.
pub fn on_resume(ctx: &Context, (): ()) {
    state::with(|s| {
        s.resume = None;
        if paused(s) {
            return;
        }
        let jobs = std::mem::take(&mut s.put_off);
        if ffi::is_replica() {
            if !jobs.is_empty() {
                ffi::log(
                    c"notice",
                    &format!(
                        "FLOCK: this node became a replica while writes were paused; {} change(s) put off \
                         until the end of the pause are left to its master",
                        jobs.len()
                    ),
                );
            }
        } else {
            for job in jobs {
                job(ctx, s);
            }
        }
        if s.tick.is_none() {
            tick(ctx, s);
        }
        grants::drain(ctx, s);
    });
}
