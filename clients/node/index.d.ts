// Types of redis-flock (hand-written; the package is plain JavaScript).

/**
 * An ioredis client (`Redis`, also with `sentinels`, or `Redis.Cluster`) or a node-redis v5+
 * client (`createClient()`, `createCluster()` or `createSentinel()`), connected or connecting.
 * Structural, so that neither library is needed to compile against these types.
 */
export type RedisClient =
  | { call(...args: any[]): Promise<unknown>; duplicate(...args: any[]): unknown; options: object }
  | { sendCommand(...args: any[]): Promise<unknown>; duplicate(...args: any[]): unknown; withTypeMapping(...args: any[]): unknown }
  | { sendCommand(...args: any[]): Promise<unknown>; getMasterNode(): unknown; acquire(): Promise<unknown> };

/**
 * One key, or several (up to 256) taken together, all or none, in one server call (and released
 * in one): in a Cluster they must share a slot (a hash tag). Several keys take no `permits`.
 */
export type Resources = string | readonly string[];

export interface FlockSettings {
  /**
   * Lease of a lock given none that is not a session grant (`sessions: false`, durable grants);
   * the watchdog renews it every third. Default 30000.
   */
  readonly watchdogLease?: number;
  /** Default wait of acquire() in ms (0 = try once, Infinity = no limit). Default 2000, redlock's retry window. */
  readonly wait?: number;
  /** redlock's settings: when `wait` is absent, acquire() waits retryCount x retryDelay ms (-1 = no limit). */
  readonly retryCount?: number;
  readonly retryDelay?: number;
  /** Resends of a command (same request ID) after a lost reply. Default 3. */
  readonly resends?: number;
  /**
   * Default true: every acquire goes through this Flock's session (one extra connection for all
   * waits, losses pushed by the server to `lock.signal`), and a lock without a fixed lease is a
   * session grant: it lives while the session is heard from, with no renewals. false: each wait
   * blocks a connection of its own (the blocking `FLOCK.ACQUIRE ... WAIT`), a watchdog renews a
   * lock without a fixed lease, losses found by renewals only.
   */
  readonly sessions?: boolean;
  /**
   * The session timeout T in ms (100 to 3600000; `FLOCK.SESSION TIMEOUT`): how long the server
   * keeps a session, and its session grants, without hearing from it. The reader's heartbeat reads
   * come every T/4; a session grant is reported lost (`unconfirmed`) once T - (10 ms + 1% of T)
   * passed since the send of the last read answered. Default: the server's
   * `flock.session-timeout-ms` (10000 unless configured).
   */
  readonly sessionTimeoutMs?: number;
  /**
   * node-redis `createSentinel()` only: options of the client FLOCK opens to the master for its
   * session (the sentinel client's own `nodeClientOptions` are private), e.g. credentials.
   */
  readonly nodeOptions?: Record<string, unknown>;
  /**
   * Durable grants: a grant counts only once this many replicas acknowledged it (after each grant,
   * `FLOCK.RENEW` then `WAIT durableReplicas durableTimeout` on a connection to the key's node);
   * fewer: the hold is given back and acquire() rejects with LockNotDurableError. Name every
   * replica of the deployment (not "those the master has now"): see docs/durability.md for what
   * each setting survived. Default 0 (off).
   */
  readonly durableReplicas?: number;
  /** How long (ms, at least 1) WAIT waits for the replicas of a durable grant. Default 1000. */
  readonly durableTimeout?: number;
}

/**
 * The mode of a grant: exclusive (neither option), the read side of a read-write lock
 * (`shared: true`), or `permits` (default 1) of a semaphore of `limit` permits. Reentry: a writer
 * may also read; a reader asking to write gets LockUpgradeError.
 */
export type ModeOptions =
  | { readonly shared?: false; readonly permits?: undefined; readonly limit?: undefined }
  | { readonly shared: true; readonly permits?: undefined; readonly limit?: undefined }
  | { readonly shared?: false; readonly permits?: number; readonly limit: number };

export type LockMode = 'exclusive' | 'shared' | 'semaphore';

export type AcquireOptions = ModeOptions & BaseAcquireOptions;

export interface BaseAcquireOptions {
  /**
   * A fixed lease in ms, never renewed: lost (`expired`) when it runs out. Absent: a session grant
   * (it lives with the Flock's session; with `sessions: false` or durable grants, a watchdog lease
   * renewed until release()).
   */
  readonly lease?: number;
  /** Keep the lock without a fixed lease (as using() does): a session grant, or a watchdog renewing `lease`. */
  readonly renew?: boolean;
  /** How long to queue, in ms: 0 = try once, Infinity = no limit. Default: the Flock's `wait`. */
  readonly wait?: number;
  /** Aborting it cancels the wait on the server (FLOCK.CANCEL); acquire() then rejects with AbortError. */
  readonly signal?: AbortSignal;
  /**
   * The owner to acquire as (default: a new one per acquire, `<process id>:<n>`, shared by all its keys). Re-enters a
   * lock this owner holds (`lock.owner`): one more hold, the same token. The same owner on all of
   * a caller's acquires lets the server see a cycle of waits through them (LockDeadlockError).
   */
  readonly owner?: string;
  /**
   * LOCKDELAY in ms (0 to 60000): when this grant ends without being released (its lease ran out, its
   * session ended), the server grants the lock to nobody for that long. Absent: the server's
   * `flock.lock-delay-ms`.
   */
  readonly lockDelay?: number;
  /** redlock's retry settings, used when `wait` is absent (wait = retryCount x retryDelay). */
  readonly retryCount?: number;
  readonly retryDelay?: number;
  /** redlock's using() without a session: the watchdog renews when this many ms of the lease are left (default: every lease/3). */
  readonly automaticExtensionThreshold?: number;
  /** This acquire's durableReplicas (0: not durable); default: the Flock's setting. */
  readonly durableReplicas?: number;
  /** This acquire's durableTimeout in ms; default: the Flock's setting. */
  readonly durableTimeout?: number;
}

