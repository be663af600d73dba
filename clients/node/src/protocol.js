'use strict';

// The rules every FLOCK client shares (docs/client-protocol.md, "The rules every client shares";
// clients/scenarios.json's `protocol` block holds the same values, and the suite checks them),
// and the local clock every deadline of this client is counted on.

const { performance } = require('node:perf_hooks');

const PROTOCOL = Object.freeze({
  // The session reader's FLOCK.INBOX reads wait at most T / heartbeatFraction.
  heartbeatFraction: 4,
  // A deadline is taken in by driftMarginMs + driftMarginPercent % of the lease or timeout.
  driftMarginMs: 10,
  driftMarginPercent: 1,
  // A grant taken without a session: this lease, renewed every lease / watchdogRenewFraction.
  watchdogLeaseMs: 30000,
  watchdogRenewFraction: 3,
  // Resends of a command (same request ID) whose reply was lost.
  resends: 3,
  // A wait whose FLOCK.CANCEL got no answer and no event within this closes its session's connection.
  cancelGraceMs: 2000,
  // Every loss is named by one of these (LockLostError#reason).
  lossReasons: Object.freeze(['expired', 'unconfirmed', 'sessionended', 'forcereleased', 'deleted', 'demoted', 'notowner']),
});

// The server's flock.session-timeout-ms default, for command timeouts before any session said its own.
const SERVER_SESSION_TIMEOUT_MS = 10000;

/** The monotonic clock (ms) every deadline is counted on: never moved by a wall-clock change. */
const now = () => performance.now();

/** The drift margin of a lease or timeout of `ms`. */
const margin = (ms) => PROTOCOL.driftMarginMs + (ms * PROTOCOL.driftMarginPercent) / 100;

module.exports = { PROTOCOL, SERVER_SESSION_TIMEOUT_MS, now, margin };
