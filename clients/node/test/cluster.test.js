'use strict';

// The Node client on Redis Cluster (3 masters, started here on loopback) through ioredis Cluster
// and node-redis createCluster: each lock goes to its key's node, waits through a session per
// node, and follow a slot that moves.

const assert = require('node:assert/strict');
const { before, describe, it } = require('node:test');
const { Flock, LockLostError, LockNotHeldError } = require('..');
const calculateSlot = require('cluster-key-slot');
const { startCluster, waitUntil } = require('./helpers');

// A short session timeout: the session grant test holds its lock past one and a half of it.
const SESSION_TIMEOUT = 1500;
const { CLUSTER_CLIENTS, WAIT, exitsAfterQuit, flockOver } = require('./topology');

/**
 * Moves the slot of `key` (with its keys) from its node to another master, the usual resharding
 * steps; resolves to the new node once every node routes the slot there.
 */
async function moveSlot(cluster, key) {
  const from = await cluster.nodeOf(key);
  const to = cluster.nodes.find((n) => n !== from);
  const slot = String(await from.probe.call('CLUSTER', 'KEYSLOT', key));
  const [fromId, toId] = await Promise.all([from, to].map((n) => n.probe.call('CLUSTER', 'MYID')));
  await to.probe.call('CLUSTER', 'SETSLOT', slot, 'IMPORTING', fromId);
  await from.probe.call('CLUSTER', 'SETSLOT', slot, 'MIGRATING', toId);
  const keys = await from.probe.call('CLUSTER', 'GETKEYSINSLOT', slot, '100');
  if (keys.length > 0) await from.probe.call('MIGRATE', '127.0.0.1', String(to.port), '', '0', '5000', 'KEYS', ...keys);
  for (const node of [to, from, ...cluster.nodes.filter((n) => n !== from && n !== to)]) {
    await node.probe.call('CLUSTER', 'SETSLOT', slot, 'NODE', toId);
  }
  await waitUntil('every node routes the slot to its new node', async () => (await cluster.nodeOf(key)) === to);
  return to;
}

