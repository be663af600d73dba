'use strict';

// Stale holds (docs/client-protocol.md, the rule "stale holds"; issue 21): a release that a
// failover lost (it went to the deposed master) or that the server refused (NOREPLICAS) leaves the
// hold on the server, and the owner's next acquire reenters it (same token); so does an acquire
// the server granted whose every reply was lost. The client gives the stale holds back then, so
// that the caller holds exactly one hold and one release frees the lock.
// Real servers: a master with `min-replicas-to-write 1` and no replica refuses the RELEASE; a
// replica promoted (REPLICAOF NO ONE) behind a proxy that then points to it keeps a grant whose
// release went to the old master.

const assert = require('node:assert/strict');
const { before, describe, it } = require('node:test');
const { CommandTimeoutError } = require('..');
const { eachClient, flockOf, startProxy, startReplicated, startServer, waitUntil } = require('./helpers');

const LEASE = { lease: 20000 };
const WAIT = { wait: 10000 };
// The session timeout of a Flock whose replies are held back: its commands time out after T/4.
const T = 2000;

let server;
before(async () => {
  server = await startServer();
});

/** Runs `fn` while `server` refuses writes (min-replicas-to-write 1, no replica: NOREPLICAS). */
async function refusingWrites(fn) {
  await server.probe.call('CONFIG', 'SET', 'min-replicas-to-write', '1');
  try {
    return await fn();
  } finally {
    await server.probe.call('CONFIG', 'SET', 'min-replicas-to-write', '0');
  }
}

/** Asserts that `lock` holds `key` alone with one hold, and that its one release lets `waiter` (a pending acquire) in. */
async function oneHoldThenFree(target, key, lock, waiter) {
  const info = await target.info(key);
  assert.equal(info.owner, lock.owner);
  assert.equal(info.holds, '1', 'the caller holds exactly one hold');
  await target.queued(key, 1);
  assert.equal(await lock.release(), 0, 'one release frees the lock');
  const next = await waiter;
  assert.equal((await target.info(key)).owner, next.owner, 'the waiter got the lock');
  await next.release();
}

