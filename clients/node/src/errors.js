'use strict';

// Error classes callers catch by type; each names the lock key it is about and its class name.
class KeyError extends Error {
  constructor(message, key, options) {
    super(message, options);
    this.name = new.target.name;
    this.key = key;
  }
}

/** The server says this owner does not hold the lock (reply `NOTOWNER`): never acquired, released, or lease ended. */
class LockNotHeldError extends KeyError {}

/** The lock stayed busy: a try (`wait: 0`) or a wait that timed out on the server (nil reply). */
class LockBusyError extends KeyError {}

/**
 * A held lock was lost (the server ended its grant, or the watchdog could not renew it in time); set
 * as `lock.signal.error`. `reason` says how, when known: the server's `lost` reason (`expired`,
 * `forcereleased`, `deleted`, `demoted`), `superseded` (another owner was granted it), or `unknown`.
 */
class LockLostError extends KeyError {
  constructor(message, key, options = {}) {
    super(message, key, options);
    this.reason = options.reason ?? 'unknown';
  }
}

/** The owner holds the lock shared and asked for it exclusively (reply `UPGRADE`): release the read holds first. */
class LockUpgradeError extends KeyError {}

/**
 * The wait would never end (reply `DEADLOCK`): its owner would wait, through other owners, for
 * itself (the message names them). Nothing was queued; release what this owner holds and retry.
 */
class LockDeadlockError extends KeyError {}

/** The key exists in another mode (reply `WRONGMODE`): permits on a lock, or no permits or another limit on a semaphore. */
class LockModeError extends KeyError {}

/**
 * A durable grant (the `durableReplicas` setting) that fewer replicas than asked acknowledged
 * within `durableTimeout` (reply of WAIT), or whose lease ended first (RENEW answered NOTOWNER):
 * the hold was given back (FLOCK.RELEASE). `reached`: the replicas that acknowledged it;
 * `replicas`: how many were asked for. Its code is the protocol's name, NOTDURABLE.
 */
class LockNotDurableError extends KeyError {
  constructor(message, key, options = {}) {
    super(message, key, options);
    this.code = 'NOTDURABLE';
    this.reached = options.reached;
    this.replicas = options.replicas;
  }
}

/** A wait cancelled through its AbortSignal; `cause` is the signal's reason. Same name and code as Node's own. */
class AbortError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'AbortError';
    this.code = 'ABORT_ERR';
  }
}

module.exports = {
  LockNotHeldError,
  LockBusyError,
  LockLostError,
  LockUpgradeError,
  LockDeadlockError,
  LockModeError,
  LockNotDurableError,
  AbortError,
};
