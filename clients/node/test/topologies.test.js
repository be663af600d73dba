'use strict';

// The Node client on Redis Cluster (3 masters) and Sentinel (1 master, 1 or 2 replicas, 3
// sentinels), started here on loopback: each lock goes to its key's node, waits through a session
// per node; durable grants across a SENTINEL FAILOVER.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { setTimeout: delay } = require('node:timers/promises');
const { promisify } = require('node:util');
const { before, describe, it } = require('node:test');
const Redis = require('ioredis');
const { createCluster, createSentinel } = require('redis');
const { Flock, LockLostError, LockNotDurableError, LockNotHeldError } = require('..');
const { onEnd, startCluster, startSentinels, waitUntil, WATCHDOG_LEASE } = require('./helpers');

const WAIT = { wait: 10000 };

/** A Flock over `client`, quit at the end (its own connections; the client is closed by its kind). */
function flockOver(client, settings) {
  const flock = new Flock(client, settings);
  onEnd(() => flock.quit());
  return flock;
}

// A child process: waits through sessions (a lock per key, let go 20 ms later), a forgotten
// watchdog lock, then the caller's client quits; it prints when, and how many sessions it had.
const EXIT_SCRIPT = `
'use strict';
const Redis = require(${JSON.stringify(require.resolve('ioredis'))});
const { createCluster, createSentinel } = require(${JSON.stringify(require.resolve('redis'))});
const { Flock } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
const [kind, ...ports] = process.argv.slice(2);
const nodes = ports.map((port) => ({ host: '127.0.0.1', port: Number(port) }));
const CLIENTS = {
  'ioredis-cluster': async () => new Redis.Cluster(nodes),
  'node-redis-cluster': () => createCluster({ rootNodes: ports.map((port) => ({ url: 'redis://127.0.0.1:' + port })) }).connect(),
  'ioredis-sentinel': async () => new Redis({ sentinels: nodes, name: 'mymaster', failoverDetector: true }),
  'node-redis-sentinel': () => createSentinel({ name: 'mymaster', sentinelRootNodes: nodes }).connect(),
};
(async () => {
  const client = await CLIENTS[kind]();
  const flock = new Flock(client);
  for (let i = 0; i < 6; i++) {
    const held = await flock.acquire('exit:' + kind + i, { lease: 10000 });
    setTimeout(() => held.release(), 20);
    await (await flock.acquire('exit:' + kind + i, { wait: 5000 })).release();
  }
  await flock.acquire('exit:' + kind + ':dog');
  // ioredis's failoverDetector keeps its sentinel connections after quit() (seen without FLOCK
  // too): disconnect() ends them.
  if (kind === 'ioredis-sentinel') client.disconnect();
  else await (client.quit ? client.quit() : client.close());
  console.log('quit at ' + Date.now() + ' sessions ' + flock._session.nodes.size);
})().catch((err) => {
  console.error(err);
  process.exit(2);
});
`;

/** Runs EXIT_SCRIPT; asserts the process ends soon after its quit; resolves to its session count. */
async function exitsAfterQuit(kind, ports) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'flock-exit-'));
  onEnd(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'exit.js');
  fs.writeFileSync(file, EXIT_SCRIPT);
  const { stdout } = await promisify(execFile)(process.execPath, [file, kind, ...ports.map(String)], { timeout: 15000 });
  const [, quitAt, sessions] = /quit at (\d+) sessions (\d+)/.exec(stdout);
  assert.ok(Date.now() - Number(quitAt) < 5000, `exited ${Date.now() - Number(quitAt)} ms after the quit`);
  return Number(sessions);
}

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

const CLUSTER_CLIENTS = [
  {
    name: 'ioredis Cluster',
    async connect(cluster) {
      const client = new Redis.Cluster(cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port })));
      client.on('error', () => {});
      onEnd(() => client.disconnect());
      return client;
    },
  },
  {
    name: 'node-redis createCluster',
    async connect(cluster) {
      const client = createCluster({ rootNodes: cluster.nodes.map((n) => ({ url: n.url })) });
      client.on('error', () => {});
      await client.connect();
      onEnd(() => client.destroy());
      return client;
    },
  },
];

