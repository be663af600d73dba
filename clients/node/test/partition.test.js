'use strict';

// A process cut off from the server (docs/client-protocol.md, "The rules every client shares"):
// its connections go through a proxy that stops carrying bytes both ways and keeps every socket
// open (a partition, a dead host), or the process is paused. Whatever it held, the holder knows it
// lost the lock before anyone else is granted it; what it waited for passes to the next waiter
// after the session timeout; a short silence loses nothing. Short session timeouts and leases (a
// few hundred ms); every wait has a deadline, and only safety orderings are asserted.

const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const { performance } = require('node:perf_hooks');
const { setTimeout: delay } = require('node:timers/promises');
const { before, describe, it } = require('node:test');
const { AbortError, LockNotHeldError, PROTOCOL } = require('..');
const { childScript, eachClient, flockOf, onEnd, startServer, startProxy, waitUntil, within, CLIENTS } = require('./helpers');

// The session timeout of a cut-off process, and a fixed lease as short.
const T = 1000;
const LEASE = 500;
const WAIT = { wait: 30000 };

let server;
before(async () => {
  server = await startServer();
});

/** A Flock behind a proxy of its own (the process to cut off), and the proxy. */
async function cutOff(kind, settings = {}) {
  const proxy = await startProxy(server.port);
  const flock = await flockOf(kind, proxy.port, { sessionTimeoutMs: T, ...settings });
  onEnd(() => proxy.heal());
  return { proxy, flock };
}

/** When `lock` is reported lost (performance.now()), once it is. */
function lostAt(lock) {
  return new Promise((resolve) => {
    if (lock.lost) resolve(performance.now());
    else lock.signal.addEventListener('abort', () => resolve(performance.now()), { once: true });
  });
}

/** `acquire` with the time it resolved (performance.now()). */
const timed = (promise) => promise.then((lock) => ({ lock, at: performance.now() }));

