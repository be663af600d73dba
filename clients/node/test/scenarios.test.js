'use strict';

// The shared client scenarios (clients/scenarios.json, explained in clients/SCENARIOS.md), each
// played as one test through the public API (Flock, Lock), once per supported client library.
// An actor is a promise chain with an owner of its own (its first grant's owner, passed as
// `owner` to re-enter); a process is one Flock over one redis client of its own, connected
// through a proxy of its own (for `drop_next_reply`, and so that `kill_process` can find and end
// its connections); FLOCK.INFO, FLOCK.FORCERELEASE, CLIENT KILL, DUMP, RESTORE and CONFIG SET go
// on the server's probe connection, the runner's own. A scenario's session_timeout_ms is each process's
// sessionTimeoutMs; `partition` pauses the process's proxy both ways. Times of a loss and of a
// grant (expect_lost_before) are taken on the monotonic clock as the client reports them: in the
// signal's abort listener, and when acquire() resolves.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { performance } = require('node:perf_hooks');
const { setTimeout: delay } = require('node:timers/promises');
const { it, before } = require('node:test');
const Redis = require('ioredis');
const { createClient } = require('redis');
const { Flock, DEFAULTS, PROTOCOL, LockBusyError, LockNotHeldError, LockUpgradeError, LockModeError, AbortError } = require('..');
const { eachClient, startServer, startProxy, waitUntil } = require('./helpers');

// ../scenarios.json from the client's directory, found from this file (not the working directory).
const SCENARIOS_FILE = process.env.FLOCK_SCENARIOS || path.resolve(__dirname, '..', '..', 'scenarios.json');
if (!fs.existsSync(SCENARIOS_FILE)) throw new Error(`the shared scenarios are not at ${SCENARIOS_FILE} (set FLOCK_SCENARIOS)`);
const { scenarios, protocol } = JSON.parse(fs.readFileSync(SCENARIOS_FILE, 'utf8'));

// SCENARIOS.md: every await_* fails after 10 s (or its within_ms); a started acquire waits 20 s
// unless told; an acquire is a try unless told.
const AWAIT_MS = 10000;
const START_WAIT_MS = 20000;
// How often expect_not_lost with for_ms looks during its time.
const NOT_LOST_POLL_MS = 10;

let server;
before(async () => {
  server = await startServer();
});

/** A redis client of `kind` (ioredis, node-redis RESP2 or RESP3) on `port`, and how to close it. */
async function connect(kind, port) {
  if (kind.name === 'ioredis') {
    const client = new Redis(port, '127.0.0.1');
    client.on('error', () => {});
    return { client, close: () => client.disconnect() };
  }
  const client = createClient({ socket: { host: '127.0.0.1', port }, RESP: kind.name.endsWith('resp3') ? 3 : 2 });
  client.on('error', () => {});
  await client.connect();
  return {
    client,
    close: () => {
      try {
        client.destroy();
      } catch {}
    },
  };
}

/** The outcome of an acquire as the scenarios name it: granted, busy, cancelled or error:CODE. */
function outcomeName(err) {
  if (err instanceof LockBusyError) return 'busy';
  if (err instanceof AbortError) return 'cancelled';
  return `error:${codeOf(err)}`;
}

function codeOf(err) {
  if (err instanceof LockNotHeldError) return 'NOTOWNER';
  if (err instanceof LockUpgradeError) return 'UPGRADE';
  if (err instanceof LockModeError) return 'WRONGMODE';
  const word = String(err?.message ?? err).split(' ', 1)[0];
  return /^[A-Z]+$/.test(word) ? word : `(not a server error: ${err?.message ?? err})`;
}

const lockMode = (step) => (step.mode === 'shared' ? 'shared' : step.mode === 'permits' ? 'semaphore' : 'exclusive');

