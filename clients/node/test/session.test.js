'use strict';

// Sessions (docs/commands.md, "Sessions"): waits multiplexed over one session connection per
// Flock, losses pushed by the server, FLOCK.CANCEL, and a process that exits by itself. Run once
// per supported client library (ioredis, node-redis RESP2/RESP3). A session connection killed is
// in session-break.test.js, a server restart mid-wait in restart.test.js.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const path = require('node:path');
const { promisify } = require('node:util');
const { describe, it, before } = require('node:test');
const { Flock, LockBusyError, LockLostError, LockNotHeldError, AbortError } = require('..');
const { aborted, childScript, eachClient, flockOf, onEnd, startServer, startProxy, waitUntil, within, PUSHED_MS } = require('./helpers');

const LEASE = 10000;

let server;
before(async () => {
  server = await startServer();
});

const connected = () => server.stat('connected_clients');

eachClient((kind, K) => {
  let flock;
  before(async () => {
    flock = await flockOf(kind, server.port);
  });

  it('300 waiting acquires of one Flock add at most 4 connections, and are granted FIFO', async () => {
    const client = await kind.connect(server.port);
    const base = await connected();
    const own = new Flock(client);
    // Quit at the end even if the test fails: its waits would otherwise retry for ever once the
    // server is stopped, and the file's process would never exit.
    onEnd(() => own.quit());
    // A lease that outlasts the queueing of 300 waits on a busy machine.
    const holder = await own.acquire(K('many'), { lease: 60000 });
    const N = 300;
    const order = [];
    const waits = Array.from({ length: N }, (_, i) =>
      own.acquire(K('many'), { lease: LEASE, wait: Infinity }).then(async (lock) => {
        order.push(i);
        await lock.release();
      }),
    );
    await server.queued(K('many'), N);
    const added = (await connected()) - base;
    assert.ok(added <= 4, `${N} waits added ${added} connections`);
    assert.ok(
      (await server.stat('flock_sessions')) >= 1,
      'waits went through a session',
    );
    await holder.release();
    await Promise.all(waits);
    assert.deepEqual(
      order,
      Array.from({ length: N }, (_, i) => i),
    );
  });

  it('a wait is one ACQUIRE ... INBOX, answered WAITING; the grant comes through the inbox', async () => {
    const holder = await flock.acquire(K('one'), { lease: LEASE });
    const acquires = await server.stat('cmdstat_flock.acquire');
    const waiting = flock.acquire(K('one'), { lease: LEASE, wait: Infinity });
    await server.queued(K('one'), 1);
    assert.equal(await server.stat('cmdstat_flock.acquire'), acquires + 1, 'no try before the wait');
    await holder.release();
    const lock = await waiting;
    assert.equal((await server.info(K('one'))).owner, lock.owner);
    assert.equal((await server.info(K('one'))).token, String(lock.token));
    await lock.release();
  });

  it('FORCERELEASE aborts lock.signal at once (fixed lease, no watchdog)', async () => {
    const lock = await flock.acquire(K('force'), { lease: 60000 });
    await server.probe.call('FLOCK.FORCERELEASE', K('force'));
    await within(PUSHED_MS, 'the pushed loss', aborted(lock.signal));
    assert.ok(lock.signal.error instanceof LockLostError);
    assert.equal(lock.signal.reason, lock.signal.error);
    assert.match(lock.signal.error.message, /force-released/);
    await assert.rejects(lock.release(), (err) => err instanceof LockNotHeldError && /force-released/.test(err.message));
  });

  it('FORCERELEASE aborts lock.signal at once with a watchdog, long before its next renewal', async () => {
    const dog = await flockOf(kind, server.port, { watchdogLease: 60000 });
    const lock = await dog.acquire(K('forcedog'));
    const renews = await server.stat('cmdstat_flock.renew');
    await server.probe.call('FLOCK.FORCERELEASE', K('forcedog'));
    await within(PUSHED_MS, 'the pushed loss', aborted(lock.signal));
    assert.equal(await server.stat('cmdstat_flock.renew'), renews, 'no renewal found it: the server pushed it');
    assert.match(lock.signal.error.message, /force-released/);
  });

  it('a fixed lease aborts lock.signal (expired) at its deadline, before the server ends it', async () => {
    const lock = await flock.acquire(K('expire'), { lease: 200 });
    await within(PUSHED_MS, 'the expiry', aborted(lock.signal));
    assert.equal(lock.signal.error.reason, 'expired');
    assert.match(lock.signal.error.message, /lease ended/);
    await waitUntil('the lease ends on the server', async () => (await server.info(K('expire'))) === null);
    await assert.rejects(lock.release(), (err) => err instanceof LockNotHeldError && /lease/.test(err.message));
  });

  it('a deleted key aborts lock.signal', async () => {
    const lock = await flock.acquire(K('del'), { lease: 60000 });
    await server.probe.del(K('del'));
    await within(PUSHED_MS, 'the pushed deletion', aborted(lock.signal));
    assert.match(lock.signal.error.message, /deleted/);
  });

  it("a holder's loss is known before a waiter of the same process is granted", async () => {
    // The holder's turn comes with the waiter queued behind it already: however late a loaded
    // machine runs the process, the holder's lease cannot end before the waiter queues.
    await server.probe.call('FLOCK.ACQUIRE', K('order'), 'first', '60000');
    const taking = flock.acquire(K('order'), { lease: 1000, wait: Infinity });
    await server.queued(K('order'), 1);
    let holder = null;
    let holderLostFirst = null;
    const waiting = flock.acquire(K('order'), { lease: LEASE, wait: Infinity }).then((lock) => {
      holderLostFirst = holder.signal.aborted;
      return lock;
    });
    await server.queued(K('order'), 2);
    assert.equal(await server.probe.call('FLOCK.RELEASE', K('order'), 'first'), '0');
    holder = await within(10000, 'the holder is granted', taking);
    const lock = await within(10000, 'the waiter is granted', waiting);
    assert.equal(holderLostFirst, true, 'the holder was marked lost before the waiter ran');
    assert.match(holder.signal.error.message, /lease ended/);
    assert.equal(lock.signal.aborted, false);
    await lock.release();
  });

  it("a grant answered directly marks this process's excluded holder lost, even before its `lost` event is read", async () => {
    const proxy = await startProxy(server.port);
    // A session timeout long enough that the session's deadline stays far while its replies are held back.
    const proxied = await flockOf(kind, proxy.port, { sessionTimeoutMs: 60000 });
    // Open the session, then hold back its inbox from the next FLOCK.INBOX on (an event makes
    // the blocked one return, so that the client sends the next).
    const opener = await proxied.acquire(K('hold-open'));
    proxy.holdReplies('FLOCK.INBOX');
    await server.probe.call('FLOCK.FORCERELEASE', K('hold-open'));
    await within(PUSHED_MS, 'the opener lost', aborted(opener.signal));
    const holder = await proxied.acquire(K('super'));
    await server.probe.call('FLOCK.FORCERELEASE', K('super'));
    const next = await proxied.acquire(K('super'), { lease: LEASE, wait: 0 });
    assert.equal(holder.signal.aborted, true, 'lost before the new grant was returned');
    assert.equal(holder.signal.error.reason, 'notowner');
    assert.match(holder.signal.error.message, /another owner was granted it/);
    proxy.flush();
    await next.release();
  });

  it('an AbortSignal sends FLOCK.CANCEL: the wait leaves the queue, acquire rejects with AbortError', async () => {
    const holder = await flock.acquire(K('cancel'), { lease: LEASE });
    const controller = new AbortController();
    const cancels = await server.stat('cmdstat_flock.cancel');
    const waiting = flock.acquire(K('cancel'), { lease: LEASE, wait: Infinity, signal: controller.signal });
    await server.queued(K('cancel'), 1);
    // Queued on the server is not yet answered here: aborted before its WAITING reply is read,
    // a wait sends a second CANCEL once it is (in case the first overtook a resend). A reply
    // read after it on the same connection, then a macrotask, and its handlers have run.
    await flock._conn.send(['PING']);
    await new Promise(setImmediate);
    controller.abort(new Error('stop'));
    await assert.rejects(waiting, (err) => err instanceof AbortError && err.cause.message === 'stop');
    assert.equal(await server.stat('cmdstat_flock.cancel'), cancels + 1);
    assert.equal((await server.info(K('cancel'))).waiters, '0');
    await holder.release();
  });

  it('a grant that wins the race with the abort (CANCEL answers 0) is released, and the wait rejects', async () => {
    const holder = await flock.acquire(K('race'), { lease: LEASE });
    const controller = new AbortController();
    const waiting = flock.acquire(K('race'), { lease: LEASE, wait: Infinity, signal: controller.signal });
    await server.queued(K('race'), 1);
    const releases = await server.stat('cmdstat_flock.release');
    // On one connection: the RELEASE grants the waiter, then its CANCEL finds no wait (0).
    const released = flock._releaseKey(K('race'), holder.owner);
    controller.abort();
    await released;
    await assert.rejects(waiting, AbortError);
    await waitUntil('the won grant is released', async () => (await server.info(K('race'))) === null);
    assert.equal(await server.stat('cmdstat_flock.release'), releases + 2);
  });

  it('a wait that times out says it waited and how to wait longer', async () => {
    const holder = await flock.acquire(K('slow'), { lease: LEASE });
    await assert.rejects(flock.acquire(K('slow'), { lease: LEASE, wait: 50 }), (err) => {
      assert.ok(err instanceof LockBusyError);
      assert.match(err.message, /waited 50 ms/);
      assert.match(err.message, /\{ wait: ms \}/);
      return true;
    });
    await assert.rejects(flock.acquire(K('slow'), { lease: LEASE, wait: 0 }), /tried once/);
    assert.equal((await server.info(K('slow'))).waiters, '0');
    await holder.release();
  });

  it('re-entry through the session keeps the token and watches the grant', async () => {
    const lock = await flock.acquire(K('reent'), { lease: 60000 });
    const again = await flock.acquire(K('reent'), { lease: 60000, owner: lock.owner, wait: Infinity });
    assert.equal(again.token, lock.token);
    assert.equal((await server.info(K('reent'))).holds, '2');
    await server.probe.call('FLOCK.FORCERELEASE', K('reent'));
    await within(PUSHED_MS, 'both handles lost', Promise.all([aborted(lock.signal), aborted(again.signal)]));
  });

  it('the blocking form (sessions: false) still waits on a connection of its own', async () => {
    const blocking = await flockOf(kind, server.port, { sessions: false });
    const holder = await flock.acquire(K('blocking'), { lease: LEASE });
    const inboxes = await server.stat('cmdstat_flock.inbox');
    const waiting = blocking.acquire(K('blocking'), { lease: LEASE, wait: Infinity });
    await server.queued(K('blocking'), 1);
    await holder.release();
    const lock = await waiting;
    assert.equal((await server.info(K('blocking'))).owner, lock.owner);
    await lock.release();
    assert.ok((await server.stat('cmdstat_flock.inbox')) - inboxes <= 2, 'no session was used for it');
  });

  it("redlock's Redlock#release(lock), Redlock#extend(lock, duration) and lock.value", async () => {
    const lock = await flock.acquire([K('rl')], 1000);
    assert.equal(lock.value, lock.owner);
    assert.equal((await server.info(K('rl'))).owner, lock.value);
    const extended = await flock.extend(lock, 60000);
    assert.equal(extended.value, lock.value);
    assert.ok(Number((await server.info(K('rl')))['ttl-ms']) > 1000);
    assert.equal(await flock.release(extended), 0);
    assert.equal(await server.info(K('rl')), null);
  });
});

