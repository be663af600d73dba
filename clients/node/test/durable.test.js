'use strict';

// Durable grants (docs/client-protocol.md, "Durable grants"), for each client library, against a
// master with one replica started here: `durableReplicas: 1` is confirmed; 2 (more than there
// are) fails with LockNotDurableError after about `durableTimeout`, and the hold is given back.
// Give-backs of reentries, refused give-backs, read, semaphore and multi-key grants are in
// durable-giveback.test.js.

const assert = require('node:assert/strict');
const { describe, it } = require('node:test');
const { Flock } = require('..');
const { eachClient, flockOf } = require('./helpers');
const { TIMEOUT, eachDurableClient, rejectsNotDurable, replicatedServers } = require('./durable');

const WAIT = { wait: 10000 };

const servers = replicatedServers();

eachDurableClient(servers, (kind, K, flocks) => {

  it('durable: a try with durableReplicas 1 is granted, and the replica has the grant when acquire returns', async () => {
    const key = K('try1');
    const lock = await flocks.one.acquire(key, { lease: 10000 });
    const copy = await servers.replica.info(key);
    assert.equal(copy?.owner, lock.owner);
    assert.equal(copy.token, String(lock.token));
    await lock.release();
  });

  it('durable: a wait granted through the session with durableReplicas 1 is granted, and the replica has it', async () => {
    const key = K('wait1');
    const holder = await flocks.plain.acquire(key, { lease: 10000 });
    const next = flocks.one.acquire(key, { lease: 10000, ...WAIT });
    await servers.master.queued(key, 1);
    await holder.release();
    const lock = await next;
    assert.equal((await servers.replica.info(key))?.owner, lock.owner);
    await lock.release();
  });

  it('durable: with durableReplicas 2 and 1 replica a try rejects with LockNotDurableError after about the timeout, the hold given back', async () => {
    const key = K('try2');
    await rejectsNotDurable(flocks.two.acquire(key, { lease: 10000 }), key);
    assert.equal(await servers.master.info(key), null, 'the lock is free again');
  });

  it('durable: the per-acquire durableReplicas overrides the Flock setting', async () => {
    const key = K('override');
    await rejectsNotDurable(flocks.plain.acquire(key, { lease: 10000, durableReplicas: 2, durableTimeout: TIMEOUT }), key);
    assert.equal(await servers.master.info(key), null);
    const lock = await flocks.two.acquire(key, { lease: 10000, durableReplicas: 0 });
    assert.equal((await servers.master.info(key)).owner, lock.owner);
    await lock.release();
  });

  it('durable: a grant that reached a waiter through the session and is not durable is given back, and the next waiter gets the lock', async () => {
    const key = K('session2');
    const holder = await flocks.plain.acquire(key, { lease: 10000 });
    const durable = flocks.two.acquire(key, { lease: 10000, ...WAIT });
    await servers.master.queued(key, 1);
    const after = flocks.plain.acquire(key, { lease: 10000, ...WAIT });
    await servers.master.queued(key, 2);
    const released = Date.now();
    await holder.release();
    await rejectsNotDurable(durable, key, released);
    const next = await after;
    assert.equal((await servers.master.info(key)).owner, next.owner, 'the next waiter holds it');
    await next.release();
  });
});

describe('durable: the blocking form (sessions: false)', () => {
  eachClient((kind, K) => {
    it('durable: a blocking wait is confirmed with durableReplicas 1 and given back with 2', async () => {
      const plain = await flockOf(kind, servers.master.port, { sessions: false });
      const key = K('blocking');
      let holder = await plain.acquire(key, { lease: 10000 });
      const one = plain.acquire(key, { lease: 10000, durableReplicas: 1, ...WAIT });
      await servers.master.queued(key, 1);
      await holder.release();
      const lock = await one;
      assert.equal((await servers.replica.info(key)).owner, lock.owner);
      await lock.release();

      holder = await plain.acquire(key, { lease: 10000 });
      const two = plain.acquire(key, { lease: 10000, durableReplicas: 2, durableTimeout: TIMEOUT, ...WAIT });
      await servers.master.queued(key, 1);
      const released = Date.now();
      await holder.release();
      await rejectsNotDurable(two, key, released);
      assert.equal(await servers.master.info(key), null);
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
