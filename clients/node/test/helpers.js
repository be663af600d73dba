'use strict';

// Test helpers: a redis-server with the FLOCK module per test file on a free loopback port, the
// two client libraries behind one factory, a probe connection for assertions, waits with a
// deadline, and a TCP proxy that loses or holds back replies.

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { setTimeout: delay } = require('node:timers/promises');
const { after, describe } = require('node:test');
const Redis = require('ioredis');
const { createClient } = require('redis');
const { Flock } = require('..');

const REPO = path.resolve(__dirname, '..', '..', '..');
const MODULE = process.env.FLOCK_MODULE || path.join(REPO, 'target', 'release', 'libredis_flock.so');
const SERVER = process.env.FLOCK_SERVER || 'redis-server';
// How long waitUntil waits by default: it bounds a test that is stuck, it is no guess at how long
// a wait takes (on a busy machine, with the suite's files side by side, correct ones took 10 s).
const DEADLINE_MS = 30000;
// A watchdog lease short enough that tests see several renewals quickly (every lease/3), long
// enough for a loaded machine: a renewal may come 1 s late. With 900 ms (600 ms to spare) and the
// suite's files side by side on 2 busy cores, a test process's timers ran late by more, and
// watchdog tests lost their locks.
const WATCHDOG_LEASE = 1500;

// Everything a test file started, undone when it ends (also on failure). Registered here at load
// time: after() called inside a hook would belong to that hook and run as soon as it ends.
const cleanups = [];
const onEnd = (fn) => cleanups.push(fn);
after(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});
const servers = new Set();
process.on('exit', () => servers.forEach((proc) => proc.kill('SIGKILL')));
// waitUntil looks again after 5 ms, then half as long again each time up to 25 ms: most
// conditions hold within a few looks, and a wait for renewals or a failover (a second or more)
// does not poll the server (often a whole INFO) 200 times a second, which with the suite's files
// side by side took CPU the tests' own timers needed.
const POLL_MS = [5, 25];

/** Polls `check` until it returns a truthy value (returned) or the deadline passes (throws `what`). */
async function waitUntil(what, check, deadlineMs = DEADLINE_MS) {
  const end = Date.now() + deadlineMs;
  for (let pause = POLL_MS[0]; ; pause = Math.min(pause * 1.5, POLL_MS[1])) {
    const value = await check();
    if (value) return value;
    if (Date.now() > end) throw new Error(`timed out waiting until ${what}`);
    await delay(pause);
  }
}

// Pushed events arrive within milliseconds; this only bounds a broken client.
const PUSHED_MS = 3000;

/** Resolves (true) once `signal` aborts. */
const aborted = (signal) => (signal.aborted ? true : new Promise((resolve) => signal.addEventListener('abort', () => resolve(true), { once: true })));

/** `promise`, or a rejection naming `what` if it has not settled within `ms`. */
const within = (ms, what, promise) =>
  Promise.race([promise, new Promise((_, reject) => setTimeout(() => reject(new Error(`not within ${ms} ms: ${what}`)), ms).unref())]);

/** Whether `port` can be bound on loopback now. */
function bindable(port) {
  return new Promise((resolve) => {
    const srv = net.createServer().unref();
    srv.once('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
  });
}

/**
 * A free loopback port at random, from 10000 to 10000 + `count` - 1, with `port + bus` free too
 * when `bus` is not 0: below the kernel's ephemeral range (32768 and up), so that no connection's
 * own end takes it between this check and the server's bind (a port the kernel hands out, bind to
 * 0, is soon handed out again), nor while a test restarts its server on it.
 */
async function freePort(count = 22768, bus = 0) {
  for (;;) {
    const port = 10000 + Math.floor(Math.random() * count);
    if ((await bindable(port)) && (bus === 0 || (await bindable(port + bus)))) return port;
  }
}

function ping(port) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let data = '';
    sock.on('connect', () => sock.write('PING\r\n'));
    sock.on('data', (chunk) => {
      data += chunk;
      if (data.includes('\r\n')) {
        sock.destroy();
        resolve(data.startsWith('+PONG'));
      }
    });
    sock.on('error', () => resolve(false));
  });
}

