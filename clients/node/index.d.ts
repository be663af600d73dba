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
  /** Lease when acquire() is given none; the watchdog renews it every third. Default 30000. */
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
   * waits, losses pushed by the server to `lock.signal`). false: each wait blocks a connection of
   * its own (the blocking `FLOCK.ACQUIRE ... WAIT`), losses found by renewals only.
   */
  readonly sessions?: boolean;
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
  /** Lease in ms. Absent: a watchdog lease (`watchdogLease`) renewed until release(). */
  readonly lease?: number;
  /** Renew the given lease automatically, as using() does. */
  readonly renew?: boolean;
  /** How long to queue, in ms: 0 = try once, Infinity = no limit. Default: the Flock's `wait`. */
  readonly wait?: number;
  /** Aborting it cancels the wait on the server (FLOCK.CANCEL); acquire() then rejects with AbortError. */
  readonly signal?: AbortSignal;
  /**
   * The owner to acquire as (default: a new UUID per acquire, shared by all its keys). Re-enters a
   * lock this owner holds (`lock.owner`): one more hold, the same token. The same owner on all of
   * a caller's acquires lets the server see a cycle of waits through them (LockDeadlockError).
   */
  readonly owner?: string;
  /** redlock's retry settings, used when `wait` is absent (wait = retryCount x retryDelay). */
  readonly retryCount?: number;
  readonly retryDelay?: number;
  /** redlock's using(): renew when this many ms of the lease are left (default: every lease/3). */
  readonly automaticExtensionThreshold?: number;
  /** This acquire's durableReplicas (0: not durable); default: the Flock's setting. */
  readonly durableReplicas?: number;
  /** This acquire's durableTimeout in ms; default: the Flock's setting. */
  readonly durableTimeout?: number;
}

/** A signal that aborts when a held lock is lost; `error` (and `reason`) says why. Like redlock's RedlockAbortSignal. */
export type LockAbortSignal = AbortSignal & { error?: LockLostError };

/** A held lock. */
export class Lock {
  private constructor();
  readonly flock: Flock;
  readonly resources: readonly string[];
  /** The owner FLOCK knows this holder by (a UUID per acquire() unless given). */
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
  /** The lease in ms (the last one given to extend(), or the watchdog's). */
  readonly lease: number;
  /** Local estimate (ms since the epoch) of when the lease ends; 0 once released. */
  readonly expiration: number;
  /**
   * Aborts with a LockLostError at once when the server pushes the lock's loss (lease ran out,
   * force-released, key deleted, demoted), or when the watchdog, extend() or the check after a
   * session break (a RENEW answered NOTOWNER) finds it lost.
   */
  readonly signal: LockAbortSignal;
  /** Resets the lease of every resource to `lease` ms from now. Rejects with LockNotHeldError if lost. */
  extend(lease: number): Promise<this>;
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
  readonly settings: Readonly<Required<Pick<FlockSettings, 'watchdogLease' | 'wait' | 'resends' | 'sessions' | 'durableReplicas' | 'durableTimeout'>>>;
  acquire(resources: Resources, options?: AcquireOptions): Promise<Lock>;
  /** redlock's shape: a fixed lease of `duration` ms (no watchdog). */
  acquire(resources: Resources, duration: number, settings?: ModeOptions & Omit<BaseAcquireOptions, 'lease'>): Promise<Lock>;
  /** Runs `routine` under a watchdog lock; releases when it settles. */
  using<T>(resources: Resources, routine: (signal: LockAbortSignal) => Promise<T>): Promise<T>;
  /** A watchdog lock with options (a mode, `wait`, `signal`, ...). */
  using<T>(
    resources: Resources,
    options: ModeOptions & Omit<BaseAcquireOptions, 'lease' | 'renew'>,
    routine: (signal: LockAbortSignal) => Promise<T>,
  ): Promise<T>;
  /** redlock's shapes: a `duration` ms lease, renewed automatically while the routine runs. */
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
  durableReplicas: number;
  durableTimeout: number;
}>;

/** NOTOWNER: this owner does not hold the lock (never acquired, released, or its lease ended). */
export class LockNotHeldError extends Error {
  readonly name: 'LockNotHeldError';
  readonly key: string;
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
  /** How it was lost, when known: the server's reason, `superseded` (another owner was granted it) or `unknown`. */
  readonly reason: 'expired' | 'forcereleased' | 'deleted' | 'demoted' | 'superseded' | 'unknown' | (string & {});
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
