'use strict';

const { randomUUID } = require('node:crypto');
const { setTimeout: delay } = require('node:timers/promises');
const { adapt, isReplyError } = require('./adapter');
const { Session, notOwnerReason, redirection } = require('./session');
const {
  LockNotHeldError,
  LockBusyError,
  LockLostError,
  AbortError,
  LockUpgradeError,
  LockDeadlockError,
  LockModeError,
  LockNotDurableError,
} = require('./errors');

const DEFAULTS = Object.freeze({
  // Watchdog lease when no lease is given (Redisson's lockWatchdogTimeout); renewed every third.
  watchdogLease: 30000,
  // How long acquire() queues: redlock's default retry window (10 retries x 200 ms).
  wait: 2000,
  // Resends of one command (same request ID) after lost replies.
  resends: 3,
  // Waits go through the process's session (one connection for every wait, pushed losses);
  // false: each wait blocks a connection of its own (FLOCK.ACQUIRE ... WAIT), no pushed losses.
  sessions: true,
  // Durable grants (docs/client-protocol.md, "Durable grants"): a grant counts only once this
  // many replicas acknowledged it (RENEW then WAIT on the key's node); 0: off.
  durableReplicas: 0,
  // WAIT's bound in ms (Redisson's slavesSyncTimeout).
  durableTimeout: 1000,
});
// Connections kept open per node for durable grants' WAIT (each blocks its connection meanwhile).
const IDLE_DURABLE = 4;
// Blocking connections kept open for the next wait; more are closed when their wait ends.
const IDLE_BLOCKING = 4;
// CLIENT UNBLOCK finds nothing to unblock while the WAIT is still on its way to the server.
const UNBLOCK_TRIES = 50;
const UNBLOCK_PAUSE_MS = 20;
// Stale holds (docs/client-protocol.md, the end of "Durable grants"; Flock#_dropStale), for
// every Flock of the process (an owner may acquire through several, as with different settings):
// the token of each (key, owner)'s last release that left no hold (its reply 0) or that failed
// (refused, or its reply lost), the oldest forgotten beyond REMEMBERED_RELEASES; and the holds of
// each (key, owner) that the process's locks have and have not released.
const REMEMBERED_RELEASES = 1024;
const lastReleases = new Map();
const holding = new Map();

function durableOf(opts, fallback) {
  const replicas = opts.durableReplicas ?? fallback.durableReplicas;
  const timeout = opts.durableTimeout ?? fallback.durableTimeout;
  if (!Number.isSafeInteger(replicas) || replicas < 0) throw new RangeError(`durableReplicas must be an integer >= 0, got ${replicas}`);
  // WAIT 0 would wait without a bound.
  if (!Number.isSafeInteger(timeout) || timeout < 1) throw new RangeError(`durableTimeout must be an integer >= 1 (ms), got ${timeout}`);
  return { replicas, timeout };
}

function integerMs(value, what) {
  if (!Number.isSafeInteger(value)) throw new Error(`${what} must be an integer value in milliseconds.`);
  if (value < 0) throw new RangeError(`${what} must not be negative, got ${value}`);
  return value;
}

/** redlock settings name a retry window as retryCount x retryDelay; FLOCK queues for that long instead. */
function waitOf(settings, fallback) {
  if (settings.wait !== undefined) return settings.wait === Infinity ? Infinity : integerMs(settings.wait, 'wait');
  if (settings.retryCount === undefined) return fallback;
  if (settings.retryCount === -1) return Infinity;
  return integerMs(settings.retryCount * (settings.retryDelay ?? 200), 'retryCount x retryDelay');
}

// FLOCK's limit on a semaphore's m (and so on n).
const MAX_PERMITS = 2 ** 32 - 1;

function permitCount(value, what) {
  if (!Number.isSafeInteger(value) || value < 1 || value > MAX_PERMITS) {
    throw new RangeError(`${what} must be an integer in 1..${MAX_PERMITS}, got ${value}`);
  }
  return value;
}

/**
 * The mode of a grant and the FLOCK.ACQUIRE arguments that ask for it: exclusive (none), the read
 * side of a read-write lock (`shared: true`: SHARED) or `permits` of a semaphore of `limit`.
 */
