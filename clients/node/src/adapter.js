'use strict';

// One small interface over ioredis and node-redis: a connection that sends an argv and answers
// integers as decimal strings (tokens are above 2^53, so a JS number would round them),
// session(node) for a session's dedicated connection, dedicated(node) for the connections of
// FLOCK's own that a blocking command holds (they must never share the caller's connection), and
// setRef() so that no connection FLOCK opens keeps the process alive when it has nothing to wait for.
//
// Topologies: nodeOf(key) names the server that holds a key, and session(node) opens a session
// there. One server (also through Sentinel, which connects to the master of the moment) is one
// node, ''; a Cluster has a node per master, named by address as the library's slot map has it.
// Keyed commands go through the library's routing (which follows MOVED and ASK), except those
// that name a session: send(args, node) sends them on that node's own connection, so that the
// answer is that node's (a MOVED, or NOSESSION only when the session really ended).

const { setTimeout: delay } = require('node:timers/promises');
const { Deadline } = require('./deadlines');
const { CommandTimeoutError } = require('./errors');
const { now } = require('./protocol');

// node-redis's RESP type byte for integers (RESP_TYPES.NUMBER, ':'); mapping it to String keeps
// tokens exact without importing the package (it is an optional peer).
const RESP_NUMBER = 58;
// MOVED answers followed for one command (ioredis's default maxRedirections).
const MAX_REDIRECTIONS = 16;
// Both libraries hash keys to slots with this package (a dependency of each, so there whenever
// a cluster client is; required only then).
const calculateSlot = (key) => require('cluster-key-slot')(key);
// How often, and how long apart, node-redis's slot map is read again while it has no node for a
// key's slot (see NodeRedisClusterConnection#_mapped): about a failover's length.
const UNMAPPED_READS = 20;
const UNMAPPED_PAUSE_MS = 100;

/**
 * The keys a command names: for FLOCK's commands on several keys those after `numkeys` (placed
 * as LMPOP places them), else the one after the command's name. Cluster routing goes by the first.
 */
function commandKeys(args) {
  if (/^FLOCK\.(ACQUIRE|RELEASE)ALL$/i.test(args[0])) return args.slice(2, 2 + Number(args[1]));
  return [args[1]];
}

function isIoredis(client) {
  return typeof client.call === 'function' && typeof client.duplicate === 'function' && client.options !== undefined;
}

function isIoredisCluster(client) {
  return isIoredis(client) && client.isCluster === true;
}

function isNodeRedisCluster(client) {
  return typeof client.sendCommand === 'function' && typeof client.nodeClient === 'function' && client.nodeByAddress instanceof Map;
}

function isNodeRedisSentinel(client) {
  return typeof client.sendCommand === 'function' && typeof client.getMasterNode === 'function' && typeof client.acquire === 'function';
}

function isNodeRedis(client) {
  return typeof client.sendCommand === 'function' && typeof client.duplicate === 'function';
}

function quiet(conn) {
  // An 'error' event without a listener would crash the process; connection errors reach the
  // caller as rejected commands instead, which FLOCK retries or reports.
  conn.on('error', () => {});
  return conn;
}

