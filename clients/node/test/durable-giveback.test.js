'use strict';

// Durable grants that are given back (docs/client-protocol.md, "Durable grants"), for each client
// library, against a master with one replica started here: a reentry gives back its one hold, a
// refused give-back is retried at the owner's next grant, read, semaphore and multi-key grants.

const assert = require('node:assert/strict');
const { it } = require('node:test');
const { LockNotDurableError } = require('..');
const { eachDurableClient, rejectsNotDurable, replicatedServers } = require('./durable');
const { flockOf, startProxy } = require('./helpers');

const servers = replicatedServers();

eachDurableClient(servers, (kind, K, flocks) => {

  it('durable: a reentry that is not durable gives back its one hold, and the first hold stays', async () => {
    const key = K('reentry');
    const first = await flocks.plain.acquire(key, { lease: 10000 });
    await rejectsNotDurable(flocks.two.acquire(key, { lease: 10000, owner: first.owner }), key);
    const info = await servers.master.info(key);
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
    await servers.master.probe.call('ACL', 'SETUSER', 'default', '-flock.release');
    try {
      await rejectsNotDurable(flocks.two.acquire(key, { lease: 10000, owner }), key);
    } finally {
      await servers.master.probe.call('ACL', 'SETUSER', 'default', '+flock.release');
    }
    assert.equal((await servers.master.info(key)).holds, '1', 'the give-back was refused');
    const lock = await flocks.one.acquire(key, { lease: 10000, owner });
    const info = await servers.master.info(key);
    assert.equal(info.owner, owner);
    assert.equal(info.holds, '1', 'the stale hold was given back');
    assert.equal((await servers.replica.info(key)).holds, '1', 'and the replica has that (the durable check came after)');
    assert.equal(await lock.release(), 0);
  });

  it('durable: a grant whose RENEW finds another grant of its owner (an older one a failover kept) is not durable, and the hold is given back', async () => {
    // A promoted replica that never got the grant, but still has an older grant of the same owner
    // (its release was lost with the old master), answers the durable check's RENEW with that
    // grant's token: this grant is gone. Here the grant is replaced while its event waits behind a
    // partition; the replica has every write, so WAIT alone would confirm it.
    const key = K('replaced');
    const owner = `replaced-${kind.name}`;
    const proxy = await startProxy(servers.master.port);
    const durable = await flockOf(kind, proxy.port, { durableReplicas: 1, durableTimeout: 2000 });
    const holder = await flocks.plain.acquire(key, { lease: 10000 });
    const waiting = durable.acquire(key, { lease: 10000, owner, wait: 10000 });
    await servers.master.queued(key, 1);
    proxy.partition();
    await holder.release();
    const granted = await servers.master.info(key);
    assert.equal(granted.owner, owner);
    await servers.master.probe.call('FLOCK.FORCERELEASE', key);
    const older = String(await servers.master.probe.call('FLOCK.ACQUIRE', key, owner, '10000'));
    proxy.heal();
    await assert.rejects(waiting, (err) => {
      assert.ok(err instanceof LockNotDurableError, `LockNotDurableError, got ${err.stack}`);
      assert.equal(err.key, key);
      assert.ok(err.message.includes(`grant (token ${granted.token}) was gone`), err.message);
      assert.ok(err.message.includes(`another grant of this owner (token ${older})`), err.message);
      return true;
    });
    assert.equal(await servers.master.info(key), null, 'the hold was given back');
  });

  it('durable: read and semaphore grants are confirmed, or given back when not durable', async () => {
    const rw = K('rw');
    const reader = await flocks.plain.acquire(rw, { shared: true, lease: 10000 });
    await rejectsNotDurable(flocks.two.acquire(rw, { shared: true, lease: 10000 }), rw);
    assert.deepEqual((await servers.master.info(rw)).holders.map((h) => h.owner), [reader.owner]);
    const durableReader = await flocks.one.acquire(rw, { shared: true, lease: 10000 });
    assert.equal((await servers.replica.info(rw)).holders.length, 2);
    await durableReader.release();
    await reader.release();
    const writer = await flocks.one.acquire(rw, { lease: 10000 });
    assert.equal((await servers.replica.info(rw)).owner, writer.owner);
    await writer.release();

    const pool = K('pool');
    await rejectsNotDurable(flocks.two.acquire(pool, { permits: 2, limit: 3, lease: 10000 }), pool);
    assert.equal(await servers.master.info(pool), null, 'no permit kept');
    const permits = await flocks.one.acquire(pool, { permits: 2, limit: 3, lease: 10000 });
    assert.equal((await servers.replica.info(pool)).holders[0].permits, '2');
    await permits.release();
  });

  it('durable: several keys: one not durable gives back every key taken', async () => {
    const keys = [K('multi:a'), K('multi:b')];
    await rejectsNotDurable(flocks.two.acquire(keys, { lease: 10000 }), keys[0]);
    for (const key of keys) assert.equal(await servers.master.info(key), null);
    const lock = await flocks.one.acquire(keys, { lease: 10000 });
    for (const key of keys) assert.equal((await servers.replica.info(key)).owner, lock.owner);
    await lock.release();
  });
});