for (const sessions of [true, false]) {
  describe(`stale holds (sessions: ${sessions})`, () => {
    eachClient((kind, K) => {
      let flock;
      let other;
      before(async () => {
        flock = await flockOf(kind, server.port, { sessions });
        other = await flockOf(kind, server.port, { sessions });
      });

      it('stale: a release refused with NOREPLICAS leaves the hold; the owner\'s next acquire gives it back and holds one', async () => {
        const key = K(`refused:${sessions}`);
        const lock = await flock.acquire(key, LEASE);
        await refusingWrites(() => assert.rejects(lock.release(), /NOREPLICAS/));
        assert.equal((await server.info(key)).holds, '1', 'the server kept the hold');
        const again = await flock.acquire(key, { ...LEASE, owner: lock.owner });
        assert.equal(again.token, lock.token, 'a reentry of the stale grant');
        await oneHoldThenFree(server, key, again, other.acquire(key, { ...LEASE, ...WAIT }));
      });

      it('stale: a refused release among the owner\'s live holds: only the refused one is given back', async () => {
        const key = K(`refused-live:${sessions}`);
        const first = await flock.acquire(key, LEASE);
        const second = await flock.acquire(key, { ...LEASE, owner: first.owner });
        await refusingWrites(() => assert.rejects(second.release(), /NOREPLICAS/));
        const third = await flock.acquire(key, { ...LEASE, owner: first.owner });
        assert.equal(third.token, first.token);
        assert.equal((await server.info(key)).holds, '2', 'first and third');
        assert.equal(await third.release(), 1);
        await oneHoldThenFree(server, key, first, other.acquire(key, { ...LEASE, ...WAIT }));
      });

      it('stale: a give-back refused again (NOPERM) is tried again at the next grant; the acquire stands', async () => {
        const key = K(`refused-twice:${sessions}`);
        const lock = await flock.acquire(key, LEASE);
        await server.probe.call('ACL', 'SETUSER', 'default', '-flock.release');
        let again;
        try {
          await assert.rejects(lock.release(), /NOPERM/);
          again = await flock.acquire(key, { ...LEASE, owner: lock.owner });
          assert.equal(again.token, lock.token);
          assert.equal((await server.info(key)).holds, '2', 'the give-back was refused');
        } finally {
          await server.probe.call('ACL', 'SETUSER', 'default', '+flock.release');
        }
        const third = await flock.acquire(key, { ...LEASE, owner: lock.owner });
        assert.equal((await server.info(key)).holds, '2', 'again and third');
        assert.equal(await again.release(), 1);
        await oneHoldThenFree(server, key, third, other.acquire(key, { ...LEASE, ...WAIT }));
      });

      it('stale: read and semaphore holds: a refused release is given back at the owner\'s next grant, the other holders untouched', async () => {
        for (const [name, opts] of [['shared', { shared: true }], ['semaphore', { permits: 2, limit: 3 }]]) {
          const key = K(`refused-${name}:${sessions}`);
          const mode = name === 'shared' ? { shared: true } : { permits: 1, limit: 3 };
          const bystander = await other.acquire(key, { ...LEASE, ...mode });
          const lock = await flock.acquire(key, { ...LEASE, ...opts });
          await refusingWrites(() => assert.rejects(lock.release(), /NOREPLICAS/));
          const again = await flock.acquire(key, { ...LEASE, ...opts, owner: lock.owner });
          assert.equal(again.token, lock.token);
          const holders = (await server.info(key)).holders;
          assert.deepEqual(holders.map((h) => [h.owner, h.holds]), [[bystander.owner, '1'], [lock.owner, '1']]);
          assert.equal(await again.release(), 0);
          assert.equal(await bystander.release(), 0);
          assert.equal(await server.info(key), null);
        }
      });

      it('stale: an acquire granted whose every reply was lost: the owner\'s next grant gives that hold back and holds one', async () => {
        const key = K(`unanswered:${sessions}`);
        const owner = `stale-unanswered:${kind.name}:${sessions}`;
        const proxy = await startProxy(server.port);
        const cut = await flockOf(kind, proxy.port, { sessions, sessionTimeoutMs: T });
        // Opened first, so that only the ACQUIRE's replies (its resends' too, on one connection) are held.
        await (await cut.acquire(K(`unanswered-warm:${sessions}`))).release();
        proxy.holdReplies('FLOCK.ACQUIRE');
        // A try: a wait through the session would retry until its deadline and end busy.
        await assert.rejects(cut.acquire(key, { ...LEASE, owner, wait: 0 }), CommandTimeoutError);
        assert.equal((await server.info(key))?.owner, owner, 'the server granted it all the same');
        proxy.flush();
        const again = await cut.acquire(key, { ...LEASE, owner });
        await oneHoldThenFree(server, key, again, other.acquire(key, { ...LEASE, ...WAIT }));
      });

      it('stale: a hold the process never knew of is given back by the release of its last lock of that owner, which answers 0', async () => {
        const key = K(`unknown:${sessions}`);
        const lock = await flock.acquire(key, { ...LEASE, owner: `stale-unknown:${kind.name}:${sessions}` });
        // A hold of the owner that no lock of the process has (as a failover's churn can leave).
        assert.equal(String(await server.probe.call('FLOCK.ACQUIRE', key, lock.owner, '10000')), String(lock.token));
        assert.equal((await server.info(key)).holds, '2');
        assert.equal(await lock.release(), 0, 'the release answers 0');
        assert.equal(await server.info(key), null, 'the unknown hold was given back');
        // Several keys (RELEASEALL), with an owner of the acquire's own: the same.
        const keys = [K(`unknown-a:${sessions}`), K(`unknown-b:${sessions}`)];
        const both = await flock.acquire(keys, LEASE);
        await server.probe.call('FLOCK.ACQUIRE', keys[1], both.owner, '10000');
        await server.probe.call('FLOCK.ACQUIRE', keys[1], both.owner, '10000');
        assert.equal(await both.release(), 0);
        assert.deepEqual(await Promise.all(keys.map((k) => server.info(k))), [null, null]);
      });

      it('stale: a release while an acquire of the same owner is in flight leaves that acquire\'s hold alone', async () => {
        const key = K(`in-flight:${sessions}`);
        const owner = `stale-in-flight:${kind.name}:${sessions}`;
        const proxy = await startProxy(server.port);
        const held = await flockOf(kind, proxy.port, { sessions });
        // Opened first, so that only the ACQUIRE's replies are held.
        await (await held.acquire(K(`in-flight-warm:${sessions}`))).release();
        const first = await flock.acquire(key, { ...LEASE, owner });
        proxy.holdReplies('FLOCK.ACQUIRE');
        const pending = held.acquire(key, { ...LEASE, owner });
        await waitUntil('the second acquire reentered', async () => (await server.info(key))?.holds === '2');
        assert.equal(await first.release(), 1, 'the in-flight acquire\'s hold is left');
        proxy.flush();
        const second = await pending;
        const info = await server.info(key);
        assert.equal(info?.owner, owner, 'the second lock\'s hold is still on the server');
        assert.equal(info.holds, '1');
        assert.equal(await second.release(), 0);
        assert.equal(await server.info(key), null);
      });

      it('stale: an ordinary reentry and a new grant after a release are left alone', async () => {
        const key = K(`plain:${sessions}`);
        const first = await flock.acquire(key, LEASE);
        const second = await flock.acquire(key, { ...LEASE, owner: first.owner });
        assert.equal((await server.info(key)).holds, '2');
        assert.equal(await second.release(), 1);
        assert.equal(await first.release(), 0);
        const fresh = await flock.acquire(key, { ...LEASE, owner: first.owner });
        assert.notEqual(fresh.token, first.token);
        assert.equal((await server.info(key)).holds, '1');
        assert.equal(await fresh.release(), 0);
      });
    });
  });
}

describe('stale holds after a failover', () => {
  eachClient((kind, K) => {
    for (const sessions of [true, false]) {
      it(`stale: a release lost with the deposed master: the promoted replica's grant is reentered and given back to one hold (sessions: ${sessions})`, async () => {
        const [master, replica] = await startReplicated(1);
        const proxy = await startProxy(master.port);
        const flock = await flockOf(kind, proxy.port, { sessions });
        const key = K(`failover:${sessions}`);
        const lock = await flock.acquire(key, LEASE);
        await waitUntil('the replica has the grant', async () => (await replica.info(key))?.owner === lock.owner);
        // The replica is promoted; the client still talks to the old master, which takes the release.
        await replica.probe.call('REPLICAOF', 'NO', 'ONE');
        assert.equal(await lock.release(), 0);
        assert.equal(await master.info(key), null);
        proxy.retarget(replica.port);
        assert.equal((await replica.info(key)).holds, '1', 'the promoted replica still has the grant');
        const again = await flock.acquire(key, { ...LEASE, owner: lock.owner });
        assert.equal(again.token, lock.token, 'a reentry of the grant whose release was lost');
        const other = await flockOf(kind, replica.port, { sessions });
        await oneHoldThenFree(replica, key, again, other.acquire(key, { ...LEASE, ...WAIT }));
      });
    }
  });
});
