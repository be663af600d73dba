'use strict';

// A Flock's sessions (docs/commands.md, "Sessions"): one dedicated connection per Flock and
// server (a Cluster node) that loops FLOCK.INBOX, opened on the first acquire there. Every wait
// for one key goes out as one
// `FLOCK.ACQUIRE ... WAIT t INBOX sid ID rid` on the command connection and is answered by an
// event in the inbox; every grant made with INBOX is watched, so the server pushes its loss. A
// grant of several keys at once (FLOCK.ACQUIREALL, which has no INBOX form) is adopted: its
// watch is moved here afterwards, as after a session break.
//
// Node runs this reader on the event loop: events of one INBOX reply are handled in order and
// synchronously, so a `lost` aborts the holder's signal before the promise of a later `granted`
// (to a waiter of this process) resolves.
//
// Waits and watched grants are kept here for every node; each remembers the node whose session it
// went to, found anew (flock._conn.nodeOf) whenever it is sent again: after a session breaks (a
// failover) or when that node answers MOVED (then it goes to the node MOVED names, at once: the
// library's slot map may still be refreshing) or ASK (a slot in migration: again a little later).

const { randomUUID } = require('node:crypto');
const { isReplyError } = require('./adapter');

// The local deadline of a wait is its WAIT timeout plus this margin; then the client sends
// FLOCK.CANCEL itself (the server's `timeout` event should have come long before).
const DEADLINE_MARGIN_MS = 1000;
// Pauses between attempts to send a wait again whose session could not be reopened (a server restart).
const REOPEN_PAUSE_MS = [0, 50, 100, 250, 500, 1000];
const RECENT_LOSSES = 1000;
// How long a re-watch waits before it tries again to open a session, while the server cannot be reached.
const REWATCH_RETRY_MS = 1000;
// How long a wait whose ACQUIRE got no reply (the server unreachable) pauses before it is sent again.
const RESUBMIT_PAUSE_MS = 250;

/** An `error` event of the inbox: what the blocking form would have answered (LOCKDELETED, UNBLOCKED, ...). */
class FlockEventError extends Error {
  constructor(detail) {
    super(detail);
    this.name = 'ReplyError';
    this.code = String(detail).split(' ', 1)[0];
  }
}

const LOSS_TEXT = {
  expired: 'its lease ended on the server (expired)',
  forcereleased: 'it was force-released (FLOCK.FORCERELEASE)',
  deleted: 'its key was deleted (DEL, FLUSH, overwrite, eviction, RENAME away...)',
  demoted: 'the server stopped being a master (demoted)',
};

const waitKey = (key, owner) => `${key}\u0000${owner}`;
const grantKey = (key, owner, token) => `${key}\u0000${owner}\u0000${token}`;

class Session {
  constructor(flock) {
    this.flock = flock;
    // The session of each node: { conn, id, opening }.
    this.nodes = new Map();
    this._closed = false;
    // Pending waits by (key, owner): an owner waits once per lock.
    this.waits = new Map();
    // Watched grants by (key, owner, token) -> Set of watch records ({ lost, onLost }).
    this.watched = new Map();
    // The watched grants of each key, by key.
    this.byKey = new Map();
    // Losses of grants nobody watches yet (a short lease lost before its reply was read), by
    // (key, owner, token); the oldest are forgotten beyond RECENT_LOSSES.
    this.recentLosses = new Map();
    // Re-watches under way, by grant.
    this.rewatching = new Map();
    // Grants whose watch moved to a session after their grant (tests): re-watched after a session
    // break or a slot move, or adopted.
    this.rewatched = 0;
  }

  /** The id of `node`'s open session, opening one (a connection of its own and FLOCK.SESSION) if none is open. */
  ensure(node) {
    if (this._closed) return Promise.reject(new Error('This Flock was quit'));
    let entry = this.nodes.get(node);
    if (!entry) {
      entry = { conn: null, id: null, opening: null };
      this.nodes.set(node, entry);
    }
    if (entry.id !== null) return Promise.resolve(entry.id);
    if (!entry.opening) {
      entry.opening = this._open(node, entry).finally(() => {
        entry.opening = null;
      });
    }
    return entry.opening;
  }

