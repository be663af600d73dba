'use strict';

const { Flock, Lock, DEFAULTS } = require('./flock');
const {
  LockNotHeldError,
  LockBusyError,
  LockLostError,
  LockUpgradeError,
  LockDeadlockError,
  LockModeError,
  LockNotDurableError,
  AbortError,
} = require('./errors');

// Static assignments, so that `import { Flock } from 'redis-flock'` finds the names in this CommonJS file.
module.exports = Flock;
module.exports.default = Flock;
module.exports.Flock = Flock;
module.exports.Lock = Lock;
module.exports.DEFAULTS = DEFAULTS;
module.exports.LockNotHeldError = LockNotHeldError;
module.exports.LockBusyError = LockBusyError;
module.exports.LockLostError = LockLostError;
module.exports.LockUpgradeError = LockUpgradeError;
module.exports.LockModeError = LockModeError;
module.exports.LockDeadlockError = LockDeadlockError;
module.exports.LockNotDurableError = LockNotDurableError;
module.exports.AbortError = AbortError;