/** A deadline on a promise (an await_* step): rejects with `what` after `ms`. */
function within(ms, what, promise) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`not within ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

class Runner {
  constructor(kind, scenario) {
    this.kind = kind;
    this.scenario = scenario;
    this.processes = new Map();
    this.actors = new Map();
    // When each lock handle was reported lost (performance.now()).
    this.lostAt = new Map();
    // save_key's DUMPs, by key name.
    this.saved = new Map();
    // Whether refuse_writes was sent: the server is shared by every scenario of the file.
    this.refusing = false;
  }

  key(name) {
    return `${this.scenario.name}:${name}`;
  }

  async process(name = 'main') {
    let proc = this.processes.get(name);
    if (proc) return proc;
    const proxy = await startProxy(server.port);
    const { client, close } = await connect(this.kind, proxy.port);
    const flock = new Flock(client, { sessionTimeoutMs: this.scenario.session_timeout_ms });
    proc = { name, proxy, client, close, flock, killed: false };
    this.processes.set(name, proc);
    return proc;
  }

  async actor(step) {
    let actor = this.actors.get(step.actor);
    if (!actor) {
      actor = { name: step.actor, proc: await this.process(step.process), owner: undefined, locks: [], pending: null };
      this.actors.set(step.actor, actor);
    } else if (step.process !== undefined && step.process !== actor.proc.name) {
      throw new Error(`actor ${actor.name} belongs to process ${actor.proc.name}, not ${step.process}`);
    }
    return actor;
  }

  // Starts an acquire of the actor; resolves (never rejects) to its outcome's name, recording a grant.
  startAcquire(actor, step, defaultWait) {
    const options = { wait: step.wait_ms ?? defaultWait };
    if (step.lease_ms !== undefined) options.lease = step.lease_ms;
    if (step.mode === 'shared') options.shared = true;
    else if (step.mode === 'permits') Object.assign(options, { permits: step.permits, limit: step.limit });
    else if (step.mode !== undefined && step.mode !== 'exclusive') throw new Error(`unknown mode ${step.mode}`);
    // The same actor acquiring again re-enters: the Node way is the owner of its first lock.
    if (actor.owner !== undefined) options.owner = actor.owner;
    const controller = new AbortController();
    options.signal = controller.signal;
    const pending = { controller, settled: false, outcome: undefined, error: undefined };
    pending.promise = actor.proc.flock.acquire(this.key(step.key), options).then(
      (lock) => {
        actor.grantedAt = performance.now();
        if (lock.signal.aborted) this.lostAt.set(lock, actor.grantedAt);
        else lock.signal.addEventListener('abort', () => this.lostAt.set(lock, performance.now()), { once: true });
        actor.owner ??= lock.owner;
        actor.locks.push(lock);
        return 'granted';
      },
      (err) => {
        pending.error = err;
        return outcomeName(err);
      },
    );
    pending.promise.then((outcome) => Object.assign(pending, { settled: true, outcome }));
    return pending;
  }

  // The actor's latest lock handle on `key` (of the step's mode when it names one).
  lockOf(actor, step) {
    const key = this.key(step.key);
    const mode = step.mode === undefined ? null : lockMode(step);
    for (let i = actor.locks.length - 1; i >= 0; i--) {
      const lock = actor.locks[i];
      if (lock.resources[0] === key && (mode === null || lock.mode === mode)) return { lock, index: i };
    }
    throw new Error(`actor ${actor.name} holds no lock handle of ${step.key}${mode ? ` (${mode})` : ''}`);
  }

  async step(step) {
    switch (step.op) {
      case 'acquire': {
        const actor = await this.actor(step);
        const pending = this.startAcquire(actor, step, 0);
        const outcome = await within(AWAIT_MS + (step.wait_ms ?? 0), `${actor.name}'s acquire`, pending.promise);
        assert.equal(outcome, step.expect, `${actor.name} acquiring ${step.key}: ${pending.error?.message ?? outcome}`);
        return;
      }
      case 'start_acquire': {
        const actor = await this.actor(step);
        if (actor.pending && !actor.pending.settled) throw new Error(`${actor.name} already has an acquire under way`);
        actor.pending = this.startAcquire(actor, step, START_WAIT_MS);
        return;
      }
      case 'await_result': {
        const actor = await this.actor(step);
        if (!actor.pending) throw new Error(`${actor.name} started no acquire`);
        const outcome = await within(step.within_ms ?? AWAIT_MS, `${actor.name}'s started acquire ends`, actor.pending.promise);
        assert.equal(outcome, step.expect, `${actor.name}'s started acquire: ${actor.pending.error?.message ?? outcome}`);
        return;
      }
      case 'expect_pending': {
        const actor = await this.actor(step);
        assert.ok(actor.pending, `${actor.name} started no acquire`);
        assert.equal(actor.pending.settled, false, `${actor.name}'s acquire already ended: ${actor.pending.outcome}`);
        return;
      }
      case 'cancel': {
        const actor = await this.actor(step);
        if (!actor.pending) throw new Error(`${actor.name} started no acquire`);
        actor.pending.controller.abort();
        return;
      }
      case 'release': {
        const actor = await this.actor(step);
        const { lock, index } = this.lockOf(actor, step);
        // One hold of the key: this handle is spent whatever the server answers.
        actor.locks.splice(index, 1);
        let outcome = 'ok';
        let message = '';
        try {
          await lock.release();
        } catch (err) {
          outcome = `error:${codeOf(err)}`;
          message = err.message;
        }
        assert.equal(outcome, step.expect ?? 'ok', `${actor.name} releasing ${step.key}: ${message || outcome}`);
        return;
      }
      case 'expect_holds': {
        const actor = await this.actor(step);
        const info = await server.info(this.key(step.key));
        const mine = info?.holders.find((h) => h.owner === actor.owner);
        assert.equal(Number(mine?.holds ?? 0), step.holds, `${actor.name}'s holds of ${step.key}: ${JSON.stringify(info)}`);
        return;
      }
      case 'await_waiters': {
        const key = this.key(step.key);
        let last;
        await waitUntil(
          `${step.count} waiter(s) on ${step.key} (last seen: ${last})`,
          async () => {
            last = Number((await server.info(key))?.waiters ?? 0);
            return last === step.count;
          },
          step.within_ms ?? AWAIT_MS,
        ).catch((err) => {
          // An acquire that ended instead of queuing says why.
          const ended = [...this.actors.values()]
            .filter((a) => a.pending?.settled && a.pending.outcome !== 'granted')
            .map((a) => `${a.name}: ${a.pending.outcome} ${a.pending.error?.message ?? ''}`);
          throw new Error(`${err.message}; last seen ${last}${ended.length ? `; ended: ${ended.join('; ')}` : ''}`);
        });
        return;
      }
      case 'expect_free': {
        const info = await server.info(this.key(step.key));
        assert.equal(info, null, `${step.key} is not free: ${JSON.stringify(info)}`);
        return;
      }
      case 'force_release':
        await server.probe.call('FLOCK.FORCERELEASE', this.key(step.key));
        return;
      case 'await_lost': {
        const actor = await this.actor(step);
        const { lock } = this.lockOf(actor, step);
        await waitUntil(`${actor.name}'s lock of ${step.key} is reported lost`, () => lock.signal.aborted, step.within_ms ?? AWAIT_MS);
        if (step.reason !== undefined) {
          assert.equal(lock.signal.error?.reason, step.reason, `why it was lost: ${lock.signal.error?.message}`);
        }
        return;
      }
      case 'expect_not_lost': {
        const actor = await this.actor(step);
        const { lock } = this.lockOf(actor, step);
        const end = performance.now() + (step.for_ms ?? 0);
        for (;;) {
          assert.equal(lock.signal.aborted, false, `${actor.name}'s lock of ${step.key} was lost: ${lock.signal.error?.message}`);
          if (performance.now() >= end) return;
          await delay(Math.min(NOT_LOST_POLL_MS, end - performance.now()));
        }
      }
      case 'expect_lost_before': {
        const actor = await this.actor(step);
        const { lock } = this.lockOf(actor, step);
        const granted = this.actors.get(step.granted);
        assert.ok(granted?.grantedAt !== undefined, `${step.granted} was granted nothing`);
        const lostAt = this.lostAt.get(lock);
        assert.ok(lostAt !== undefined, `${actor.name}'s lock of ${step.key} was never reported lost`);
        assert.ok(
          lostAt < granted.grantedAt,
          `${actor.name}'s lock of ${step.key} was reported lost ${(lostAt - granted.grantedAt).toFixed(1)} ms after ${step.granted} was granted it`,
        );
        return;
      }
      case 'partition': {
        const { proxy } = await this.process(step.process);
        proxy.partition();
        if (step.for_ms !== undefined) {
          await delay(step.for_ms);
          proxy.heal();
        }
        return;
      }
      case 'heal':
        (await this.process(step.process)).proxy.heal();
        return;
      case 'drop_next_reply':
        (await this.process(step.process)).proxy.dropReply(step.command);
        return;
      case 'kill_process':
        await this.kill(await this.process(step.process));
        return;
      case 'save_key':
        // DUMP's payload is binary: read as a string it would not RESTORE.
        this.saved.set(step.key, await server.probe.dumpBuffer(this.key(step.key)));
        return;
      case 'restore_key': {
        const saved = this.saved.get(step.key);
        if (!saved) throw new Error(`${step.key} was not saved (save_key)`);
        await server.probe.restore(this.key(step.key), 0, saved, 'REPLACE');
        return;
      }
      case 'refuse_writes':
        // Set before it is sent: a CONFIG SET whose reply is lost may still have been applied.
        this.refusing = true;
        await this.minReplicasToWrite(1);
        return;
      case 'accept_writes':
        await this.minReplicasToWrite(0);
        return;
      default:
        throw new Error(`unknown step op ${JSON.stringify(step.op)}`);
    }
  }

  async minReplicasToWrite(n) {
    await server.probe.config('SET', 'min-replicas-to-write', String(n));
  }

  // Every connection of the process (those through its proxy) is ended by CLIENT KILL on the
  // server; then the process is gone: its proxy accepts nothing more (no reconnect reaches the
  // server) and its Flock and client are closed, which ends its actors' acquires.
  async kill(proc) {
    const addrs = new Set(proc.proxy.addrs());
    const list = await server.probe.client('LIST');
    const ids = list
      .split('\n')
      .map((line) => /^id=(\d+) addr=(\S+) /.exec(line))
      .filter((m) => m && addrs.has(m[2]))
      .map((m) => m[1]);
    assert.ok(ids.length > 0, `no connection of process ${proc.name} found`);
    for (const id of ids) await server.probe.client('KILL', 'ID', id);
    await this.stop(proc);
  }

  async stop(proc) {
    if (proc.killed) return;
    proc.killed = true;
    proc.proxy.close();
    await proc.flock.quit().catch(() => {});
    proc.close();
  }

  // The scenario's processes: each step's `process`, else its actor's (where the actor was
  // first named), else main.
  processNames() {
    const names = new Set();
    const actorOf = new Map();
    for (const step of this.scenario.steps) {
      if (step.actor !== undefined && !actorOf.has(step.actor)) actorOf.set(step.actor, step.process ?? 'main');
      if (step.process !== undefined) names.add(step.process);
      else if (step.actor !== undefined) names.add(actorOf.get(step.actor));
      else if (['drop_next_reply', 'partition', 'heal', 'kill_process'].includes(step.op)) names.add('main');
    }
    return names;
  }

  async play() {
    try {
      // Every process runs before the first step, as programs already started do (its client
      // connected; its session opens at its first acquire): connecting a client is no step's time
      // (with node-redis it took 380 ms on a busy machine, longer than a 300 ms lease the scenario
      // holds across a step).
      for (const name of this.processNames()) await this.process(name);
      for (const [i, step] of this.scenario.steps.entries()) {
        try {
          await this.step(step);
        } catch (err) {
          err.message = `step ${i + 1} ${JSON.stringify(step)}: ${err.message}`;
          throw err;
        }
      }
      for (const proc of this.processes.values()) {
        assert.equal(proc.proxy.dropping(), null, `process ${proc.name} never sent the command whose reply was to be dropped`);
      }
    } finally {
      // First, so that what follows (cancels, the sessions' ends) is not refused, nor the next
      // scenarios' writes.
      if (this.refusing) await this.minReplicasToWrite(0);
      // Ends every acquire still under way and closes every process.
      for (const actor of this.actors.values()) actor.pending?.controller.abort();
      await Promise.all([...this.actors.values()].map((a) => a.pending?.promise));
      for (const proc of this.processes.values()) await this.stop(proc);
    }
  }
}

it("the client's constants are the protocol block of scenarios.json", () => {
  assert.deepEqual(
    {
      heartbeat_fraction: PROTOCOL.heartbeatFraction,
      drift_margin_ms: PROTOCOL.driftMarginMs,
      drift_margin_percent: PROTOCOL.driftMarginPercent,
      watchdog_lease_ms: PROTOCOL.watchdogLeaseMs,
      watchdog_renew_fraction: PROTOCOL.watchdogRenewFraction,
      resends: PROTOCOL.resends,
      cancel_grace_ms: PROTOCOL.cancelGraceMs,
      loss_reasons: [...PROTOCOL.lossReasons],
    },
    protocol,
  );
  // What the client uses is what it declares.
  assert.equal(DEFAULTS.watchdogLease, protocol.watchdog_lease_ms);
  assert.equal(DEFAULTS.resends, protocol.resends);
});

eachClient((kind) => {
  for (const scenario of scenarios) {
    it(scenario.name, async () => {
      // A scenario starts on an empty server.
      await server.probe.flushall();
      await new Runner(kind, scenario).play();
    });
  }
});