  /** `node` (by default the node that holds `key` now) and its session's id. */
  async sessionFor(key, node) {
    node ??= await this.flock._conn.nodeOf(key);
    return { node, sid: await this.ensure(node) };
  }

  /** `node` answered NOSESSION for `sid`: if that is still its session, the session broke. */
  ended(node, sid, err) {
    const entry = this.nodes.get(node);
    if (entry?.id === sid) this._broken(node, entry.conn, err);
  }

  async _open(node, entry) {
    const conn = await this.flock._conn.session(node);
    // Referenced while it connects or waits are pending: an awaited acquire keeps the process alive.
    conn.setRef(true);
    let id;
    try {
      id = await conn.send(['FLOCK.SESSION']);
    } catch (err) {
      conn.close();
      throw err;
    }
    if (this._closed) {
      conn.close();
      throw new Error('This Flock was quit');
    }
    entry.conn = conn;
    entry.id = String(id);
    this._updateRef();
    this._read(node, entry, conn);
    return entry.id;
  }

  _updateRef() {
    for (const { conn } of this.nodes.values()) conn?.setRef(this.waits.size > 0);
  }

  async _read(node, entry, conn) {
    for (;;) {
      let events;
      try {
        events = await conn.send(['FLOCK.INBOX', '0']);
      } catch (err) {
        if (entry.conn !== conn) return;
        // Demotion on Redis 7.0 / 8.2 answers a blocked INBOX with UNBLOCKED; the events stay.
        if (isReplyError(err) && /^UNBLOCKED/.test(err.message)) continue;
        this._broken(node, conn, err);
        return;
      }
      if (entry.conn !== conn) return;
      if (Array.isArray(events)) for (const event of events) this._event(node, event);
    }
  }

  _event(node, event) {
    const [kind, key, owner, token, detail] = event.map((v) => (v === null || v === undefined ? '' : String(v)));
    if (kind === 'lost') {
      const id = grantKey(key, owner, token);
      const lost = { key, reason: detail, text: `The lock ${key} was lost: ${LOSS_TEXT[detail] ?? detail}` };
      if (!this.watched.has(id)) {
        this.recentLosses.set(id, lost);
        if (this.recentLosses.size > RECENT_LOSSES) this.recentLosses.delete(this.recentLosses.keys().next().value);
        return;
      }
      this.lose(id, lost);
      return;
    }
    if (kind === 'moved') {
      // Not a loss: the grant went with its key to another node (a Cluster slot move) and is
      // held there; watched again through a session of that node (a MOVED leads the re-watch there).
      const id = grantKey(key, owner, token);
      if (this.watched.has(id)) this._rewatchSoon(id);
      return;
    }
    const wait = this.waits.get(waitKey(key, owner));
    if (!wait) {
      // A grant nobody waits for any more (its wait gave up): give it back.
      if (kind === 'granted') this.flock._releaseHolds([key], owner, [BigInt(token)]).catch(() => {});
      return;
    }
    if (kind === 'granted') this._settle(wait, { token, node });
    else if (kind === 'timeout') this._settle(wait, { timeout: true });
    else if (kind === 'cancelled') this._settle(wait, { cancelled: true });
    else if (kind === 'error' && /^UNBLOCKED/.test(detail) && !wait.cancelled && !this._closed) {
      // The node stopped being a master (a failover) and dropped the wait from its queue: sent
      // again (same request ID) to the key's master now, as after a session break.
      this._retry(wait, new FlockEventError(detail));
    } else if (kind === 'error') this._settle(wait, { error: new FlockEventError(detail) });
  }