/**
 * A signal that aborts when a held lock is lost; `error` (and `reason`) says why. Like redlock's
 * RedlockAbortSignal. Its `aborted`, `reason` and `throwIfAborted()` compare the lock's deadline
 * with the clock when they are read.
 */
export type LockAbortSignal = AbortSignal & { error?: LockLostError };

/** A held lock. */
export class Lock {
  private constructor();
  readonly flock: Flock;
  readonly resources: readonly string[];
  /** The owner FLOCK knows this holder by (`<process id>:<n>`, new per acquire() unless given). */
  readonly owner: string;
  /** redlock's `lock.value`: the same as `owner`. */
  readonly value: string;
  /** How it was acquired: exclusive, shared (a reader) or semaphore (`permits` of it). */
  readonly mode: LockMode;
  /** The semaphore permits held (0 for a lock). */
  readonly permits: number;
  /** Fencing token of resources[0]: a bigint, since tokens (about unix-ms x 2^20) exceed 2^53. */
  readonly token: bigint;
  /** Fencing token of each resource. */
  readonly tokens: ReadonlyMap<string, bigint>;
  /** The lease in ms (the last one given to extend(), or the watchdog's); 0 for a session grant. */
  readonly lease: number;
  /**
   * The local deadline (ms since the epoch) until which the server is known to hold the lock: the
   * session's for a session grant, else its lease's, each taken in by the drift margin; 0 once
   * released or lost.
   */
  readonly expiration: number;
  /**
   * Whether the lock is lost, by the clock when read: a deadline that passed counts at once (and
   * aborts `signal`), even before its timer ran, so a process paused past it (SIGSTOP, a long GC)
   * sees it lost at its first check.
   */
  readonly lost: boolean;
  /**
   * Aborts with a LockLostError when the lock is lost: at its deadline (a timer; `expired` for a
   * fixed lease, `unconfirmed` for a session or watchdog grant), when the server pushes the loss
   * (`expired`, `forcereleased`, `deleted`, `demoted`), when its session ends (`sessionended`), or
   * when a renewal or check answers NOTOWNER (`notowner`). `aborted`, `reason` and
   * `throwIfAborted()` look at the clock when read, as `lost` does.
   */
  readonly signal: LockAbortSignal;
  /**
   * Resets the lease of every resource to `lease` ms from now (a session grant then has that fixed
   * lease). Rejects with LockNotHeldError if lost.
   */
  extend(lease: number): Promise<this>;
  /**
   * Runs `command` (a command of the server and its arguments) only while this lock's grant of
   * `resource` (default: its first) holds it, in one step (FLOCK.FENCED with the grant's fencing
   * token); resolves to the command's reply. Rejects with StaleTokenError once the grant ended
   * (nothing ran; the lock is then lost), and with the command's own errors.
   */
  fenced(command: Array<string | Buffer | number>, options?: { resource?: string }): Promise<unknown>;
  /**
   * Releases one hold of each resource (several: in one call); resolves to the holds left of the
   * first (0 = free). Stops the watchdog. If one was lost, the others are still released and it
   * rejects with the lost one's LockNotHeldError.
   */
  release(): Promise<number>;
}