function modeOf(opts) {
  const semaphore = opts.permits !== undefined || opts.limit !== undefined;
  if (opts.shared && semaphore) throw new TypeError('shared and permits/limit exclude each other');
  if (opts.shared) return { mode: 'shared', permits: 0, args: ['SHARED'] };
  if (!semaphore) return { mode: 'exclusive', permits: 0, args: [] };
  if (opts.limit === undefined) throw new TypeError('permits needs the semaphore\'s limit');
  const limit = permitCount(opts.limit, 'limit');
  const permits = permitCount(opts.permits ?? 1, 'permits');
  if (permits > limit) throw new RangeError(`permits (${permits}) must not exceed limit (${limit})`);
  return { mode: 'semaphore', permits, args: ['PERMITS', String(permits), 'LIMIT', String(limit)] };
}

function keysOf(resources) {
  const keys = typeof resources === 'string' ? [resources] : [...resources];
  if (keys.length === 0) throw new TypeError('acquire needs at least one resource (key)');
  for (const key of keys) if (typeof key !== 'string') throw new TypeError('resources must be strings');
  if (new Set(keys).size !== keys.length) throw new TypeError('resources must not repeat a key');
  return keys;
}

function abortError(signal) {
  return new AbortError('The lock wait was aborted', { cause: signal.reason });
}

/**
 * A FLOCK lock service over one ioredis or node-redis client. Each acquire() gets its own owner
 * (a UUID), so two acquires of one key exclude each other, also within one process; pass
 * `owner: lock.owner` to re-enter on purpose. Settings: watchdogLease, wait, resends, sessions,
 * nodeOptions, and durableReplicas / durableTimeout (durable grants: each grant confirmed by that
 * many replicas, or given back with LockNotDurableError; also per acquire).
 */
class Flock {
  constructor(client, settings = {}) {
    if (Array.isArray(client)) {
      if (client.length !== 1) {
        throw new Error('FLOCK locks live on one Redis server (not a Redlock quorum): give exactly one client');
      }
      client = client[0];
    }
    const durable = durableOf(settings, DEFAULTS);
    this.settings = Object.freeze({
      watchdogLease: integerMs(settings.watchdogLease ?? DEFAULTS.watchdogLease, 'watchdogLease'),
      wait: waitOf(settings, DEFAULTS.wait),
      resends: settings.resends ?? DEFAULTS.resends,
      sessions: settings.sessions ?? DEFAULTS.sessions,
      durableReplicas: durable.replicas,
      durableTimeout: durable.timeout,
    });
    this._conn = adapt(client, { nodeOptions: settings.nodeOptions });
    if (!this.settings.sessions && !this._conn.blocking) {
      throw new TypeError('sessions: false (a blocked connection per wait) needs a single-server client or ioredis with sentinels');
    }
    this._idle = [];
    // Idle connections for durable grants' WAIT, by node.
    this._durableIdle = new Map();
    this._session = new Session(this);
  }

  /**
   * Acquires `resources` (a key or keys; several are taken in sorted order so that overlapping sets
   * cannot deadlock). Either `acquire(resources, {lease, wait, signal, owner})` or redlock's
   * `acquire(resources, duration, settings)`. Without a lease, a watchdog keeps a
   * `watchdogLease` lease renewed until release().
   */
  async acquire(resources, durationOrOptions, settings) {
    return this._acquire(resources, durationOrOptions, settings);
  }

  /**
   * Runs `routine(signal)` while holding `resources`, renewing the lease automatically; `signal`
   * aborts (with `signal.error`) if the lock is lost. Releases when the routine settles.
   * Shapes: using(resources, routine), using(resources, options, routine) (a watchdog lease),
   * using(resources, duration, routine), using(resources, duration, settings, routine).
   */
  async using(resources, ...rest) {
    const routine = rest.pop();
    if (typeof routine !== 'function') throw new TypeError('using needs a routine(signal) as its last argument');
    const [duration, settings = {}] = typeof rest[0] === 'object' ? [undefined, ...rest] : rest;
    const options = { ...settings };
    if (duration !== undefined) {
      options.lease = duration;
      options.renew = true;
    }
    const lock = await this._acquire(resources, options);
    let failed = true;
    try {
      const value = await routine(lock.signal);
      failed = false;
      return value;
    } finally {
      await lock.release().catch((err) => {
        // The routine's own error matters more than a release that found the lease already gone.
        if (!failed || !(err instanceof LockNotHeldError)) throw err;
      });
    }
  }

