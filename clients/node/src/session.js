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

const { isReplyError, timeboxed } = require('./adapter');
const { CommandTimeoutError } = require('./errors');
const { schedule, sweep } = require('./deadlines');
const { Grant, grantId, pairId, loss } = require('./grant');
const { newRequestId } = require('./ids');
const { PROTOCOL, margin, now } = require('./protocol');

// The local deadline of a wait is its WAIT timeout plus this margin (docs/client-protocol.md,
// "Timeouts and cancellation"); then the client sends FLOCK.CANCEL itself (the server's `timeout`
// event should have come long before).
const DEADLINE_MARGIN_MS = 2000;
// Pauses between attempts to send a wait again whose session could not be reopened (a server restart).
const REOPEN_PAUSE_MS = [0, 50, 100, 250, 500, 1000];
const RECENT_LOSSES = 1000;
// Grants that answered a resend of their wait, remembered this many (see `told`).
const TOLD = 1024;
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

/** One wait of Session#wait: `owner` queued for `key` for `waitMs` (Infinity: no limit); `id`: pairId(key, owner). */
class Wait {
  constructor(id, key, owner, lease, waitMs, extra) {
    this.id = id;
    this.key = key;
    this.owner = owner;
    this.rid = newRequestId();
    this.lease = lease;
    this.extra = extra;
    this.waitMs = waitMs;
    // When it ends (by Date.now(): what a resend's WAIT has left), and its local deadline (then
    // the client cancels it), armed once it may be queued or is sent again (not for a grant at once).
    this.deadlineAt = Date.now() + waitMs;
    this.localDeadline = this.deadlineAt + DEADLINE_MARGIN_MS;
    // When its ACQUIRE was first sent: a direct grant's lease counts from then (a resend of the
    // same request ID can be answered with a grant the first one made).
    this.firstSent = null;
    // Whether its latest send repeats an earlier one (same request ID).
    this.resent = false;
    this.outcome = null;
    this.cancelled = null;
    // Whether its FLOCK.CANCEL was answered, and the grace after which it closes the session.
    this.cancelAnswered = false;
    this.grace = null;
    // The node and session it was last sent to; `retrying`: it waits to be sent again after a
    // session break, `lastError` the error that keeps it from being sent.
    this.node = null;
    this.sentTo = null;
    this.retrying = false;
    this.attempts = 0;
    this.lastError = null;
    this.timer = null;
    this.resolve = null;
  }

  /** Its ACQUIRE through session `sid`: a resend (to a new session) waits for the time it has left, not its whole timeout. */
  args(sid) {
    const timeout = this.waitMs === Infinity ? '0' : String(Math.max(1, Math.ceil(this.deadlineAt - Date.now())));
    return ['FLOCK.ACQUIRE', this.key, this.owner, String(this.lease), 'WAIT', timeout, 'INBOX', sid, ...this.extra];
  }
}

class Session {
  constructor(flock) {
    this.flock = flock;
    // The session of each node (an entry: { node, conn, id, opening, timeout, deadline, broken });
    // a broken entry leaves the map, and the next wait there opens a new one.
    this.nodes = new Map();
    this._closed = false;
    // Whether the session connections are referenced now (_updateRef).
    this._referenced = false;
    // Pending waits by (key, owner): an owner waits once per lock.
    this.waits = new Map();
    // The watched grants (Grant) of each key, by key: a Grant, or an array of several. Events
    // find their grant here too: a Map by grant ID as well cost each acquire an ID string,
    // hashed, and an entry that joins and leaves a second Map.
    this.byKey = new Map();
    // Losses of grants nobody watches yet (a short lease lost before its reply was read), by
    // (key, owner, token); the oldest are forgotten beyond RECENT_LOSSES.
    this.recentLosses = new Map();
    // (key, owner, token) of the newest grants that answered a wait sent again (same request
    // ID: the server's record of it answers): the `granted` event of such a grant can be on its
    // way already, and is dropped when it comes. It is neither the owner's next wait's nor a
    // grant nobody waits for: its holder has it, or released it and may hold another since.
    this.told = new Set();
    // Re-watches under way, by grant.
    this.rewatching = new Map();
    // Grants whose watch moved to a session after their grant (tests): re-watched after a session
    // break or a slot move, or adopted.
    this.rewatched = 0;
  }