  /** Reports the loss of a watched grant to each of its records, and stops watching it. */
  lose(id, lost) {
    const records = this.watched.get(id);
    if (!records) return;
    this._forget(id, records);
    for (const record of records) {
      record.lost = lost;
      record.onLost?.(lost);
    }
  }

  _forget(id, records) {
    this.watched.delete(id);
    const ids = this.byKey.get(records.key);
    ids?.delete(id);
    if (ids?.size === 0) this.byKey.delete(records.key);
  }

  /**
   * Watches a grant (`mode`: exclusive, shared or semaphore) for a pushed loss; `record.onLost` is
   * called (at once if already lost). A grant of this key to another owner that excludes a grant
   * this process watches (either is exclusive, its token is newer) proves that one ended: it is
   * reported lost now, before the new grant reaches its caller, even if the server's `lost`
   * event is not read yet (the new grant came as a direct reply, not through the inbox).
   */
  watch(key, owner, token, node, mode = 'exclusive', { extra = [], lease = 0, renews = false } = {}) {
    const id = grantKey(key, owner, token);
    for (const other of [...(this.byKey.get(key) ?? [])]) {
      const records = this.watched.get(other);
      if (records.owner === owner || BigInt(records.token) >= BigInt(token)) continue;
      if (records.mode !== 'exclusive' && mode !== 'exclusive') continue;
      this.lose(other, { key, reason: 'superseded', text: `The lock ${key} was lost: another owner was granted it (token ${token})` });
    }
    // `lease`/`leaseEnd`: the grant's lease as this handle set it (a reentry resets it) and when it
    // ends at the latest (counted from the reply); `renews`: a watchdog keeps it renewed.
    const record = { id, lost: null, onLost: null, lease, leaseEnd: Date.now() + lease, renews, released: false };
    const lost = this.recentLosses.get(id);
    if (lost) {
      this.recentLosses.delete(id);
      record.lost = lost;
      return record;
    }
    if (!this.watched.has(id)) {
      // `node`: whose session watches it (a re-watch moves it).
      this.watched.set(id, Object.assign(new Set(), { key, owner, token, mode, extra, node }));
      if (!this.byKey.has(key)) this.byKey.set(key, new Set());
      this.byKey.get(key).add(id);
    }
    this.watched.get(id).add(record);
    return record;
  }

  /**
   * Watches a grant that was not made through this session (FLOCK.ACQUIREALL has no INBOX form):
   * recorded as watch() records one, then moved to the session of its key's node as a re-watch
   * after a session break moves one (a RENEW, a reentrant ACQUIRE ... INBOX, a RELEASE of that
   * hold). Resolves to the record once that session watches the grant, or once it was found lost
   * (`record.lost`).
   */
  async adopt(key, owner, token, mode, options) {
    // Opened first: a session that cannot be opened fails the acquire (which gives the grants
    // back) rather than leave the re-watch retrying until release.
    const { node } = await this.sessionFor(key);
    const record = this.watch(key, owner, token, node, mode, options);
    if (!record.lost) await this._rewatchSoon(record.id);
    return record;
  }

  unwatch(record) {
    const records = this.watched.get(record.id);
    if (!records) return;
    records.delete(record);
    if (records.size === 0) this._forget(record.id, records);
  }

