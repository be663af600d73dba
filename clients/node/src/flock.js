'use strict';

const { setTimeout: delay } = require('node:timers/promises');
const { adapt, commandKeys, isReplyError } = require('./adapter');
const { sweep } = require('./deadlines');
const { Grant, pairId } = require('./grant');
const { newOwner, newRequestId } = require('./ids');
const { PROTOCOL, SERVER_SESSION_TIMEOUT_MS, margin, now } = require('./protocol');
const { Session, redirection, without } = require('./session');
const {
  LockNotHeldError,
  StaleTokenError,
  LockBusyError,
  LockLostError,
  AbortError,
  LockUpgradeError,
  LockDeadlockError,
  LockModeError,
  LockNotDurableError,
} = require('./errors');

const DEFAULTS = Object.freeze({
  // The lease of a lock without one that is not a session grant (sessions: false, durable grants,
  // several keys until their session adopts them): Redisson's lockWatchdogTimeout, renewed every third.
  watchdogLease: PROTOCOL.watchdogLeaseMs,
  // How long acquire() queues: redlock's default retry window (10 retries x 200 ms).
  wait: 2000,
  // Resends of one command (same request ID) after lost replies.
  resends: PROTOCOL.resends,
  // Waits go through the process's session (one connection for every wait, pushed losses), and a
  // lock without a fixed lease is a session grant (it lives with the session);
  // false: each wait blocks a connection of its own (FLOCK.ACQUIRE ... WAIT), no pushed losses,
  // a watchdog for a lock without a fixed lease.
  sessions: true,
  // The session timeout T in ms (FLOCK.SESSION TIMEOUT); undefined: the server's
  // flock.session-timeout-ms (10 s by default).
  sessionTimeoutMs: undefined,
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
// Stale holds (docs/client-protocol.md, the rule "stale holds"; Flock#_dropStale), for
// every Flock of the process (an owner may acquire through several, as with different settings):
// the token of each (key, owner)'s last release that left no hold (its reply 0) or that failed
// (refused, or its reply lost), or ANY_TOKEN after an acquire that got no reply, the oldest
// forgotten once REMEMBERED_RELEASES came after them; and the holds of each (key, owner) that the
// process's locks have and have not released, and its acquires under way.
const REMEMBERED_RELEASES = 1024;
// An acquire whose every reply was lost may have been granted all the same, with a token never
// seen: the owner's next grant, whatever its token, looks for stale holds.
const ANY_TOKEN = Symbol('any token');

/**
 * A Map by (key, owner) that forgets its oldest entries: two generations, the newer filled until
 * it holds `limit`, then made the older (the older dropped). Forgetting the oldest entry one by
 * one (a Map's first key) cost every release about 0.5 µs once the Map was full: V8 walks the
 * deleted entries at its front to find the first live one.
 */
class Forgetful {
  constructor(limit) {
    this.limit = limit;
    this.newer = new Map();
    this.older = new Map();
  }
  has(id) {
    return this.newer.has(id) || this.older.has(id);
  }
  get(id) {
    return this.newer.has(id) ? this.newer.get(id) : this.older.get(id);
  }
  delete(id) {
    this.newer.delete(id);
    this.older.delete(id);
  }
  // The older generation may keep an entry of `id` too: get() reads the newer first, and the
  // older goes whole. Deleting it here cost every release a lookup of a Map gone cold (0.3 µs).
  set(id, value) {
    this.newer.set(id, value);
    if (this.newer.size >= this.limit) {
      this.older = this.newer;
      this.newer = new Map();
    }
  }
}

const lastReleases = new Forgetful(REMEMBERED_RELEASES);
let holding = new Map();

// `fallback` ({ replicas, timeout }) itself when `opts` names neither: an acquire that does not
// ask for durability makes nothing.
function durableOf(opts, fallback) {
  if (opts.durableReplicas === undefined && opts.durableTimeout === undefined) return fallback;
  const replicas = opts.durableReplicas ?? fallback.replicas;
  const timeout = opts.durableTimeout ?? fallback.timeout;
  if (!Number.isSafeInteger(replicas) || replicas < 0) throw new RangeError(`durableReplicas must be an integer >= 0, got ${replicas}`);
  // WAIT 0 would wait without a bound.
  if (!Number.isSafeInteger(timeout) || timeout < 1) throw new RangeError(`durableTimeout must be an integer >= 1 (ms), got ${timeout}`);
  return Object.freeze({ replicas, timeout });
}

// FLOCK.SESSION TIMEOUT's range.
const SESSION_TIMEOUT_RANGE = [100, 3600000];

function sessionTimeoutOf(value) {
  if (value === undefined) return undefined;
  const [low, high] = SESSION_TIMEOUT_RANGE;
  if (!Number.isSafeInteger(value) || value < low || value > high) {
    throw new RangeError(`sessionTimeoutMs must be an integer from ${low} to ${high} (ms), got ${value}`);
  }
  return value;
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
const EXCLUSIVE = Object.freeze({ mode: 'exclusive', permits: 0, args: Object.freeze([]) });
const SHARED = Object.freeze({ mode: 'shared', permits: 0, args: Object.freeze(['SHARED']) });

function modeOf(opts) {
  const semaphore = opts.permits !== undefined || opts.limit !== undefined;
  if (opts.shared && semaphore) throw new TypeError('shared and permits/limit exclude each other');
  if (opts.shared) return SHARED;
  if (!semaphore) return EXCLUSIVE;
  if (opts.limit === undefined) throw new TypeError('permits needs the semaphore\'s limit');
  const limit = permitCount(opts.limit, 'limit');
  const permits = permitCount(opts.permits ?? 1, 'permits');
  if (permits > limit) throw new RangeError(`permits (${permits}) must not exceed limit (${limit})`);
  return { mode: 'semaphore', permits, args: ['PERMITS', String(permits), 'LIMIT', String(limit)] };
}

// `mode` with LOCKDELAY `lockDelay` ms added to its ACQUIRE arguments, if given (0 to 60000).
function withLockDelay(mode, lockDelay) {
  if (lockDelay === undefined) return mode;
  if (!Number.isInteger(lockDelay) || lockDelay < 0 || lockDelay > 60000) {
    throw new RangeError(`lockDelay must be an integer number of ms from 0 to 60000, got ${lockDelay}`);
  }
  return { ...mode, args: [...mode.args, 'LOCKDELAY', String(lockDelay)] };
}

// The options of a call given none (an acquire's, a send's): read, never written.
const NO_OPTIONS = Object.freeze({});

function keysOf(resources) {
  // One key, the common case, needs none of the checks of several.
  if (typeof resources === 'string') return [resources];
  const keys = [...resources];
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
 * (`<process id>:<n>`), so two acquires of one key exclude each other, also within one process; pass
 * `owner: lock.owner` to re-enter on purpose. Settings: watchdogLease, wait, resends, sessions,
 * sessionTimeoutMs, nodeOptions, and durableReplicas / durableTimeout (durable grants: each grant
 * confirmed by that many replicas, or given back with LockNotDurableError; also per acquire).
 */
class Flock {
  constructor(client, settings = {}) {
    if (Array.isArray(client)) {
      if (client.length !== 1) {
        throw new Error('FLOCK locks live on one Redis server (not a Redlock quorum): give exactly one client');
      }
      client = client[0];
    }
    const durable = durableOf(settings, { replicas: DEFAULTS.durableReplicas, timeout: DEFAULTS.durableTimeout });
    this.settings = Object.freeze({
      watchdogLease: integerMs(settings.watchdogLease ?? DEFAULTS.watchdogLease, 'watchdogLease'),
      wait: waitOf(settings, DEFAULTS.wait),
      resends: settings.resends ?? DEFAULTS.resends,
      sessions: settings.sessions ?? DEFAULTS.sessions,
      sessionTimeoutMs: sessionTimeoutOf(settings.sessionTimeoutMs),
      durableReplicas: durable.replicas,
      durableTimeout: durable.timeout,
    });
    // The durability of an acquire that asks for none of its own.
    this._durable = durable;
    // The session timeout the server last named (FLOCK.SESSION ... WITHTIMEOUT).
    this._knownSessionTimeout = undefined;
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
   * `acquire(resources, duration, settings)`. Without a lease it is a session grant, which lives
   * with this Flock's session until release() (without a session, or for a durable grant, a
   * watchdog keeps a `watchdogLease` lease renewed instead); a lease is fixed, never renewed.
   */
  acquire(resources, durationOrOptions, settings) {
    return this._acquire(resources, durationOrOptions, settings);
  }

  /**
   * Runs `routine(signal)` while holding `resources` (a session grant; without a session, a
   * `duration` lease the watchdog renews); `signal` aborts (with `signal.error`) if the lock is
   * lost. Releases when the routine settles. Shapes: using(resources, routine),
   * using(resources, options, routine), using(resources, duration, routine),
   * using(resources, duration, settings, routine).
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
  //
  // How the grant lives (its plan; docs/client-protocol.md, "The rules every client shares"): a
  // lock without a fixed lease is a session grant (lease 0: it lives with the session, no
  // renewals; several keys are taken with the watchdog's lease and then adopted with 0), unless
  // it has no session (sessions: false) or must outlive one (durable grants, for a failover):
  // then a watchdog renews its lease. A fixed lease is never renewed.
  async _acquire(resources, durationOrOptions, settings) {
    const keys = keysOf(resources);
    // Read, never written: an acquire with one options object (or none) uses it as it is.
    const opts =
      typeof durationOrOptions === 'number'
        ? { ...settings, lease: durationOrOptions }
        : settings === undefined
          ? (durationOrOptions ?? NO_OPTIONS)
          : { ...durationOrOptions, ...settings };
    const mode = withLockDelay(modeOf(opts), opts.lockDelay);
    if (keys.length > 1 && mode.mode === 'semaphore') {
      throw new TypeError('permits/limit take one resource (a semaphore is one key): acquire several semaphores one by one');
    }
    const given = opts.lease !== undefined;
    const lease = given ? integerMs(opts.lease, 'Duration') : this.settings.watchdogLease;
    if (lease < 1) throw new RangeError('Duration must be at least 1 ms');
    const wait = waitOf(opts, this.settings.wait);
    const { signal } = opts;
    if (signal?.aborted) throw abortError(signal);
    const owner = opts.owner ?? newOwner();
    const durable = durableOf(opts, this._durable);
    const sessions = this.settings.sessions;
    const plan = given && !opts.renew ? 'fixed' : sessions && durable.replicas === 0 ? 'session' : 'watchdog';
    const handleLease = plan === 'session' ? 0 : lease;
    // The (key, owner) names of the session's waits, the process's hold counts and remembered releases.
    const ids = keys.map((key) => pairId(key, owner));
    // An owner the caller named is counted from before the acquire is sent (Flock#_hold): a
    // release of the same owner meanwhile then never takes this acquire's hold for stale
    // (Flock#_releaseHolds); _unlessFailed undoes it. A new owner per acquire has no other acquire
    // to race: counted at its grant, and its steps have no handler of their own (a try/catch here
    // had doubled the uncontended pair's p99).
    const named = opts.owner !== undefined;
    if (named) for (const id of ids) this._hold(id, 1);
    let grants;
    if (keys.length === 1 && sessions) {
      // One key through the session: a try is one ACQUIRE with INBOX; a wait is one ACQUIRE ...
      // WAIT t INBOX sid, answered at once (a token) or by an inbox event. A session grant that
      // came as it is asked for is watched here, without a step (and a turn) of its own.
      const outcome = await (wait < 1
        ? this._unlessFailed(named, ids, this._try(keys[0], owner, handleLease, mode.args))
        : this._session.wait(ids[0], keys[0], owner, handleLease, wait, mode.args, signal));
      grants =
        outcome.token && outcome.life.entry && !outcome.aborted
          ? [this._watchOutcome(keys[0], owner, outcome, mode, plan, handleLease, outcome.life)]
          : await this._unlessFailed(named, ids, this._sessionOutcome(keys[0], owner, handleLease, signal, mode, plan, outcome));
    } else {
      grants = await this._unlessFailed(named, ids, this._acquireBlocking(keys, owner, lease, wait, signal, mode.args));
    }
    if (grants === null) {
      if (named) for (const id of ids) this._hold(id, -1);
      throw new LockBusyError(busyMessage(keys, wait), keys[0]);
    }
    if (!named) for (const id of ids) this._hold(id, 1);
    const tokens = grants.map((grant) => grant.token);
    const handles = grants.map((grant) => grant.handle ?? null);
    // A session's grant of one key, not durable and with no stale holds, is complete as it came.
    // Only an owner the caller named can have a remembered release: a new one was never released.
    if (keys.length > 1 || !sessions || durable.replicas > 0 || (named && ids.some((id) => lastReleases.has(id)))) {
      await this._complete(keys, owner, lease, mode, plan, durable, grants, tokens, handles, ids);
    }
    const renewEvery = plan === 'watchdog' ? renewPeriod(lease, opts.automaticExtensionThreshold) : 0;
    const lock = new Lock(this, keys, owner, tokens, handleLease, renewEvery, mode, handles, ids);
    // Every deadline of the process that has passed is a loss reported before this grant is
    // handed over (a holder of this process whose timer has not run yet).
    sweep();
    return lock;
  }

  // `step` of an acquire of a named owner (`named`), counted from before its send: when it fails,
  // the hold is uncounted, and an acquire that got no reply is remembered (ANY_TOKEN: the server
  // may have granted it all the same, and only an owner used again can reenter that grant).
  _unlessFailed(named, ids, step) {
    if (!named) return step;
    return step.catch((err) => {
      for (const id of ids) this._hold(id, -1);
      if (unanswered(err)) for (const id of ids) this._rememberRelease(id, ANY_TOKEN);
      throw err;
    });
  }

  // What follows the grants of an acquire before they are handed over: lease deadlines asked
  // anew, the session's watch for grants made without it, stale holds given back, the durable
  // check; if one of them fails, every grant is given back. Fills in `handles`.
  async _complete(keys, owner, lease, mode, plan, durable, grants, tokens, handles, ids) {
    const sessions = this.settings.sessions;
    const handleLease = plan === 'session' ? 0 : lease;
    try {
      if (keys.length > 1 || !sessions) {
        // Lease deadlines counted from a send long before the grant (a blocking wait) are asked anew.
        for (const [i, key] of keys.entries()) grants[i].life = await this._confirmLife(key, owner, lease, grants[i].life);
      }
      if (keys.length > 1 && sessions) {
        // ACQUIREALL has no INBOX form: its grants are handed to the session's watch now.
        const adopted = await Promise.allSettled(
          keys.map((key, i) =>
            this._session.adopt(key, owner, String(tokens[i]), mode.mode, { extra: mode.args, plan, lease: handleLease, life: grants[i].life }),
          ),
        );
        adopted.forEach((result, i) => result.status === 'fulfilled' && (handles[i] = result.value));
        const failed = adopted.find((result) => result.status === 'rejected');
        if (failed) throw failed.reason;
      } else if (!sessions) {
        // No session watches it: a grant of this handle's own, with its lease's deadline.
        keys.forEach((key, i) => {
          const grant = new Grant(key, owner, tokens[i], { mode: mode.mode, extra: mode.args });
          handles[i] = grant.handle(plan, lease);
          grant.leaseUntil(grants[i].life.until);
        });
      }
      for (const [i, key] of keys.entries()) {
        // Before the durable check, whose RENEW and WAIT then cover these releases too.
        if (lastReleases.has(ids[i])) await this._dropStale(key, owner, tokens[i], ids[i]);
      }
      // Each key given back with the others (the catch below) when the replicas do not confirm it.
      if (durable.replicas > 0) {
        for (const [i, key] of keys.entries()) await this._confirmDurable(key, owner, tokens[i], lease, durable, grants[i].node);
      }
    } catch (err) {
      for (const handle of handles) handle?.grant.drop(handle);
      await this._releaseHolds(keys, owner, tokens, ids, 1).catch(() => {});
      // Uncounted once the give-backs were answered (see Lock#release).
      for (const id of ids) this._hold(id, -1);
      throw err;
    }
  }

  // The rest of what a session's try or wait for one key came to (`outcome`): an abort, a grant
  // whose lease is asked anew, an error; [{ token, handle, node }], or null when busy. `lease` 0:
  // a session grant.
  async _sessionOutcome(key, owner, lease, signal, mode, plan, outcome) {
    if (outcome.aborted) {
      // The grant won the race with the abort: hand it back before reporting the abort.
      if (outcome.token) await this._releaseHolds([key], owner, tokensOf(outcome.token), [pairId(key, owner)], 1).catch(() => {});
      throw abortError(signal);
    }
    if (outcome.token) {
      const life = outcome.life.entry ? outcome.life : await this._confirmLife(key, owner, lease, outcome.life);
      return [this._watchOutcome(key, owner, outcome, mode, plan, lease, life)];
    }
    if (outcome.error) throw outcome.error;
    return null;
  }

  // A session's grant, watched from now on: { token, handle, node }.
  _watchOutcome(key, owner, { token, node }, mode, plan, lease, life) {
    const handle = this._session.watch(key, owner, token, node, mode.mode, { extra: mode.args, plan, lease, life });
    return { token: BigInt(token), handle, node };
  }

  // A try through the session of the key's node: { token, node, life } or { timeout }.
  async _try(key, owner, lease, extra) {
    let to;
    for (let attempt = 0; ; attempt++) {
      const entry = this._session.openFor(key, to) ?? (await this._session.sessionFor(key, to));
      const { node, id: sid } = entry;
      const sent = now();
      try {
        const args = ['FLOCK.ACQUIRE', key, owner, String(lease), 'INBOX', sid, ...extra];
        const reply = await this._send(this._conn, args, { node });
        if (reply === null) return { timeout: true };
        // A session grant of a session that ended while the reply was on its way ended with it:
        // tried again on a new session.
        if (lease === 0 && entry.broken && attempt < this.settings.resends) continue;
        return { token: String(reply), node, life: lease === 0 ? { entry } : { until: sent + lease - margin(lease) } };
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
   * A grant's lease deadline counted from a send well before the grant (a blocking wait's, a
   * resent wait's: more than a quarter of the lease ago) would report it lost early: the lease
   * left is asked instead (FLOCK.INFO, the holder's ttl-ms, counted from that send). A session
   * grant, or a deadline counted from a recent send, is left as it is.
   */
  async _confirmLife(key, owner, lease, life) {
    if (life.until === undefined) return life;
    const basis = life.until + margin(lease) - lease;
    if (now() - basis <= lease / PROTOCOL.heartbeatFraction) return life;
    const sent = now();
    try {
      const info = await this._send(this._conn, ['FLOCK.INFO', key], { noId: true });
      const ttl = Number(holderOf(info, owner)?.ttl ?? -1);
      return ttl >= 0 ? { until: Math.max(life.until, sent + ttl - margin(lease)) } : life;
    } catch {
      return life;
    }
  }

  /**
   * A durable grant (docs/client-protocol.md, "Durable grants"): `FLOCK.RENEW key owner lease ID`
   * and `WAIT replicas timeout` in one round trip on a connection of FLOCK's own to the key's node
   * (`node`: the one that granted it, if known). The RENEW is this connection's write, after the
   * grant in the replication stream, so the WAIT's count covers the grant (a grant pushed to the
   * session, or handed over in another client's command, is no write of this connection's).
   * Throws LockNotDurableError when fewer replicas answer, or the RENEW finds the grant (`token`)
   * gone: NOTOWNER, or another grant of this owner's (a failover's promoted replica kept an older
   * one); the caller gives the hold back.
   */
  async _confirmDurable(key, owner, token, lease, { replicas, timeout }, node) {
    node ??= await this._conn.nodeOf(key);
    for (let attempt = 0; ; attempt++) {
      const conn = await this._ownConn(node);
      let renew, wait;
      try {
        // A fresh request ID on each attempt: a resend answered from the ID's record writes nothing,
        // and the WAIT after it would count acknowledgements of nothing.
        [renew, wait] = await conn.pipeline(
          [
            ['FLOCK.RENEW', key, owner, String(lease), 'ID', newRequestId()],
            ['WAIT', String(replicas), String(timeout)],
          ],
          timeout + this._commandTimeout(),
        );
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
      const renewed = BigInt(String(renew.value));
      if (renewed !== token) {
        throw new LockNotDurableError(
          `The lock ${key} was not kept durable: its grant (token ${token}) was gone, the server holds another grant of this owner (token ${renewed}); the hold was given back`,
          key,
          { reached, replicas },
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
   * holds); then a WAIT that blocks a connection of FLOCK's own. [{ token, life }] in key order
   * (each lease counted from the send of the command that was granted), or null.
   */
  async _acquireBlocking(keys, owner, lease, wait, signal, extra) {
    const base =
      keys.length === 1
        ? ['FLOCK.ACQUIRE', keys[0], owner, String(lease)]
        : ['FLOCK.ACQUIREALL', String(keys.length), ...keys, owner, String(lease)];
    let sent = now();
    let reply = await this._send(this._conn, [...base, ...extra]);
    if (reply === null && wait >= 1) {
      const giveBack = (granted) => this._releaseHolds(keys, owner, tokensOf(granted), undefined, 1);
      sent = now();
      reply = await this._wait(keys[0], (timeout) => [...base, 'WAIT', timeout, ...extra], wait, signal, giveBack);
    }
    const life = { until: sent + lease - margin(lease) };
    return reply === null ? null : tokensOf(reply).map((token) => ({ token, life }));
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
    const rid = newRequestId();
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
      // Blocked for the wait's time (0: no limit), and a grace for its answer to come.
      const waitMs = Number(args[args.indexOf('WAIT') + 1]);
      const timeout = waitMs === 0 ? Infinity : waitMs + PROTOCOL.cancelGraceMs;
      const reply = await this._send(conn, args, { rid, resends: 0, timeout });
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
   *
   * `counted`: the holds of each (key, owner) that the caller's grant still has in the process's
   * count (Flock#_hold; 1, or 0 when it has none there). Holds left once the process counts none
   * of that owner beyond the caller's are stale: none of its locks or acquires under way has
   * them (a failover's churn reentered a grant whose memory another grant has since replaced, a
   * hold never seen): they are given back at once (_giveBackLeft), and that key answers 0. Not
   * async: every release goes through here, and a release that leaves no hold, the common case,
   * costs one comparison more.
   */
  _releaseHolds(keys, owner, tokens, ids = keys.map((key) => pairId(key, owner)), counted = 0) {
    const args = keys.length === 1 ? ['FLOCK.RELEASE', keys[0], owner] : ['FLOCK.RELEASEALL', String(keys.length), ...keys, owner];
    return this._send(this._conn, args).then(
      (reply) => {
        const left = keys.length === 1 ? [Number(reply)] : reply.map(Number);
        let stale = null;
        for (let i = 0; i < ids.length; i++) {
          if (left[i] === 0) this._rememberRelease(ids[i], tokens[i]);
          else if ((holding.get(ids[i]) ?? 0) <= counted) (stale ??= []).push(i);
        }
        return stale ? this._giveBackLeft(keys, owner, tokens, ids, left, stale) : left;
      },
      (err) => this._releaseFailed(keys, owner, tokens, ids, err, counted),
    );
  }

  /**
   * _releaseHolds' stale holds: each key of index in `stale`, with holds `left` of which the
   * process counts none (see there), is released that many times more, and answers 0. At most
   * `left`: an acquire of the owner sent meanwhile, and so not seen in the count, keeps the hold
   * it adds. A give-back that leaves no hold, or that fails other than with NOTOWNER (the holds
   * are gone), is remembered as a release is, for the owner's next grant (_dropStale).
   */
  async _giveBackLeft(keys, owner, tokens, ids, left, stale) {
    const answered = left.slice();
    await Promise.all(
      stale.map(async (i) => {
        answered[i] = 0;
        try {
          for (let n = left[i]; n > 0; n--) {
            if ((await this._releaseKey(keys[i], owner)) === 0) return this._rememberRelease(ids[i], tokens[i]);
          }
        } catch (err) {
          if (!(err instanceof LockNotHeldError)) this._rememberRelease(ids[i], tokens[i]);
        }
      }),
    );
    return answered;
  }

  // _releaseHolds' release that failed, with `err`.
  async _releaseFailed(keys, owner, tokens, ids, err, counted) {
    if (!(err instanceof LockNotHeldError)) {
      ids.forEach((id, i) => this._rememberRelease(id, tokens[i]));
      throw err;
    }
    if (keys.length === 1) throw err;
    const each = await Promise.allSettled(keys.map((key, i) => this._releaseHolds([key], owner, [tokens[i]], [ids[i]], counted)));
    const failed = each.find((result) => result.status === 'rejected');
    if (failed) throw failed.reason;
    return each.map((result) => result.value[0]);
  }

  // `id`: pairId(key, owner).
  _rememberRelease(id, token) {
    lastReleases.set(id, token);
  }

  // Counts the holds of (key, owner) that the process's locks have or its acquires under way may
  // get (`by` 1 before an acquire is sent, -1 once its release was answered or it ended without a grant).
  _hold(id, by) {
    const n = (holding.get(id) ?? 0) + by;
    if (n > 0) holding.set(id, n);
    else holding = without(holding, id);
  }

  /**
   * A grant of (key, owner) came back with the token of that owner's last release remembered (see
   * _releaseHolds), or with any token after an acquire of theirs that got no reply (ANY_TOKEN): the
   * server still had that grant (the release was lost with a deposed master, or refused; the
   * acquire was granted), so this grant reentered it and the holds released are still counted, each
   * reentry renewing the lease: an owner that loops acquire/release would keep the lock from every
   * other. The holds the server counts beyond those the process's locks and acquires under way
   * have (this one included: counted since its acquire was sent) are given back now, so that the
   * caller's one release frees the lock. If the server refuses again, the release is remembered
   * again, for the next grant; the acquire stands.
   */
  async _dropStale(key, owner, token, id) {
    const last = lastReleases.get(id);
    lastReleases.delete(id);
    if (last !== token && last !== ANY_TOKEN) return;
    try {
      const holds = holdsOf(await this._send(this._conn, ['FLOCK.INFO', key], { noId: true }), owner);
      for (let extra = holds - (holding.get(id) ?? 0); extra > 0; extra--) {
        await this._releaseKey(key, owner);
      }
    } catch (err) {
      if (!(err instanceof LockNotHeldError)) this._rememberRelease(id, token);
    }
  }

  // A renewal: its timeout is its grant's deadline (`until`).
  async _renewKey(key, owner, lease, until) {
    return BigInt(await this._send(this._conn, ['FLOCK.RENEW', key, owner, String(lease)], { until }));
  }

  /** The session timeout T: the one asked for, else the one the server last named, else the server's default. */
  _sessionTimeout() {
    return this.settings.sessionTimeoutMs ?? this._knownSessionTimeout ?? SERVER_SESSION_TIMEOUT_MS;
  }

  /** The timeout of a command that serves no deadline: T/4. */
  _commandTimeout() {
    return Math.floor(this._sessionTimeout() / PROTOCOL.heartbeatFraction);
  }

  // Every command carries a request ID (fresh unless given); a lost reply (I/O error, a timeout;
  // not an error reply) is resent at once with the same ID, which the server applies once and
  // answers with the first reply (`resends` times at most). `noId`: commands without the ID option
  // (CANCEL, INFO). `node`: sent on that node's own connection (a command that names its session),
  // not routed. Each send has a timeout: until `until` (the deadline the command serves: a number
  // or a function on protocol.now()'s clock), else `timeout` ms, else T/4; none hangs. Not
  // async: every command of an acquire and a release goes through here.
  _send(conn, args, options = NO_OPTIONS) {
    const full = options.noId ? args : args.concat('ID', options.rid ?? newRequestId());
    return this._attempt(conn, args, full, options, 0);
  }

  // Attempt `n` of _send's command (`full`: with its ID), and the resends that follow a lost reply.
  _attempt(conn, args, full, options, n) {
    const { until, timeout } = options;
    const deadline = typeof until === 'function' ? until() : until;
    const ms = deadline !== undefined ? deadline - now() : (timeout ?? this._commandTimeout());
    return conn.send(full, options.node, ms, (err) => {
      if (isReplyError(err)) throw replyError(err, args);
      if (n >= (options.resends ?? this.settings.resends) || ms <= 0) throw err;
      return this._attempt(conn, args, full, options, n + 1);
    });
  }
}

// Whether an acquire's error leaves unknown whether the server granted it: no reply came (an I/O
// error or a timeout after the resends), neither an error reply (the client's own types keep it
// as `cause`) nor an abort.
function unanswered(err) {
  return !(err instanceof AbortError) && !isReplyError(err) && !isReplyError(err?.cause);
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

// `owner`'s entry in a FLOCK.INFO reply ({ holds, ttl }), or undefined (it holds nothing).
function holderOf(info, owner) {
  if (info === null || info === undefined) return undefined;
  for (const holder of field(info, 'holders') ?? []) {
    if (String(field(holder, 'owner')) === owner) return { holds: Number(field(holder, 'holds')), ttl: Number(field(holder, 'ttl-ms')) };
  }
  return undefined;
}

// The holds `owner` has according to a FLOCK.INFO reply (0: none, or nobody holds the key).
function holdsOf(info, owner) {
  return holderOf(info, owner)?.holds ?? 0;
}

// The server's error codes that callers catch by type, and what they say of one key and of
// several; the rest reach callers unchanged (CROSSSLOT with a hint).
const REPLY_ERRORS = [
  ['NOTOWNER', LockNotHeldError, 'is not held by this owner', 'are not all held by this owner'],
  ['STALE', StaleTokenError, 'is no longer held with this token: the command did not run', 'are no longer held with this token: the command did not run'],
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

// A loss ({ key, reason, text }) as the error of the lock's signal.
function lostError(lost) {
  return new LockLostError(lost.text, lost.key, { reason: lost.reason });
}

// redlock's using() extends when `automaticExtensionThreshold` ms are left; FLOCK's default is lease/3.
function renewPeriod(lease, threshold) {
  const period = threshold === undefined ? lease / PROTOCOL.watchdogRenewFraction : lease - threshold;
  return Math.max(1, Math.floor(period));
}

const SIGNAL = AbortSignal.prototype;
const abortedOf = Object.getOwnPropertyDescriptor(SIGNAL, 'aborted').get;
const reasonOf = Object.getOwnPropertyDescriptor(SIGNAL, 'reason').get;

// The prototype of a lock's signal: an AbortSignal whose `aborted`, `reason` and
// `throwIfAborted()` first run the deadlines due by the clock now (sweep), so that what they
// answer is true when they are read, even before an overdue timer has run.
const CHECKED_SIGNAL = Object.create(SIGNAL, {
  aborted: {
    get() {
      sweep();
      return abortedOf.call(this);
    },
  },
  reason: {
    get() {
      sweep();
      return reasonOf.call(this);
    },
  },
  throwIfAborted: {
    value() {
      sweep();
      return SIGNAL.throwIfAborted.call(this);
    },
  },
});

/**
 * A held lock: `token` (bigint fencing token of the first resource; `tokens` for each),
 * `release()`, `extend(lease)`, and `signal`, which aborts with `signal.error` when the lock is lost.
 * `mode` is how it was asked for: 'exclusive', 'shared' or 'semaphore' (`permits` of it).
 *
 * Lost: at its deadline (a timer), when the server pushes the loss, when a renewal answers
 * NOTOWNER, or when its session ends; `lost`, `signal.aborted`, `signal.reason` and
 * `signal.throwIfAborted()` also compare the deadline with the clock when they are read.
 */
class Lock {
  constructor(flock, resources, owner, tokens, lease, renewEvery, { mode, permits }, handles, holdIds) {
    this.flock = flock;
    this.resources = resources;
    this.owner = owner;
    this.mode = mode;
    this.permits = permits;
    // The tokens in resource order; `tokens` maps them by resource when first read.
    this._tokens = tokens;
    this._tokensByKey = null;
    // The lease asked for (0: a session grant, which has none of its own).
    this.lease = lease;
    // The signal's controller, made when `signal` is first read.
    this._controller = null;
    this._lostError = null;
    this._renewEvery = renewEvery;
    this._renewing = null;
    this._timer = null;
    this._released = false;
    // Whether release() took this lock's holds off the process's count (Flock#_hold).
    this._uncounted = false;
    // One handle per resource, in order: this lock's hold of each grant; and each one's pairId.
    this._handles = handles;
    this._holdIds = holdIds;
    this._schedule();
    // A loss (pushed, a deadline, the session's end) aborts the signal at once.
    for (const handle of handles) {
      handle.onLost = (lost) => this._released || this._lose(lostError(lost));
      if (handle.lost) this._lose(lostError(handle.lost));
    }
  }

  get token() {
    return this._tokens[0];
  }

  /** The fencing token of each resource. */
  get tokens() {
    this._tokensByKey ??= new Map(this.resources.map((key, i) => [key, this._tokens[i]]));
    return this._tokensByKey;
  }

  /** redlock's `lock.value`: what identifies this holder on the server (here its owner). */
  get value() {
    return this.owner;
  }

  /** Aborts with a LockLostError (also `signal.error`) when the lock is lost. */
  get signal() {
    if (!this._controller) {
      this._controller = new AbortController();
      Object.setPrototypeOf(this._controller.signal, CHECKED_SIGNAL);
      if (this._lostError) this._abort();
    }
    return this._controller.signal;
  }

  /**
   * Whether the lock is lost, by the clock now: a deadline that has passed counts at once (the
   * signal aborts then), before its timer runs: a process paused past it (SIGSTOP, a long GC)
   * sees it at its first check.
   */
  get lost() {
    sweep();
    return this._lostError !== null;
  }

  /** The deadline (ms since the epoch) until which the server is known to hold the lock; 0 once released or lost. */
  get expiration() {
    if (this._released || this.lost) return 0;
    const until = Math.min(...this._handles.map((handle) => handle.grant.until));
    return Math.floor(Date.now() + (until - now()));
  }

  /**
   * Sets every resource's lease to `lease` ms from now (a session grant gets a lease of its own:
   * from then on it is a fixed lease unless the watchdog renews it); resolves to this lock
   * (redlock resolves to a new one). A lost lock is not extended: LockNotHeldError.
   */
  async extend(lease) {
    integerMs(lease, 'Duration');
    if (lease < 1) throw new RangeError('Duration must be at least 1 ms');
    if (this.lost) {
      throw new LockNotHeldError(`${this._lostError.message}; it is not extended`, this._lostError.key, { cause: this._lostError });
    }
    const sent = now();
    try {
      await Promise.all(this.resources.map((key, i) => this.flock._renewKey(key, this.owner, lease, () => this._handles[i].grant.until)));
    } catch (err) {
      if (err instanceof LockNotHeldError) this._lose(err);
      throw err;
    }
    this.lease = lease;
    // Each grant's lease is now this one, counted from the send.
    for (const handle of this._handles) {
      handle.lease = lease;
      if (handle.plan === 'session') handle.plan = 'fixed';
      handle.grant.leaseUntil(sent + lease - margin(lease));
    }
    return this;
  }

  /**
   * Runs `command` (an array: a command of the server and its arguments, `['HSET',
   * '{order:42}:row', 'status', 'paid']`) only while this lock's grant of `resource` (by default
   * its first) holds it, in one step on the server (FLOCK.FENCED with the grant's fencing token);
   * resolves to the command's reply. Rejects with StaleTokenError when the grant has ended
   * (nothing ran; the lock is then lost; nothing is sent when it is known lost here), and with
   * the command's own errors. In a Cluster the command's keys share the lock's slot: give them
   * its hash tag (docs/fencing.md).
   */
  async fenced(command, { resource = this.resources[0] } = {}) {
    const i = this.resources.indexOf(resource);
    if (i < 0) throw new TypeError(`${resource} is not a resource of this lock (${this.resources.join(', ')})`);
    if (this._released) throw new LockNotHeldError(`The lock ${resource} was released: nothing is written through it`, resource);
    if (this.lost) {
      throw new StaleTokenError(`The lock ${resource} was lost (${this._lostError.message}): the command was not sent`, resource, {
        cause: this._lostError,
      });
    }
    try {
      return await this.flock._send(this.flock._conn, ['FLOCK.FENCED', resource, String(this._tokens[i]), ...command], {
        // Applied once or not at all: FLOCK.FENCED takes no request ID, so a lost reply is not resent.
        noId: true,
        resends: 0,
      });
    } catch (err) {
      if (err instanceof StaleTokenError) this._lose(new LockLostError(err.message, resource, { cause: err, reason: 'notowner' }));
      throw err;
    }
  }

  /**
   * Releases one hold of each resource (several: one FLOCK.RELEASEALL, all or none); resolves to
   * the holds left of the first (0 when no other lock or acquire of the process has them: stale
   * holds, given back at once, Flock#_releaseHolds). If one was lost, the others are still
   * released and the lost one's LockNotHeldError is thrown. A lock reported lost rejects with
   * LockNotHeldError (its `cause` the loss) whatever the server answers: the RELEASE is still
   * sent, so that a hold the server still counts (its deadline passed here first) is given back
   * at once.
   */
  release() {
    // Not async (a turn and a promise less between the reply and the caller's next step), and
    // so it rejects rather than throws.
    try {
      const lost = this.lost ? this._lostError : null;
      this._released = true;
      for (const handle of this._handles) handle.released = true;
      clearTimeout(this._timer);
      // A renewal in flight would race the release; let it finish (its outcome no longer
      // matters). So would a re-watch's extra hold (added and released after a session break):
      // the hold count this release answers must not count it.
      if (this._renewing || this.flock._session.rewatching.size > 0) return this._settled().then(() => this._release(lost));
      return this._release(lost);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  async _settled() {
    if (this._renewing) await this._renewing;
    if (this.flock._session.rewatching.size > 0) await this.flock._session.settled(this._handles);
  }

  // release()'s RELEASE (or RELEASEALL). Not async: every release goes through here.
  _release(lost) {
    const uncount = !this._uncounted;
    this._uncounted = true;
    // Uncounted once the releases were answered: a stale-hold check of the same owner meanwhile
    // (Flock#_dropStale) then counts this hold until the server no longer does, and so never
    // gives back more than the stale holds.
    const answered = () => {
      if (uncount) for (const id of this._holdIds) this.flock._hold(id, -1);
      for (const handle of this._handles) handle.grant.drop(handle);
    };
    return this.flock._releaseHolds(this.resources, this.owner, this._tokens, this._holdIds, uncount ? 1 : 0).then(
      (left) => {
        answered();
        if (lost) throw new LockNotHeldError(`${lost.message}; it was not held when released`, lost.key, { cause: lost });
        return left[0];
      },
      (err) => {
        answered();
        throw err;
      },
    );
  }

  _schedule() {
    if (this._renewEvery === 0 || this._released) return;
    this._timer = setTimeout(() => (this._renewing = this._renew()), this._renewEvery);
    // A forgotten lock must not keep the process alive; its lease ends on the server.
    this._timer.unref();
  }

  // The watchdog: a renewal whose reply is lost or late is tried again at the next period; its
  // deadline (the last renewal answered + the lease - m) reports the loss when none got through.
  async _renew() {
    try {
      await this.extend(this.lease);
    } catch (err) {
      if (err instanceof LockNotHeldError) return;
    } finally {
      this._renewing = null;
    }
    this._schedule();
  }

  _lose(err) {
    if (this._lostError) return;
    const lost = err instanceof LockLostError ? err : new LockLostError(err.message, err.key, { cause: err, reason: 'notowner' });
    this._lostError = lost;
    clearTimeout(this._timer);
    this._renewEvery = 0;
    if (this._controller) this._abort();
  }

  _abort() {
    const signal = this._controller.signal;
    signal.error = this._lostError;
    this._controller.abort(this._lostError);
  }
}

module.exports = { Flock, Lock, DEFAULTS };
