'use strict';

// The Node client on Redis Cluster with a replica per master (started here on loopback): durable
// grants wait for the replica of their key's node, and a waiter follows a CLUSTER FAILOVER.

const assert = require('node:assert/strict');
const { before, describe, it } = require('node:test');
const { LockNotDurableError, LockNotHeldError } = require('..');
const { startCluster, waitUntil } = require('./helpers');
const { CLUSTER_CLIENTS, flockOver } = require('./topology');

describe('Cluster (3 masters, a replica each): durable grants and failover', () => {
  let cluster;
  before(async () => {
    cluster = await startCluster({ replicas: 1 });
  });

  for (const kind of CLUSTER_CLIENTS) {
    describe(kind.name, () => {
      const K = (name) => `${kind.name}:${name}`;
      const flockOf = async (settings) => flockOver(await kind.connect(cluster), settings);

      it('durable: a grant on each node waits for that node\'s replica; 2 replicas asked fail NOTDURABLE there', { timeout: 30000 }, async () => {
        const one = await flockOf({ durableReplicas: 1 });
        const two = await flockOf({ durableReplicas: 2, durableTimeout: 200 });
        const masters = await cluster.masters();
        assert.equal(masters.length, 3);
        const keys = await Promise.all(masters.map((node, i) => cluster.keyOn(node, K(`durable${i}`))));
        for (const key of keys) {
          const lock = await one.acquire(key, { lease: 10000 });
          const replica = await cluster.replicaOf(await cluster.nodeOf(key));
          assert.equal((await replica.info(key))?.owner, lock.owner, 'the replica of the key\'s node has the grant');
          await lock.release();
        }
        await assert.rejects(two.acquire(keys[0], { lease: 10000 }), (err) => err instanceof LockNotDurableError && err.reached === 1);
        assert.equal(await (await cluster.nodeOf(keys[0])).info(keys[0]), null, 'the hold was given back');
      });

      it('durable: a waiter at a CLUSTER FAILOVER of its key\'s node is granted by the new master', { timeout: 60000 }, async () => {
        const holders = await flockOf();
        const waiter = await flockOf({ durableReplicas: 1, durableTimeout: 5000 });
        const key = K('failover');
        const old = await cluster.nodeOf(key);
        const replica = await cluster.replicaOf(old);
        const held = await holders.acquire(key, { lease: 30000 });
        const next = waiter.acquire(key, { lease: 10000, wait: 30000 });
        // Should the wait end before it queues on the new master, the test fails with its error.
        let ended = null;
        next.catch((err) => (ended = err));
        await old.queued(key, 1);
        await waitUntil('the replica has the grant', async () => (await replica.info(key))?.owner === held.owner);
        await replica.probe.call('CLUSTER', 'FAILOVER');
        await waitUntil('the replica is the key\'s master', async () => (await cluster.nodeOf(key)) === replica, 30000);
        // The holder keeps its grant on the new master; its release goes there and the waiter,
        // sent again there, gets the lock.
        assert.equal((await replica.info(key)).owner, held.owner);
        await waitUntil(
          'the waiter queues on the new master',
          async () => {
            if (ended) throw ended;
            return (await replica.info(key))?.waiters === '1';
          },
          30000,
        );
        // Valkey 9.1 pushes the old node's `lost ... demoted` (it can no longer vouch for the grant):
        // the release still gives the hold back, and rejects, saying the lock was lost.
        await held.release().catch((err) => {
          if (!(err instanceof LockNotHeldError && err.cause?.reason === 'demoted')) throw err;
        });
        const lock = await next;
        assert.equal((await replica.info(key)).owner, lock.owner, 'granted by the new master');
        await lock.release();
      });
    });
  }
});