describe('Cluster (3 masters)', () => {
  let cluster;
  before(async () => {
    cluster = await startCluster();
  });

  it('node-redis createCluster: a command of a slot its slot map lacks (read mid-failover) is sent once the map is read again', async () => {
    const client = await CLUSTER_CLIENTS.find((k) => k.name === 'node-redis createCluster').connect(cluster);
    const flock = flockOver(client);
    const key = 'node-redis:unmapped';
    // What a CLUSTER SHARDS read while the key's shard has no master leaves behind.
    const forget = () => (client.slots[calculateSlot(key)] = undefined);
    forget();
    const lock = await flock.acquire(key, { lease: 10000 });
    assert.equal((await (await cluster.nodeOf(key)).info(key)).owner, lock.owner);
    forget();
    assert.equal(await lock.release(), 0);
    assert.equal(await (await cluster.nodeOf(key)).info(key), null);
  });

  for (const kind of CLUSTER_CLIENTS) {
    describe(kind.name, () => {
      const K = (name) => `${kind.name}:${name}`;
      const flockOf = async (settings) => flockOver(await kind.connect(cluster), settings);

      it('grants the waits on one lock in FIFO order', async () => {
        const flock = await flockOf();
        const key = K('fifo');
        const node = await cluster.nodeOf(key);
        const holder = await flock.acquire(key, WAIT);
        const order = [];
        const waits = [];
        for (let i = 0; i < 3; i++) {
          waits.push(
            flock.acquire(key, WAIT).then(async (lock) => {
              order.push(i);
              await lock.release();
            }),
          );
          await node.queued(key, i + 1);
        }
        await holder.release();
        await Promise.all(waits);
        assert.deepEqual(order, [0, 1, 2]);
      });

      it('grants a wait on each of three nodes at once through a session per node', async () => {
        const holders = await flockOf();
        const waiter = await flockOf();
        const keys = await Promise.all(cluster.nodes.map((node, i) => cluster.keyOn(node, K(`each${i}`))));
        const held = await Promise.all(keys.map((key) => holders.acquire(key, WAIT)));
        const waits = keys.map((key) => waiter.acquire(key, WAIT));
        await Promise.all(keys.map((key, i) => cluster.nodes[i].queued(key, 1)));
        // One session per node, each on the node of its key.
        const ports = [...waiter._session.nodes.keys()].map((addr) => Number(addr.split(':').pop())).sort();
        assert.deepEqual(ports, cluster.nodes.map((n) => n.port).sort());
        await Promise.all(held.map((lock) => lock.release()));
        const granted = await Promise.all(waits);
        for (const [i, lock] of granted.entries()) {
          assert.equal((await cluster.nodes[i].info(keys[i])).owner, lock.owner);
          await lock.release();
        }
      });

      it('takes hash-tagged keys together on their one node', async () => {
        const flock = await flockOf();
        const keys = [K('{order-7}:items'), K('{order-7}:total')];
        const node = await cluster.nodeOf(keys[0]);
        assert.equal(await cluster.nodeOf(keys[1]), node);
        const lock = await flock.acquire(keys, WAIT);
        for (const key of keys) assert.equal((await node.info(key)).owner, lock.owner);
        // A second owner waits on both at once (ACQUIREALL ... WAIT on a connection of its own to that node).
        const next = flock.acquire(keys, WAIT);
        await node.queued(keys[0], 1);
        await node.queued(keys[1], 1);
        await lock.release();
        const second = await next;
        for (const key of keys) assert.equal((await node.info(key)).owner, second.owner);
        // Its grants are watched through that node's session: a loss is pushed.
        await node.probe.call('FLOCK.FORCERELEASE', keys[1]);
        await waitUntil('the signal aborts', () => second.signal.aborted);
        assert.equal(second.signal.error.key, keys[1]);
        await assert.rejects(second.release(), LockNotHeldError);
        assert.equal(await node.info(keys[0]), null);
      });

      it('refuses keys of different slots with an error that names hash tags (CROSSSLOT), taking none', async () => {
        const flock = await flockOf();
        const keys = [await cluster.keyOn(cluster.nodes[0], K('cross')), await cluster.keyOn(cluster.nodes[1], K('cross'))];
        for (const wait of [0, 1000]) {
          await assert.rejects(flock.acquire(keys, { wait }), (err) => {
            assert.equal(err.code, 'CROSSSLOT');
            assert.deepEqual(err.keys, keys);
            assert.match(err.message, /hash tag/);
            assert.match(err.cause.message, /^CROSSSLOT/);
            return true;
          });
        }
        for (const [i, key] of keys.entries()) assert.equal(await cluster.nodes[i].info(key), null);
      });

      it('sends a multi-key wait to the new node after its slot moved', async () => {
        const flock = await flockOf();
        const keys = [K('{moved-all}:a'), K('{moved-all}:b')];
        // The client learns the slot map first.
        await (await flock.acquire(keys, WAIT)).release();
        const to = await moveSlot(cluster, keys[0]);
        const holder = await flockOf();
        const held = await holder.acquire(keys[1], WAIT);
        // The try follows the MOVED through the library's routing; the blocking wait goes to the
        // node the slot map names then, and a MOVED from the old node would send it on.
        const next = flock.acquire(keys, WAIT);
        await to.queued(keys[1], 1);
        await held.release();
        const lock = await next;
        for (const key of keys) assert.equal((await to.info(key)).owner, lock.owner);
        await lock.release();
      });

      it('takes a lock without a lease as a session grant of the key\'s node, held there with no renewal', async () => {
        const flock = await flockOf({ sessionTimeoutMs: SESSION_TIMEOUT });
        const key = K('session-grant');
        const node = await cluster.nodeOf(key);
        const renews = await node.stat('cmdstat_flock.renew');
        const start = Date.now();
        const lock = await flock.acquire(key);
        assert.equal((await node.info(key)).session, '1');
        await waitUntil('one and a half session timeouts pass', () => Date.now() - start > 1.5 * SESSION_TIMEOUT);
        assert.equal((await node.info(key)).owner, lock.owner, 'still held: its session is heard from');
        assert.equal(lock.signal.aborted, false);
        assert.equal(await node.stat('cmdstat_flock.renew'), renews, 'nothing renewed it');
        await lock.release();
      });

      it('aborts lock.signal when FLOCK.FORCERELEASE on the key\'s node ends the grant', async () => {
        const flock = await flockOf();
        const key = K('force');
        const lock = await flock.acquire(key, { lease: 60000 });
        await (await cluster.nodeOf(key)).probe.call('FLOCK.FORCERELEASE', key);
        await waitUntil('the signal aborts', () => lock.signal.aborted);
        assert.ok(lock.signal.error instanceof LockLostError);
        assert.equal(lock.signal.error.reason, 'forcereleased');
      });

      it('refuses sessions: false (a blocking wait cannot be routed)', async () => {
        const client = await kind.connect(cluster);
        assert.throws(() => new Flock(client, { sessions: false }), /sessions: false/);
      });

      it('sends a wait to the new node after its slot moved', async () => {
        const flock = await flockOf();
        const key = K('moved');
        const from = await cluster.nodeOf(key);
        // The client learns the slot map (and opens a session on the old node) first.
        await (await flock.acquire(key, WAIT)).release();
        const session = (node) => flock._session.nodes.get(`127.0.0.1:${node.port}`)?.id;
        const fromSession = session(from);
        assert.ok(fromSession, 'a session on the old node');
        // The free lock's key (kept for its request IDs) moves with its slot.
        const to = await moveSlot(cluster, key);
        const holder = await flockOf();
        const held = await holder.acquire(key, WAIT);
        assert.equal((await to.info(key)).owner, held.owner);
        // This client still maps the slot to the old node: its wait goes there with the old node's
        // session, is answered MOVED, and is sent again to the new node with a session there.
        const moves = await from.stat('errorstat_MOVED');
        const next = flock.acquire(key, WAIT);
        await to.queued(key, 1);
        assert.ok((await from.stat('errorstat_MOVED')) > moves, 'the old node answered MOVED');
        assert.ok(session(to), 'a session on the new node');
        assert.equal(session(from), fromSession, 'the MOVED left the old node\'s session alone');
        await held.release();
        const lock = await next;
        assert.equal((await to.info(key)).owner, lock.owner);
        await lock.release();
      });

      it('watches held grants again through the new node\'s session after their slot moved (the moved event)', async () => {
        const flock = await flockOf();
        // A fixed lease, and a session grant: the new node's session is its session then.
        const keys = [K('{moved-held}fixed'), K('{moved-held}session')];
        const fixed = await flock.acquire(keys[0], { lease: 60000 });
        const session = await flock.acquire(keys[1]);
        const to = await moveSlot(cluster, keys[0]);
        for (const [i, lock] of [fixed, session].entries()) {
          assert.equal((await to.info(keys[i])).owner, lock.owner, 'the grant went with its slot');
        }
        // The old node's session heard `moved`: the grants are watched from a session of the new node.
        await waitUntil('the grants are re-watched', () => flock._session.rewatched >= 2);
        for (const [i, lock] of [fixed, session].entries()) {
          assert.equal((await to.info(keys[i])).holds, '1', 'the re-watch left the hold count as it was');
          assert.equal(lock.signal.aborted, false);
        }
        assert.equal((await to.info(keys[1])).session, '1', 'the session grant lives with the new node\'s session');
        // So a loss on the new node is pushed.
        for (const [i, lock] of [fixed, session].entries()) {
          await to.probe.call('FLOCK.FORCERELEASE', keys[i]);
          await waitUntil('the signal aborts', () => lock.signal.aborted);
          assert.equal(lock.signal.error.reason, 'forcereleased');
        }
      });
    });
  }

  for (const kind of ['ioredis', 'node-redis']) {
    it(`${kind}: a process exits by itself after the cluster client quits`, async () => {
      const sessions = await exitsAfterQuit(`${kind}-cluster`, cluster.nodes.map((n) => n.port));
      assert.ok(sessions > 1, 'its waits went through sessions on more than one node');
    });
  }
});