/**
 * Starts a redis-server with the module; stopped when the test file ends (also on failure).
 * `server.probe` is an ioredis connection for assertions (integers as strings, tokens exact);
 * `server.queued(key, n)` waits until n waiters queue on key.
 */
async function startServer(extraArgs = [], { port, sentinel = false } = {}) {
  if (!fs.existsSync(MODULE)) throw new Error(`FLOCK module not found at ${MODULE} (build it, or set FLOCK_MODULE)`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'flock-node-'));
  port ??= await freePort();
  // A sentinel is the same binary with its (writable) config file first and no module.
  const args = sentinel
    ? [sentinelConf(dir, port, ...extraArgs), '--sentinel']
    : ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, '--loadmodule', MODULE, ...extraArgs];
  let current = null;
  // Starts the process (again, for restart()) and waits until it answers PING.
  const launch = async () => {
    const proc = spawn(SERVER, args, {
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    servers.add(proc);
    const run = { proc, running: true, exited: new Promise((resolve) => proc.on('exit', resolve)) };
    run.exited.then(() => {
      run.running = false;
      servers.delete(proc);
    });
    current = run;
    await waitUntil(`redis-server on port ${port} answers PING`, async () => {
      if (!run.running) throw new Error(`redis-server exited (port ${port} taken, or the module failed to load)`);
      return ping(port);
    });
  };
  const kill = async () => {
    if (current.running) current.proc.kill('SIGKILL');
    await current.exited;
  };
  const stop = async () => {
    await kill();
    fs.rmSync(dir, { recursive: true, force: true });
  };
  onEnd(stop);
  try {
    await launch();
  } catch (err) {
    await stop();
    throw err;
  }
  const probe = new Redis(port, '127.0.0.1', { stringNumbers: true, lazyConnect: false });
  probe.on('error', () => {});
  onEnd(() => probe.disconnect());
  const info = (key) => lockInfo(probe, key);
  const queued = (key, n) => waitUntil(`${n} waiter(s) queue on ${key}`, async () => (await info(key))?.waiters === String(n));
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    probe,
    info,
    queued,
    stat: (name) => stat(probe, name),
    // A crash: SIGKILL (nothing persisted); start() brings up an empty server on the same port.
    kill,
    start: launch,
  };
}

function sentinelConf(dir, port, masterPort) {
  const file = path.join(dir, 'sentinel.conf');
  const lines = [
    `port ${port}`,
    'bind 127.0.0.1',
    `dir ${dir}`,
    `sentinel monitor mymaster 127.0.0.1 ${masterPort} 2`,
    'sentinel down-after-milliseconds mymaster 2000',
    'sentinel failover-timeout mymaster 10000',
  ];
  fs.writeFileSync(file, `${lines.join('\n')}\n`);
  return file;
}

/** A port for a cluster node: it and its bus port (+10000) free, both below 32768. */
const clusterPort = () => freePort(12768, 10000);

/**
 * A 3-master cluster (redis-cli --cluster create), each node a startServer() with its probe;
 * with `replicas` (0 or 1), that many replicas per master, in sync. `cluster.nodes` are the masters
 * as created, `cluster.all` every node; `cluster.nodeOf(key)` is the node serving the key's slot
 * now; `cluster.keyOn(node, name)` a key named after `name` whose slot that node serves;
 * `cluster.masters()` the masters now, `cluster.replicaOf(node)` a replica of that master now.
 */
