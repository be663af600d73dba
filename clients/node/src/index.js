'use strict';

const { Flock, Lock, DEFAULTS } = require('./flock');
const { PROTOCOL } = require('./protocol');

// The error classes are listed once, in errors.js. Node finds the names of a CommonJS module's
// exports (for `import { LockBusyError } from 'redis-flock'`) by reading its source: static
// assignments, and a call named `__exportStar(require(...), ...)` (TypeScript's re-export
// helper), which it follows into errors.js. So the helper is named that.
function __exportStar(from, to) {
  for (const name of Object.keys(from)) to[name] = from[name];
}

module.exports = Flock;
module.exports.default = Flock;
module.exports.Flock = Flock;
module.exports.Lock = Lock;
module.exports.DEFAULTS = DEFAULTS;
module.exports.PROTOCOL = PROTOCOL;
__exportStar(require('./errors'), module.exports);
