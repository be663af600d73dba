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

/**
 * `lock.fenced()` sent a command with its grant's fencing token after the grant had ended (reply
 * `STALE`): the command did not run, and the lock is lost. Also thrown without sending when the
 * grant is already known lost here. A LockNotHeldError, as a release of a lost lock throws.
 */
class StaleTokenError extends LockNotHeldError {}

/** The lock stayed busy: a try (`wait: 0`) or a wait that timed out on the server (nil reply). */
class LockBusyError extends KeyError {}

/**
 * A held lock was lost; set as `lock.signal.error` (and `signal.reason`). `reason` is one word
 * (docs/client-protocol.md, "Losses"): `expired` (a fixed lease reached its deadline, or the
 * server pushed it), `unconfirmed` (a session grant's or a watchdog grant's deadline passed with
 * no heartbeat or renewal reply confirming it), `sessionended` (its session closed or expired),
 * `forcereleased`, `deleted`, `demoted` (pushed by the server), or `notowner` (a renewal or check
 * answered NOTOWNER, or another owner was granted it; the message keeps the server's text).
 */
class LockLostError extends KeyError {
  constructor(message, key, options = {}) {
    super(message, key, options);
    this.reason = options.reason ?? 'notowner';
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

/**
 * A command FLOCK sent got no reply within its timeout (a partition, a server that stopped
 * answering): counted as a lost reply, resent with its request ID up to `resends` times, and
 * passed on when none of them was answered. Its code is ETIMEDOUT.
 */
class CommandTimeoutError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'CommandTimeoutError';
    this.code = 'ETIMEDOUT';
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
  StaleTokenError,
  LockBusyError,
  LockLostError,
  LockUpgradeError,
  LockDeadlockError,
  LockModeError,
  LockNotDurableError,
  CommandTimeoutError,
  AbortError,
};