  /**
   * Queues `owner` for `key` through the session: resolves to { token } | { timeout } |
   * { cancelled } | { error }, and to { aborted, token? } when `signal` aborted the wait.
   */
  wait(key, owner, lease, waitMs, extra, signal) {
    const id = waitKey(key, owner);
    if (this.waits.has(id)) {
      return Promise.resolve({ error: new Error(`QUEUED this process already waits for ${key} as this owner`) });
    }
    const rid = randomUUID();
    const deadlineAt = Date.now() + waitMs;
    // A resend (to a new session) waits for the time the wait has left, not its whole timeout.
    const timeout = () => (waitMs === Infinity ? '0' : String(Math.max(1, Math.ceil(deadlineAt - Date.now()))));
    const wait = {
      id,
      key,
      owner,
      rid,
      args: (sid) => ['FLOCK.ACQUIRE', key, owner, String(lease), 'WAIT', timeout(), 'INBOX', sid, ...extra],
      outcome: null,
      cancelled: null,
      // The node and session it was last sent to; `retrying`: it waits to be sent again after a
      // session break, `lastError` the error that keeps it from being sent.
      node: null,
      sentTo: null,
      retrying: false,
      attempts: 0,
      lastError: null,
      timer: null,
      resolve: null,
    };
    const done = new Promise((resolve) => (wait.resolve = resolve));
    // Registered before it is sent: the event can beat the WAITING reply.
    this.waits.set(id, wait);
    this._updateRef();
    if (waitMs !== Infinity) {
      wait.timer = setTimeout(() => this._cancel(wait, 'deadline'), waitMs + DEADLINE_MARGIN_MS);
      wait.timer.unref();
    }
    const onAbort = () => this._cancel(wait, 'abort');
    signal?.addEventListener('abort', onAbort, { once: true });
    this._submit(wait);
    return done.then((outcome) => {
      signal?.removeEventListener('abort', onAbort);
      return wait.cancelled === 'abort' || signal?.aborted ? { ...outcome, aborted: true } : outcome;
    });
  }

  async _submit(wait, to) {
    let node, sid;
    try {
      ({ node, sid } = await this.sessionFor(wait.key, to));
    } catch (err) {
      // No session could be opened: a first wait fails at once; one that was queued before
      // (the session broke mid-wait) keeps retrying until its deadline.
      if (this._closed || wait.sentTo === null) return this._settle(wait, { error: err });
      return this._retry(wait, err);
    }
    if (wait.outcome) return;
    if (wait.cancelled) return this._settle(wait, { cancelled: true });
    wait.node = node;
    wait.sentTo = sid;
    wait.retrying = false;
    wait.attempts = 0;
    let reply;
    try {
      reply = await this.flock._send(this.flock._conn, wait.args(sid), { rid: wait.rid, node });
    } catch (err) {
      const redirect = redirection(err);
      // The key is on another node: sent again (same request ID) with that node's session.
      if (redirect) {
        if (!redirect.pause) return this._submit(wait, redirect.to);
        setTimeout(() => wait.outcome || this._submit(wait), redirect.pause);
        return;
      }
      if (isReplyError(err) && /^NOSESSION/.test(err.message)) {
        // The session ended (its connection closed): its break sends every wait it had again.
        this.ended(node, sid, err);
        if (!wait.outcome && !wait.retrying) this._submit(wait);
        return;
      }
      // (An error reply the client turned into its own error type keeps it as `cause`.)
      if (!isReplyError(err) && !isReplyError(err.cause) && !this._closed) {
        // The server cannot be reached (no reply, even to the resends): the wait tries again
        // until its own deadline, which ends it as a timeout.
        setTimeout(() => wait.outcome || this._submit(wait), RESUBMIT_PAUSE_MS);
        return;
      }
      return this._settle(wait, { error: err });
    }
    if (reply === 'WAITING') {
      // Cancelled while the ACQUIRE was on its way: its CANCEL may have overtaken a resend of it,
      // so send another now that it queues (a second CANCEL answers 0 and changes nothing).
      if (wait.cancelled && !wait.outcome) this._sendCancel(wait);
      return;
    }
    if (reply === null) this._settle(wait, { timeout: true });
    else this._settle(wait, { token: String(reply), node });
  }

  // A wait whose session broke is sent again, after a pause that grows while no session opens.
  _retry(wait, err) {
    if (wait.outcome) return;
    if (wait.cancelled) return this._settle(wait, this._gaveUp(wait, err));
    wait.retrying = true;
    wait.lastError = err;
    const pause = REOPEN_PAUSE_MS[Math.min(wait.attempts++, REOPEN_PAUSE_MS.length - 1)];
    // Referenced: an awaited acquire keeps the process alive.
    setTimeout(() => wait.outcome || this._submit(wait), pause);
  }

