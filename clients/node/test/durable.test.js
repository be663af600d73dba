'use strict';

// Durable grants (docs/client-protocol.md, "Durable grants"), for each client library, against a
// master with one replica started here: `durableReplicas: 1` is confirmed; 2 (more than there
// are) fails with LockNotDurableError after about `durableTimeout`, and the hold is given back.

const assert = require('node:assert/strict');
const { before, describe, it } = require('node:test');
const { Flock, LockNotDurableError } = require('..');
const { eachClient, flockOf, startReplicated } = require('./helpers');

// Short, so that the failing cases cost little; long enough for a loaded machine's replica to ack.
const TIMEOUT = 200;
const WAIT = { wait: 10000 };

let master;
let replica;
before(async () => {
  [master, replica] = await startReplicated(1);
});

/** Asserts `promise` rejects with NOTDURABLE for `key` (1 of 2 replicas) after about TIMEOUT ms. */
async function rejectsNotDurable(promise, key, since = Date.now()) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof LockNotDurableError, `LockNotDurableError, got ${err.stack}`);
    assert.equal(err.code, 'NOTDURABLE');
    assert.equal(err.key, key);
    assert.equal(err.reached, 1);
    assert.equal(err.replicas, 2);
    assert.match(err.message, /1 of 2 replica/);
    return true;
  });
  const took = Date.now() - since;
  assert.ok(took >= TIMEOUT - 20 && took < TIMEOUT + 2000, `failed after ${took} ms (durableTimeout ${TIMEOUT})`);
}

eachClient((kind, K) => {
  let plain;
  let one;
  let two;
  before(async () => {
    plain = await flockOf(kind, master.port);
    one = await flockOf(kind, master.port, { durableReplicas: 1, durableTimeout: 2000 });
    two = await flockOf(kind, master.port, { durableReplicas: 2, durableTimeout: TIMEOUT });
  });

  it('durable: a try with durableReplicas 1 is granted, and the replica has the grant when acquire returns', async () => {
    const key = K('try1');
    const lock = await one.acquire(key, { lease: 10000 });
    const copy = await replica.info(key);
    assert.equal(copy?.owner, lock.owner);
    assert.equal(copy.token, String(lock.token));
    await lock.release();
  });

  it('durable: a wait granted through the session with durableReplicas 1 is granted, and the replica has it', async () => {
    const key = K('wait1');
    const holder = await plain.acquire(key, { lease: 10000 });
    const next = one.acquire(key, { lease: 10000, ...WAIT });
    await master.queued(key, 1);
    await holder.release();
    const lock = await next;
    assert.equal((await replica.info(key))?.owner, lock.owner);
    await lock.release();
  });

  it('durable: with durableReplicas 2 and 1 replica a try rejects with LockNotDurableError after about the timeout, the hold given back', async () => {
    const key = K('try2');
    await rejectsNotDurable(two.acquire(key, { lease: 10000 }), key);
    assert.equal(await master.info(key), null, 'the lock is free again');
  });

  it('durable: the per-acquire durableReplicas overrides the Flock setting', async () => {
    const key = K('override');
    await rejectsNotDurable(plain.acquire(key, { lease: 10000, durableReplicas: 2, durableTimeout: TIMEOUT }), key);
    assert.equal(await master.info(key), null);
    const lock = await two.acquire(key, { lease: 10000, durableReplicas: 0 });
    assert.equal((await master.info(key)).owner, lock.owner);
    await lock.release();
  });

  it('durable: a grant that reached a waiter through the session and is not durable is given back, and the next waiter gets the lock', async () => {
    const key = K('session2');
    const holder = await plain.acquire(key, { lease: 10000 });
    const durable = two.acquire(key, { lease: 10000, ...WAIT });
    await master.queued(key, 1);
    const after = plain.acquire(key, { lease: 10000, ...WAIT });
    await master.queued(key, 2);
    const released = Date.now();
    await holder.release();
    await rejectsNotDurable(durable, key, released);
    const next = await after;
    assert.equal((await master.info(key)).owner, next.owner, 'the next waiter holds it');
    await next.release();
  });

  it('durable: a reentry that is not durable gives back its one hold, and the first hold stays', async () => {
    const key = K('reentry');
    const first = await plain.acquire(key, { lease: 10000 });
    await rejectsNotDurable(two.acquire(key, { lease: 10000, owner: first.owner }), key);
    const info = await master.info(key);
    assert.equal(info.owner, first.owner);
    assert.equal(info.holds, '1');
    assert.equal(first.signal.aborted, false);
    assert.equal(await first.release(), 0);
  });

  it('durable: a give-back the server refuses (NOPERM) leaves the hold; the owner\'s next grant gives it back and holds one', async () => {
    // The failover test's case (issue 21): a NOTDURABLE give-back refused (there NOREPLICAS) left a
    // hold that the same owner's reentries renewed for good.
    const key = K('giveback-refused');
    const owner = `giveback-refused-${kind.name}`;
    await master.probe.call('ACL', 'SETUSER', 'default', '-flock.release');
    try {
      await rejectsNotDurable(two.acquire(key, { lease: 10000, owner }), key);
    } finally {
      await master.probe.call('ACL', 'SETUSER', 'default', '+flock.release');
    }
    assert.equal((await master.info(key)).holds, '1', 'the give-back was refused');
    const lock = await one.acquire(key, { lease: 10000, owner });
    const info = await master.info(key);
    assert.equal(info.owner, owner);
    assert.equal(info.holds, '1', 'the stale hold was given back');
    assert.equal((await replica.info(key)).holds, '1', 'and the replica has that (the durable check came after)');
    assert.equal(await lock.release(), 0);
  });

  it('durable: read and semaphore grants are confirmed, or given back when not durable', async () => {
    const rw = K('rw');
    const reader = await plain.acquire(rw, { shared: true, lease: 10000 });
    await rejectsNotDurable(two.acquire(rw, { shared: true, lease: 10000 }), rw);
    assert.deepEqual((await master.info(rw)).holders.map((h) => h.owner), [reader.owner]);
    const durableReader = await one.acquire(rw, { shared: true, lease: 10000 });
    assert.equal((await replica.info(rw)).holders.length, 2);
    await durableReader.release();
    await reader.release();
    const writer = await one.acquire(rw, { lease: 10000 });
    assert.equal((await replica.info(rw)).owner, writer.owner);
    await writer.release();

    const pool = K('pool');
    await rejectsNotDurable(two.acquire(pool, { permits: 2, limit: 3, lease: 10000 }), pool);
    assert.equal(await master.info(pool), null, 'no permit kept');
    const permits = await one.acquire(pool, { permits: 2, limit: 3, lease: 10000 });
    assert.equal((await replica.info(pool)).holders[0].permits, '2');
    await permits.release();
  });

  it('durable: several keys: one not durable gives back every key taken', async () => {
    const keys = [K('multi:a'), K('multi:b')];
    await rejectsNotDurable(two.acquire(keys, { lease: 10000 }), keys[0]);
    for (const key of keys) assert.equal(await master.info(key), null);
    const lock = await one.acquire(keys, { lease: 10000 });
    for (const key of keys) assert.equal((await replica.info(key)).owner, lock.owner);
    await lock.release();
  });
});