// `owned`: a connection FLOCK opened and closes; the caller's own client is never closed.
// `autoRef`: referenced (keeps the process alive) only while a command is in flight on it.
class Connection {
  constructor(client, owned, autoRef = false) {
    this.client = client;
    this.owned = owned;
    this._autoRef = autoRef;
    this._inflight = 0;
    // The end of each command in flight (autoRef): one function for all.
    this._ended = () => {
      if (--this._inflight === 0) this.setRef(false);
    };
    this.closed = false;
  }
  close() {
    if (this.owned && !this.closed) {
      this.closed = true;
      this.end();
    }
  }
  // One server: one node, whatever key.
  async nodeOf() {
    return '';
  }
  // The node of `key` if known without a round trip (the slot map is there), else undefined.
  nodeNow() {
    return '';
  }
  // Whether the blocking form of single-key waits (sessions: false) is offered: with one server
  // (also through ioredis's Sentinel support) only; cluster clients and node-redis's sentinel
  // client wait through sessions (their multi-key waits block a dedicated() connection).
  get blocking() {
    return true;
  }
  /**
   * Sends `args` (to `node`'s own connection when given); with `timeoutMs`, rejects with a
   * CommandTimeoutError when no reply came by then (none at all for 0 or less: nothing is sent).
   * The reply that comes later is read and dropped: the connection stays in step. `onError`, if
   * given, turns a failure (an error reply, a timeout, a lost reply) into the outcome (what it
   * returns, or throws): the caller's handling without a promise of its own in between.
   */
  send(args, node, timeoutMs, onError) {
    if (timeoutMs <= 0) {
      const failed = Promise.reject(timedOut(args[0], timeoutMs));
      return onError ? failed.catch(onError) : failed;
    }
    return this._inFlight(this._send(args, node), timeoutMs, args[0], onError);
  }
  /**
   * Sends `commands` (argvs) in one round trip on this one connection; resolves to a settled
   * result per command ({ status, value | reason }, as Promise.allSettled). `timeoutMs` as send's.
   */
  pipeline(commands, timeoutMs) {
    return this._inFlight(this._pipeline(commands), timeoutMs, commands[0][0]);
  }
  // A command in flight: referenced meanwhile (autoRef), until it settles or times out.
  _inFlight(promise, timeoutMs, what, onError) {
    if (!this._autoRef) return timeboxed(promise, timeoutMs, what, undefined, onError);
    if (this._inflight++ === 0) this.setRef(true);
    return timeboxed(promise, timeoutMs, what, this._ended, onError);
  }
  // node-redis writes the commands of one tick together (its auto-pipelining).
  _pipeline(commands) {
    return Promise.allSettled(commands.map((args) => this._send(args)));
  }
  /**
   * A connection of FLOCK's own to `node` (the session's kind: no reconnects of its own, so a
   * break rejects), referenced only while a command is in flight: for commands that block their
   * connection for a while (a blocking FLOCK.ACQUIRE or ACQUIREALL ... WAIT, durable grants'
   * WAIT), never the caller's client.
   */
  async dedicated(node) {
    const conn = await this.session(node);
    conn._autoRef = true;
    conn.setRef(false);
    return conn;
  }
  /**
   * Whether a dedicated() connection kept idle may still be used: open, and (through Sentinel,
   * where one node '' is whichever server is master now) on the server this client uses now.
   */
  current(conn) {
    return !conn.closed && conn.open;
  }
}

class IoredisConnection extends Connection {
  constructor(client, owned, autoRef) {
    super(client, owned, autoRef);
    this._ref = !autoRef;
    if (owned) {
      // ioredis makes a new socket on each (re)connect: apply the wanted state to each.
      client.on('connect', () => this._apply());
      this._apply();
    }
  }
  _send(args) {
    return this.client.call(...args);
  }
  async _pipeline(commands) {
    const replies = await this.client.pipeline(commands.map((args) => ['call', ...args])).exec();
    return replies.map(([reason, value]) => (reason ? { status: 'rejected', reason } : { status: 'fulfilled', value }));
  }
  end() {
    this.client.disconnect();
  }
  setRef(on) {
    this._ref = on;
    this._apply();
  }
  get open() {
    return this.client.status === 'ready';
  }
  // Through Sentinel: on the same server as this client's own connection.
  current(conn) {
    if (!super.current(conn) || !this.client.options.sentinels) return super.current(conn);
    const [mine, its] = [this.client.stream, conn.client.stream];
    return Boolean(mine && its && mine.remoteAddress === its.remoteAddress && mine.remotePort === its.remotePort);
  }
  _apply() {
    const stream = this.client.stream;
    if (!this.owned || !stream || typeof stream.ref !== 'function') return;
    if (this._ref) stream.ref();
    else stream.unref();
  }
  // FLOCK's command connection when the caller's client lacks `stringNumbers` (see adapt).
  // Synchronous (ioredis connects in the background and queues commands meanwhile).
  duplicate() {
    const dup = quiet(this.client.duplicate({ stringNumbers: true, failoverDetector: false }));
    if (this.client.options.sentinels) {
      // Through Sentinel, a duplicate follows the caller's client to a new master: when that
      // reconnects (ioredis's failoverDetector does at a failover), so does the duplicate. Its own
      // failoverDetector would keep connections to the sentinels open, and the process alive.
      // A duplicate not connected yet asks the sentinels anyway (and a disconnect then could
      // leave it closed).
      this.client.on('connect', () => dup.status === 'ready' && dup.disconnect(true));
    }
    return new IoredisConnection(dup, true, true);
  }
  async session() {
    return ioredisSession(this.client);
  }
}