eachClient((kind, K) => {
  let flock;
  before(async () => {
    flock = await flockOf(kind, server.port);
  });

  for (const [name, settings, options, reason] of [
    ['a session grant', {}, {}, 'unconfirmed'],
    ['a watchdog lease (no session)', { sessions: false, watchdogLease: LEASE }, {}, 'unconfirmed'],
    ['a fixed lease', {}, { lease: LEASE }, 'expired'],
  ]) {
    it(`a holder of ${name} cut off reports the loss (${reason}) before the next waiter is granted`, async () => {
      const { proxy, flock: cut } = await cutOff(kind, settings);
      const key = K(`cut:${name}`);
      // The holder's turn comes with the next waiter queued behind it already: however late a loaded
      // machine runs the processes, nobody else can be granted the lock before the holder's lease ends.
      const first = await flock.acquire(key);
      const taking = cut.acquire(key, { ...options, ...WAIT });
      await server.queued(key, 1);
      const next = timed(flock.acquire(key, WAIT));
      await server.queued(key, 2);
      await first.release();
      const lock = await within(10000, 'the holder is granted', taking);
      const lost = lostAt(lock);
      proxy.partition();
      const granted = await within(10000, 'the next waiter is granted', next);
      assert.ok((await lost) < granted.at, 'the holder knew first');
      assert.equal(lock.signal.error.reason, reason);
      proxy.heal();
      await granted.lock.release();
      await assert.rejects(lock.release(), LockNotHeldError);
    });
  }

  it('a process stalled past its deadline (its event loop blocked) sees the loss at its first check, before any timer runs', async () => {
    const { flock: own } = await cutOff(kind);
    const locks = [await own.acquire(K('stalled:session')), await own.acquire(K('stalled:fixed'), { lease: LEASE })];
    // Synchronous from here to the checks: no timer and no I/O callback can run in between. Each
    // deadline is less than the session timeout or the lease from now.
    const until = performance.now() + Math.max(T, LEASE);
    while (performance.now() < until);
    assert.equal(locks[0].lost, true, 'the session grant');
    assert.equal(locks[0].signal.error.reason, 'unconfirmed');
    assert.equal(locks[1].signal.aborted, true, 'the fixed lease');
    assert.equal(locks[1].signal.reason.reason, 'expired');
    assert.throws(() => locks[1].signal.throwIfAborted(), /lease ended/);
  });

  it('a waiting process cut off when its turn comes holds nobody up past its session timeout, and never takes that grant', async () => {
    const { proxy, flock: cut } = await cutOff(kind);
    const key = K('cut-waiter');
    const holder = await flock.acquire(key);
    const waiting = cut.acquire(key, WAIT);
    let outcome = null;
    waiting.then(
      (lock) => (outcome = lock),
      (err) => (outcome = err),
    );
    await server.queued(key, 1);
    const next = flock.acquire(key, WAIT);
    await server.queued(key, 2);
    proxy.partition();
    await holder.release();
    // Its turn came while it was cut off: its session expires and the grant passes on.
    const lock = await within(10000, 'the next waiter is granted', next);
    assert.equal(outcome, null, 'the cut-off waiter was granted nothing meanwhile');
    proxy.heal();
    // Its wait is sent again (same request ID, a new session) and queues behind the holder now.
    await server.queued(key, 1);
    assert.equal(outcome, null);
    await lock.release();
    const later = await within(10000, 'the resent wait is granted', waiting);
    assert.equal((await server.info(key)).token, String(later.token), 'a grant of its own, made after the heal');
    await later.release();
  });

  it('a holder cut off with 100 waiters behind it: they are granted after its session timeout, in FIFO order, after it knew', async () => {
    const { proxy, flock: cut } = await cutOff(kind);
    const key = K('cut-many');
    const lock = await cut.acquire(key);
    const lost = lostAt(lock);
    const N = 100;
    const order = [];
    let firstAt;
    const waits = Array.from({ length: N }, (_, i) =>
      flock.acquire(key, WAIT).then(async (granted) => {
        firstAt ??= performance.now();
        order.push(i);
        await granted.release();
      }),
    );
    await server.queued(key, N);
    proxy.partition();
    await within(20000, 'every waiter is granted', Promise.all(waits));
    assert.ok((await lost) < firstAt, 'the holder knew before the first waiter was granted');
    assert.deepEqual(
      order,
      Array.from({ length: N }, (_, i) => i),
    );
    proxy.heal();
  });

  it('a cancelled wait whose FLOCK.CANCEL gets no answer and no event within the cancel grace closes its session: it ends, and leaves the queue once the server hears of it', async () => {
    // The default session timeout (10 s): its deadline is far beyond the grace.
    const { proxy, flock: cut } = await cutOff(kind, { sessionTimeoutMs: undefined });
    const key = K('cancel-grace');
    const holder = await flock.acquire(key);
    const controller = new AbortController();
    const waiting = cut.acquire(key, { ...WAIT, signal: controller.signal });
    await server.queued(key, 1);
    const session = cut._session.nodes.get('');
    proxy.partition();
    controller.abort();
    await assert.rejects(within(PROTOCOL.cancelGraceMs + 3000, 'the wait ends', waiting), AbortError);
    assert.equal(session.broken, true, 'its session was closed');
    proxy.heal();
    await server.queued(key, 0);
    await holder.release();
  });

  it('a session silent for less than its timeout loses nothing: no grant lost, none re-taken', async () => {
    const { proxy, flock: own } = await cutOff(kind, { sessionTimeoutMs: 3 * T });
    const locks = [await own.acquire(K('silent:session')), await own.acquire(K('silent:fixed'), { lease: 20 * T })];
    const acquires = await server.stat('cmdstat_flock.acquire');
    // Less than half the timeout, less its margin: the heartbeat read sent after the heal is
    // answered before any deadline, however the silence fell between two reads.
    proxy.partition();
    await delay(T / 2);
    proxy.heal();
    const healed = performance.now();
    await waitUntil('a session timeout went by since the heal', () => performance.now() - healed > 3 * T);
    for (const lock of locks) assert.equal(lock.lost, false, lock.signal.error?.message);
    for (const [i, key] of [K('silent:session'), K('silent:fixed')].entries()) {
      assert.equal((await server.info(key)).owner, locks[i].owner);
      assert.equal((await server.info(key)).holds, '1');
    }
    assert.equal(await server.stat('cmdstat_flock.acquire'), acquires, 'nothing was acquired again');
    for (const lock of locks) assert.equal(await lock.release(), 0);
  });
});