  /** `node`'s open session (its entry), opening one (a connection of its own and FLOCK.SESSION) if none is open. */
  ensure(node) {
    if (this._closed) return Promise.reject(new Error('This Flock was quit'));
    let entry = this.nodes.get(node);
    if (!entry) {
      entry = { node, conn: null, id: null, opening: null, timeout: 0, deadline: null, broken: false };
      this.nodes.set(node, entry);
    }
    if (entry.id !== null) return Promise.resolve(entry);
    if (!entry.opening) {
      entry.opening = this._open(entry).finally(() => {
        entry.opening = null;
      });
    }
    return entry.opening;
  }

  /** The open session (its entry: `node`, `id`) of `node`, by default of the node that holds `key` now. */
  async sessionFor(key, node) {
    return this.openFor(key, node) ?? this._sessionFor(key, node);
  }

  /** What sessionFor() resolves to when `node`'s (or `key`'s) session is open and known now, else undefined. */
  openFor(key, node) {
    node ??= this.flock._conn.nodeNow(key);
    const entry = node === undefined || this._closed ? undefined : this.nodes.get(node);
    return entry?.id ? entry : undefined;
  }

  async _sessionFor(key, node) {
    return this.ensure(node ?? (await this.flock._conn.nodeOf(key)));
  }

  /** `node` answered NOSESSION for `sid`: if that is still its session, the session ended. */
  ended(node, sid, err) {
    const entry = this.nodes.get(node);
    if (entry?.id === sid) this._broken(entry, err);
  }

  /**
   * Opens the session: a connection of its own, then `FLOCK.SESSION [TIMEOUT ms] WITHTIMEOUT`,
   * whose reply names the timeout T the session keeps; its deadline is counted from the send of
   * the one answered. FLOCK.SESSION has a command timeout and is resent (on the same connection
   * it names the same session), and the connection must open within as long as all of them take:
   * a partition never holds the open for ever.
   */
  async _open(entry) {
    const flock = this.flock;
    const commandTimeout = flock._commandTimeout();
    const resends = flock.settings.resends;
    const connecting = flock._conn.session(entry.node);
    let conn;
    try {
      conn = await timeboxed(connecting, commandTimeout * (resends + 1), 'opening a session connection');
    } catch (err) {
      connecting.then((late) => late.close(), () => {});
      throw err;
    }
    // Referenced while it connects: an awaited acquire keeps the process alive.
    conn.setRef(true);
    const asked = flock.settings.sessionTimeoutMs;
    const args = ['FLOCK.SESSION', ...(asked ? ['TIMEOUT', String(asked)] : []), 'WITHTIMEOUT'];
    let reply, sent;
    for (let attempt = 0; ; attempt++) {
      sent = now();
      try {
        reply = await conn.send(args, undefined, commandTimeout);
        break;
      } catch (err) {
        if (isReplyError(err) || attempt >= resends || conn.closed || this._closed) {
          conn.close();
          throw err;
        }
      }
    }
    if (this._closed) {
      conn.close();
      throw new Error('This Flock was quit');
    }
    const [id, timeout] = reply;
    entry.conn = conn;
    entry.id = String(id);
    entry.timeout = Number(timeout);
    flock._knownSessionTimeout = entry.timeout;
    entry.deadline = schedule(sent + entry.timeout - margin(entry.timeout), () => this._broken(entry, null, 'unconfirmed'));
    conn.setRef(this._referenced);
    this._read(entry);
    return entry;
  }

  // The session connections keep the process alive while a wait is pending (looked at once one is
  // queued, and when one ends: a wait's ACQUIRE keeps it alive while it is in flight), and only then.
  _updateRef() {
    const waiting = this.waits.size > 0;
    if (waiting === this._referenced) return;
    this._referenced = waiting;
    for (const { conn } of this.nodes.values()) conn?.setRef(waiting);
  }