// The session's connection: no reconnects of its own (FLOCK opens a new session instead, and
// a reconnect timer must not keep the process alive), so a break rejects the pending read.
// `redis`: a single-server ioredis client (with `sentinels`, the duplicate asks them for the master).
function ioredisSession(redis) {
  const dup = quiet(
    redis.duplicate({
        stringNumbers: true,
        retryStrategy: () => null,
        reconnectOnError: null,
        autoResubscribe: false,
        enableOfflineQueue: true,
        enableAutoPipelining: false,
        // FLOCK.SESSION is the first command: no INFO before it (a LOADING server answers it an error).
        enableReadyCheck: false,
        lazyConnect: false,
      commandTimeout: undefined,
      // A session that a failover leaves on the old master is found out by NOSESSION (or its
      // demotion) and reopened on the new one.
      failoverDetector: false,
    }),
  );
  return new IoredisConnection(dup, true, false);
}

// An ioredis Cluster: the caller's, for its slot map; FLOCK's commands go on connections of its
// own to each node (with stringNumbers, which the cluster itself cannot have: ioredis then
// misreads CLUSTER SLOTS, whose slot numbers come as strings too).
class IoredisClusterConnection extends Connection {
  get blocking() {
    return false;
  }
  constructor(cluster) {
    super(cluster, false);
    // Node address -> IoredisConnection (a plain client of that node).
    this._nodes = new Map();
  }
  nodeNow(key) {
    return this.client.slots?.[calculateSlot(key)]?.[0];
  }
  async nodeOf(key) {
    const slot = calculateSlot(key);
    // The slot map is there once the cluster is ready: a command connects it (or fails).
    if (!this.client.slots[slot]) await this.client.ping();
    const nodes = this.client.slots[slot];
    if (!nodes) throw new Error(`No cluster node serves the slot of ${key} (${slot})`);
    return nodes[0];
  }
  _node(node) {
    let conn = this._nodes.get(node);
    if (!conn) {
      const known = this.client.connectionPool.getInstanceByKey(node) ?? this.client.nodes()[0];
      if (!known) throw new Error(`The cluster knows no node (${node})`);
      const at = node.lastIndexOf(':');
      const dup = known.duplicate({ host: node.slice(0, at), port: Number(node.slice(at + 1)), stringNumbers: true });
      conn = new IoredisConnection(quiet(dup), true, true);
      this._nodes.set(node, conn);
    }
    return conn;
  }
  // ioredis does not know FLOCK's commands, so it would send them to a random node and follow
  // the MOVED: they go to their key's node here instead; a MOVED (the slot map is refreshed on
  // it) to the node it names, an ASK (a slot in migration) to its node after ASKING. A command
  // for a given `node` (it names that node's session) is not redirected: the caller is.
  async _send(args, node) {
    const follow = node === undefined;
    node ??= await this.nodeOf(commandKeys(args)[0]);
    let asking = false;
    for (let redirections = 0; ; redirections++) {
      const conn = this._node(node);
      try {
        if (!asking) return await conn.send(args);
        const [[askErr], [err, reply]] = await conn.client.pipeline().call('ASKING').call(...args).exec();
        if (askErr || err) throw askErr || err;
        return reply;
      } catch (err) {
        const [code, , address] = err.message.split(' ');
        if (!isReplyError(err) || (code !== 'MOVED' && code !== 'ASK')) throw err;
        if (code === 'MOVED') this.client.refreshSlotsCache();
        if (!follow || redirections >= MAX_REDIRECTIONS) throw err;
        asking = code === 'ASK';
        node = address;
      }
    }
  }
  // Only the node connections are FLOCK's; each is referenced while a command is in flight on it.
  setRef() {}
  end() {
    for (const conn of this._nodes.values()) conn.end();
  }
  close() {
    if (this.closed) return;
    this.closed = true;
    this.end();
  }
  async session(node) {
    return ioredisSession(this._node(node).client);
  }
}

