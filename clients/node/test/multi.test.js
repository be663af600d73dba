'use strict';

// Several locks at once (docs/commands.md, FLOCK.ACQUIREALL and FLOCK.RELEASEALL), for each client
// library: acquire(keys) is one ACQUIREALL, all or none; a wait queues at every key at once and
// blocks a connection of FLOCK's own; release() is one RELEASEALL. In a Cluster (keys of one slot,
// CROSSSLOT otherwise) it is in topologies.test.js.

const assert = require('node:assert/strict');
const { it, before } = require('node:test');
const { Flock, AbortError, LockBusyError, LockDeadlockError, LockLostError, LockNotHeldError } = require('..');
const { eachClient, flockOf, onEnd, requestId, startProxy, startServer, waitUntil } = require('./helpers');

const LEASE = 10000;
const WAIT = { lease: LEASE, wait: 10000 };

let server;
before(async () => {
  server = await startServer();
});

const ping = (client) => (client.call ? client.call('PING') : client.sendCommand(['PING']));

eachClient((kind, K) => {
  let client;
  let flock;
  before(async () => {
    client = await kind.connect(server.port);
    flock = new Flock(client);
    onEnd(() => flock.quit());
  });

  it('takes every key in one FLOCK.ACQUIREALL, for one owner, each with its own token and one hold', async () => {
    const keys = [K('one:a'), K('one:b'), K('one:c')];
    const calls = await server.stat('cmdstat_flock.acquireall');
    const lock = await flock.acquire(keys, LEASE);
    assert.equal(await server.stat('cmdstat_flock.acquireall'), calls + 1);
    assert.deepEqual(lock.resources, keys);
    assert.equal(lock.token, lock.tokens.get(keys[0]));
    for (const key of keys) {
      const info = await server.info(key);
      assert.equal(info.owner, lock.owner);
      assert.equal(info.token, String(lock.tokens.get(key)));
      assert.equal(info.holds, '1', 'watching the grant through the session left one hold');
    }
    assert.equal(await lock.release(), 0);
  });

  it('a try (retryCount 0) takes none of the keys when one is busy, and queues nothing', async () => {
    const [a, b, c] = [K('try:a'), K('try:b'), K('try:c')];
    const holder = await flock.acquire(b, LEASE);
    await assert.rejects(flock.acquire([a, b, c], LEASE, { retryCount: 0 }), (err) => {
      assert.ok(err instanceof LockBusyError, String(err));
      assert.equal(err.key, a);
      assert.match(err.message, /none was taken/);
      return true;
    });
    assert.equal(await server.info(a), null);
    assert.equal(await server.info(c), null);
    assert.equal((await server.info(b)).waiters, '0');
    await holder.release();
  });

  it("a wait queues at every key at once and is granted when the last one frees, without blocking the caller's connection", async () => {
    const [a, b] = [K('last:a'), K('last:b')];
    const first = await flock.acquire(a, LEASE);
    const second = await flock.acquire(b, LEASE);
    let granted = false;
    const waiting = flock.acquire([a, b], WAIT).then((lock) => {
      granted = true;
      return lock;
    });
    await server.queued(a, 1);
    await server.queued(b, 1);
    assert.equal(await ping(client), 'PONG', "the caller's connection is not the blocked one");
    await first.release();
    const kept = await server.info(a);
    assert.equal(kept.owner, null, 'a is free, kept for the waiter');
    assert.equal(kept.waiters, '1', 'which still waits for b');
    assert.equal(granted, false);
    await second.release();
    const lock = await waiting;
    for (const key of [a, b]) assert.equal((await server.info(key)).owner, lock.owner);
    await lock.release();
  });

  it('FIFO: a single-key waiter that comes later waits behind it, also on a key nobody holds; a try does not cut in', async () => {
    const [a, b] = [K('fifo:a'), K('fifo:b')];
    const holder = await flock.acquire(a, LEASE);
    const order = [];
    const multi = flock.acquire([a, b], WAIT).then((lock) => (order.push('multi'), lock));
    await server.queued(b, 1);
    const single = flock.acquire(b, WAIT).then((lock) => (order.push('single'), lock));
    await server.queued(b, 2);
    assert.equal((await server.info(b)).owner, null, 'b is free, kept for the multi-key waiter');
    await assert.rejects(flock.acquire(b, { lease: LEASE, wait: 0 }), LockBusyError);
    await holder.release();
    const multiLock = await multi;
    assert.equal((await server.info(b)).owner, multiLock.owner);
    assert.deepEqual(order, ['multi']);
    await multiLock.release();
    const singleLock = await single;
    assert.deepEqual(order, ['multi', 'single']);
    await singleLock.release();
  });

  it('release gives back one hold of every key in one FLOCK.RELEASEALL; a key the owner held is reentered', async () => {
    const [a, b] = [K('rel:a'), K('rel:b')];
    const first = await flock.acquire(a, LEASE);
    const lock = await flock.acquire([a, b], { lease: LEASE, owner: first.owner });
    assert.equal(lock.tokens.get(a), first.token, 'a reentry keeps the token');
    assert.equal((await server.info(a)).holds, '2');
    const calls = await server.stat('cmdstat_flock.releaseall');
    assert.equal(await lock.release(), 1, 'the holds left of the first key');
    assert.equal(await server.stat('cmdstat_flock.releaseall'), calls + 1);
    assert.equal(await server.info(b), null);
    assert.equal((await server.info(a)).holds, '1');
    assert.equal(await first.release(), 0);
    await assert.rejects(lock.release(), (err) => err instanceof LockNotHeldError && err.key === a);
  });

  it('extend renews every key', async () => {
    const keys = [K('ext:a'), K('ext:b')];
    const lock = await flock.acquire(keys, 1000);
    assert.equal(await lock.extend(60000), lock);
    for (const key of keys) assert.ok(Number((await server.info(key))['ttl-ms']) > 1000, `${key} renewed`);
    await lock.release();
  });

  it("the loss of one key is pushed to lock.signal; release then frees the others and names the lost one", async () => {
    const [a, b] = [K('lost:a'), K('lost:b')];
    // A fixed lease, no watchdog: only the session's push can report the loss.
    const lock = await flock.acquire([a, b], LEASE);
    await server.probe.call('FLOCK.FORCERELEASE', b);
    await waitUntil('the signal aborts', () => lock.signal.aborted);
    assert.ok(lock.signal.error instanceof LockLostError);
    assert.equal(lock.signal.error.key, b);
    assert.equal(lock.signal.error.reason, 'forcereleased');
    await assert.rejects(lock.release(), (err) => err instanceof LockNotHeldError && err.key === b);
    assert.equal(await server.info(a), null, 'the key still held was released');
  });

  it('using takes several keys and releases them all', async () => {
    const keys = [K('using:a'), K('using:b')];
    const value = await flock.using(keys, async (signal) => {
      const owners = await Promise.all(keys.map(async (key) => (await server.info(key)).owner));
      assert.equal(owners[0], owners[1]);
      return signal.aborted ? 0 : 42;
    });
    assert.equal(value, 42);
    for (const key of keys) assert.equal(await server.info(key), null);
  });

  it("a wait that would close a cycle rejects with LockDeadlockError when each caller's locks have one owner", async () => {
    const [a, b, c] = [K('dl:a'), K('dl:b'), K('dl:c')];
    const [alice, bob] = [`alice-${kind.name}`, `bob-${kind.name}`];
    const alicesA = await flock.acquire(a, { lease: LEASE, owner: alice });
    const bobsB = await flock.acquire(b, { lease: LEASE, owner: bob });
    // Alice waits for b (Bob's) and c; Bob then asks for a (Alice's) and c: each would wait for the other.
    const alicesBC = flock.acquire([b, c], { ...WAIT, owner: alice });
    await server.queued(b, 1);
    await assert.rejects(flock.acquire([a, c], { ...WAIT, owner: bob }), (err) => {
      assert.ok(err instanceof LockDeadlockError, String(err));
      assert.equal(err.key, a);
      assert.match(err.message, /DEADLOCK/);
      return true;
    });
    assert.equal((await server.info(a)).waiters, '0', 'nothing was queued');
    await bobsB.release();
    const lock = await alicesBC;
    assert.equal((await server.info(b)).owner, alice);
    await lock.release();
    await alicesA.release();
  });

  it('an AbortSignal ends a multi-key wait on the server: it leaves every queue', async () => {
    const [a, b] = [K('abort:a'), K('abort:b')];
    const holder = await flock.acquire(b, LEASE);
    const controller = new AbortController();
    const waiting = flock.acquire([a, b], { lease: LEASE, wait: Infinity, signal: controller.signal });
    await server.queued(a, 1);
    controller.abort(new Error('shutting down'));
    await assert.rejects(waiting, (err) => err instanceof AbortError && err.cause.message === 'shutting down');
    assert.equal(await server.info(a), null);
    assert.equal((await server.info(b)).waiters, '0');
    await holder.release();
  });

  it('a lost reply to a multi-key wait is resent with the same request ID on a new connection, and the grant counted once', async () => {
    const proxy = await startProxy(server.port);
    const proxied = await flockOf(kind, proxy.port);
    const [a, b] = [K('resend:a'), K('resend:b')];
    const holder = await flock.acquire(b, LEASE);
    // The blocking ACQUIREALL (the try before it has no WAIT): its grant's reply is lost.
    proxy.dropReply('WAIT');
    const waiting = proxied.acquire([a, b], WAIT);
    await server.queued(b, 1);
    await holder.release();
    const lock = await waiting;
    const sent = proxy.sent('WAIT').filter((text) => text.includes('FLOCK.ACQUIREALL'));
    assert.equal(sent.length, 2, 'sent twice');
    assert.equal(requestId(sent[0]), requestId(sent[1]), 'with the same request ID');
    for (const key of [a, b]) {
      const info = await server.info(key);
      assert.equal(info.token, String(lock.tokens.get(key)), 'the resend answered the grant');
      assert.equal(info.holds, '1');
    }
    assert.equal(await lock.release(), 0);
  });

  it('sessions: false waits the same way, with no session', async () => {
    const blocking = await flockOf(kind, server.port, { sessions: false });
    const [a, b] = [K('nosession:a'), K('nosession:b')];
    const holder = await flock.acquire(a, LEASE);
    const waiting = blocking.acquire([a, b], WAIT);
    await server.queued(b, 1);
    await holder.release();
    const lock = await waiting;
    assert.equal((await server.info(b)).owner, lock.owner);
    assert.equal(blocking._session.nodes.size, 0);
    await lock.release();
  });

  it('shared: true takes the read side of every key: readers share them, a writer waits for both', async () => {
    const keys = [K('read:a'), K('read:b')];
    const read = { lease: LEASE, shared: true };
    const readers = [await flock.acquire(keys, read), await flock.acquire(keys, read)];
    for (const key of keys) assert.equal((await server.info(key)).holders.length, 2);
    const writer = flock.acquire(keys, WAIT);
    await server.queued(keys[1], 1);
    await readers[0].release();
    assert.equal((await server.info(keys[0])).waiters, '1', 'the writer still waits for the other reader');
    await readers[1].release();
    const lock = await writer;
    assert.equal(lock.mode, 'exclusive');
    for (const key of keys) assert.equal((await server.info(key)).mode, 'exclusive');
    await lock.release();
  });

  it('refuses a semaphore on several keys, and more than 256 keys, before anything is sent', async () => {
    const calls = await server.stat('cmdstat_flock.acquireall');
    await assert.rejects(flock.acquire([K('sem:a'), K('sem:b')], { permits: 1, limit: 2 }), TypeError);
    const many = Array.from({ length: 257 }, (_, i) => K(`many:${i}`));
    await assert.rejects(flock.acquire(many), RangeError);
    assert.equal(await server.stat('cmdstat_flock.acquireall'), calls);
  });
});