  /**
   * The reader: FLOCK.INBOX reads that wait at most T/4 (the server answers nil by then: the
   * heartbeat), each with a socket timeout at the session's deadline. A reply moves the deadline
   * to the read's send time + T - m; none by the deadline ends the session here. A read waits
   * less than T/4 when the deadline is nearer than twice that (a slow reply, a slow open), so that
   * its answer comes back well before it.
   */
  async _read(entry) {
    const { conn } = entry;
    const beat = Math.floor(entry.timeout / PROTOCOL.heartbeatFraction);
    for (;;) {
      const sent = now();
      const left = entry.deadline.at - sent;
      const wait = Math.max(1, Math.min(beat, Math.floor(left / 2)));
      let events;
      try {
        events = await conn.send(['FLOCK.INBOX', String(wait)], undefined, left);
      } catch (err) {
        if (entry.broken) return;
        // Demotion on Redis 7.0 / 8.2 answers a blocked INBOX with UNBLOCKED; the events stay.
        if (isReplyError(err) && /^UNBLOCKED/.test(err.message)) continue;
        // No reply by the deadline (its timer may run a little before the monotonic clock says so).
        this._broken(entry, err, err instanceof CommandTimeoutError ? 'unconfirmed' : undefined);
        return;
      }
      // The reply confirms the session until the read's send time + T - m: the server renewed
      // it when the read came, and answered, so it lived on all along. Then every other deadline
      // that passed while the reply was on its way (or the process was paused) is a loss, before
      // this reply's events are handed out.
      const before = entry.deadline.at;
      const confirmed = sent + entry.timeout - margin(entry.timeout);
      if (confirmed > before) entry.deadline.move(confirmed);
      sweep();
      if (entry.broken) return;
      if (Array.isArray(events)) for (const event of events) this._event(entry, event, sent, before);
    }
  }

  // One event of an INBOX reply, read by a read sent at `sent`; `before`: the session's deadline
  // as the previous read confirmed it.
  _event(entry, event, sent, before) {
    const { node } = entry;
    const [kind, key, owner, token, detail] = event.map((v) => (v === null || v === undefined ? '' : String(v)));
    if (kind === 'lost') {
      const grant = this._watched(key, owner, token);
      const lost = loss(key, detail);
      if (!grant) {
        this.recentLosses.set(grantId(key, owner, token), lost);
        if (this.recentLosses.size > RECENT_LOSSES) this.recentLosses.delete(this.recentLosses.keys().next().value);
        return;
      }
      grant.lose(lost);
      return;
    }
    if (kind === 'moved') {
      // Not a loss: the grant went with its key to another node (a Cluster slot move) and is
      // held there; watched again through a session of that node (a MOVED leads the re-watch
      // there). A session grant is held there with the session's timeout as its lease, counted
      // from when the server last heard of the session before the move: no earlier than the
      // previous read was sent, so the deadline that read confirmed stays its deadline.
      const grant = this._watched(key, owner, token);
      if (!grant) return;
      if (grant.session) grant.leaseUntil(before);
      this._rewatchSoon(grant);
      return;
    }
    if (kind === 'granted' && this.told.size > 0 && this.told.has(grantId(key, owner, token))) return;
    const wait = this.waits.get(pairId(key, owner));
    if (!wait) {
      // A grant nobody waits for any more (its wait gave up): give it back.
      if (kind === 'granted') this.flock._releaseHolds([key], owner, [BigInt(token)]).catch(() => {});
      return;
    }
    if (kind === 'granted') {
      // The lease left when this read answered (none: a session grant), counted from its send.
      const life = detail === '' ? { entry } : { until: sent + Number(detail) - margin(wait.lease) };
      this._settle(wait, { token, node, life });
    } else if (kind === 'timeout') this._settle(wait, { timeout: true });
    else if (kind === 'cancelled') this._settle(wait, { cancelled: true });
    else if (kind === 'error' && /^UNBLOCKED/.test(detail) && !wait.cancelled && !this._closed) {
      // The node stopped being a master (a failover) and dropped the wait from its queue: sent
      // again (same request ID) to the key's master now, as after a session break.
      this._retry(wait, new FlockEventError(detail));
    } else if (kind === 'error') this._settle(wait, { error: new FlockEventError(detail) });
  }

  // The watched grant (key, owner, token), if any.
  _watched(key, owner, token) {
    const of = this.byKey.get(key);
    if (Array.isArray(of)) return of.find((grant) => grant.owner === owner && grant.token === token);
    return of?.owner === owner && of.token === token ? of : undefined;
  }

  // Every watched grant.
  _allWatched() {
    return [...this.byKey.values()].flat();
  }