  /** redlock's `Redlock#release(lock)`: `lock.release()`. */
  async release(lock) {
    return lock.release();
  }

  /** redlock's `Redlock#extend(lock, duration)`: `lock.extend(duration)` (resolves to the same lock). */
  async extend(lock, duration) {
    return lock.extend(duration);
  }

  /**
   * Closes the connections FLOCK opened (never the client you gave it): the session's and, with
   * ioredis, its command connection. Not needed for the process to exit: none keeps it alive.
   */
  async quit() {
    this._session.close();
    for (const conn of this._idle.splice(0)) conn.close();
    for (const conns of this._durableIdle.values()) for (const conn of conns.splice(0)) conn.close();
    this._conn.close();
  }

  // The one acquire path for every mode: they differ only in the FLOCK.ACQUIRE arguments.
  async _acquire(resources, durationOrOptions, settings) {
    const keys = keysOf(resources);
    const opts =
      typeof durationOrOptions === 'number'
        ? { ...settings, lease: durationOrOptions }
        : { ...durationOrOptions, ...settings };
    const mode = modeOf(opts);
    const watchdog = opts.lease === undefined;
    const lease = watchdog ? this.settings.watchdogLease : integerMs(opts.lease, 'Duration');
    if (lease < 1) throw new RangeError('Duration must be at least 1 ms');
    const wait = waitOf(opts, this.settings.wait);
    const { signal } = opts;
    if (signal?.aborted) throw abortError(signal);
    const owner = opts.owner ?? randomUUID();
    const deadline = Date.now() + wait;
    const tokens = new Map();
    const watches = [];
    const start = Date.now();
    const renews = watchdog || Boolean(opts.renew);
    const durable = durableOf(opts, this.settings);
    try {
      for (const key of [...keys].sort()) {
        const left = wait === Infinity ? Infinity : Math.max(0, deadline - Date.now());
        const got = this.settings.sessions
          ? await this._sessionAcquireKey(key, owner, lease, left, signal, mode.args, renews)
          : await this._acquireKey(key, owner, lease, left, signal, mode.args);
        if (got === null) throw new LockBusyError(busyMessage(key, wait), key);
        tokens.set(key, BigInt(got.token));
        this._hold(key, owner, 1);
        if (got.watch) watches.push(got.watch);
        // Before the durable check, whose RENEW and WAIT then cover these releases too.
        await this._dropStale(key, owner, BigInt(got.token));
        // Given back with the others (the catch below) when the replicas do not confirm it.
        if (durable.replicas > 0) await this._confirmDurable(key, owner, lease, durable, got.node);
      }
    } catch (err) {
      for (const watch of watches) this._session.unwatch(watch);
      await Promise.all([...tokens].map(([key, token]) => this._releaseHold(key, owner, token).catch(() => {})));
      // Uncounted once the give-backs were answered (see Lock#release).
      for (const key of tokens.keys()) this._hold(key, owner, -1);
      throw err;
    }
    const renewEvery = renews ? renewPeriod(lease, opts.automaticExtensionThreshold) : 0;
    const ordered = new Map(keys.map((k) => [k, tokens.get(k)]));
    return new Lock(this, keys, owner, ordered, lease, start, renewEvery, mode, watches);
  }

  // Through the session: a try is one ACQUIRE with INBOX (its grant is watched); a wait is one
  // ACQUIRE ... WAIT t INBOX sid, answered at once (a token) or by an inbox event.
  async _sessionAcquireKey(key, owner, lease, wait, signal, extra, renews = false) {
    let outcome;
    if (wait < 1) {
      outcome = await this._try(key, owner, lease, extra);
    } else {
      outcome = await this._session.wait(key, owner, lease, wait, extra, signal);
    }
    if (outcome.aborted) {
      // The grant won the race with the abort: hand it back before reporting the abort.
      if (outcome.token) await this._releaseHold(key, owner, BigInt(outcome.token)).catch(() => {});
      throw abortError(signal);
    }
    if (outcome.token) {
      const mode = extra[0] === 'SHARED' ? 'shared' : extra[0] === 'PERMITS' ? 'semaphore' : 'exclusive';
      const watch = this._session.watch(key, owner, outcome.token, outcome.node, mode, { extra, lease, renews });
      return { token: outcome.token, watch, node: outcome.node };
    }
    if (outcome.error) throw outcome.error;
    return null;
  }

