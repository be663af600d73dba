'use strict';

// The one documented behaviour for a server restart mid-wait (docs/commands.md, "Sessions"), once
// per supported client library: the waits retry (a new session, the same request IDs) until their
// own deadline; the session's grants end with it, and are reported lost, never taken again.

const assert = require('node:assert/strict');
const { before, describe, it } = require('node:test');
const { LockBusyError, LockNotHeldError } = require('..');
const { aborted, eachClient, flockOf, startServer, waitUntil, within, PUSHED_MS } = require('./helpers');

const LEASE = 10000;

describe('a server restart mid-wait', () => {
  let own;
  before(async () => {
    own = await startServer();
  });
  eachClient((kind, K) => {
    it('a wait is resent to the restarted server and granted there (its lock died with the server); a session grant is reported lost and not taken again', async () => {
      const flock = await flockOf(kind, own.port);
      const holder = await flock.acquire(K('restart'), { lease: 60000 });
      const session = await flock.acquire(K('restart-session'));
      const waiting = flock.acquire(K('restart'), { lease: LEASE, wait: 20000 });
      await own.queued(K('restart'), 1);
      await own.kill();
      // Its session's connection closed with the server: its grants ended with it.
      await within(PUSHED_MS, 'the session grant reported lost', aborted(session.signal));
      assert.equal(session.signal.error.reason, 'sessionended');
      // Down long enough that the client's first new session failed and the wait waits to retry.
      await waitUntil('a new session failed while the server was down', () => [...flock._session.waits.values()].some((w) => w.attempts >= 2));
      await own.start();
      const lock = await within(15000, 'the resent wait is granted', waiting);
      assert.equal((await own.info(K('restart'))).owner, lock.owner);
      await lock.release();
      // The holder's grant died with the server: reported when the session reconnected.
      await within(PUSHED_MS, 'the lost holder reported', aborted(holder.signal));
      assert.equal(holder.signal.error.reason, 'notowner');
      assert.equal(await own.info(K('restart-session')), null, 'the session grant was not taken again');
      await assert.rejects(session.release(), LockNotHeldError);
    });

    it('a server that stays down past the deadline: the wait ends as a timeout (LockBusyError), not a connection error', async () => {
      const flock = await flockOf(kind, own.port);
      const holder = await flock.acquire(K('down'), { lease: 60000 });
      // A wait long enough to be seen queued, and the server killed, before it ends, however late a
      // loaded machine runs the process: the server stays down until it has ended all the same.
      const waiting = flock.acquire(K('down'), { lease: LEASE, wait: 1000 });
      await own.queued(K('down'), 1);
      await own.kill();
      try {
        await assert.rejects(within(15000, 'the wait ends', waiting), LockBusyError);
      } finally {
        await own.start();
      }
      void holder;
    });
  });
});
