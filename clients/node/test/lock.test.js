'use strict';

// The core of the client, run once per supported client library (ioredis, node-redis).

const assert = require('node:assert/strict');
const { describe, it, before } = require('node:test');
const { Flock, LockNotHeldError, LockBusyError, LockLostError, AbortError, StaleTokenError } = require('..');
const { eachClient, flockOf, onEnd, renewals, requestId, startServer, startProxy, waitUntil, WATCHDOG_LEASE } = require('./helpers');

let server;
before(async () => {
  server = await startServer();
});

eachClient((kind, K) => {
  let flock;
  let other;
  before(async () => {
    flock = await flockOf(kind, server.port);
    other = await flockOf(kind, server.port, { wait: 0 });
  });

  it('acquire answers the exact fencing token as a bigint (above 2^53)', async () => {
    const lock = await flock.acquire(K('tok'), { lease: 10000 });
    assert.equal(typeof lock.token, 'bigint');
    assert.ok(lock.token > BigInt(Number.MAX_SAFE_INTEGER));
    const info = await server.info(K('tok'));
    assert.equal(String(lock.token), info.token);
    assert.equal(info.owner, lock.owner);
    const next = await (await lock.release(), flock.acquire(K('tok'), { lease: 10000 }));
    assert.ok(next.token > lock.token, 'tokens increase per grant');
    await next.release();
  });

  it('a busy lock rejects a try with LockBusyError and queues nothing', async () => {
    const lock = await flock.acquire(K('busy'), { lease: 10000 });
    await assert.rejects(other.acquire(K('busy'), { lease: 10000 }), (err) => err instanceof LockBusyError && err.key === K('busy'));
    assert.equal((await server.info(K('busy'))).waiters, '0');
    assert.equal((await server.info(K('busy'))).owner, lock.owner);
    await lock.release();
  });

  it('a wait that times out on the server rejects with LockBusyError and leaves the queue', async () => {
    const lock = await flock.acquire(K('timeout'), { lease: 10000 });
    await assert.rejects(flock.acquire(K('timeout'), { lease: 10000, wait: 50 }), LockBusyError);
    assert.equal((await server.info(K('timeout'))).waiters, '0');
    await lock.release();
  });

  it('release frees the lock; a second release rejects with LockNotHeldError', async () => {
    const lock = await flock.acquire(K('rel'), { lease: 10000 });
    assert.equal(await lock.release(), 0);
    assert.equal(await server.info(K('rel')), null);
    await assert.rejects(lock.release(), (err) => err instanceof LockNotHeldError && err.key === K('rel') && /NOTOWNER/.test(err.message));
  });

  it('extend resets the lease on the server and resolves to the same lock', async () => {
    const lock = await flock.acquire(K('ext'), { lease: 5000 });
    assert.equal(await lock.extend(60000), lock);
    assert.ok(Number((await server.info(K('ext')))['ttl-ms']) > 5000);
    assert.equal(lock.lease, 60000);
    await lock.release();
  });

  it('extend of a lock that was taken away rejects with LockNotHeldError and aborts its signal', async () => {
    const lock = await flock.acquire(K('gone'), { lease: 10000 });
    await server.probe.call('FLOCK.FORCERELEASE', K('gone'));
    await assert.rejects(lock.extend(10000), LockNotHeldError);
    assert.ok(lock.signal.aborted);
    assert.ok(lock.signal.error instanceof LockLostError);
    // Pushed by the session (forcereleased) or answered NOTOWNER, whichever came first.
    assert.ok(['forcereleased', 'notowner'].includes(lock.signal.error.reason), lock.signal.error.reason);
    assert.match(lock.signal.error.message, /force-released/);
  });

  it('waiters are granted in arrival order (FIFO)', async () => {
    const lock = await flock.acquire(K('fifo'), { lease: 10000 });
    const order = [];
    const waits = [];
    for (let i = 0; i < 3; i++) {
      waits.push(
        flock.acquire(K('fifo'), { lease: 10000, wait: Infinity }).then(async (l) => {
          order.push(i);
          await l.release();
        }),
      );
      await server.queued(K('fifo'), i + 1);
    }
    await lock.release();
    await Promise.all(waits);
    assert.deepEqual(order, [0, 1, 2]);
  });

  it('a wait never blocks the client it was given', async () => {
    const client = await kind.connect(server.port);
    const own = new Flock(client);
    onEnd(() => own.quit());
    const lock = await flock.acquire(K('own'), { lease: 10000 });
    const waiting = own.acquire(K('own'), { lease: 10000, wait: Infinity });
    await server.queued(K('own'), 1);
    assert.equal(await (client.call ? client.call('PING') : client.sendCommand(['PING'])), 'PONG');
    await lock.release();
    await (await waiting).release();
  });

  it('an AbortSignal cancels a wait on the server: the waiter leaves the queue', async () => {
    const lock = await flock.acquire(K('abort'), { lease: 10000 });
    const controller = new AbortController();
    const waiting = flock.acquire(K('abort'), { lease: 10000, wait: Infinity, signal: controller.signal });
    await server.queued(K('abort'), 1);
    controller.abort(new Error('shutting down'));
    await assert.rejects(waiting, (err) => err instanceof AbortError && err.cause.message === 'shutting down');
    const info = await server.info(K('abort'));
    assert.equal(info.waiters, '0');
    assert.equal(info.owner, lock.owner, 'the holder is untouched');
    await lock.release();
  });

  it('an already aborted signal rejects before anything is queued', async () => {
    const held = await flock.acquire(K('preabort'), { lease: 10000 });
    await assert.rejects(flock.acquire(K('preabort'), { signal: AbortSignal.abort(), wait: Infinity }), AbortError);
    assert.equal((await server.info(K('preabort'))).waiters, '0');
    await held.release();
  });

  // The blocking form's race (sessions: false): CLIENT UNBLOCK. The session's race (FLOCK.CANCEL
  // answers 0) is in session.test.js.
  it('blocking form: a grant that wins the race with an abort is released, and the wait rejects', async () => {
    const proxy = await startProxy(server.port);
    const proxied = await flockOf(kind, proxy.port, { sessions: false });
    const lock = await flock.acquire(K('race'), { lease: 10000 });
    const controller = new AbortController();
    proxy.holdReplies('WAIT');
    const waiting = proxied.acquire(K('race'), { lease: 10000, wait: Infinity, signal: controller.signal });
    await server.queued(K('race'), 1);
    await lock.release();
    // The grant is on its way, held back by the proxy; the abort finds no blocked client.
    await waitUntil('the grant reply is held', () => proxy.heldCount() > 0);
    const unblocks = await server.stat('cmdstat_client|unblock');
    controller.abort();
    await waitUntil('CLIENT UNBLOCK was tried', async () => (await server.stat('cmdstat_client|unblock')) > unblocks);
    proxy.flush();
    await assert.rejects(waiting, AbortError);
    await waitUntil('the won grant is released', async () => (await server.info(K('race'))) === null);
  });

  it('without a session, a lock without a lease has a watchdog, which renews it and keeps it', async () => {
    const dog = await flockOf(kind, server.port, { watchdogLease: WATCHDOG_LEASE, sessions: false });
    const lock = await dog.acquire(K('dog'));
    const renews = await server.stat('cmdstat_flock.renew');
    await renewals(server, renews, 3, [lock]);
    const info = await server.info(K('dog'));
    assert.equal(info.owner, lock.owner);
    assert.equal(info.token, String(lock.token));
    assert.equal(lock.signal.aborted, false);
    await lock.release();
  });

  it('the watchdog stops on release', async () => {
    const dog = await flockOf(kind, server.port, { watchdogLease: WATCHDOG_LEASE, sessions: false });
    const lock = await dog.acquire(K('dogstop'));
    await lock.release();
    const notowner = await server.stat('errorstat_NOTOWNER');
    // The next holder's own watchdog is the clock: two of its renewals span two of the old period.
    const next = await dog.acquire(K('dogstop'));
    const renews = await server.stat('cmdstat_flock.renew');
    await renewals(server, renews, 2, [next]);
    assert.equal(await server.stat('errorstat_NOTOWNER'), notowner, 'the released lock renewed no more');
    assert.equal((await server.info(K('dogstop'))).owner, next.owner);
    await next.release();
  });

  it('a lock without a lease is a session grant: no renewals, and its loss is pushed to lock.signal', async () => {
    const renews = await server.stat('cmdstat_flock.renew');
    const lock = await flock.acquire(K('doglost'));
    const info = await server.info(K('doglost'));
    assert.equal(info.session, '1', 'it lives with the session');
    assert.equal(lock.lease, 0);
    const lost = new Promise((resolve) => lock.signal.addEventListener('abort', resolve));
    await server.probe.call('FLOCK.FORCERELEASE', K('doglost'));
    await lost;
    assert.ok(lock.signal.error instanceof LockLostError);
    assert.equal(lock.signal.reason, lock.signal.error);
    assert.equal(lock.signal.error.reason, 'forcereleased');
    await assert.rejects(lock.release(), LockNotHeldError);
    assert.equal(await server.stat('cmdstat_flock.renew'), renews, 'nothing renewed it');
  });

  it("without a session the watchdog's NOTOWNER says why the lock was lost", async () => {
    const dog = await flockOf(kind, server.port, { watchdogLease: WATCHDOG_LEASE, sessions: false });
    const lock = await dog.acquire(K('doglost-blocking'));
    const lost = new Promise((resolve) => lock.signal.addEventListener('abort', resolve));
    await server.probe.call('FLOCK.FORCERELEASE', K('doglost-blocking'));
    await lost;
    assert.ok(lock.signal.error instanceof LockLostError);
    assert.equal(lock.signal.error.reason, 'notowner');
    assert.match(lock.signal.error.message, /NOTOWNER .*force-released/);
  });

  it('using releases the lock when the routine throws, and rethrows its error', async () => {
    await assert.rejects(
      flock.using(K('usethrow'), 10000, async () => {
        assert.ok(await server.info(K('usethrow')));
        throw new Error('routine failed');
      }),
      { message: 'routine failed' },
    );
    assert.equal(await server.info(K('usethrow')), null);
  });

  it("using's signal aborts with signal.error when the lock is lost, and the routine's error wins", async () => {
    const dog = await flockOf(kind, server.port, { watchdogLease: WATCHDOG_LEASE });
    await assert.rejects(
      dog.using(K('uselost'), async (signal) => {
        await server.probe.call('FLOCK.FORCERELEASE', K('uselost'));
        // The session pushes the loss, which may abort the signal before FORCERELEASE's reply is read.
        if (!signal.aborted) await new Promise((resolve) => signal.addEventListener('abort', resolve));
        throw signal.error;
      }),
      LockLostError,
    );
  });

  it('re-entry is explicit: acquire with owner: lock.owner adds a hold with the same token', async () => {
    const lock = await flock.acquire(K('reent'), { lease: 10000 });
    const again = await flock.acquire(K('reent'), { lease: 10000, owner: lock.owner });
    assert.equal(again.token, lock.token);
    assert.equal((await server.info(K('reent'))).holds, '2');
    await assert.rejects(flock.acquire(K('reent'), { lease: 10000, wait: 0 }), LockBusyError, 'a new acquire is another owner');
    assert.equal(await again.release(), 1);
    assert.equal(await lock.release(), 0);
  });

  it('a RELEASE whose reply was lost is resent with the same ID and applied once', async () => {
    const proxy = await startProxy(server.port);
    const proxied = await flockOf(kind, proxy.port);
    const lock = await proxied.acquire(K('lost'), { lease: 10000 });
    await proxied.acquire(K('lost'), { lease: 10000, owner: lock.owner });
    proxy.dropReply('FLOCK.RELEASE');
    assert.equal(await lock.release(), 1, 'the resend answers the first reply');
    assert.equal((await server.info(K('lost'))).holds, '1', 'one hold released, not two');
    const sent = proxy.sent('FLOCK.RELEASE');
    assert.equal(sent.length, 2, 'sent twice');
    assert.equal(requestId(sent[0]), requestId(sent[1]), 'with the same request ID');
    assert.equal(await lock.release(), 0);
  });

  it('every command carries a request ID', async () => {
    const proxy = await startProxy(server.port);
    const proxied = await flockOf(kind, proxy.port);
    const lock = await proxied.acquire(K('ids'), { lease: 10000 });
    await lock.extend(10000);
    await lock.release();
    for (const cmd of ['FLOCK.ACQUIRE', 'FLOCK.RENEW', 'FLOCK.RELEASE']) {
      const [text] = proxy.sent(cmd);
      assert.match(text, /\r\nID\r\n\$36\r\n[0-9a-f-]{36}\r\n/, `${cmd} has ID <uuid>`);
    }
  });

  it('bad arguments are refused before anything reaches the server', async () => {
    const before = await server.stat('cmdstat_flock.acquire');
    await assert.rejects(flock.acquire(K('bad'), { lease: 1.5 }), /integer value in milliseconds/);
    await assert.rejects(flock.acquire(K('bad'), { lease: -1 }), RangeError);
    await assert.rejects(flock.acquire([]), TypeError);
    await assert.rejects(flock.acquire(['a', 'a']), TypeError);
    await assert.rejects(flock.using(K('bad'), 1000), TypeError);
    assert.equal(await server.stat('cmdstat_flock.acquire'), before);
    assert.throws(() => new Flock([]), /exactly one client/);
    assert.throws(() => new Flock({}), /ioredis or node-redis/);
  });

  it('fenced runs a command only while the grant holds, and once it ended rejects with StaleTokenError', async () => {
    // No session: nothing tells this process of the force-release, so the server refuses.
    const plain = await flockOf(kind, server.port, { sessions: false });
    const lock = await plain.acquire(K('fenced'), { lease: 30000 });
    assert.equal(String(await lock.fenced(['SET', K('fenced:row'), 'held'])), 'OK');
    assert.equal(String(await lock.fenced(['GET', K('fenced:row')])), 'held');
    await assert.rejects(lock.fenced(['INCR', K('fenced:row')]), (err) => !(err instanceof LockNotHeldError) && /ERR/.test(err.message));
    assert.equal(lock.lost, false, "the command's own error loses nothing");
    assert.equal(await server.probe.call('FLOCK.FORCERELEASE', K('fenced')), '1');
    await assert.rejects(lock.fenced(['SET', K('fenced:row'), 'late']), (err) => err instanceof StaleTokenError && /STALE/.test(err.message));
    assert.equal(lock.lost, true);
    assert.equal(lock.signal.error.reason, 'notowner');
    await assert.rejects(lock.fenced(['SET', K('fenced:row'), 'later']), StaleTokenError);
    assert.equal(await server.probe.get(K('fenced:row')), 'held');
    await assert.rejects(lock.release(), LockNotHeldError);
    await assert.rejects(lock.fenced(['GET', K('fenced:row')]), LockNotHeldError);
  });

  it('lockDelay is asked with the acquire: after its lease runs out nobody is granted the lock for that long', async () => {
    await assert.rejects(flock.acquire(K('delayed'), { lease: 100, lockDelay: 60001 }), RangeError);
    // A long lease, cut short once the holder is read: a loaded machine cannot let it run out before.
    const lock = await flock.acquire(K('delayed'), { lease: 60000, lockDelay: 400 });
    const [holder] = (await server.info(K('delayed'))).holders;
    assert.equal(holder['lock-delay-ms'], '400');
    await server.probe.call('FLOCK.RENEW', K('delayed'), holder.owner, '100');
    await waitUntil('the lease ends into its delay', async () => Number((await server.info(K('delayed')))?.['delayed-ms'] ?? 0) > 0);
    await assert.rejects(other.acquire(K('delayed'), { lease: 1000 }), LockBusyError, 'closed during the delay');
    await waitUntil('the delay ends', async () => (await server.info(K('delayed'))) === null);
    await (await other.acquire(K('delayed'), { lease: 1000 })).release();
    await assert.rejects(lock.release(), LockNotHeldError);
  });

  it('server errors other than NOTOWNER reach the caller unchanged', async () => {
    await server.probe.set(K('plain'), 'x');
    await assert.rejects(flock.acquire(K('plain'), { lease: 1000, wait: 0 }), /WRONGTYPE/);
    await assert.rejects(flock.acquire(K('plain'), { lease: 1000, wait: 100 }), /WRONGTYPE/);
  });
});

describe('ioredis with stringNumbers', () => {
  it('is used as it is: no connection of its own for commands, tokens exact', async () => {
    const Redis = require('ioredis');
    // Duplicates would inherit the connection name.
    const client = new Redis(server.port, '127.0.0.1', { stringNumbers: true, connectionName: 'strnum' });
    onEnd(() => client.disconnect());
    // The session's connection (a duplicate, last command FLOCK.INBOX) is not a command connection.
    const clients = async () =>
      (await server.probe.client('LIST')).split('\n').filter((l) => l.includes(' name=strnum ') && !l.includes(' cmd=flock.inbox ')).length;
    await client.ping();
    const flock = new Flock(client);
    onEnd(() => flock.quit());
    const lock = await flock.acquire('strnum', { lease: 10000 });
    assert.equal(String(lock.token), (await server.info('strnum')).token);
    assert.equal(await clients(), 1, 'no duplicate connection');
    await lock.release();
    await flock.quit();
    assert.equal(await client.ping(), 'PONG', "quit() leaves the caller's client open");
  });
});
