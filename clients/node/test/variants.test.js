'use strict';

// Read-write locks (`shared: true`) and semaphores (`permits`, `limit`), run once per supported
// client library (ioredis, node-redis RESP2 and RESP3).

const assert = require('node:assert/strict');
const { it, before } = require('node:test');
const { LockBusyError, LockUpgradeError, LockModeError, LockDeadlockError } = require('..');
const { eachClient, flockOf, renewals, requestId, startServer, startProxy, waitUntil, WATCHDOG_LEASE } = require('./helpers');

const LEASE = 10000;

let server;
before(async () => {
  server = await startServer();
});

eachClient((kind, K) => {
  let flock;
  before(async () => {
    flock = await flockOf(kind, server.port, { wait: 0 });
  });
  const read = (key, opts) => flock.acquire(key, { lease: LEASE, shared: true, ...opts });
  const write = (key, opts) => flock.acquire(key, { lease: LEASE, ...opts });
  const holders = async (key) => (await server.info(key)).holders.map((h) => [h.owner, h.holds]);

  it('a wait that would deadlock rejects with LockDeadlockError at once and queues nothing', async () => {
    // One owner per caller across locks (the `owner` option): A takes 1 then 2, B 2 then 1.
    const a1 = await write(K('dl1'), { owner: 'A' });
    const b2 = await write(K('dl2'), { owner: 'B' });
    const b1 = write(K('dl1'), { owner: 'B', wait: Infinity });
    await server.queued(K('dl1'), 1);
    await assert.rejects(
      write(K('dl2'), { owner: 'A', wait: 5000 }),
      (err) => err instanceof LockDeadlockError && err.key === K('dl2') && /'A' -> 'B' -> 'A'/.test(err.message),
    );
    assert.equal((await server.info(K('dl2'))).waiters, '0', 'nothing queued');
    await a1.release();
    await (await b1).release();
    await b2.release();
  });

  it('readers share the lock, each with its own rising token; a writer is kept out', async () => {
    const a = await read(K('share'));
    const b = await read(K('share'));
    assert.equal(a.mode, 'shared');
    assert.ok(b.token > a.token);
    const info = await server.info(K('share'));
    assert.equal(info.mode, 'shared');
    assert.deepEqual(
      info.holders.map((h) => [h.owner, h.token]),
      [
        [a.owner, String(a.token)],
        [b.owner, String(b.token)],
      ],
    );
    await assert.rejects(write(K('share')), LockBusyError);
    assert.equal(await a.release(), 0);
    assert.equal(await b.release(), 0);
    assert.equal(await server.info(K('share')), null);
  });

  it('a queued writer blocks later readers (FIFO): they are granted after it', async () => {
    const reader = await read(K('fifo'));
    const order = [];
    const writer = write(K('fifo'), { wait: Infinity }).then((l) => (order.push('writer'), l));
    await server.queued(K('fifo'), 1);
    await assert.rejects(read(K('fifo')), LockBusyError, 'a try never overtakes the queued writer');
    const later = read(K('fifo'), { wait: Infinity }).then((l) => (order.push('reader'), l));
    await server.queued(K('fifo'), 2);
    await reader.release();
    const w = await writer;
    const info = await server.info(K('fifo'));
    assert.equal(info.owner, w.owner);
    assert.equal(info.waiters, '1', 'the later reader still waits');
    await w.release();
    await (await later).release();
    assert.deepEqual(order, ['writer', 'reader']);
  });

  it('a writer is granted when the last reader leaves', async () => {
    const r1 = await read(K('last'));
    const r2 = await read(K('last'));
    const writer = write(K('last'), { wait: Infinity });
    await server.queued(K('last'), 1);
    await r1.release();
    // The server hands off within the RELEASE, so the writer still queues after it answered.
    assert.equal((await server.info(K('last'))).waiters, '1');
    assert.deepEqual(await holders(K('last')), [[r2.owner, '1']]);
    await r2.release();
    const w = await writer;
    assert.equal(w.mode, 'exclusive');
    assert.equal((await server.info(K('last'))).owner, w.owner);
    await w.release();
  });

  it('a writer may also read: a shared re-entry adds a hold to its exclusive grant', async () => {
    const w = await write(K('wread'));
    const r = await read(K('wread'), { owner: w.owner });
    assert.equal(r.token, w.token);
    const info = await server.info(K('wread'));
    assert.equal(info.owner, w.owner);
    assert.equal(info.holds, '2');
    assert.equal(await r.release(), 1);
    assert.equal(await w.release(), 0);
  });

  it('a reader asking to write rejects with LockUpgradeError and changes nothing', async () => {
    const r = await read(K('up'));
    await assert.rejects(
      write(K('up'), { owner: r.owner, wait: Infinity }),
      (err) => err instanceof LockUpgradeError && err.key === K('up') && /^UPGRADE /.test(err.cause.message),
    );
    assert.deepEqual(await holders(K('up')), [[r.owner, '1']]);
    assert.equal((await server.info(K('up'))).waiters, '0');
    await r.release();
  });

  it('a semaphore is never held beyond its limit by many concurrent holders', async () => {
    const LIMIT = 3;
    let running = 0;
    let peak = 0;
    const job = () =>
      flock.using(K('sem'), LEASE, { limit: LIMIT, wait: Infinity }, async () => {
        peak = Math.max(peak, ++running);
        assert.ok((await server.info(K('sem'))).holders.length <= LIMIT);
        // Hold on until the limit was reached once, so that the jobs overlap and some queue.
        await waitUntil(`${LIMIT} jobs hold a permit at once`, () => peak === LIMIT);
        running--;
      });
    await Promise.all(Array.from({ length: 4 * LIMIT }, job));
    assert.equal(peak, LIMIT);
    assert.equal(await server.info(K('sem')), null);
  });

  it('a big request at the head of the queue is not overtaken by a smaller one', async () => {
    const sem = { lease: LEASE, limit: 3 };
    const first = await flock.acquire(K('big'), { ...sem, permits: 2 });
    const big = flock.acquire(K('big'), { ...sem, permits: 2, wait: Infinity });
    await server.queued(K('big'), 1);
    await assert.rejects(flock.acquire(K('big'), { ...sem, permits: 1 }), LockBusyError, 'one permit is free, but the head needs two');
    const small = flock.acquire(K('big'), { ...sem, permits: 1, wait: Infinity });
    await server.queued(K('big'), 2);
    assert.deepEqual(await holders(K('big')), [[first.owner, '1']]);
    await first.release();
    const [b, s] = await Promise.all([big, small]);
    assert.deepEqual([b.permits, s.permits], [2, 1]);
    assert.ok(s.token > b.token, 'granted in queue order');
    assert.deepEqual(
      (await server.info(K('big'))).holders.map((h) => h.permits),
      ['2', '1'],
    );
    await b.release();
    await s.release();
  });

  it('WRONGMODE: a semaphore refuses a lock request or another limit, a lock refuses permits', async () => {
    const wrongMode = (key) => (err) => err instanceof LockModeError && err.key === key && /^WRONGMODE /.test(err.cause.message);
    const s = await flock.acquire(K('sem-mode'), { lease: LEASE, permits: 1, limit: 2 });
    for (const opts of [{}, { shared: true }, { permits: 1, limit: 3 }]) {
      await assert.rejects(write(K('sem-mode'), opts), wrongMode(K('sem-mode')));
    }
    assert.deepEqual(await holders(K('sem-mode')), [[s.owner, '1']]);
    const r = await read(K('lock-mode'));
    await assert.rejects(flock.acquire(K('lock-mode'), { lease: LEASE, permits: 1, limit: 2 }), wrongMode(K('lock-mode')));
    assert.deepEqual(await holders(K('lock-mode')), [[r.owner, '1']]);
    await s.release();
    await r.release();
  });

  it("without a session, the watchdog keeps a reader's and a semaphore holder's lease alive", async () => {
    const dog = await flockOf(kind, server.port, { watchdogLease: WATCHDOG_LEASE, sessions: false });
    const r = await dog.acquire(K('dog-read'), { shared: true });
    const s = await dog.acquire(K('dog-sem'), { permits: 2, limit: 5 });
    const renews = await server.stat('cmdstat_flock.renew');
    // Four renewals each, every lease/3: together longer than the first lease.
    await renewals(server, renews, 8, [r, s]);
    assert.deepEqual(await holders(K('dog-read')), [[r.owner, '1']]);
    assert.deepEqual(await holders(K('dog-sem')), [[s.owner, '1']]);
    assert.equal(r.signal.aborted || s.signal.aborted, false);
    await r.release();
    await s.release();
    assert.equal(await server.info(K('dog-read')), null);
    assert.equal(await server.info(K('dog-sem')), null);
  });

  it('a shared RELEASE whose reply was lost is resent with the same ID and applied once', async () => {
    const proxy = await startProxy(server.port);
    const proxied = await flockOf(kind, proxy.port);
    const r = await proxied.acquire(K('lost'), { lease: LEASE, shared: true });
    await proxied.acquire(K('lost'), { lease: LEASE, shared: true, owner: r.owner });
    const other = await read(K('lost'));
    proxy.dropReply('FLOCK.RELEASE');
    assert.equal(await r.release(), 1, 'the resend answers the first reply');
    assert.deepEqual(await holders(K('lost')), [
      [r.owner, '1'],
      [other.owner, '1'],
    ]);
    const sent = proxy.sent('FLOCK.RELEASE');
    assert.equal(sent.length, 2, 'sent twice');
    assert.equal(requestId(sent[0]), requestId(sent[1]), 'with the same request ID');
    assert.equal(await r.release(), 0);
    await other.release();
  });

  it('bad mode arguments are refused before anything reaches the server', async () => {
    const before = await server.stat('cmdstat_flock.acquire');
    await assert.rejects(flock.acquire(K('bad'), { shared: true, permits: 1, limit: 2 }), TypeError);
    await assert.rejects(flock.acquire(K('bad'), { permits: 1 }), TypeError);
    for (const sem of [{ permits: 3, limit: 2 }, { limit: 0 }, { limit: 2 ** 32 }, { permits: 1.5, limit: 2 }]) {
      await assert.rejects(flock.acquire(K('bad'), sem), RangeError);
    }
    assert.equal(await server.stat('cmdstat_flock.acquire'), before);
  });
});
