'use strict';

// A session connection killed (docs/client-protocol.md, "Sessions", point 4), once per supported
// client library (ioredis, node-redis RESP2/RESP3): its waits are resent to a new session, and
// the grants it watched are checked and re-watched there.

const assert = require('node:assert/strict');
const { before, it } = require('node:test');
const { LockLostError, LockNotHeldError } = require('..');
const { aborted, eachClient, flockOf, startServer, startProxy, waitUntil, within, PUSHED_MS } = require('./helpers');

const LEASE = 10000;

let server;
before(async () => {
  server = await startServer();
});

/** The session connections of the server (CLIENT LIST entries whose last command was FLOCK.INBOX). */
async function sessionClients() {
  const list = await server.probe.client('LIST');
  return list
    .split('\n')
    .filter((l) => / cmd=flock\.inbox /.test(l))
    .map((l) => /^id=(\d+) /.exec(l)[1]);
}

eachClient((kind, K) => {
  let flock;
  before(async () => {
    flock = await flockOf(kind, server.port);
  });

  it('a killed session connection: the waits are resent to a new session and still granted in order', async () => {
    const own = await flockOf(kind, server.port);
    const holder = await flock.acquire(K('kill'), { lease: LEASE });
    const order = [];
    const waits = [];
    for (let i = 0; i < 3; i++) {
      waits.push(own.acquire(K('kill'), { lease: LEASE, wait: 30000 }).then(async (lock) => {
        order.push(i);
        await lock.release();
      }));
      await server.queued(K('kill'), i + 1);
    }
    const before = await sessionClients();
    const opened = await server.stat('flock_sessions');
    // Every Flock of the file has a session; kill the one that is not older than `own`'s waits:
    // the newest session connection is own's (flock's was opened earlier).
    const victim = before.map(Number).sort((a, b) => b - a)[0];
    await server.probe.client('KILL', 'ID', String(victim));
    await waitUntil('the waits queue again in a new session', async () => {
      const ids = await sessionClients();
      return !ids.includes(String(victim)) && (await server.info(K('kill')))?.waiters === '3';
    });
    assert.equal(await server.stat('flock_sessions'), opened, 'one session ended, one opened');
    await holder.release();
    await within(10000, 'the resent waits are granted', Promise.all(waits));
    assert.deepEqual(order, [0, 1, 2]);
  });

  // The session connection of a Flock whose client goes through `proxy` (its id for CLIENT KILL).
  async function proxiedSession(proxy) {
    const list = await server.probe.client('LIST');
    const addrs = proxy.addrs();
    const line = list.split('\n').find((l) => / cmd=flock\.inbox /.test(l) && addrs.some((a) => l.includes(` addr=${a} `)));
    return line && /^id=(\d+) /.exec(line)[1];
  }

  for (const [name, what, options] of [
    ['fixed', 'a fixed lease (no watchdog)', { lease: 60000 }],
    ['shared', 'a shared fixed lease', { lease: 60000, shared: true }],
    ['sem', 'a semaphore fixed lease', { lease: 60000, permits: 2, limit: 3 }],
  ]) {
    it(`a killed session connection: a held grant with ${what} is re-watched, its hold count unchanged, and FORCERELEASE still aborts lock.signal at once`, async () => {
      const proxy = await startProxy(server.port);
      const own = await flockOf(kind, proxy.port, { watchdogLease: 60000 });
      const key = K(`rewatch${name}`);
      const lock = await own.acquire(key, options);
      const victim = await proxiedSession(proxy);
      assert.ok(victim, 'the Flock has a session');
      const acquires = await server.stat('cmdstat_flock.acquire');
      await server.probe.client('KILL', 'ID', victim);
      await waitUntil('the grant is re-watched on a new session', () => own._session.rewatched === 1);
      assert.ok((await server.stat('cmdstat_flock.acquire')) > acquires, 'a reentrant ACQUIRE moved the watch');
      assert.ok(proxy.sent('FLOCK.RENEW').length >= 1, 'the grant was checked with a RENEW');
      const info = (await server.info(key)).holders.find((h) => h.owner === lock.owner);
      assert.equal(info.holds, '1', "the re-watch's extra hold was released");
      assert.equal(info.token, String(lock.token));
      if (options.permits) assert.equal(info.permits, '2');
      if (options.lease) assert.ok(Number(info['ttl-ms']) <= 60000, `a fixed lease is not lengthened (ttl ${info['ttl-ms']})`);
      assert.equal(lock.signal.aborted, false);
      await server.probe.call('FLOCK.FORCERELEASE', key);
      await within(PUSHED_MS, 'the loss pushed to the new session', aborted(lock.signal));
      assert.match(lock.signal.error.message, /force-released/);
    });
  }

  it('a killed session connection: its session grants are reported lost (sessionended) and never taken again; a later wait of the same owner is a new grant', async () => {
    const proxy = await startProxy(server.port);
    const own = await flockOf(kind, proxy.port);
    const key = K('sessionended');
    const lock = await own.acquire(key);
    const victim = await proxiedSession(proxy);
    const acquires = await server.stat('cmdstat_flock.acquire');
    await server.probe.client('KILL', 'ID', victim);
    await within(PUSHED_MS, 'the loss', aborted(lock.signal));
    assert.equal(lock.signal.error.reason, 'sessionended');
    await waitUntil('the server ended the grant with its session', async () => (await server.info(key)) === null);
    assert.equal(await server.stat('cmdstat_flock.acquire'), acquires, 'nothing took it again');
    await assert.rejects(lock.release(), LockNotHeldError);
    const again = await own.acquire(key, { owner: lock.owner });
    assert.notEqual(again.token, lock.token, 'a new grant');
    await again.release();
  });

  it('a session grant whose reply comes after its session ended is not handed over: the wait is sent again and granted anew', async () => {
    const proxy = await startProxy(server.port);
    const own = await flockOf(kind, proxy.port);
    const key = K('late-reply');
    // The session is open before the acquire, so that only the ACQUIRE's replies are held back.
    await (await own.acquire(K('late-reply:warm'))).release();
    const victim = await proxiedSession(proxy);
    proxy.holdReplies('FLOCK.ACQUIRE');
    const acquiring = own.acquire(key, { wait: 30000 });
    await waitUntil('the server granted it', async () => (await server.info(key)) !== null);
    const first = (await server.info(key)).token;
    await server.probe.client('KILL', 'ID', victim);
    await waitUntil('the grant ended with its session', async () => (await server.info(key))?.token !== first);
    proxy.flush();
    const lock = await within(10000, 'the wait sent again is granted', acquiring);
    assert.equal(lock.lost, false);
    assert.notEqual(String(lock.token), first, 'not the grant that ended with the session');
    assert.equal((await server.info(key)).owner, lock.owner);
    assert.equal(await lock.release(), 0);
  });

  it('a grant force-released while the session is down is reported lost after the reconnect (RENEW: NOTOWNER)', async () => {
    const proxy = await startProxy(server.port);
    const own = await flockOf(kind, proxy.port);
    const lock = await own.acquire(K('rewatchgone'), { lease: 60000 });
    const victim = await proxiedSession(proxy);
    // The new session's FLOCK.SESSION reply is held back: the session stays down meanwhile.
    proxy.holdReplies('FLOCK.SESSION');
    await server.probe.client('KILL', 'ID', victim);
    await waitUntil('a new session is asked for', () => proxy.heldCount() > 0);
    await server.probe.call('FLOCK.FORCERELEASE', K('rewatchgone'));
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.equal(lock.signal.aborted, false, 'nobody watched the grant while the session was down');
    proxy.flush();
    await within(PUSHED_MS, 'the loss found by the RENEW', aborted(lock.signal));
    assert.ok(lock.signal.error instanceof LockLostError);
    assert.equal(lock.signal.error.reason, 'notowner');
    assert.match(lock.signal.error.message, /NOTOWNER .*force-released/);
    assert.equal(await server.info(K('rewatchgone')), null, 'no grant was made by the re-watch');
  });

  it('a fixed lease with no time left when the new session opens is reported lost (expired), not re-acquired', async () => {
    const proxy = await startProxy(server.port);
    const own = await flockOf(kind, proxy.port);
    // Long enough to be held still when the session is killed, on a busy machine too (with 300
    // ms it had ended first, once: nothing was left to re-watch, and no new session was asked for).
    const lock = await own.acquire(K('rewatchend'), { lease: 1000 });
    const victim = await proxiedSession(proxy);
    proxy.holdReplies('FLOCK.SESSION');
    const [, [, held]] = await server.probe.multi().client('KILL', 'ID', victim).call('FLOCK.INFO', K('rewatchend')).exec();
    assert.ok(held, 'the lease had not ended yet when the session was killed');
    await waitUntil('a new session is asked for', () => proxy.heldCount() > 0);
    await waitUntil('the lease ends on the server', async () => (await server.info(K('rewatchend'))) === null);
    await new Promise((resolve) => setTimeout(resolve, 50));
    proxy.flush();
    await within(PUSHED_MS, 'the loss', aborted(lock.signal));
    assert.equal(lock.signal.error.reason, 'expired');
    assert.equal(proxy.sent('FLOCK.RENEW').length, 0, 'nothing sent for a lease already over');
    assert.equal(await server.info(K('rewatchend')), null, 'no grant was made by the re-watch');
  });

  it('a release during the re-watch waits for it: the hold count it answers is right', async () => {
    const proxy = await startProxy(server.port);
    const own = await flockOf(kind, proxy.port);
    const lock = await own.acquire(K('rewatchrel'), { lease: 60000 });
    const again = await own.acquire(K('rewatchrel'), { lease: 60000, owner: lock.owner });
    const victim = await proxiedSession(proxy);
    proxy.holdReplies('FLOCK.SESSION');
    await server.probe.client('KILL', 'ID', victim);
    await waitUntil('a new session is asked for', () => proxy.heldCount() > 0);
    const released = again.release();
    proxy.flush();
    assert.equal(await released, 1, 'one hold left (the re-watch added and released its own)');
    assert.equal(own._session.rewatched, 1);
    assert.equal((await server.info(K('rewatchrel'))).holds, '1');
    assert.equal(await lock.release(), 0);
  });

  // docs/client-protocol.md, "grants told": a wait sent again with its request ID (as a session
  // break sends it) is answered with its grant from the server's record while the INBOX reply
  // that carries its `granted` event is on its way. That event is the same grant: dropped, not
  // given back as a grant nobody waits for.
  it('a granted event of a grant that answered a resend of its wait is dropped, the lock stays held', async () => {
    const proxy = await startProxy(server.port);
    const own = await flockOf(kind, proxy.port);
    const key = K('told');
    const holder = await flock.acquire(key, { lease: LEASE });
    // The session's reads are answered, and held in the proxy, from its first FLOCK.INBOX on.
    proxy.holdReplies('FLOCK.INBOX');
    const waiting = own.acquire(key, { lease: LEASE, wait: 10000 });
    await server.queued(key, 1);
    await waitUntil("the session's read went out", () => proxy.sent('FLOCK.INBOX').length > 0);
    await holder.release();
    await waitUntil("the grant's event is held on its way", () => proxy.heldCount() > 0);
    const session = own._session;
    const [wait] = session.waits.values();
    session._sendWait(wait, session.openFor(key));
    const lock = await within(5000, 'the resend answered with the grant', waiting);
    proxy.flush();
    await waitUntil('the held read handed out', () => proxy.heldCount() === 0);
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal((await server.info(key))?.owner, lock.owner, 'still held by its grant');
    assert.equal(lock.signal.aborted, false);
    assert.equal(await lock.release(), 0);
  });
});