describe('durable: the blocking form (sessions: false)', () => {
  eachClient((kind, K) => {
    it('durable: a blocking wait is confirmed with durableReplicas 1 and given back with 2', async () => {
      const plain = await flockOf(kind, master.port, { sessions: false });
      const key = K('blocking');
      let holder = await plain.acquire(key, { lease: 10000 });
      const one = plain.acquire(key, { lease: 10000, durableReplicas: 1, ...WAIT });
      await master.queued(key, 1);
      await holder.release();
      const lock = await one;
      assert.equal((await replica.info(key)).owner, lock.owner);
      await lock.release();

      holder = await plain.acquire(key, { lease: 10000 });
      const two = plain.acquire(key, { lease: 10000, durableReplicas: 2, durableTimeout: TIMEOUT, ...WAIT });
      await master.queued(key, 1);
      const released = Date.now();
      await holder.release();
      await rejectsNotDurable(two, key, released);
      assert.equal(await master.info(key), null);
    });
  });
});

it('durable: bad durable settings are refused', () => {
  const client = { call() {}, duplicate() {}, options: { stringNumbers: true } };
  assert.throws(() => new Flock(client, { durableReplicas: -1 }), RangeError);
  assert.throws(() => new Flock(client, { durableReplicas: 1.5 }), RangeError);
  assert.throws(() => new Flock(client, { durableTimeout: 0 }), RangeError);
  assert.equal(new Flock(client).settings.durableReplicas, 0);
  assert.equal(new Flock(client).settings.durableTimeout, 1000);
});