  // A try through the session of the key's node: { token, node } or { timeout }.
  async _try(key, owner, lease, extra) {
    let to;
    for (let attempt = 0; ; attempt++) {
      const { node, sid } = await this._session.sessionFor(key, to);
      try {
        const args = ['FLOCK.ACQUIRE', key, owner, String(lease), 'INBOX', sid, ...extra];
        const reply = await this._send(this._conn, args, { node });
        return reply === null ? { timeout: true } : { token: String(reply), node };
      } catch (err) {
        // The session ended under us, or the key is on another node: send again where it is.
        if (attempt >= this.settings.resends) throw err;
        const redirect = redirection(err);
        to = redirect?.to;
        if (redirect?.pause) await delay(redirect.pause);
        if (!redirect) {
          if (!(isReplyError(err) && /^NOSESSION/.test(err.message))) throw err;
          this._session.ended(node, sid, err);
        }
      }
    }
  }

  /**
   * A durable grant (docs/client-protocol.md, "Durable grants"): `FLOCK.RENEW key owner lease ID`
   * and `WAIT replicas timeout` in one round trip on a connection of FLOCK's own to the key's node
   * (`node`: the one that granted it, if known). The RENEW is this connection's write, after the
   * grant in the replication stream, so the WAIT's count covers the grant (a grant pushed to the
   * session, or handed over in another client's command, is no write of this connection's).
   * Throws LockNotDurableError when fewer replicas answer or the RENEW answers NOTOWNER; the
   * caller gives the hold back.
   */
  async _confirmDurable(key, owner, lease, { replicas, timeout }, node) {
    node ??= await this._conn.nodeOf(key);
    for (let attempt = 0; ; attempt++) {
      const conn = await this._durableConn(node);
      let renew, wait;
      try {
        // A fresh request ID on each attempt: a resend answered from the ID's record writes nothing,
        // and the WAIT after it would count acknowledgements of nothing.
        [renew, wait] = await conn.pipeline([
          ['FLOCK.RENEW', key, owner, String(lease), 'ID', randomUUID()],
          ['WAIT', String(replicas), String(timeout)],
        ]);
      } catch (err) {
        conn.close();
        if (attempt >= this.settings.resends) throw err;
        continue;
      }
      const failed = [renew, wait].find((r) => r.status === 'rejected');
      if (failed && !isReplyError(failed.reason)) {
        // A lost reply (the connection broke): again on a new connection.
        conn.close();
        if (attempt >= this.settings.resends) throw failed.reason;
        continue;
      }
      this._parkDurable(node, conn);
      if (wait.status === 'rejected') throw wait.reason;
      const reached = Number(wait.value);
      if (renew.status === 'rejected') {
        const err = replyError(renew.reason, ['FLOCK.RENEW', key]);
        if (!(err instanceof LockNotHeldError)) throw err;
        throw new LockNotDurableError(
          `The lock ${key} was not kept durable: it ended before ${replicas} replica(s) acknowledged it (${renew.reason.message})`,
          key,
          { reached, replicas, cause: err },
        );
      }
      if (reached < replicas) {
        throw new LockNotDurableError(
          `The lock ${key} was not kept durable: ${reached} of ${replicas} replica(s) acknowledged its grant within ${timeout} ms (durableTimeout); the grant was given back`,
          key,
          { reached, replicas },
        );
      }
      return;
    }
  }

  async _durableConn(node) {
    const idle = this._durableIdle.get(node) ?? [];
    for (let conn = idle.pop(); conn; conn = idle.pop()) {
      if (this._conn.current(conn)) return conn;
      conn.close();
    }
    return this._conn.dedicated(node);
  }

  _parkDurable(node, conn) {
    if (!this._durableIdle.has(node)) this._durableIdle.set(node, []);
    const idle = this._durableIdle.get(node);
    if (idle.length < IDLE_DURABLE && !conn.closed) idle.push(conn);
    else conn.close();
  }

  // The blocking form (`sessions: false`): a try, then a WAIT on a connection of FLOCK's own.
  async _acquireKey(key, owner, lease, wait, signal, extra) {
    const reply = await this._acquireKeyBlocking(key, owner, lease, wait, signal, extra);
    return reply === null ? null : { token: String(reply), watch: null, node: undefined };
  }