describe('a holding process paused (SIGSTOP) past its deadline', () => {
  const ROOT = path.resolve(__dirname, '..');
  // The child's session timeout: long enough that a child process starved of CPU on a busy
  // machine still holds the lock when the next waiter queues.
  const CHILD_T = 1000;
  // The child holds a session grant through the parent's proxy, then answers each `check` line on
  // stdin with what its lock says.
  const script = `
'use strict';
const { Flock } = require(${JSON.stringify(ROOT)});
const [kind, port, key, timeout] = process.argv.slice(2);
(async () => {
  let redis;
  if (kind === 'ioredis') {
    const Redis = require(${JSON.stringify(require.resolve('ioredis'))});
    redis = new Redis(Number(port), '127.0.0.1');
  } else {
    const { createClient } = require(${JSON.stringify(require.resolve('redis'))});
    redis = createClient({ socket: { host: '127.0.0.1', port: Number(port) } });
    await redis.connect();
  }
  redis.on('error', () => {});
  const flock = new Flock(redis, { sessionTimeoutMs: Number(timeout) });
  const lock = await flock.acquire(key);
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', () => {
    // The first thing this process does on a check: read lost, then the signal.
    const lost = lock.lost;
    console.log(JSON.stringify({ lost, aborted: lock.signal.aborted, reason: lock.signal.error?.reason }));
  });
  console.log('held ' + lock.owner);
})().catch((err) => {
  console.error(err);
  process.exit(2);
});
`;
  for (const kind of ['ioredis', 'node-redis']) {
    it(`${kind}: after SIGCONT its first check says lost; the lock went to the next waiter meanwhile`, async () => {
      const file = childScript('stop', script);
      const proxy = await startProxy(server.port);
      onEnd(() => proxy.heal());
      const key = `stopped:${kind}`;
      // The next waiter's session is open before the child holds the lock, so that it queues at once.
      const flock = await flockOf(CLIENTS.find((c) => c.name === kind), server.port);
      await (await flock.acquire(`${key}:warm`)).release();
      const child = spawn(process.execPath, [file, kind, String(proxy.port), key, String(CHILD_T)], { stdio: ['pipe', 'pipe', 'inherit'] });
      onEnd(() => child.kill('SIGKILL'));
      const lines = [];
      child.stdout.setEncoding('utf8');
      child.stdout.on('data', (chunk) => lines.push(...chunk.split('\n').filter(Boolean)));
      await waitUntil('the child holds the lock', () => lines.some((l) => l.startsWith('held ')));
      const next = flock.acquire(key, WAIT);
      await server.queued(key, 1);
      // Paused, and nothing reaches it meanwhile (not even the server closing its session).
      proxy.partition();
      child.kill('SIGSTOP');
      const lock = await within(10000, 'the next waiter is granted', next);
      // The check is waiting on its stdin when it resumes: it may run before any overdue timer.
      child.stdin.write('check\n');
      child.kill('SIGCONT');
      await waitUntil('the child answers the check', () => lines.length > 1);
      const answer = JSON.parse(lines[1]);
      assert.equal(answer.lost, true, `after SIGCONT the child's lock says ${lines[1]}`);
      assert.equal(answer.aborted, true);
      assert.equal(answer.reason, 'unconfirmed');
      await lock.release();
    });
  }
});