  _forget(grant) {
    const of = this.byKey.get(grant.key);
    if (of === grant) this.byKey = without(this.byKey, grant.key);
    else if (Array.isArray(of) && of.includes(grant)) {
      const left = of.filter((other) => other !== grant);
      this.byKey.set(grant.key, left.length === 1 ? left[0] : left);
    }
  }

  /**
   * Watches a grant (`mode`: exclusive, shared or semaphore) for a pushed loss, and returns a new
   * handle of it (`plan`: session, watchdog or fixed; `lease`: the one asked for); `life` is how
   * long the server holds it as this reply says: { entry } (a session grant) or { until }.
   * `handle.onLost` is called (at once if already lost). A grant of this key to another owner
   * that excludes a grant this process watches (either is exclusive, its token is newer) proves
   * that one ended: it is reported lost now, before the new grant reaches its caller, even if the
   * server's `lost` event is not read yet (the new grant came as a direct reply, not through the
   * inbox).
   */
  watch(key, owner, token, node, mode, { extra = [], plan, lease, life }) {
    const others = this.byKey.get(key);
    if (others !== undefined) for (const grant of Array.isArray(others) ? [...others] : [others]) {
      if (grant.owner === owner || BigInt(grant.token) >= BigInt(token)) continue;
      if (grant.mode !== 'exclusive' && mode !== 'exclusive') continue;
      grant.lose(loss(key, 'notowner', `another owner was granted it (token ${token})`));
    }
    // A grant ID is made only when a loss may be waiting for it.
    const id = this.recentLosses.size > 0 ? grantId(key, owner, token) : undefined;
    const lost = id && this.recentLosses.get(id);
    if (lost) {
      this.recentLosses.delete(id);
      const gone = new Grant(key, owner, token, { mode, extra, node });
      gone.lose(lost);
      return gone.handle(plan, lease);
    }
    let grant = this._watched(key, owner, token);
    if (!grant) {
      // `node`: whose session watches it (a re-watch moves it).
      grant = new Grant(key, owner, token, { mode, extra, node });
      grant.onForget = () => this._forget(grant);
      const of = this.byKey.get(key);
      this.byKey.set(key, of === undefined ? grant : Array.isArray(of) ? [...of, grant] : [of, grant]);
    }
    const handle = grant.handle(plan, lease);
    // What this reply says of the grant is what the server holds now, for every handle of it.
    if (life.entry) grant.livesWith(life.entry);
    else grant.leaseUntil(life.until);
    return handle;
  }

  /**
   * Watches a grant that was not made through this session (FLOCK.ACQUIREALL has no INBOX form):
   * recorded as watch() records one, then moved to the session of its key's node as a re-watch
   * after a session break moves one (a RENEW, a reentrant ACQUIRE ... INBOX, a RELEASE of that
   * hold; a session grant's with lease 0, so that it lives with the session). Resolves to the
   * handle once that session watches the grant, or once it was found lost (`handle.lost`).
   */
  async adopt(key, owner, token, mode, options) {
    // Opened first: a session that cannot be opened fails the acquire (which gives the grants
    // back) rather than leave the re-watch retrying until release.
    const { node } = await this.sessionFor(key);
    const handle = this.watch(key, owner, token, node, mode, options);
    if (!handle.lost) await this._rewatchSoon(handle.grant);
    return handle;
  }

  /**
   * Queues `owner` for `key` (`id`: pairId(key, owner)) through the session: resolves to
   * { token, node, life } | { timeout } | { cancelled } | { error }, and to { aborted, token? }
   * when `signal` aborted the wait.
   */
  wait(id, key, owner, lease, waitMs, extra, signal) {
    if (this.waits.has(id)) {
      return Promise.resolve({ error: new Error(`QUEUED this process already waits for ${key} as this owner`) });
    }
    const wait = new Wait(id, key, owner, lease, waitMs, extra);
    // Sent first, then registered: nothing that is read (its reply, its event, which can beat the
    // WAITING reply) is handled before this returns, and a free lock's reply comes sooner.
    this._submit(wait);
    const done = new Promise((resolve) => (wait.resolve = resolve));
    this.waits.set(id, wait);
    if (!signal) return done;
    const onAbort = () => this._cancel(wait, 'abort');
    signal.addEventListener('abort', onAbort, { once: true });
    return done.then((outcome) => {
      signal.removeEventListener('abort', onAbort);
      return wait.cancelled === 'abort' || signal.aborted ? { ...outcome, aborted: true } : outcome;
    });
  }