async function startCluster({ replicas = 0 } = {}) {
  const all = [];
  const total = 3 * (1 + replicas);
  for (let i = 0; i < total; i++) {
    // Announced, or a node may list itself with an empty host in CLUSTER SLOTS (which ioredis skips).
    const args = ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '2000', '--cluster-announce-ip', '127.0.0.1'];
    all.push(await startServer([...args, '--repl-diskless-sync-delay', '0'], { port: await clusterPort() }));
  }
  const addrs = all.map((n) => `127.0.0.1:${n.port}`);
  await new Promise((resolve, reject) => {
    const cli = spawn('redis-cli', ['--cluster', 'create', ...addrs, '--cluster-replicas', String(replicas), '--cluster-yes'], {
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    cli.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`redis-cli --cluster create exited ${code}`))));
  });
  await waitUntil(
    'every node sees the others, every slot served and every replica in sync',
    async () => {
      for (const node of all) {
        const info = await node.probe.call('CLUSTER', 'INFO');
        if (!info.includes('cluster_state:ok') || !info.includes(`cluster_known_nodes:${total}`)) return false;
        const replication = await node.probe.info('replication');
        if (replication.includes('role:slave') && !replication.includes('master_link_status:up')) return false;
        // Every node knows every replica as one (a CLUSTER FAILOVER before its master knows it
        // as its replica times out).
        const flags = (await node.probe.call('CLUSTER', 'NODES')).split('\n').map((line) => line.split(' ')[2] ?? '');
        if (flags.filter((f) => f.split(',').includes('slave')).length !== 3 * replicas) return false;
      }
      return true;
    },
    30000,
  );
  // The masters as created (redis-cli makes the first three masters).
  const roles = await Promise.all(all.map(async (n) => (await n.probe.info('replication')).includes('role:master')));
  const nodes = all.filter((n, i) => roles[i]);
  if (replicas > 0) await Promise.all(nodes.map((node) => replicasAcknowledge(node, replicas)));
  // The probes read replicas too (FLOCK.INFO there), and so masters that become replicas.
  await Promise.all(all.map((n) => n.probe.call('READONLY')));
  const slotOf = require('cluster-key-slot');
  const nodeOf = async (key) => {
    const slot = slotOf(key);
    const ranges = await nodes[0].probe.call('CLUSTER', 'SLOTS');
    const range = ranges.find(([start, end]) => slot >= Number(start) && slot <= Number(end));
    // During a failover a node's slot map can leave the slot out for a moment: no node yet.
    return range && all.find((n) => n.port === Number(range[2][1]));
  };
  // The masters serving slots now (a failover changes them).
  const masters = async () => {
    const ranges = await nodes[0].probe.call('CLUSTER', 'SLOTS');
    const ports = new Set(ranges.map((range) => Number(range[2][1])));
    return all.filter((n) => ports.has(n.port));
  };
  const replicaOf = async (master) => {
    for (const node of all) {
      const replication = await node.probe.info('replication');
      if (replication.includes('role:slave') && replication.includes(`master_port:${master.port}`)) return node;
    }
    return null;
  };
  const keyOn = async (node, name) => {
    for (let i = 0; ; i++) if ((await nodeOf(`${name}:${i}`)) === node) return `${name}:${i}`;
  };
  return { nodes, all, nodeOf, keyOn, masters, replicaOf };
}

/**
 * Waits until `replicas` replicas acknowledge `master`'s writes. A replica the master lists
 * online, its link up, may get the master's commands only from its next acknowledgement on (up to
 * a second later: Redis starts the stream at an acknowledgement, and the first can come before
 * the master counts the replica online), and until then a write's WAIT counts it out: a durable
 * grant in that second failed NOTDURABLE with 0 replicas. A PUBLISH is a write that leaves no key.
 */
async function replicasAcknowledge(master, replicas) {
  await waitUntil(
    `${replicas} replica(s) acknowledge the master's writes`,
    async () => {
      await master.probe.publish('flock-test:sync', '');
      return Number(await master.probe.call('WAIT', String(replicas), '100')) >= replicas;
    },
    30000,
  );
}

/**
 * A master and `replicas` replicas of it, each in sync (its link up, the master counting it, and
 * acknowledging its writes): [master, ...replicas].
 */
async function startReplicated(replicas = 1) {
  const master = await startServer(['--repl-diskless-sync-delay', '0']);
  const started = [master];
  for (let i = 0; i < replicas; i++) {
    started.push(await startServer(['--replicaof', '127.0.0.1', String(master.port), '--repl-diskless-sync-delay', '0']));
  }
  await waitUntil(
    `${replicas} replica(s) in sync`,
    async () => {
      for (const replica of started.slice(1)) {
        if (!(await replica.probe.info('replication')).includes('master_link_status:up')) return false;
      }
      return (await master.probe.info('replication')).includes(`connected_slaves:${replicas}`);
    },
    30000,
  );
  await replicasAcknowledge(master, replicas);
  return started;
}

/**
 * 1 master + `replicas` replicas (in sync; default 1) + 3 sentinels watching them as `mymaster`
 * (quorum 2). `topology.master()` is the server the sentinels name master now;
 * `topology.sentinelNodes` their addresses ({ host, port }).
 */
