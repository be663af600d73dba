'use strict';

// Durable grants across a SENTINEL FAILOVER (1 master, 2 replicas, 3 sentinels, started here on
// loopback), through both libraries' Sentinel clients at once.

const assert = require('node:assert/strict');
const { setTimeout: delay } = require('node:timers/promises');
const { before, describe, it } = require('node:test');
const { startSentinels, waitUntil } = require('./helpers');
const { SENTINEL_CLIENTS, flockOver } = require('./topology');

describe('Sentinel (1 master, 2 replicas, 3 sentinels): durable grants', () => {
  let topology;
  before(async () => {
    topology = await startSentinels({ replicas: 2 });
  });

  it('durable: across SENTINEL FAILOVER with waiters queued, durable grants keep rising tokens, never overlap, and resume on the new master', { timeout: 90000 }, async () => {
    const key = 'durable:failover';
    // Two tasks through each library, each with a Flock (and client) of its own.
    const kinds = [...SENTINEL_CLIENTS, ...SENTINEL_CLIENTS];
    const clients = await Promise.all(kinds.map((kind) => kind.connect(topology)));
    const flocks = clients.map((client) => flockOver(client, { durableReplicas: 2, durableTimeout: 500 }));
    const old = await topology.master();
    // Each durable grant as its client saw it: held from the acquire's return to the release's send.
    const grants = [];
    const failures = new Map();
    let promoted = null;
    let stop = false;
    const task = async (flock) => {
      while (!stop) {
        let lock;
        try {
          lock = await flock.acquire(key, { lease: 1000, wait: 1000 });
        } catch (err) {
          failures.set(err.name, (failures.get(err.name) ?? 0) + 1);
          // The master may be unreachable for a moment: not a busy loop meanwhile.
          await delay(10);
          continue;
        }
        const grant = { start: Date.now(), token: lock.token, onNew: false };
        // The hold: a look at the new master (once there is one) for this very grant.
        if (promoted) grant.onNew = (await promoted.info(key).catch(() => null))?.token === String(lock.token);
        else await delay(5);
        grant.end = Date.now();
        grants.push(grant);
        await lock.release().catch(() => {});
      }
    };
    const tasks = flocks.map(task);
    try {
      await waitUntil('a few durable grants on the first master', () => grants.length >= 10);
      await waitUntil('waiters queue on the lock', async () => Number((await old.info(key))?.waiters ?? 0) >= 1);
      await topology.sentinels[0].probe.call('SENTINEL', 'FAILOVER', 'mymaster');
      await waitUntil('the sentinels name a replica master', async () => (await topology.master()) !== old, 30000);
      promoted = await topology.master();
      // Until the old master is a replica again the new one has 1 of the 2 replicas durable
      // grants ask for: Sentinel turns it into one 8 s after the switch (startSentinels), with
      // what it sends here; done at once to keep the test short. Meanwhile the old master kept
      // serving, with fewer replicas (its durable grants failed NOTDURABLE).
      await old.probe
        .multi()
        .call('REPLICAOF', '127.0.0.1', String(promoted.port))
        .call('CLIENT', 'KILL', 'TYPE', 'normal')
        .exec();
      await waitUntil('durable grants resume on the new master', () => grants.filter((g) => g.onNew).length >= 5, 30000);
    } finally {
      stop = true;
      await Promise.all(tasks);
    }
    for (let i = 1; i < grants.length; i++) {
      const [before, grant] = [grants[i - 1], grants[i]];
      assert.ok(grant.token > before.token, `token ${grant.token} after ${before.token}: durable tokens rise in grant order`);
      assert.ok(grant.start >= before.end, `grant ${i} began at ${grant.start}, before its predecessor's release at ${before.end}`);
    }
    assert.ok(grants.filter((g) => g.onNew).length >= 5, `durable grants on the new master (failures: ${[...failures]})`);
  });
});