  _settle(wait, outcome) {
    if (wait.outcome) {
      // A second answer for one wait (a resend answered after its event): a grant given twice is
      // the same grant (same request ID), nothing to do.
      return;
    }
    wait.outcome = outcome;
    clearTimeout(wait.timer);
    if (this.waits.get(wait.id) === wait) this.waits.delete(wait.id);
    this._updateRef();
    wait.resolve(outcome);
  }

  // An abort or the local deadline: FLOCK.CANCEL from the command connection; the event decides.
  _cancel(wait, why) {
    if (wait.outcome || wait.cancelled) return;
    wait.cancelled = why;
    // Between sessions: it ends here, with the error that kept the session closed, if any (a
    // server restart that outlasted the wait).
    if (wait.retrying) return this._settle(wait, this._gaveUp(wait, wait.lastError));
    // Not sent yet: its send ends it.
    if (wait.sentTo === null) return;
    this._sendCancel(wait);
  }

  // How a cancelled wait ends when the server cannot be reached: its deadline is a timeout (as
  // if the server had answered `timeout`); an abort keeps the error that kept the server away.
  _gaveUp(wait, err) {
    if (wait.cancelled === 'deadline') return { timeout: true };
    return { cancelled: true, error: err ?? undefined };
  }

  _sendCancel(wait) {
    this.flock._send(this.flock._conn, ['FLOCK.CANCEL', wait.key, wait.owner], { noId: true }).catch((err) => {
      // The command connection failed: no event will be asked for; end the wait here (a grant
      // that still arrives for it is given back as unclaimed).
      this._settle(wait, this._gaveUp(wait, err));
    });
  }

  // A node's session connection broke (or a reply said NOSESSION): its waits left their queues on
  // the server; each is sent again to a new session where its key is now (same request IDs, they
  // queue at the tail). Grants it watched are no longer pushed to us: each is checked again and
  // re-watched on a new session (docs/client-protocol.md, "Sessions", point 4).
  _broken(node, conn, err) {
    if (this.nodes.get(node)?.conn === conn) this.nodes.delete(node);
    conn?.close();
    for (const [id, records] of this.watched) if (records.node === node) this._rewatchSoon(id);
    for (const wait of [...this.waits.values()]) if (wait.node === node) this._retry(wait, err);
  }

  // One re-watch per grant at a time (chained), registered at once, so that a release() that
  // starts now waits for it (the holder's RELEASE never falls between its ACQUIRE and RELEASE).
  _rewatchSoon(id) {
    const previous = this.rewatching.get(id) ?? Promise.resolve();
    const next = previous.then(() => this._rewatch(id)).catch(() => {});
    this.rewatching.set(id, next);
    next.then(() => {
      if (this.rewatching.get(id) === next) this.rewatching.delete(id);
    });
    return next;
  }

  /** Resolves when no re-watch of these watch records' grants is under way. */
  async settled(records) {
    await Promise.all(records.map((record) => this.rewatching.get(record.id)));
  }