  async _acquireKeyBlocking(key, owner, lease, wait, signal, extra) {
    const base = ['FLOCK.ACQUIRE', key, owner, String(lease)];
    // A try first, on the shared connection: a free lock then costs one round trip and no
    // connection of its own (a try never overtakes queued waiters, so FIFO order holds).
    const reply = await this._send(this._conn, [...base, ...extra]);
    if (reply !== null || wait < 1) return reply;
    return this._wait([...base, 'WAIT', wait === Infinity ? '0' : String(Math.ceil(wait)), ...extra], signal);
  }

  // A WAIT blocks its connection, so it runs on one of FLOCK's own; an abort ends it on the server
  // (CLIENT UNBLOCK answers the waiter nil, and it leaves the queue).
  async _wait(args, signal) {
    const conn = this._idle.pop() ?? (await this._conn.duplicate());
    const id = await conn.send(['CLIENT', 'ID']).catch((err) => {
      conn.close();
      throw err;
    });
    if (signal?.aborted) {
      this._park(conn);
      throw abortError(signal);
    }
    let aborted = false;
    let settled = false;
    const onAbort = () => {
      aborted = true;
      this._unblock(conn, id, () => settled);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    let reply;
    try {
      reply = await this._send(conn, args, { stop: () => aborted });
    } catch (err) {
      conn.close();
      throw aborted ? abortError(signal) : err;
    } finally {
      settled = true;
      signal?.removeEventListener('abort', onAbort);
    }
    this._park(conn);
    if (!aborted) return reply;
    // The grant won the race with the abort: hand it back before reporting the abort.
    if (reply !== null) await this._releaseHold(args[1], args[2], BigInt(reply)).catch(() => {});
    throw abortError(signal);
  }

  async _unblock(conn, id, settled) {
    for (let i = 0; i < UNBLOCK_TRIES && !settled(); i++) {
      const unblocked = await this._conn.send(['CLIENT', 'UNBLOCK', id]).catch(() => '0');
      if (String(unblocked) === '1') return;
      await delay(UNBLOCK_PAUSE_MS);
    }
    // Last resort: a closed connection leaves the queue, and an undelivered grant passes on.
    if (!settled()) conn.close();
  }

  _park(conn) {
    if (this._idle.length < IDLE_BLOCKING) this._idle.push(conn);
    else conn.close();
  }

  async _releaseKey(key, owner) {
    return Number(await this._send(this._conn, ['FLOCK.RELEASE', key, owner]));
  }

  /**
   * Releases one hold of the grant `token` (a bigint). A release that left no hold, or that failed
   * other than with NOTOWNER (refused: NOREPLICAS, READONLY, ...; or its reply lost), is
   * remembered: it may have reached a master that a failover then deposed, or not have been
   * applied, and the promoted master still have the grant (see _dropStale).
   */
  async _releaseHold(key, owner, token) {
    let left;
    try {
      left = await this._releaseKey(key, owner);
    } catch (err) {
      if (!(err instanceof LockNotHeldError)) this._rememberRelease(key, owner, token);
      throw err;
    }
    if (left === 0) this._rememberRelease(key, owner, token);
    return left;
  }

  _rememberRelease(key, owner, token) {
    const id = holdId(key, owner);
    lastReleases.delete(id);
    lastReleases.set(id, token);
    if (lastReleases.size > REMEMBERED_RELEASES) lastReleases.delete(lastReleases.keys().next().value);
  }

  // Counts the holds of (key, owner) that the process's locks have (`by` 1 at a grant, -1 at its release).
  _hold(key, owner, by) {
    const id = holdId(key, owner);
    const n = (holding.get(id) ?? 0) + by;
    if (n > 0) holding.set(id, n);
    else holding.delete(id);
  }

  /**
   * A grant of (key, owner) came back with the token of that owner's last release remembered (see
   * _releaseHold): the server still had that grant (the release was lost with a deposed master,
   * or refused), so this grant reentered it and the holds released are still counted, each
   * reentry renewing the lease: an owner that loops acquire/release would keep the lock from every
   * other. The holds the server counts beyond those the process's locks have (this one included)
   * are given back now, so that the caller's one release frees the lock. If the server refuses
   * again, the release is remembered again, for the next grant; the acquire stands.
   */
  async _dropStale(key, owner, token) {
    const id = holdId(key, owner);
    const last = lastReleases.get(id);
    lastReleases.delete(id);
    if (last !== token) return;
    try {
      const holds = holdsOf(await this._send(this._conn, ['FLOCK.INFO', key], { noId: true }), owner);
      for (let extra = holds - (holding.get(id) ?? 0); extra > 0; extra--) {
        await this._releaseKey(key, owner);
      }
    } catch (err) {
      if (!(err instanceof LockNotHeldError)) this._rememberRelease(key, owner, token);
    }
  }

  async _renewKey(key, owner, lease) {
    return BigInt(await this._send(this._conn, ['FLOCK.RENEW', key, owner, String(lease)]));
  }

  // Every command carries a request ID (fresh unless given); a lost reply (I/O error, not an error
  // reply) is resent at once with the same ID, which the server applies once and answers with the
  // first reply. `noId`: commands without the ID option (CANCEL, INFO).
  // `node`: sent on that node's own connection (a command that names its session), not routed.
  async _send(conn, args, { rid = randomUUID(), noId = false, stop = () => false, node } = {}) {
    const full = noId ? args : [...args, 'ID', rid];
    for (let attempt = 0; ; attempt++) {
      try {
        return await conn.send(full, node);
      } catch (err) {
        if (isReplyError(err)) throw replyError(err, args);
        if (attempt >= this.settings.resends || stop()) throw err;
      }
    }
  }
}

function holdId(key, owner) {
  return `${key}\n${owner}`;
}

// A field of a FLOCK.INFO reply or of one of its holders: a flat array (RESP2), a Map or an object (RESP3).
function field(reply, name) {
  if (Array.isArray(reply)) {
    for (let i = 0; i + 1 < reply.length; i += 2) if (String(reply[i]) === name) return reply[i + 1];
    return undefined;
  }
  if (reply instanceof Map) return reply.get(name);
  return reply?.[name];
}

// The holds `owner` has according to a FLOCK.INFO reply (0: none, or nobody holds the key).
function holdsOf(info, owner) {
  if (info === null || info === undefined) return 0;
  for (const holder of field(info, 'holders') ?? []) {
    if (String(field(holder, 'owner')) === owner) return Number(field(holder, 'holds'));
  }
  return 0;
}

// The server's error codes that callers catch by type; the rest reach them unchanged.
const REPLY_ERRORS = [
  ['NOTOWNER', LockNotHeldError, 'is not held by this owner'],
  ['UPGRADE', LockUpgradeError, 'is held shared by this owner, which cannot upgrade'],
  ['WRONGMODE', LockModeError, 'exists in another mode'],
  ['DEADLOCK', LockDeadlockError, 'cannot be waited for: the wait would deadlock'],
];

function busyMessage(key, wait) {
  if (wait < 1) return `The lock ${key} is held by another owner (tried once: wait is 0)`;
  return (
    `The lock ${key} is held by another owner: waited ${wait} ms in its queue (the \`wait\` option, default ` +
    `${DEFAULTS.wait} ms); to wait longer pass { wait: ms } (or Infinity) to acquire(), or new Flock(client, { wait })`
  );
}

function replyError(err, args) {
  const known = REPLY_ERRORS.find(([code]) => err.message.startsWith(`${code} `));
  if (!known) return err;
  const [, Type, what] = known;
  return new Type(`The lock ${args[1]} ${what}: ${err.message}`, args[1], { cause: err });
}

// A loss the session reported ({ key, reason, text }) as the error of the lock's signal.
function lostError(lost) {
  return new LockLostError(lost.text, lost.key, { reason: lost.reason });
}

// redlock's using() extends when `automaticExtensionThreshold` ms are left; FLOCK's default is lease/3.
function renewPeriod(lease, threshold) {
  const period = threshold === undefined ? lease / 3 : lease - threshold;
  return Math.max(1, Math.floor(period));
}

/**
 * A held lock: `token` (bigint fencing token of the first resource; `tokens` for each),
 * `release()`, `extend(lease)`, and `signal`, which aborts with `signal.error` when the lock is lost.
 * `mode` is how it was asked for: 'exclusive', 'shared' or 'semaphore' (`permits` of it).
 */
class Lock {
  constructor(flock, resources, owner, tokens, lease, start, renewEvery, { mode, permits }, watches = []) {
    this.flock = flock;
    this.resources = resources;
    this.owner = owner;
    this.mode = mode;
    this.permits = permits;
    this.tokens = tokens;
    this.lease = lease;
    this.expiration = start + lease;
    this._controller = new AbortController();
    this.signal = this._controller.signal;
    this._renewEvery = renewEvery;
    this._renewing = null;
    this._timer = null;
    this._released = false;
    // Whether release() took this lock's holds off the process's count (Flock#_hold).
    this._uncounted = false;
    this._watches = watches;
    this._schedule();
    // Losses the server pushes to the session abort the signal at once (with or without a watchdog).
    for (const watch of watches) {
      watch.onLost = (lost) => this._released || this._lose(lostError(lost));
      if (watch.lost) this._lose(lostError(watch.lost));
    }
  }