  // The wait's local deadline: then the client sends FLOCK.CANCEL itself (or ends a wait that
  // could not be sent again by then).
  _armDeadline(wait) {
    if (wait.timer || wait.outcome || wait.localDeadline === Infinity) return;
    wait.timer = setTimeout(() => this._cancel(wait, 'deadline'), Math.max(0, wait.localDeadline - Date.now()));
    wait.timer.unref();
  }

  // Sends the wait through the session of its key's node (of node `to` when given), opening one
  // if none is open. Not async: an acquire's every hop costs an allocation and a turn.
  _submit(wait, to) {
    const open = this.openFor(wait.key, to);
    if (open) return this._sendWait(wait, open);
    this._sessionFor(wait.key, to).then(
      (entry) => this._sendWait(wait, entry),
      (err) => {
        // No session could be opened: a first wait fails at once; one that was queued before
        // (the session broke mid-wait) keeps retrying until its deadline.
        if (this._closed || wait.sentTo === null) this._settle(wait, { error: err });
        else this._retry(wait, err);
      },
    );
  }

  // The wait's ACQUIRE ... INBOX through session `entry`.
  _sendWait(wait, entry) {
    if (wait.outcome) return;
    if (wait.cancelled) return this._settle(wait, { cancelled: true });
    wait.node = entry.node;
    wait.sentTo = entry.id;
    wait.retrying = false;
    wait.attempts = 0;
    wait.resent = wait.firstSent !== null;
    wait.firstSent ??= now();
    this.flock._send(this.flock._conn, wait.args(entry.id), { rid: wait.rid, node: entry.node }).then(
      (reply) => this._replied(wait, entry, reply),
      (err) => this._unsent(wait, entry, err),
    );
  }

  // The wait's ACQUIRE got no reply, or an error.
  _unsent(wait, { node, id: sid }, err) {
    const redirect = redirection(err);
    // The key is on another node: sent again (same request ID) with that node's session.
    if (redirect) {
      if (!redirect.pause) return this._submit(wait, redirect.to);
      this._armDeadline(wait);
      setTimeout(() => wait.outcome || this._submit(wait), redirect.pause);
      return;
    }
    if (isReplyError(err) && /^NOSESSION/.test(err.message)) {
      // The session ended (its connection closed): its end sends every wait it had again.
      this.ended(node, sid, err);
      if (!wait.outcome && !wait.retrying) this._submit(wait);
      return;
    }
    // (An error reply the client turned into its own error type keeps it as `cause`.)
    if (!isReplyError(err) && !isReplyError(err.cause) && !this._closed) {
      // The server cannot be reached (no reply, even to the resends): the wait tries again
      // until its own deadline, which ends it as a timeout.
      this._armDeadline(wait);
      setTimeout(() => wait.outcome || this._submit(wait), RESUBMIT_PAUSE_MS);
      return;
    }
    return this._settle(wait, { error: err });
  }

  // The reply to the wait's ACQUIRE through session `entry`.
  _replied(wait, entry, reply) {
    if (reply === 'WAITING') {
      // Queued: from now on only the session's connection brings its outcome (until then the
      // command's kept the process alive).
      this._updateRef();
      this._armDeadline(wait);
      // Cancelled while the ACQUIRE was on its way: its CANCEL may have overtaken a resend of it,
      // so send another now that it queues (a second CANCEL answers 0 and changes nothing).
      if (wait.cancelled && !wait.outcome) this._sendCancel(wait);
      return;
    }
    if (reply === null) this._settle(wait, { timeout: true });
    else if (wait.lease === 0 && entry.broken) {
      // A session grant of a session that ended while the reply was on its way: it ended with
      // it. The session's end has sent the wait again (same request ID) to a new session.
    } else {
      const life = wait.lease === 0 ? { entry } : { until: wait.firstSent + wait.lease - margin(wait.lease) };
      const token = String(reply);
      if (wait.resent && !wait.outcome) {
        this.told.add(grantId(wait.key, wait.owner, token));
        if (this.told.size > TOLD) this.told.delete(this.told.values().next().value);
      }
      this._settle(wait, { token, node: entry.node, life });
    }
  }