/** A FLOCK lock service over one client. */
export class Flock {
  /** `client` or `[client]` (redlock's constructor takes a list; FLOCK needs exactly one server). */
  constructor(client: RedisClient | readonly [RedisClient], settings?: FlockSettings);
  readonly settings: Readonly<
    Required<Pick<FlockSettings, 'watchdogLease' | 'wait' | 'resends' | 'sessions' | 'durableReplicas' | 'durableTimeout'>> &
      Pick<FlockSettings, 'sessionTimeoutMs'>
  >;
  acquire(resources: Resources, options?: AcquireOptions): Promise<Lock>;
  /** redlock's shape: a fixed lease of `duration` ms (no watchdog). */
  acquire(resources: Resources, duration: number, settings?: ModeOptions & Omit<BaseAcquireOptions, 'lease'>): Promise<Lock>;
  /** Runs `routine` under a lock without a fixed lease (a session grant); releases when it settles. */
  using<T>(resources: Resources, routine: (signal: LockAbortSignal) => Promise<T>): Promise<T>;
  /** The same with options (a mode, `wait`, `signal`, ...). */
  using<T>(
    resources: Resources,
    options: ModeOptions & Omit<BaseAcquireOptions, 'lease' | 'renew'>,
    routine: (signal: LockAbortSignal) => Promise<T>,
  ): Promise<T>;
  /**
   * redlock's shapes: held while the routine runs (a session grant; without a session, a
   * `duration` ms lease renewed automatically).
   */
  using<T>(resources: Resources, duration: number, routine: (signal: LockAbortSignal) => Promise<T>): Promise<T>;
  using<T>(
    resources: Resources,
    duration: number,
    settings: ModeOptions & Omit<BaseAcquireOptions, 'lease' | 'renew'>,
    routine: (signal: LockAbortSignal) => Promise<T>,
  ): Promise<T>;
  /** redlock's `Redlock#release(lock)`: `lock.release()`. */
  release(lock: Lock): Promise<number>;
  /** redlock's `Redlock#extend(lock, duration)`: `lock.extend(duration)`, resolves to the same lock. */
  extend(lock: Lock, duration: number): Promise<Lock>;
  /**
   * Closes the connections the Flock opened itself (its session's, and with ioredis its command
   * connection), never the client it was given. Optional: none of them keeps the process alive.
   */
  quit(): Promise<void>;
}

export default Flock;

export const DEFAULTS: Readonly<{
  watchdogLease: number;
  wait: number;
  resends: number;
  sessions: boolean;
  sessionTimeoutMs: number | undefined;
  durableReplicas: number;
  durableTimeout: number;
}>;

/** How a lock was lost (docs/client-protocol.md, "Losses"). */
export type LossReason = 'expired' | 'unconfirmed' | 'sessionended' | 'forcereleased' | 'deleted' | 'demoted' | 'notowner';

/**
 * The rules every FLOCK client shares (docs/client-protocol.md; clients/scenarios.json's
 * `protocol` block).
 */
export const PROTOCOL: Readonly<{
  /** The session reader's reads wait at most T / heartbeatFraction. */
  heartbeatFraction: number;
  /** A deadline is taken in by driftMarginMs + driftMarginPercent % of its lease or timeout. */
  driftMarginMs: number;
  driftMarginPercent: number;
  /** A grant without a session: this lease, renewed every lease / watchdogRenewFraction. */
  watchdogLeaseMs: number;
  watchdogRenewFraction: number;
  /** Resends of a command whose reply was lost. */
  resends: number;
  /** A wait whose FLOCK.CANCEL got no answer and no event within this closes its session. */
  cancelGraceMs: number;
  lossReasons: readonly LossReason[];
}>;

/** NOTOWNER: this owner does not hold the lock (never acquired, released, or its lease ended). */
export class LockNotHeldError extends Error {
  readonly name: 'LockNotHeldError';
  readonly key: string;
}

/** STALE: a fenced() command was refused, its grant having ended; nothing ran. */
export class StaleTokenError extends LockNotHeldError {
  readonly name: 'StaleTokenError';
}

/** The lock stayed busy for the whole wait (or at once, for a try); for several keys, `key` is the first. */
export class LockBusyError extends Error {
  readonly name: 'LockBusyError';
  readonly key: string;
}

/** A held lock was lost; the error of `lock.signal`. */
export class LockLostError extends Error {
  readonly name: 'LockLostError';
  readonly key: string;
  /** How it was lost, in one word (the message says more). */
  readonly reason: LossReason;
}

/**
 * A command got no reply within its timeout (a partition, a server that stopped answering), even
 * after its resends. `code` ETIMEDOUT.
 */
export class CommandTimeoutError extends Error {
  readonly name: 'CommandTimeoutError';
  readonly code: 'ETIMEDOUT';
}

/** UPGRADE: this owner holds the lock shared and asked for it exclusively; release the read holds first. */
export class LockUpgradeError extends Error {
  readonly name: 'LockUpgradeError';
  readonly key: string;
}

/**
 * DEADLOCK: the wait would never end (its owner would wait for itself through others); nothing was
 * queued. For several keys, `key` is the first.
 */
export class LockDeadlockError extends Error {
  readonly name: 'LockDeadlockError';
  readonly key: string;
}

/** WRONGMODE: permits on a lock, or no permits or another limit on a semaphore. */
export class LockModeError extends Error {
  readonly name: 'LockModeError';
  readonly key: string;
}

/**
 * NOTDURABLE: fewer replicas than `durableReplicas` acknowledged a grant within `durableTimeout`
 * (or its lease ended first); the hold was given back (FLOCK.RELEASE).
 */
export class LockNotDurableError extends Error {
  readonly name: 'LockNotDurableError';
  readonly code: 'NOTDURABLE';
  readonly key: string;
  /** The replicas that acknowledged the grant (WAIT's answer). */
  readonly reached: number;
  /** The replicas asked for (durableReplicas). */
  readonly replicas: number;
}

/** A wait cancelled by its AbortSignal; `cause` is the signal's reason. */
export class AbortError extends Error {
  readonly name: 'AbortError';
  readonly code: 'ABORT_ERR';
}
