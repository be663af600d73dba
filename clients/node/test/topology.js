'use strict';

// What the Cluster and Sentinel test files share: their client libraries' constructors, a Flock
// quit at the end, and a child process that must exit by itself after its client quits.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const path = require('node:path');
const { promisify } = require('node:util');
const Redis = require('ioredis');
const { createCluster, createSentinel } = require('redis');
const { Flock } = require('..');
const { childScript, onEnd } = require('./helpers');

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
  const file = childScript('exit', EXIT_SCRIPT);
  const { stdout } = await promisify(execFile)(process.execPath, [file, kind, ...ports.map(String)], { timeout: 60000 });
  const [, quitAt, sessions] = /quit at (\d+) sessions (\d+)/.exec(stdout);
  assert.ok(Date.now() - Number(quitAt) < 5000, `exited ${Date.now() - Number(quitAt)} ms after the quit`);
  return Number(sessions);
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

module.exports = { CLUSTER_CLIENTS, SENTINEL_CLIENTS, WAIT, exitsAfterQuit, flockOver };