async function startSentinels({ replicas = 1 } = {}) {
  const servers = await startReplicated(replicas);
  const [first] = servers;
  // Started after the sync, or the sentinels would learn the replicas only at their next 10 s check.
  const sentinels = [];
  // Sentinel's own periods (SENTINEL DEBUG) stay as they are. A sentinel turns a replica that
  // reports itself master back into a replica 4 publish-periods (8 s) after it saw that: with a
  // 200 ms publish-period the two other sentinels demoted the replica a SENTINEL FAILOVER had just
  // promoted, before the leader's new configuration reached them (a failover reads INFO every 1 s
  // whatever the info-period), and the failover went back. A short info-period speeds up nothing
  // the tests wait for (an old master is demoted at its first INFO 8 s after the switch; the
  // durable failover test demotes it itself), and on a busy machine it leaves the replicas' INFO
  // too old (3 info-periods) to be promoted.
  for (let i = 0; i < 3; i++) sentinels.push(await startServer([first.port], { sentinel: true }));
  await waitUntil(
    'every sentinel knows the replicas and the other sentinels',
    async () => {
      for (const sentinel of sentinels) {
        const master = fields(await sentinel.probe.call('SENTINEL', 'MASTER', 'mymaster'));
        if (master['num-slaves'] !== String(replicas) || master['num-other-sentinels'] !== '2') return false;
      }
      return true;
    },
    30000,
  );
  const master = async () => {
    const [, port] = await sentinels[0].probe.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', 'mymaster');
    return servers.find((s) => s.port === Number(port));
  };
  return { servers, sentinels, master, sentinelNodes: sentinels.map((s) => ({ host: '127.0.0.1', port: s.port })) };
}

function fields(flat) {
  const object = {};
  for (let i = 0; i < flat.length; i += 2) object[flat[i]] = flat[i + 1];
  return object;
}

/**
 * FLOCK.INFO as an object ({owner, holds, token, 'ttl-ms', ..., holders: [{owner, ...}]}, integers
 * as strings), or null.
 */
async function lockInfo(probe, key) {
  const flat = await probe.call('FLOCK.INFO', key);
  if (flat === null) return null;
  const info = fields(flat);
  info.holders = info.holders.map(fields);
  return info;
}

/**
 * Waits until `node` (a startServer()) has counted `n` FLOCK.RENEW calls more than `from`. Should
 * one of `locks` (each with a `signal`) be lost meanwhile, fails at once with that loss (a renewal
 * that came too late, say) rather than wait out the deadline for renewals that stopped.
 */
async function renewals(node, from, n, locks = []) {
  await waitUntil(`${n} renewals`, async () => {
    const lost = locks.find((lock) => lock.signal.aborted);
    if (lost) throw lost.signal.error;
    return (await node.stat('cmdstat_flock.renew')) >= from + n;
  });
}

/** One number from INFO (e.g. `cmdstat_flock.renew` calls, `errorstat_NOTOWNER` count, `flock_grants`). */
async function stat(probe, name) {
  // 'everything': 'all' leaves out the sections of modules (INFO flock).
  const text = await probe.info('everything');
  const line = text.split('\r\n').find((l) => l.startsWith(`${name}:`));
  if (line === undefined) return 0;
  const value = line.slice(name.length + 1);
  const m = /^(?:calls|count)=(\d+)/.exec(value);
  return Number(m ? m[1] : value);
}

/** The client libraries FLOCK supports, each as a factory of a connected client closed at the end. */
const CLIENTS = [
  {
    name: 'ioredis',
    async connect(port) {
      const client = new Redis(port, '127.0.0.1');
      client.on('error', () => {});
      onEnd(() => client.disconnect());
      return client;
    },
  },
  ...[2, 3].map((RESP) => ({
    name: RESP === 2 ? 'node-redis' : 'node-redis-resp3',
    async connect(port) {
      const client = createClient({ socket: { host: '127.0.0.1', port }, RESP });
      client.on('error', () => {});
      await client.connect();
      onEnd(() => client.destroy());
      return client;
    },
  })),
];

/**
 * Runs `suite(kind, K)` in a describe per client library; `K(name)` names a key of that library's
 * own, since the suites of a file share one server.
 */
