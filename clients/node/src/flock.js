'use strict';

const { randomUUID } = require('node:crypto');
const { setTimeout: delay } = require('node:timers/promises');
const { adapt, commandKeys, isReplyError } = require('./adapter');
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
// Connections of FLOCK's own kept open per node for the next blocking command (a WAIT for a
// lock or for replicas); more are closed when their command ends.
const IDLE_OWN = 4;
// CLIENT UNBLOCK finds nothing to unblock while the WAIT is still on its way to the server.
const UNBLOCK_TRIES = 50;
const UNBLOCK_PAUSE_MS = 20;
// The pause before a resent WAIT is sent again when the server answers QUEUED: it has not yet
// seen the connection of the first one close.
const REQUEUE_PAUSE_MS = 250;
// FLOCK.ACQUIREALL's numkeys.
const MAX_KEYS = 256;
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
  if (keys.length > MAX_KEYS) throw new RangeError(`acquire takes at most ${MAX_KEYS} resources at once, got ${keys.length}`);
  for (const key of keys) if (typeof key !== 'string') throw new TypeError('resources must be strings');
  if (new Set(keys).size !== keys.length) throw new TypeError('resources must not repeat a key');
  return keys;
}

// The tokens of an ACQUIRE (one) or ACQUIREALL (one per key) reply, as bigints.
function tokensOf(reply) {
  return (Array.isArray(reply) ? reply : [reply]).map((token) => BigInt(String(token)));
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
    // Idle connections of FLOCK's own for blocking commands, by node.
    this._ownIdle = new Map();
    this._session = new Session(this);
  }

  /**
   * Acquires `resources`: a key, or several keys together, all or none (one FLOCK.ACQUIREALL,
   * queued at every key at once; in a Cluster they must share a slot). Either
   * `acquire(resources, {lease, wait, signal, owner})` or redlock's
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
    for (const conns of this._ownIdle.values()) for (const conn of conns.splice(0)) conn.close();
    this._conn.close();
  }

  // The one acquire path for every mode and number of keys: modes differ only in the
  // FLOCK.ACQUIRE(ALL) arguments, one key and several only in how the grant is asked for (one
  // ACQUIRE through the session or blocking; one ACQUIREALL, blocking); what follows a grant
  // (its watch, stale holds, the durable check, the give-back if one of them fails) is the same.
  async _acquire(resources, durationOrOptions, settings) {
    const keys = keysOf(resources);
    const opts =
      typeof durationOrOptions === 'number'
        ? { ...settings, lease: durationOrOptions }
        : { ...durationOrOptions, ...settings };
    const mode = modeOf(opts);
    if (keys.length > 1 && mode.mode === 'semaphore') {
      throw new TypeError('permits/limit take one resource (a semaphore is one key): acquire several semaphores one by one');
    }
    const watchdog = opts.lease === undefined;
    const lease = watchdog ? this.settings.watchdogLease : integerMs(opts.lease, 'Duration');
    if (lease < 1) throw new RangeError('Duration must be at least 1 ms');
    const wait = waitOf(opts, this.settings.wait);
    const { signal } = opts;
    if (signal?.aborted) throw abortError(signal);
    const owner = opts.owner ?? randomUUID();
    const start = Date.now();
    const renews = watchdog || Boolean(opts.renew);
    const durable = durableOf(opts, this.settings);
    const grants =
      keys.length === 1 && this.settings.sessions
        ? await this._sessionAcquireKey(keys[0], owner, lease, wait, signal, mode, renews)
        : await this._acquireBlocking(keys, owner, lease, wait, signal, mode.args);
    if (grants === null) throw new LockBusyError(busyMessage(keys, wait), keys[0]);
    const tokens = grants.map((grant) => grant.token);
    const watches = grants.flatMap((grant) => grant.watch ?? []);
    for (const key of keys) this._hold(key, owner, 1);
    try {
      if (keys.length > 1 && this.settings.sessions) {
        // ACQUIREALL has no INBOX form: its grants are handed to the session's watch now.
        const adopted = await Promise.allSettled(
          keys.map((key, i) => this._session.adopt(key, owner, String(tokens[i]), mode.mode, { extra: mode.args, lease, renews })),
        );
        for (const result of adopted) if (result.status === 'fulfilled') watches.push(result.value);
        const failed = adopted.find((result) => result.status === 'rejected');
        if (failed) throw failed.reason;
      }
      for (const [i, key] of keys.entries()) {
        // Before the durable check, whose RENEW and WAIT then cover these releases too.
        await this._dropStale(key, owner, tokens[i]);
      }
      // Each key given back with the others (the catch below) when the replicas do not confirm it.
      if (durable.replicas > 0) {
        for (const [i, key] of keys.entries()) await this._confirmDurable(key, owner, lease, durable, grants[i].node);
      }
    } catch (err) {
      for (const watch of watches) this._session.unwatch(watch);
      await this._releaseHolds(keys, owner, tokens).catch(() => {});
      // Uncounted once the give-backs were answered (see Lock#release).
      for (const key of keys) this._hold(key, owner, -1);
      throw err;
    }
    const renewEvery = renews ? renewPeriod(lease, opts.automaticExtensionThreshold) : 0;
    const held = new Map(keys.map((key, i) => [key, tokens[i]]));
    return new Lock(this, keys, owner, held, lease, start, renewEvery, mode, watches);
  }

  // One key through the session: a try is one ACQUIRE with INBOX (its grant is watched); a wait
  // is one ACQUIRE ... WAIT t INBOX sid, answered at once (a token) or by an inbox event.
  // [{ token, watch, node }], or null when busy.
  async _sessionAcquireKey(key, owner, lease, wait, signal, mode, renews) {
    const extra = mode.args;
    let outcome;
    if (wait < 1) {
      outcome = await this._try(key, owner, lease, extra);
    } else {
      outcome = await this._session.wait(key, owner, lease, wait, extra, signal);
    }
    if (outcome.aborted) {
      // The grant won the race with the abort: hand it back before reporting the abort.
      if (outcome.token) await this._releaseHolds([key], owner, tokensOf(outcome.token)).catch(() => {});
      throw abortError(signal);
    }
    if (outcome.token) {
      const watch = this._session.watch(key, owner, outcome.token, outcome.node, mode.mode, { extra, lease, renews });
      return [{ token: BigInt(outcome.token), watch, node: outcome.node }];
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
      const conn = await this._ownConn(node);
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
      this._parkOwn(node, conn);
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

  // A connection of FLOCK's own to `node` for a blocking command: an idle one if still current.
  async _ownConn(node) {
    const idle = this._ownIdle.get(node) ?? [];
    for (let conn = idle.pop(); conn; conn = idle.pop()) {
      if (this._conn.current(conn)) return conn;
      conn.close();
    }
    return this._conn.dedicated(node);
  }

  _parkOwn(node, conn) {
    if (!this._ownIdle.has(node)) this._ownIdle.set(node, []);
    const idle = this._ownIdle.get(node);
    if (idle.length < IDLE_OWN && !conn.closed) idle.push(conn);
    else conn.close();
  }

  /**
   * The blocking form, for several keys (FLOCK.ACQUIREALL has no INBOX form) and for one key with
   * `sessions: false`. A try first, on the shared connection: a free lock then costs one round
   * trip and no connection of its own (a try never overtakes queued waiters, so FIFO order
   * holds); then a WAIT that blocks a connection of FLOCK's own. [{ token }] in key order, or null.
   */
  async _acquireBlocking(keys, owner, lease, wait, signal, extra) {
    const base =
      keys.length === 1
        ? ['FLOCK.ACQUIRE', keys[0], owner, String(lease)]
        : ['FLOCK.ACQUIREALL', String(keys.length), ...keys, owner, String(lease)];
    let reply = await this._send(this._conn, [...base, ...extra]);
    if (reply === null && wait >= 1) {
      const giveBack = (granted) => this._releaseHolds(keys, owner, tokensOf(granted));
      reply = await this._wait(keys[0], (timeout) => [...base, 'WAIT', timeout, ...extra], wait, signal, giveBack);
    }
    return reply === null ? null : tokensOf(reply).map((token) => ({ token }));
  }

  /**
   * A WAIT for `key` (and the keys sharing its slot) on a connection of FLOCK's own to its node:
   * `argsFor(timeout)` is the command, `timeout` the time the wait has left. A lost reply (the
   * connection broke) is resent, same request ID, on a new connection: the server answers a grant
   * made under that ID with the same tokens, and queues again a wait that the broken
   * connection's close ended. A MOVED or ASK sends it where the key is. An abort ends it on the
   * server (CLIENT UNBLOCK: the waiter is answered nil and leaves every queue); a grant that won
   * the race with the abort is handed back (`giveBack(reply)`) before the abort is reported.
   */
  async _wait(key, argsFor, wait, signal, giveBack) {
    const rid = randomUUID();
    const deadline = Date.now() + wait;
    let node = await this._conn.nodeOf(key);
    for (let attempt = 0; ; ) {
      if (signal?.aborted) throw abortError(signal);
      const timeout = wait === Infinity ? '0' : String(Math.max(1, Math.ceil(deadline - Date.now())));
      let reply;
      try {
        reply = await this._block(node, argsFor(timeout), rid, signal);
      } catch (err) {
        if (signal?.aborted) throw abortError(signal);
        const redirect = redirection(err);
        if (isReplyError(err) || isReplyError(err.cause)) {
          if (redirect && attempt++ < this.settings.resends) {
            if (redirect.pause) await delay(redirect.pause);
            node = redirect.to ?? (await this._conn.nodeOf(key));
            continue;
          }
          // A resend that reached the server before it saw the first connection close.
          if (attempt > 0 && /^QUEUED/.test(err.message) && Date.now() < deadline) {
            await delay(REQUEUE_PAUSE_MS);
            continue;
          }
          throw err;
        }
        if (attempt++ >= this.settings.resends) throw err;
        continue;
      }
      if (!signal?.aborted) return reply;
      // The grant won the race with the abort: hand it back before reporting the abort.
      if (reply !== null) await giveBack(reply).catch(() => {});
      throw abortError(signal);
    }
  }

  // One blocking command on a connection of FLOCK's own to `node`, unblocked (CLIENT UNBLOCK) if
  // `signal` aborts meanwhile. A connection that broke is closed, one that answered is kept.
  async _block(node, args, rid, signal) {
    const conn = await this._ownConn(node);
    const id = await conn.send(['CLIENT', 'ID']).catch((err) => {
      conn.close();
      throw err;
    });
    if (signal?.aborted) {
      this._parkOwn(node, conn);
      throw abortError(signal);
    }
    let settled = false;
    const onAbort = () => this._unblock(conn, id, node, () => settled);
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      const reply = await this._send(conn, args, { rid, resends: 0 });
      this._parkOwn(node, conn);
      return reply;
    } catch (err) {
      if (isReplyError(err) || isReplyError(err.cause)) this._parkOwn(node, conn);
      else conn.close();
      throw err;
    } finally {
      settled = true;
      signal?.removeEventListener('abort', onAbort);
    }
  }

  async _unblock(conn, id, node, settled) {
    for (let i = 0; i < UNBLOCK_TRIES && !settled(); i++) {
      const unblocked = await this._conn.send(['CLIENT', 'UNBLOCK', id], node).catch(() => '0');
      if (String(unblocked) === '1') return;
      await delay(UNBLOCK_PAUSE_MS);
    }
    // Last resort: a closed connection leaves the queue, and an undelivered grant passes on.
    if (!settled()) conn.close();
  }

  async _releaseKey(key, owner) {
    return Number(await this._send(this._conn, ['FLOCK.RELEASE', key, owner]));
  }

  /**
   * Releases one hold of each of `keys`, whose grants have `tokens` (bigints, in key order): one
   * FLOCK.RELEASE, or for several one FLOCK.RELEASEALL (all or none); resolves to each key's holds
   * left. A release that left no hold, or that failed other than with NOTOWNER (refused:
   * NOREPLICAS, READONLY, ...; or its reply lost), is remembered: it may have reached a master
   * that a failover then deposed, or not have been applied, and the promoted master still have
   * the grant (see _dropStale). RELEASEALL answers NOTOWNER, releasing nothing, when one key is
   * no longer held (its lease ended, force-released): then each key is released on its own, so
   * that those still held are freed, and the NOTOWNER of the first key lost is thrown.
   */
  async _releaseHolds(keys, owner, tokens) {
    let left;
    try {
      left =
        keys.length === 1
          ? [await this._releaseKey(keys[0], owner)]
          : (await this._send(this._conn, ['FLOCK.RELEASEALL', String(keys.length), ...keys, owner])).map(Number);
    } catch (err) {
      if (!(err instanceof LockNotHeldError)) {
        keys.forEach((key, i) => this._rememberRelease(key, owner, tokens[i]));
        throw err;
      }
      if (keys.length === 1) throw err;
      const each = await Promise.allSettled(keys.map((key, i) => this._releaseHolds([key], owner, [tokens[i]])));
      const failed = each.find((result) => result.status === 'rejected');
      if (failed) throw failed.reason;
      return each.map((result) => result.value[0]);
    }
    keys.forEach((key, i) => left[i] === 0 && this._rememberRelease(key, owner, tokens[i]));
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
   * _releaseHolds): the server still had that grant (the release was lost with a deposed master,
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
  // first reply (`resends` times at most). `noId`: commands without the ID option (CANCEL, INFO).
  // `node`: sent on that node's own connection (a command that names its session), not routed.
  async _send(conn, args, { rid = randomUUID(), noId = false, resends = this.settings.resends, node } = {}) {
    const full = noId ? args : [...args, 'ID', rid];
    for (let attempt = 0; ; attempt++) {
      try {
        return await conn.send(full, node);
      } catch (err) {
        if (isReplyError(err)) throw replyError(err, args);
        if (attempt >= resends) throw err;
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

// The server's error codes that callers catch by type, and what they say of one key and of
// several; the rest reach callers unchanged (CROSSSLOT with a hint).
const REPLY_ERRORS = [
  ['NOTOWNER', LockNotHeldError, 'is not held by this owner', 'are not all held by this owner'],
  ['UPGRADE', LockUpgradeError, 'is held shared by this owner, which cannot upgrade', 'include one held shared by this owner, which cannot upgrade'],
  ['WRONGMODE', LockModeError, 'exists in another mode', 'include one that exists in another mode'],
  ['DEADLOCK', LockDeadlockError, 'cannot be waited for: the wait would deadlock', 'cannot be waited for: the wait would deadlock'],
];

const WAIT_LONGER =
  `(the \`wait\` option, default ${DEFAULTS.wait} ms); to wait longer pass { wait: ms } (or Infinity) to ` +
  'acquire(), or new Flock(client, { wait })';

function busyMessage(keys, wait) {
  if (keys.length > 1) {
    if (wait < 1) return `The locks ${keys.join(', ')} are not all free: none was taken (tried once: wait is 0)`;
    return `The locks ${keys.join(', ')} did not all come free: waited ${wait} ms in their queues, none was taken ${WAIT_LONGER}`;
  }
  if (wait < 1) return `The lock ${keys[0]} is held by another owner (tried once: wait is 0)`;
  return `The lock ${keys[0]} is held by another owner: waited ${wait} ms in its queue ${WAIT_LONGER}`;
}

function replyError(err, args) {
  const keys = commandKeys(args);
  if (err.message.startsWith('CROSSSLOT ')) {
    const crossSlot = new Error(
      `The locks ${keys.join(', ')} are in different Cluster slots, and several locks are taken together on one ` +
        'slot only: give their keys one hash tag, the part in braces that alone is hashed ({order-7}:items and ' +
        `{order-7}:total share a slot) (${err.message})`,
      { cause: err },
    );
    return Object.assign(crossSlot, { code: 'CROSSSLOT', keys });
  }
  const known = REPLY_ERRORS.find(([code]) => err.message.startsWith(`${code} `));
  if (!known) return err;
  const [, Type, one, several] = known;
  const what = keys.length === 1 ? `The lock ${keys[0]} ${one}` : `The locks ${keys.join(', ')} ${several}`;
  return new Type(`${what}: ${err.message}`, keys[0], { cause: err });
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

  /**
   * Releases one hold of each resource (several: one FLOCK.RELEASEALL, all or none); resolves to
   * the holds left of the first. If one was lost, the others are still released and the lost
   * one's LockNotHeldError is thrown.
   */
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
    try {
      const tokens = this.resources.map((key) => this.tokens.get(key));
      return (await this.flock._releaseHolds(this.resources, this.owner, tokens))[0];
    } finally {
      // Uncounted once the releases were answered: a stale-hold check of the same owner meanwhile
      // (Flock#_dropStale) then counts this hold until the server no longer does, and so never
      // gives back more than the stale holds.
      if (uncount) for (const key of this.resources) this.flock._hold(key, this.owner, -1);
      for (const watch of this._watches) this.flock._session.unwatch(watch);
    }
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