  get token() {
    return this.tokens.get(this.resources[0]);
  }

  /** redlock's `lock.value`: what identifies this holder on the server (here its owner). */
  get value() {
    return this.owner;
  }

  /** Sets every resource's lease to `lease` ms from now; resolves to this lock (redlock resolves to a new one). */
  async extend(lease) {
    integerMs(lease, 'Duration');
    const start = Date.now();
    try {
      await Promise.all(this.resources.map((key) => this.flock._renewKey(key, this.owner, lease)));
    } catch (err) {
      if (err instanceof LockNotHeldError) this._lose(err);
      throw err;
    }
    this.lease = lease;
    this.expiration = start + lease;
    // The lease a re-watch gives the grant (after a session break): reset from this reply.
    const now = Date.now();
    for (const watch of this._watches) {
      watch.lease = lease;
      watch.leaseEnd = now + lease;
    }
    return this;
  }

  /** Releases one hold of each resource (reverse order); resolves to the holds left of the first. */
  async release() {
    this._released = true;
    for (const watch of this._watches) watch.released = true;
    clearTimeout(this._timer);
    // A renewal in flight would race the release; let it finish (its outcome no longer matters).
    await this._renewing;
    // So would a re-watch's extra hold (added and released after a session break): the hold
    // count this release answers must not count it.
    await this.flock._session.settled(this._watches);
    this.expiration = 0;
    const uncount = !this._uncounted;
    this._uncounted = true;
    const results = await Promise.allSettled(
      [...this.resources].reverse().map((key) => this.flock._releaseHold(key, this.owner, this.tokens.get(key))),
    );
    // Uncounted once the releases were answered: a stale-hold check of the same owner meanwhile
    // (Flock#_dropStale) then counts this hold until the server no longer does, and so never
    // gives back more than the stale holds.
    if (uncount) for (const key of this.resources) this.flock._hold(key, this.owner, -1);
    for (const watch of this._watches) this.flock._session.unwatch(watch);
    const failed = results.find((r) => r.status === 'rejected');
    if (failed) throw failed.reason;
    return results[results.length - 1].value;
  }

  _schedule() {
    if (this._renewEvery === 0 || this._released) return;
    this._timer = setTimeout(() => (this._renewing = this._renew()), this._renewEvery);
    // A forgotten lock must not keep the process alive; its lease ends on the server.
    this._timer.unref();
  }

  async _renew() {
    try {
      await this.extend(this.lease);
    } catch (err) {
      if (err instanceof LockNotHeldError) return;
      // A lost reply or a dropped connection: try again until the lease would have ended.
      if (Date.now() >= this.expiration) {
        return this._lose(
          new LockLostError(`The lease of ${this.resources[0]} could not be renewed`, this.resources[0], { cause: err, reason: 'expired' }),
        );
      }
    } finally {
      this._renewing = null;
    }
    this._schedule();
  }

  _lose(err) {
    if (this.signal.aborted) return;
    const lost = err instanceof LockLostError ? err : new LockLostError(err.message, err.key, { cause: err, reason: notOwnerReason(err.message) });
    clearTimeout(this._timer);
    this._renewEvery = 0;
    this.signal.error = lost;
    this._controller.abort(lost);
  }
}

module.exports = { Flock, Lock, DEFAULTS };