class NodeRedisConnection extends Connection {
  _send(args) {
    return this.client.sendCommand(args, { typeMapping: { [RESP_NUMBER]: String } });
  }
  end() {
    // destroy() throws when the socket is already closed.
    try {
      this.client.destroy();
    } catch {}
  }
  get open() {
    return this.client.isReady;
  }
  setRef(on) {
    if (!this.owned) return;
    if (on) this.client.ref();
    else this.client.unref();
  }
  async session() {
    return nodeRedisSession(this.client);
  }
}

async function nodeRedisSession(client) {
  const socket = { ...(client.options?.socket ?? {}), reconnectStrategy: false };
  const dup = quiet(client.duplicate({ socket, pingInterval: undefined }));
  const conn = new NodeRedisConnection(dup, true);
  await dup.connect();
  return conn;
}

// A node-redis cluster (createCluster): commands routed by their key (args[1]), and a session
// per master, duplicated from the cluster's own client of that node.
class NodeRedisClusterConnection extends NodeRedisConnection {
  get blocking() {
    return false;
  }
  async _send(args, node) {
    const options = { typeMapping: { [RESP_NUMBER]: String } };
    if (node === undefined) {
      const key = commandKeys(args)[0];
      if (!this.nodeNow(key)) await this._mapped(key);
      return this.client.sendCommand(key, false, args, options);
    }
    const client = await this._nodeClient(node);
    try {
      return await client.sendCommand(args, options);
    } catch (err) {
      // node-redis refreshes its slot map on the MOVED of a command it routed, not of this one.
      if (isReplyError(err) && /^MOVED /.test(err.message)) await this._rediscover(client).catch(() => {});
      throw err;
    }
  }
  async _nodeClient(node) {
    let master = this.client.nodeByAddress.get(node);
    if (!master) {
      // A node the slot map does not know yet (a replica promoted, named by a MOVED): asked anew.
      await this._rediscover();
      master = this.client.nodeByAddress.get(node);
    }
    if (!master) throw new Error(`The cluster node ${node} is gone from the slot map`);
    return this.client.nodeClient(master);
  }
  // Resolves once node-redis's slot map has a node for `key`'s slot. A map read during a failover
  // can lack one (the shard had no master then), and node-redis then throws a TypeError on every
  // command of that slot until something reads the map again: it is read again here, a few times,
  // as ioredis holds commands back while it reads its own.
  async _mapped(key) {
    for (let reads = 0; !this.nodeNow(key); reads++) {
      if (reads === UNMAPPED_READS) throw new Error(`The cluster's slot map has no node for the slot of ${key}`);
      await this._rediscover();
      if (!this.nodeNow(key)) await delay(UNMAPPED_PAUSE_MS);
    }
  }
  // The cluster's slot map, asked again (starting from `client`, or any master it knows).
  async _rediscover(client) {
    const slots = this.client._slots;
    const start = client ?? this.client.masters.find((m) => m.client)?.client;
    if (slots && typeof slots.rediscover === 'function' && start) await slots.rediscover(start);
  }
  nodeNow(key) {
    return this.client.slots?.[calculateSlot(key)]?.master.address;
  }
  async nodeOf(key) {
    if (!this.client.isOpen) await this.client.connect();
    await this._mapped(key);
    return this.nodeNow(key);
  }
  async session(node) {
    return nodeRedisSession(await this._nodeClient(node));
  }
}

// A node-redis sentinel client (createSentinel): commands go to its master pool; the session is a
// client of FLOCK's own to the master it knows now (its own options are private: `nodeOptions`
// gives the session client what the nodes need, e.g. credentials).
class NodeRedisSentinelConnection extends NodeRedisConnection {
  get blocking() {
    return false;
  }
  constructor(client, nodeOptions) {
    super(client, false);
    this._nodeOptions = nodeOptions ?? {};
  }
  _send(args) {
    return this.client.sendCommand(false, args, { typeMapping: { [RESP_NUMBER]: String } });
  }
  // On the master the sentinel client knows now.
  current(conn) {
    const master = this.client.getMasterNode();
    const socket = conn.client.options?.socket ?? {};
    return super.current(conn) && Boolean(master) && master.port === socket.port && master.host === socket.host;
  }
  async session() {
    const master = this.client.getMasterNode();
    if (!master) throw new Error('The sentinel client knows no master now');
    // node-redis is installed: the caller's client is one of its.
    const { createClient } = require('@redis/client');
    const socket = { ...(this._nodeOptions.socket ?? {}), host: master.host, port: master.port, reconnectStrategy: false };
    const client = quiet(createClient({ ...this._nodeOptions, socket }));
    const conn = new NodeRedisConnection(client, true);
    await client.connect();
    return conn;
  }
}

