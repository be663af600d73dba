'use strict';

// One small interface over ioredis and node-redis: a connection that sends an argv and answers
// integers as decimal strings (tokens are above 2^53, so a JS number would round them),
// duplicate() for connections of FLOCK's own (blocking waits must never share a connection),
// session() for the session's dedicated connection, and setRef() so that no connection FLOCK
// opens keeps the process alive when it has nothing to wait for.

// node-redis's RESP type byte for integers (RESP_TYPES.NUMBER, ':'); mapping it to String keeps
// tokens exact without importing the package (it is an optional peer).
const RESP_NUMBER = 58;

function isIoredis(client) {
  return typeof client.call === 'function' && typeof client.duplicate === 'function' && client.options !== undefined;
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
    this.closed = false;
  }
  close() {
    if (this.owned && !this.closed) {
      this.closed = true;
      this.end();
    }
  }
  send(args) {
    if (!this._autoRef) return this._send(args);
    if (this._inflight++ === 0) this.setRef(true);
    return this._send(args).finally(() => {
      if (--this._inflight === 0) this.setRef(false);
    });
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
  end() {
    this.client.disconnect();
  }
  setRef(on) {
    this._ref = on;
    this._apply();
  }
  _apply() {
    const stream = this.client.stream;
    if (!this.owned || !stream || typeof stream.ref !== 'function') return;
    if (this._ref) stream.ref();
    else stream.unref();
  }
  // Synchronous (ioredis connects in the background and queues commands meanwhile).
  duplicate() {
    return new IoredisConnection(quiet(this.client.duplicate({ stringNumbers: true })), true, true);
  }
  // The session's connection: no reconnects of its own (FLOCK opens a new session instead, and
  // a reconnect timer must not keep the process alive), so a break rejects the pending read.
  async session() {
    const dup = quiet(
      this.client.duplicate({
        stringNumbers: true,
        retryStrategy: () => null,
        reconnectOnError: null,
        autoResubscribe: false,
        enableOfflineQueue: true,
        enableAutoPipelining: false,
        lazyConnect: false,
        commandTimeout: undefined,
      }),
    );
    return new IoredisConnection(dup, true, false);
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
  setRef(on) {
    if (!this.owned) return;
    if (on) this.client.ref();
    else this.client.unref();
  }
  async duplicate() {
    const dup = quiet(this.client.duplicate());
    const conn = new NodeRedisConnection(dup, true, true);
    conn.setRef(false);
    await dup.connect();
    return conn;
  }
  async session() {
    const socket = { ...(this.client.options?.socket ?? {}), reconnectStrategy: false };
    const dup = quiet(this.client.duplicate({ socket, pingInterval: undefined }));
    const conn = new NodeRedisConnection(dup, true);
    await dup.connect();
    return conn;
  }
}

/**
 * The connection FLOCK sends its non-blocking commands on. ioredis parses integers per connection,
 * so unless the caller's client already has `stringNumbers`, FLOCK uses a duplicate that has it
 * (unreferenced while idle, so that it never keeps the process alive).
 */
function adapt(client) {
  if (client === null || typeof client !== 'object') {
    throw new TypeError('redis-flock needs an ioredis or node-redis (redis >= 5) client');
  }
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

/** An error the server answered (as opposed to a lost reply: I/O error, closed connection). */
function isReplyError(err) {
  for (let p = err; p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = p.constructor && p.constructor.name;
    if (name === 'ReplyError' || name === 'ErrorReply' || name === 'FlockEventError') return true;
  }
  return false;
}

module.exports = { adapt, isReplyError };
