'use strict';

// Sessions (docs/commands.md, "Sessions"): waits multiplexed over one session connection per
// Flock, losses pushed by the server, FLOCK.CANCEL, a session connection killed, and a process
// that exits by itself. Run once per supported client library (ioredis, node-redis RESP2/RESP3).
// A server restart mid-wait is in restart.test.js.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { promisify } = require('node:util');
const { describe, it, before } = require('node:test');
const { Flock, LockBusyError, LockLostError, LockNotHeldError, AbortError } = require('..');
const { aborted, eachClient, flockOf, onEnd, startServer, startProxy, waitUntil, within, PUSHED_MS } = require('./helpers');

const LEASE = 10000;

let server;
before(async () => {
  server = await startServer();
});

const connected = () => server.stat('connected_clients');

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

  it('300 waiting acquires of one Flock add at most 4 connections, and are granted FIFO', async () => {
    const client = await kind.connect(server.port);
    const base = await connected();
    const own = new Flock(client);
    // Quit at the end even if the test fails: its waits would otherwise retry for ever once the
    // server is stopped, and the file's process would never exit.
    onEnd(() => own.quit());
    const holder = await own.acquire(K('many'), { lease: LEASE });
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

  it('a fixed lease that runs out aborts lock.signal (pushed `lost expired`)', async () => {
    const lock = await flock.acquire(K('expire'), { lease: 200 });
    await within(PUSHED_MS, 'the pushed expiry', aborted(lock.signal));
    assert.match(lock.signal.error.message, /lease ended/);
    assert.equal(await server.info(K('expire')), null);
    await assert.rejects(lock.release(), (err) => err instanceof LockNotHeldError && /lease/.test(err.message));
  });

  it('a deleted key aborts lock.signal', async () => {
    const lock = await flock.acquire(K('del'), { lease: 60000 });
    await server.probe.del(K('del'));
    await within(PUSHED_MS, 'the pushed deletion', aborted(lock.signal));
    assert.match(lock.signal.error.message, /deleted/);
  });

  it("a holder's loss is known before a waiter of the same process is granted", async () => {
    const holder = await flock.acquire(K('order'), { lease: 300 });
    let holderLostFirst = null;
    const waiting = flock.acquire(K('order'), { lease: LEASE, wait: Infinity }).then((lock) => {
      holderLostFirst = holder.signal.aborted;
      return lock;
    });
    await server.queued(K('order'), 1);
    const lock = await waiting;
    assert.equal(holderLostFirst, true, 'the holder was marked lost before the waiter ran');
    assert.match(holder.signal.error.message, /lease ended/);
    assert.equal(lock.signal.aborted, false);
    await lock.release();
  });

  it("a grant answered directly marks this process's excluded holder lost, even before its `lost` event is read", async () => {
    const proxy = await startProxy(server.port);
    const proxied = await flockOf(kind, proxy.port);
    // Open the session, then hold back its inbox from the next FLOCK.INBOX on (an event makes
    // the blocked one return, so that the client sends the next).
    const opener = await proxied.acquire(K('hold-open'), { lease: 50 });
    proxy.holdReplies('FLOCK.INBOX');
    await within(PUSHED_MS, 'the opener expired', aborted(opener.signal));
    const holder = await proxied.acquire(K('super'), { lease: 200 });
    await waitUntil('the lease ended on the server', async () => (await server.info(K('super'))) === null);
    const next = await proxied.acquire(K('super'), { lease: LEASE, wait: 0 });
    assert.equal(holder.signal.aborted, true, 'lost before the new grant was returned');
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
    ['dog', 'a watchdog', {}],
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
    assert.equal(lock.signal.error.reason, 'forcereleased');
    assert.match(lock.signal.error.message, /NOTOWNER/);
    assert.equal(await server.info(K('rewatchgone')), null, 'no grant was made by the re-watch');
  });

  it('a fixed lease with no time left when the new session opens is reported lost (expired), not re-acquired', async () => {
    const proxy = await startProxy(server.port);
    const own = await flockOf(kind, proxy.port);
    const lock = await own.acquire(K('rewatchend'), { lease: 300 });
    const victim = await proxiedSession(proxy);
    proxy.holdReplies('FLOCK.SESSION');
    await server.probe.client('KILL', 'ID', victim);
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
      const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'flock-exit-')), 'exit.js');
      fs.writeFileSync(file, script);
      const { stdout } = await promisify(execFile)(process.execPath, [file, kind, String(server.port)], { timeout: 15000 });
      const quitAt = Number(/quit at (\d+)/.exec(stdout)[1]);
      assert.ok(Date.now() - quitAt < 5000, `exited ${Date.now() - quitAt} ms after redis.quit()`);
      fs.rmSync(path.dirname(file), { recursive: true, force: true });
    });
  }
});