  // A wait whose session broke is sent again, after a pause that grows while no session opens.
  _retry(wait, err) {
    if (wait.outcome) return;
    if (wait.cancelled) return this._settle(wait, this._gaveUp(wait, err));
    wait.retrying = true;
    wait.lastError = err;
    this._armDeadline(wait);
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
    clearTimeout(wait.grace);
    if (this.waits.get(wait.id) === wait) this.waits = without(this.waits, wait.id);
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

  // The event decides how a cancelled wait ends. A CANCEL that got no answer, and no event within
  // the cancel grace, closes the wait's session: its waits are sent again on a new one, and this
  // one, cancelled, ends then.
  _sendCancel(wait) {
    const { node, sentTo } = wait;
    if (!wait.grace) {
      wait.grace = setTimeout(() => {
        const entry = this.nodes.get(node);
        if (!wait.outcome && !wait.cancelAnswered && entry?.id === sentTo) {
          this._broken(entry, new Error(`FLOCK.CANCEL of ${wait.key} got no answer within ${PROTOCOL.cancelGraceMs} ms`));
        }
      }, PROTOCOL.cancelGraceMs);
      wait.grace.unref();
    }
    this.flock._send(this.flock._conn, ['FLOCK.CANCEL', wait.key, wait.owner], { noId: true }).then(
      () => (wait.cancelAnswered = true),
      () => {},
    );
  }

  /**
   * A node's session ended: its connection broke, a reply said NOSESSION, or its deadline passed
   * unconfirmed (`reason`). Its session grants are lost (`unconfirmed` past the deadline, else
   * `sessionended`) and never taken again; its waits left their queues on the server, and each is
   * sent again to a new session where its key is now (same request IDs, they queue at the tail,
   * with the time they have left); grants with a lease of their own it watched are no longer
   * pushed to us: each is checked and re-watched on a new session (docs/client-protocol.md,
   * "Sessions", point 4).
   */
  _broken(entry, err, reason) {
    if (entry.broken) return;
    entry.broken = true;
    const { node } = entry;
    if (this.nodes.get(node) === entry) this.nodes.delete(node);
    const pastDeadline = entry.deadline !== null && entry.deadline.at <= now();
    entry.deadline?.cancel();
    entry.conn?.close();
    reason ??= pastDeadline ? 'unconfirmed' : 'sessionended';
    const why = reason === 'unconfirmed' ? `no FLOCK.INBOX reply within its session timeout (${entry.timeout} ms, less the margin)` : err?.message;
    for (const grant of this._allWatched()) if (grant.session === entry) grant.lose(loss(grant.key, reason, why));
    // (Those just lost are no longer watched.)
    for (const grant of this._allWatched()) if (grant.node === node && !grant.session) this._rewatchSoon(grant);
    for (const wait of [...this.waits.values()]) if (wait.node === node) this._retry(wait, err ?? new Error(why));
  }

  // One re-watch per grant at a time (chained), registered at once, so that a release() that
  // starts now waits for it (the holder's RELEASE never falls between its ACQUIRE and RELEASE).
  _rewatchSoon(grant) {
    const previous = this.rewatching.get(grant) ?? Promise.resolve();
    const next = previous.then(() => this._rewatch(grant)).catch(() => {});
    this.rewatching.set(grant, next);
    next.then(() => {
      if (this.rewatching.get(grant) === next) this.rewatching.delete(grant);
    });
    return next;
  }

  /** Resolves when no re-watch of these handles' grants is under way. */
  async settled(handles) {
    await Promise.all(handles.map((handle) => this.rewatching.get(handle.grant)));
  }

  /**
   * A held grant whose watch ended with its session (or moved with its key, or never was on a
   * session: adopted): a RENEW (NOTOWNER: it is lost, with the NOTOWNER text), then a reentrant
   * `FLOCK.ACQUIRE key owner lease [mode] INBOX new-sid ID fresh` that moves the watch to the new
   * session, and a RELEASE of that extra hold. The lease: a session grant's is 0 (it lives with
   * the new session; the RENEW gives it T meanwhile), a watchdog's its lease, and a fixed one what
   * is left of it (counted from the send that set it), never more; none left: lost (expired).
   * Each command's timeout is the grant's deadline.
   */
  async _rewatch(grant, to) {
    let entry;
    for (;;) {
      if (this._closed || !this._held(grant)) return;
      try {
        entry = await this.sessionFor(grant.key, to);
        break;
      } catch {
        // The server cannot be reached: try again later, while the grant is still held.
        await new Promise((resolve) => setTimeout(resolve, REWATCH_RETRY_MS).unref());
      }
    }
    const { node, id: sid } = entry;
    const held = this._held(grant);
    if (!held) return;
    const { key, owner, token, extra } = grant;
    const toSession = held.some((h) => h.plan === 'session');
    const renewed = toSession || held.some((h) => h.plan === 'watchdog');
    let lease;
    if (toSession) lease = entry.timeout;
    else if (renewed) lease = Math.max(...held.filter((h) => h.plan === 'watchdog').map((h) => h.lease));
    else {
      // What is left of the lease the server holds: the deadline is m before its end at the earliest.
      const fixed = Math.max(...held.map((h) => h.lease));
      lease = Math.floor(grant.until + margin(fixed) - now());
      if (lease < 1) return grant.lose(loss(key, 'expired', 'no time was left of its lease when a new session could watch it'));
    }
    const flock = this.flock;
    const until = () => grant.until;
    const sent = now();
    try {
      await flock._send(flock._conn, ['FLOCK.RENEW', key, owner, String(lease)], { until });
    } catch (err) {
      const text = err.cause?.message ?? err.message;
      if (/^NOTOWNER/.test(text)) grant.lose(loss(key, 'notowner', `the server ended it while the session was down (${text})`));
      // Anything else (the server unreachable again): the next session's break re-watches.
      return;
    }
    if (renewed) grant.leaseUntil(sent + lease - margin(lease));
    let reply;
    try {
      reply = await flock._send(flock._conn, ['FLOCK.ACQUIRE', key, owner, toSession ? '0' : String(lease), ...extra, 'INBOX', sid], { node, until });
    } catch (err) {
      // MOVED or ASK: again with the session of the node it names. NOSESSION: that session's end
      // re-watches again; anything else: nothing more to learn.
      const redirect = redirection(err);
      if (redirect?.pause) await new Promise((resolve) => setTimeout(resolve, redirect.pause).unref());
      if (redirect) return this._rewatch(grant, redirect.to);
      return;
    }
    const same = reply !== null && reply !== undefined && String(reply) === token;
    if (same) {
      if (toSession) grant.livesWith(entry);
      grant.node = node;
    }
    // Remembered if refused (Flock#_releaseHolds): the owner's next grant of this token gives it back.
    if (reply !== null && reply !== undefined) await flock._releaseHolds([key], owner, [BigInt(reply)]).catch(() => {});
    // Counted once the extra hold is given back: the server's hold count is the holder's again.
    if (same) this.rewatched++;
    else grant.lose(loss(key, 'notowner', 'it ended before a new session could watch it'));
  }

  // The handles that still hold a grant (not released), or null.
  _held(grant) {
    if (!grant || grant.lost) return null;
    const held = grant.handles.filter((h) => !h.released);
    return held.length > 0 ? held : null;
  }

  /** Ends every wait and session: the session grants end with their sessions on the server, and are reported lost. */
  close() {
    this._closed = true;
    for (const wait of [...this.waits.values()]) this._settle(wait, { error: new Error('This Flock was quit while waiting') });
    for (const entry of [...this.nodes.values()]) this._broken(entry, new Error('This Flock was quit'), 'sessionended');
    this.nodes.clear();
  }
}

/**
 * `map` without `key`: a new Map when `key` was its last entry. V8 allocates the new table of a
 * Map that empties where the Map lives, so a long-lived Map that an entry joins and leaves (a
 * wait, a hold count, a watched grant: each acquire's) would leave old-space garbage every time,
 * which only a full GC (a pause of milliseconds) collects; a new Map is young garbage.
 */
function without(map, key) {
  if (map.size === 1 && map.has(key)) return new Map();
  map.delete(key);
  return map;
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

module.exports = { Session, FlockEventError, redirection, without };
