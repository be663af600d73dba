'use strict';

// One small interface over ioredis and node-redis: a connection that sends an argv and answers
// integers as decimal strings (tokens are above 2^53, so a JS number would round them), and
// duplicate() for connections of FLOCK's own (blocking waits must never share a connection).

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
class Connection {
  constructor(client, owned) {
    this.client = client;
    this.owned = owned;
  }
  close() {
    if (this.owned) this.end();
  }
}

class IoredisConnection extends Connection {
  send(args) {
    return this.client.call(...args);
  }
  end() {
    this.client.disconnect();
  }
  // Synchronous (ioredis connects in the background and queues commands meanwhile).
  duplicate() {
    return new IoredisConnection(quiet(this.client.duplicate({ stringNumbers: true })), true);
  }
}

class NodeRedisConnection extends Connection {
  send(args) {
    return this.client.sendCommand(args, { typeMapping: { [RESP_NUMBER]: String } });
  }
  end() {
    this.client.destroy();
  }
  async duplicate() {
    const dup = quiet(this.client.duplicate());
    await dup.connect();
    return new NodeRedisConnection(dup, true);
  }
}

/**
 * The connection FLOCK sends its non-blocking commands on. ioredis parses integers per connection,
 * so unless the caller's client already has `stringNumbers`, FLOCK uses a duplicate that has it.
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
    if (name === 'ReplyError' || name === 'ErrorReply') return true;
  }
  return false;
}

module.exports = { adapt, isReplyError };