  /**
   * A held grant whose watch ended with its session: a RENEW (NOTOWNER: it is lost, with the
   * NOTOWNER text), then a reentrant `FLOCK.ACQUIRE key owner lease [mode] INBOX new-sid ID fresh`
   * that moves the watch to the new session, and a RELEASE of that extra hold. The lease is the
   * renewing one (a watchdog), or for a fixed lease the time it has left (counted from when its
   * grant's reply came), never more; none left: lost (expired).
   */
  async _rewatch(id, to) {
    const records = this.watched.get(id);
    let node, sid;
    for (;;) {
      if (this._closed || !this._held(id)) return;
      try {
        ({ node, sid } = await this.sessionFor(records.key, to));
        break;
      } catch {
        // The server cannot be reached: try again later, while the grant is still held.
        await new Promise((resolve) => setTimeout(resolve, REWATCH_RETRY_MS).unref());
      }
    }
    const held = this._held(id);
    if (!held) return;
    const { key, owner, token, extra } = records;
    let lease;
    if (held.some((r) => r.renews)) {
      lease = Math.max(...held.filter((r) => r.renews).map((r) => r.lease));
    } else {
      lease = Math.floor(Math.max(...held.map((r) => r.leaseEnd)) - Date.now());
      if (lease < 1) {
        this.lose(id, { key, reason: 'expired', text: `The lock ${key} was lost: ${LOSS_TEXT.expired}` });
        return;
      }
    }
    const flock = this.flock;
    try {
      await flock._send(flock._conn, ['FLOCK.RENEW', key, owner, String(lease)]);
    } catch (err) {
      if (/^NOTOWNER/.test(err.cause?.message ?? err.message)) {
        const text = err.cause?.message ?? err.message;
        this.lose(id, { key, reason: notOwnerReason(text), text: `The lock ${key} was lost: the server ended it while the session was down (${text})` });
      }
      // Anything else (the server unreachable again): the next session's break re-watches.
      return;
    }
    let reply;
    try {
      reply = await flock._send(flock._conn, ['FLOCK.ACQUIRE', key, owner, String(lease), ...extra, 'INBOX', sid], { node });
    } catch (err) {
      // MOVED or ASK: again with the session of the node it names. NOSESSION: that session's end
      // re-watches again; anything else: nothing more to learn.
      const redirect = redirection(err);
      if (redirect?.pause) await new Promise((resolve) => setTimeout(resolve, redirect.pause).unref());
      if (redirect) return this._rewatch(id, redirect.to);
      return;
    }
    if (reply === null || reply === undefined) {
      this.lose(id, { key, reason: 'unknown', text: `The lock ${key} was lost: it ended before a session could watch it` });
      return;
    }
    // Remembered if refused (Flock#_releaseHolds): the owner's next grant of this token gives it back.
    await flock._releaseHolds([key], owner, [BigInt(reply)]).catch(() => {});
    if (String(reply) !== token) {
      this.lose(id, { key, reason: 'unknown', text: `The lock ${key} was lost: it ended before a session could watch it` });
      return;
    }
    records.node = node;
    this.rewatched++;
  }

  // The watch records of a grant whose handles still hold it (not released), or null.
  _held(id) {
    const records = this.watched.get(id);
    const held = records ? [...records].filter((r) => !r.released && !r.lost) : [];
    return held.length > 0 ? held : null;
  }

  close() {
    this._closed = true;
    for (const { conn } of this.nodes.values()) conn?.close();
    this.nodes.clear();
    for (const wait of [...this.waits.values()]) this._settle(wait, { error: new Error('This Flock was quit while waiting') });
  }
}

// How a NOTOWNER reply says the grant ended, when the server remembers it.
function notOwnerReason(text) {
  if (/lease of this owner ended/.test(text)) return 'expired';
  if (/force-released/.test(text)) return 'forcereleased';
  if (/lock was deleted/.test(text)) return 'deleted';
  return 'unknown';
}

/**
 * Where a Cluster's redirection sends a command that names a session: `MOVED slot host:port`, to
 * that node now ({ to }); `ASK` (its slot is migrating; the node that has the key accepts it only
 * after ASKING, for one command), to the key's node as the slot map says after a pause
 * ({ pause }), until the migration ends in a MOVED. Undefined for any other error.
 */
function redirection(err) {
  if (!isReplyError(err)) return undefined;
  const [code, , address] = (err.cause?.message ?? err.message).split(' ');
  if (code === 'MOVED') return { to: address };
  if (code === 'ASK') return { pause: RESUBMIT_PAUSE_MS };
  return undefined;
}

module.exports = { Session, FlockEventError, notOwnerReason, redirection };