describe('Cluster (3 masters)', () => {
  let cluster;
  before(async () => {
    cluster = await startCluster();
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

      it('keeps a watchdog lease renewed on the key\'s node', async () => {
        const flock = await flockOf({ watchdogLease: WATCHDOG_LEASE });
        const key = K('watchdog');
        const node = await cluster.nodeOf(key);
        const renews = await node.stat('cmdstat_flock.renew');
        const start = Date.now();
        const lock = await flock.acquire(key);
        await waitUntil('two renewals on the key\'s node', async () => (await node.stat('cmdstat_flock.renew')) >= renews + 2);
        await waitUntil('one and a half leases pass', () => Date.now() - start > 1.5 * WATCHDOG_LEASE);
        const info = await node.info(key);
        assert.equal(info.owner, lock.owner, 'still held past its first lease');
        assert.ok(Number(info['ttl-ms']) > 0);
        assert.equal(lock.signal.aborted, false);
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

      it('watches a held grant again through the new node\'s session after its slot moved (the moved event)', async () => {
        const flock = await flockOf();
        const key = K('moved-held');
        const lock = await flock.acquire(key, { lease: 60000 });
        const to = await moveSlot(cluster, key);
        assert.equal((await to.info(key)).owner, lock.owner, 'the grant went with its slot');
        // The old node's session heard `moved`: the grant is watched from a session of the new node.
        await waitUntil('the grant is re-watched', () => flock._session.rewatched >= 1);
        assert.equal((await to.info(key)).holds, '1', 'the re-watch left the hold count as it was');
        assert.equal(lock.signal.aborted, false);
        // So a loss on the new node is pushed.
        await to.probe.call('FLOCK.FORCERELEASE', key);
        await waitUntil('the signal aborts', () => lock.signal.aborted);
        assert.equal(lock.signal.error.reason, 'forcereleased');
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
        next.catch(() => {});
        await old.queued(key, 1);
        await waitUntil('the replica has the grant', async () => (await replica.info(key))?.owner === held.owner);
        await replica.probe.call('CLUSTER', 'FAILOVER');
        await waitUntil('the replica is the key\'s master', async () => (await cluster.nodeOf(key)) === replica, 30000);
        // The holder keeps its grant on the new master; its release goes there and the waiter,
        // sent again there, gets the lock.
        assert.equal((await replica.info(key)).owner, held.owner);
        await waitUntil('the waiter queues on the new master', async () => (await replica.info(key))?.waiters === '1', 30000);
        await held.release();
        const lock = await next;
        assert.equal((await replica.info(key)).owner, lock.owner, 'granted by the new master');
        await lock.release();
      });
    });
  }
});

const SENTINEL_CLIENTS = [
  {
    name: 'ioredis sentinels',
    async connect(topology) {
      // failoverDetector: the client moves to the new master as the sentinels switch, not when
      // the old one is demoted (about 11 s later, serving meanwhile).
      const client = new Redis({ sentinels: topology.sentinelNodes, name: 'mymaster', failoverDetector: true });
      client.on('error', () => {});
      onEnd(() => client.disconnect());
      return client;
    },
    // The client's connection is to `port` now.
    on: (client, port) => client.status === 'ready' && client.stream?.remotePort === port,
  },
  {
    name: 'node-redis createSentinel',
    async connect(topology) {
      const client = createSentinel({ name: 'mymaster', sentinelRootNodes: topology.sentinelNodes });
      client.on('error', () => {});
      await client.connect();
      onEnd(() => client.destroy());
      return client;
    },
    on: (client, port) => client.getMasterNode()?.port === port,
  },
];

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

  it('after SENTINEL FAILOVER a new acquire works on the new master, and a holder at the failover keeps its grant, re-watched there', async () => {
    const clients = await Promise.all(SENTINEL_CLIENTS.map((kind) => kind.connect(topology)));
    const flocks = clients.map((client) => flockOver(client));
    const old = await topology.master();
    const held = await Promise.all(flocks.map((flock, i) => flock.acquire(`failover:held${i}`)));
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
  });
});


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
      // grants ask for: Sentinel turns it into one at its next look (INFO every 10 s), with what
      // it sends here; done at once to keep the test short. Meanwhile the old master kept
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
