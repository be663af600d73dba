'use strict';

// The Node client on Sentinel (1 master, 1 replica, 3 sentinels, started here on loopback)
// through ioredis with `sentinels` and node-redis createSentinel: locks and waits on the master,
// and a SENTINEL FAILOVER.

const assert = require('node:assert/strict');
const { before, describe, it } = require('node:test');
const { startSentinels, waitUntil } = require('./helpers');
const { SENTINEL_CLIENTS, WAIT, exitsAfterQuit, flockOver } = require('./topology');

describe('Sentinel (1 master, 1 replica, 3 sentinels)', () => {
  let topology;
  before(async () => {
    topology = await startSentinels();
  });

  for (const kind of SENTINEL_CLIENTS) {
    it(`${kind.name}: locks and waits through a session on the master`, async () => {
      const flock = flockOver(await kind.connect(topology));
      const key = `${kind.name}:wait`;
      const master = await topology.master();
      const lock = await flock.acquire(key, WAIT);
      assert.equal((await master.info(key)).owner, lock.owner);
      const next = flock.acquire(key, WAIT);
      await master.queued(key, 1);
      await lock.release();
      const second = await next;
      assert.equal((await master.info(key)).owner, second.owner);
      await second.release();
    });
  }

  for (const kind of ['ioredis', 'node-redis']) {
    it(`${kind}: a process exits by itself after the sentinel client quits`, async () => {
      assert.equal(await exitsAfterQuit(`${kind}-sentinel`, topology.sentinelNodes.map((n) => n.port)), 1);
    });
  }

  it('after SENTINEL FAILOVER a new acquire works on the new master, a holder of a fixed lease at the failover keeps its grant, re-watched there, and a session grant is reported lost (its session ended), not taken again', async () => {
    const clients = await Promise.all(SENTINEL_CLIENTS.map((kind) => kind.connect(topology)));
    const flocks = clients.map((client) => flockOver(client));
    const old = await topology.master();
    const held = await Promise.all(flocks.map((flock, i) => flock.acquire(`failover:held${i}`, { lease: 60000 })));
    const sessionGrants = await Promise.all(flocks.map((flock, i) => flock.acquire(`failover:session${i}`)));
    await topology.sentinels[0].probe.call('SENTINEL', 'FAILOVER', 'mymaster');
    await waitUntil('the sentinels name the replica master', async () => (await topology.master()) !== old, 30000);
    const promoted = await topology.master();
    for (const [i, flock] of flocks.entries()) {
      const { name, on } = SENTINEL_CLIENTS[i];
      await waitUntil(`${name} follows the switch to the new master`, () => on(clients[i], promoted.port), 30000);
      const key = `failover:new${i}`;
      const lock = await flock.acquire(key, WAIT);
      assert.equal((await promoted.info(key)).owner, lock.owner, `${SENTINEL_CLIENTS[i].name}: the new grant is on the new master`);
      await lock.release();
    }
    for (const [i, lock] of held.entries()) {
      assert.equal((await promoted.info(`failover:held${i}`)).owner, lock.owner, 'the grant was replicated');
      await waitUntil(`${SENTINEL_CLIENTS[i].name}: its grant is re-watched`, () => flocks[i]._session.rewatched >= 1, 30000);
      assert.equal(lock.signal.aborted, false);
      await lock.release();
    }
    for (const [i, lock] of sessionGrants.entries()) {
      await waitUntil(`${SENTINEL_CLIENTS[i].name}: its session grant is reported lost`, () => lock.signal.aborted, 30000);
      assert.equal(lock.signal.error.reason, 'sessionended');
      // Its replicated copy lasts the session's timeout there, and nothing watches it again.
      await waitUntil('the session grant ends on the new master', async () => (await promoted.info(`failover:session${i}`)) === null, 30000);
    }
  });
});