describe('a process exits by itself after redis.quit()', () => {
  const ROOT = path.resolve(__dirname, '..');
  const script = `
'use strict';
const { Flock } = require(${JSON.stringify(ROOT)});
const kind = process.argv[2];
const port = Number(process.argv[3]);
(async () => {
  let redis;
  if (kind === 'ioredis') {
    const Redis = require(${JSON.stringify(require.resolve('ioredis'))});
    redis = new Redis(port, '127.0.0.1');
  } else {
    const { createClient } = require(${JSON.stringify(require.resolve('redis'))});
    redis = createClient({ socket: { host: '127.0.0.1', port } });
    await redis.connect();
  }
  const flock = new Flock(redis);
  const key = 'exit:' + kind;
  const held = await flock.acquire(key, { lease: 10000 });
  setTimeout(() => held.release(), 100);
  const waited = await flock.acquire(key, { wait: 5000 });
  await waited.release();
  // Forgotten on purpose: a fixed lease and a watchdog lock, both watched by the session.
  await flock.acquire(key + ':fixed', { lease: 60000 });
  await flock.acquire(key + ':dog');
  // A wait that timed out.
  await flock.acquire(key + ':fixed', { wait: 20 }).catch(() => {});
  await (redis.quit ? redis.quit() : redis.close());
  console.log('quit at ' + Date.now());
})().catch((err) => {
  console.error(err);
  process.exit(2);
});
`;
  for (const kind of ['ioredis', 'node-redis']) {
    it(`${kind}: no session connection, watchdog or timer keeps it alive`, async () => {
      const file = childScript('exit', script);
      const { stdout } = await promisify(execFile)(process.execPath, [file, kind, String(server.port)], { timeout: 60000 });
      const quitAt = Number(/quit at (\d+)/.exec(stdout)[1]);
      assert.ok(Date.now() - quitAt < 5000, `exited ${Date.now() - quitAt} ms after redis.quit()`);
    });
  }
});