/**
 * The connection FLOCK sends its non-blocking commands on. ioredis parses integers per connection,
 * so unless the caller's client already has `stringNumbers`, FLOCK uses a duplicate that has it
 * (unreferenced while idle, so that it never keeps the process alive).
 */
function adapt(client, { nodeOptions } = {}) {
  if (client === null || typeof client !== 'object') {
    throw new TypeError('redis-flock needs an ioredis or node-redis (redis >= 5) client');
  }
  if (isIoredisCluster(client)) return new IoredisClusterConnection(client);
  if (isNodeRedisCluster(client)) return new NodeRedisClusterConnection(client, false);
  if (isNodeRedisSentinel(client)) return new NodeRedisSentinelConnection(client, nodeOptions);
  if (isIoredis(client)) {
    const conn = new IoredisConnection(client, false);
    return client.options.stringNumbers ? conn : conn.duplicate();
  }
  if (isNodeRedis(client)) {
    if (typeof client.withTypeMapping !== 'function') {
      throw new TypeError(
        'node-redis v4 answers integers as JS numbers, which round fencing tokens (above 2^53): use redis >= 5 or ioredis',
      );
    }
    return new NodeRedisConnection(client, false);
  }
  throw new TypeError('redis-flock needs an ioredis or node-redis (redis >= 5) client');
}

function timedOut(what, ms) {
  return new CommandTimeoutError(`${what} got no reply within ${Math.max(0, Math.round(ms))} ms`);
}

/**
 * `promise`, or a CommandTimeoutError after `ms` (none when `ms` is undefined or Infinity), taken
 * on the process's deadline heap (no timer of its own: a command costs no timer); `onEnd` runs
 * once either comes. Its own outcome after the timeout is of no use (a late reply, the
 * connection closed) and is dropped. `onError`: as Connection#send's.
 */
function timeboxed(promise, ms, what, onEnd, onError) {
  const bounded = ms !== undefined && ms < Infinity;
  if (!bounded && !onEnd) return onError ? promise.catch(onError) : promise;
  return new Promise((resolve, reject) => {
    const fail = onError ? (err) => settleWith(onError, err, resolve, reject) : reject;
    const box = new Timebox(fail, what, ms, onEnd);
    if (bounded) box.move(now() + ms);
    promise.then(
      (value) => box.end() && resolve(value),
      (err) => box.end() && fail(err),
    );
  });
}

// Settles a promise (`resolve`, `reject`) with what `handle(err)` returns, or with what it throws.
function settleWith(handle, err, resolve, reject) {
  try {
    resolve(handle(err));
  } catch (thrown) {
    reject(thrown);
  }
}

// timeboxed()'s deadline, an object of its own for every command: no closures for its end.
class Timebox extends Deadline {
  constructor(reject, what, ms, onEnd) {
    super(Infinity, null);
    this.reject = reject;
    this.what = what;
    this.ms = ms;
    this.onEnd = onEnd;
    this.open = true;
  }

  fire() {
    if (this.end()) this.reject(timedOut(this.what, this.ms));
  }

  // Whether this is the first end (the outcome, or the timeout): only the first counts.
  end() {
    if (!this.open) return false;
    this.open = false;
    if (this.pending) this.cancel();
    this.onEnd?.();
    return true;
  }
}

/** An error the server answered (as opposed to a lost reply: I/O error, closed connection). */
function isReplyError(err) {
  for (let p = err; p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = p.constructor && p.constructor.name;
    if (name === 'ReplyError' || name === 'ErrorReply' || name === 'FlockEventError') return true;
  }
  return false;
}

module.exports = { adapt, commandKeys, isReplyError, timeboxed };