function eachClient(suite) {
  for (const kind of CLIENTS) describe(kind.name, () => suite(kind, (name) => `${kind.name}:${name}`));
}

/**
 * A TCP proxy in front of `port`. `dropReply(word)`: the first reply to a command containing
 * `word` is swallowed and that client connection cut once the server has answered (a lost reply
 * of an applied command). `holdReplies(word)`: replies on the connection that sent `word` are held
 * back until `flush()`. `partition()`: nothing flows any more either way on any connection, new
 * ones included, and every socket stays open (no FIN, no RST), as under a network partition;
 * `heal()` lets it all flow again, nothing lost (each socket is paused, so what is sent meanwhile
 * waits in the kernel's buffers, as TCP keeps it). `sent(word)` lists the commands seen
 * containing `word`; `addrs()` the proxied connections as the server sees them (CLIENT LIST
 * addr=). `retarget(port)` cuts every connection and sends the new ones to `port`.
 */
async function startProxy(port) {
  let target = port;
  const seen = [];
  let drop = null;
  let hold = null;
  const holding = [];
  const sockets = new Set();
  const upstreams = new Set();
  let cut = false;
  const server = net.createServer((client) => {
    const upstream = net.connect(target, '127.0.0.1');
    // A paused socket is not read (neither its data nor its end is seen) until it is resumed.
    if (cut) {
      client.pause();
      upstream.pause();
    }
    sockets.add(client).add(upstream);
    upstreams.add(upstream);
    upstream.on('close', () => upstreams.delete(upstream));
    let dropping = false;
    const state = { held: null, client };
    client.on('data', (chunk) => {
      const text = chunk.toString('latin1');
      seen.push(text);
      if (drop && text.includes(drop)) {
        drop = null;
        dropping = true;
      }
      if (hold && text.includes(hold)) {
        hold = null;
        state.held = [];
        holding.push(state);
      }
      upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      if (dropping) return client.destroy();
      if (state.held) return state.held.push(chunk);
      client.write(chunk);
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('close', end).on('error', end);
    upstream.on('close', end).on('error', end);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const close = () => {
    for (const s of sockets) s.destroy();
    server.close();
  };
  onEnd(close);
  return {
    port: server.address().port,
    dropReply: (word) => (drop = word),
    // The command whose reply is still to be dropped (null once it was).
    dropping: () => drop,
    holdReplies: (word) => (hold = word),
    heldCount: () => holding.reduce((n, st) => n + st.held.length, 0),
    flush: () => {
      for (const st of holding.splice(0)) {
        for (const chunk of st.held) st.client.write(chunk);
        st.held = null;
      }
    },
    partition: () => {
      cut = true;
      for (const s of sockets) s.pause();
    },
    heal: () => {
      cut = false;
      for (const s of sockets) s.resume();
    },
    sent: (word) => seen.filter((text) => text.includes(word)),
    // The server's view of the proxied connections ('127.0.0.1:port', as CLIENT LIST's addr=).
    addrs: () => [...upstreams].filter((s) => s.localPort).map((s) => `${s.localAddress}:${s.localPort}`),
    close,
    // A failover as its clients see it: every proxied connection cut, and the new ones go to `to`.
    retarget: (to) => {
      target = to;
      for (const s of sockets) s.destroy();
    },
  };
}

/** The request ID of a command as the proxy saw it (RESP). */
const requestId = (text) => /ID\r\n\$\d+\r\n([^\r]+)/.exec(text)[1];

/** Writes `source` to a file of its own (removed at the end) for a child `node` process; its path. */
function childScript(name, source) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `flock-${name}-`));
  onEnd(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, `${name}.js`);
  fs.writeFileSync(file, source);
  return file;
}

/** A Flock over a new client of `kind` on `port`, its own connections closed at the end. */
async function flockOf(kind, port, settings) {
  const flock = new Flock(await kind.connect(port), settings);
  onEnd(() => flock.quit());
  return flock;
}

module.exports = {
  aborted,
  childScript,
  eachClient,
  flockOf,
  freePort,
  onEnd,
  renewals,
  requestId,
  startCluster,
  startReplicated,
  startSentinels,
  startServer,
  startProxy,
  waitUntil,
  within,
  CLIENTS,
  PUSHED_MS,
  REPO,
  WATCHDOG_LEASE,
};
