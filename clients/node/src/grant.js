'use strict';

// A grant (key, owner, token) as this process knows the server holds it, and how long that is
// confirmed (docs/client-protocol.md, "The rules every client shares"):
//
// - a session grant (`FLOCK.ACQUIRE key owner 0 ... INBOX sid`) lives with its session: its
//   deadline is the session's (the send time of the last FLOCK.INBOX or FLOCK.SESSION whose reply
//   came, + T - m), and it is lost when that passes (`unconfirmed`) or the session ends
//   (`sessionended`);
// - a grant with a lease of its own is confirmed until the send time of the command that set that
//   lease (the acquire, a renewal; or the FLOCK.INBOX read that delivered it, with the event's
//   lease left) + the lease - m: a fixed lease is then `expired`, a renewed one `unconfirmed`.
//
// Each Lock handle of a grant is a `handle` of it ({ grant, plan, lease, released, lost, onLost });
// a reentry is one more handle of the same grant, and what the server was last told of the
// grant (a reentry with a lease, a RENEW, a reentry with 0) is what every handle's deadline is.

const { schedule } = require('./deadlines');

// What each loss reason says, in a LockLostError's message.
const LOSS_TEXT = {
  expired: 'its lease ended (expired)',
  unconfirmed: 'no reply confirmed it before its deadline (unconfirmed)',
  sessionended: 'its session ended (sessionended)',
  forcereleased: 'it was force-released (FLOCK.FORCERELEASE)',
  deleted: 'its key was deleted (DEL, FLUSH, overwrite, eviction, RENAME away...)',
  demoted: 'the server stopped being a master (demoted)',
};

/** A loss of `key` ({ key, reason, text }), the text saying more when `detail` is given. */
function loss(key, reason, detail) {
  const what = LOSS_TEXT[reason] ?? reason;
  return { key, reason, text: `The lock ${key} was lost: ${what}${detail ? `: ${detail}` : ''}` };
}

// One string for a (key, owner): what names its wait, its process-wide hold count and its
// remembered release (made once per acquire and shared: hashing a new string costs more than a
// Map lookup); and one for a grant (key, owner, token), that a loss read before its grant waits under.
const pairId = (key, owner) => `${key}\u0000${owner}`;
const grantId = (key, owner, token) => `${key}\u0000${owner}\u0000${token}`;

class Grant {
  constructor(key, owner, token, { mode = 'exclusive', extra = [], node } = {}) {
    this.key = key;
    this.owner = owner;
    this.token = String(token);
    this.mode = mode;
    // The ACQUIRE arguments of its mode (a re-watch asks for the same), and the node it is on.
    this.extra = extra;
    this.node = node;
    this.handles = [];
    // The session entry it lives with (a session grant), or null: a lease of its own, confirmed
    // until its Deadline `_own`.
    this.session = null;
    this._own = null;
    this.lost = null;
    // Called once it is no longer watched (lost, or its last handle dropped): set by the Session.
    this.onForget = null;
  }

  /** When it stops being confirmed, on protocol.now()'s clock (-Infinity once it no longer is). */
  get until() {
    if (this.session) return this.session.deadline.at;
    return this._own ? this._own.at : -Infinity;
  }

  /** From now on it lives with `entry`'s session (it was granted, or reentered, with lease 0 there). */
  livesWith(entry) {
    if (this.lost) return;
    if (entry.broken) return this.lose(loss(this.key, 'sessionended', 'it ended before the grant was read'));
    this._unlink();
    this.session = entry;
  }

  /** From now on it has a lease of its own, confirmed until `at`. */
  leaseUntil(at) {
    if (this.lost) return;
    this.session = null;
    if (this._own) this._own.move(at);
    else this._own = schedule(at, () => this._expire());
  }

  // Its own lease's deadline passed: renewed (a watchdog's, or a session grant's moved on) and
  // unconfirmed, or a fixed one that ran out.
  _expire() {
    this._own = null;
    const renewed = this.handles.some((handle) => !handle.released && handle.plan !== 'fixed');
    this.lose(loss(this.key, renewed ? 'unconfirmed' : 'expired', renewed ? undefined : 'its fixed lease reached its deadline'));
  }

  /** Marks it lost for every handle (once), and stops watching it. */
  lose(lost) {
    if (this.lost) return;
    this.lost = lost;
    this._stop();
    for (const handle of this.handles) {
      handle.lost = lost;
      handle.onLost?.(lost);
    }
  }

  /** A new handle of it (a Lock's, for one acquire). */
  handle(plan, lease) {
    const handle = { grant: this, plan, lease, released: false, lost: this.lost, onLost: null };
    this.handles.push(handle);
    return handle;
  }

  /** `handle` no longer holds it (released); with no handle left, nothing watches it. */
  drop(handle) {
    const at = this.handles.indexOf(handle);
    if (at >= 0) this.handles.splice(at, 1);
    if (this.handles.length === 0) this._stop();
  }

  // No deadline of its own, no session: nothing counts its time any more.
  _unlink() {
    this._own?.cancel();
    this._own = null;
    this.session = null;
  }

  _stop() {
    this._unlink();
    const forget = this.onForget;
    this.onForget = null;
    forget?.();
  }
}

module.exports = { Grant, grantId, pairId, loss };
