// Compiled (never run) by types.test.js with `tsc --noEmit`: index.d.ts accepts both client
// libraries and types each call shape; the @ts-expect-error lines must stay errors.
import Redis from 'ioredis';
import { createClient, createCluster, createSentinel } from 'redis';
import Flock, { Flock as Named, Lock, LockAbortSignal, LockBusyError, LockNotHeldError, LockLostError, LockUpgradeError, LockModeError, LockNotDurableError, LockDeadlockError, StaleTokenError, AbortError, LockMode, LossReason, PROTOCOL, CommandTimeoutError } from 'redis-flock';

export async function usage(): Promise<void> {
  const io = new Flock(new Redis());
  const nr = new Named([createClient()], { watchdogLease: 30000, wait: Infinity, resends: 2 });

  const lock: Lock = await io.acquire('key', { lease: 5000, wait: 1000, signal: AbortSignal.timeout(100), lockDelay: 500 });
  const token: bigint = lock.token;
  const tokens: ReadonlyMap<string, bigint> = lock.tokens;
  const reply: unknown = await lock.fenced(['SET', 'row', 1], { resource: 'key' });
  const same: Lock = await lock.extend(10000);
  const left: number = await same.release();
  const lost: boolean = lock.signal.aborted && lock.signal.error instanceof LockLostError;
  const lostNow: boolean = lock.lost;
  const why: LossReason | undefined = lock.signal.error?.reason;
  const timed = new Flock(new Redis(), { sessionTimeoutMs: 3000 });
  console.log(reply, lostNow, why, timed.settings.sessionTimeoutMs, PROTOCOL.heartbeatFraction, new CommandTimeoutError('x').code);

  const redlockShape = await nr.acquire(['a', 'b'], 5000, { retryCount: 3, retryDelay: 100 });
  await redlockShape.release();
  const keys: readonly string[] = ['{t}:from', '{t}:to'];
  try {
    const both = await io.acquire(keys, { owner: 'worker-1', wait: 1000, shared: true });
    const tokenOfTo: bigint | undefined = both.tokens.get('{t}:to');
    console.log(tokenOfTo, await both.release());
  } catch (err) {
    if (err instanceof LockDeadlockError) console.log(err.key);
  }
  const reentered = await nr.acquire('key', { owner: lock.owner });
  const value: string = reentered.value;
  const extended: Lock = await nr.extend(reentered, 5000);
  const freed: number = await nr.release(extended);
  const blocking = new Flock(new Redis(), { sessions: false });
  new Flock(new Redis.Cluster([{ host: '127.0.0.1', port: 7000 }]));
  new Flock(createCluster({ rootNodes: [{ url: 'redis://127.0.0.1:7000' }] }));
  new Flock(createSentinel({ name: 'mymaster', sentinelRootNodes: [{ host: '127.0.0.1', port: 26379 }] }), {
    nodeOptions: { password: 'secret' },
  });
  console.log(value, freed, blocking.settings.sessions);

  const n: number = await io.using('key', async (signal: LockAbortSignal) => (signal.aborted ? 0 : 1));
  const s: string = await io.using(['a', 'b'], 5000, async () => 'done');
  await io.using('a', 5000, { automaticExtensionThreshold: 500, wait: 0 }, async (signal) => signal.error?.key);

  const reader = await io.acquire('rw', { shared: true, wait: 1000 });
  const mode: LockMode = reader.mode;
  const slots = await nr.acquire('pool', 5000, { permits: 2, limit: 3 });
  const permits: number = slots.permits;
  await io.using('rw', { shared: true }, async (signal) => signal.aborted);
  await io.using('pool', 5000, { limit: 3 }, async () => 'one permit');
  console.log(mode, permits);

  const durable = new Flock(new Redis({ sentinels: [{ host: '127.0.0.1', port: 26379 }], name: 'mymaster' }), {
    durableReplicas: 2,
    durableTimeout: 500,
  });
  const replicas: number = durable.settings.durableReplicas;
  try {
    await io.acquire('key', { durableReplicas: 1, durableTimeout: 200, shared: true });
  } catch (err) {
    if (err instanceof LockNotDurableError) console.log(err.code, err.key, err.reached < err.replicas, replicas);
  }

  try {
    await io.acquire('key');
  } catch (err) {
    if (err instanceof LockBusyError || err instanceof LockNotHeldError || err instanceof StaleTokenError || err instanceof AbortError) console.log(err.name);
    if (err instanceof LockUpgradeError || err instanceof LockModeError) console.log(err.key);
  }
  console.log(token, tokens, left, lost, reentered, n, s);
  await io.quit();

  // @ts-expect-error a token is a bigint, not a number
  const wrong: number = lock.token;
  // @ts-expect-error using needs a routine
  await io.using('key', 5000);
  // @ts-expect-error shared and permits exclude each other
  await io.acquire('key', { shared: true, permits: 1, limit: 2 });
  // @ts-expect-error permits need the semaphore's limit
  await io.acquire('key', { permits: 1 });
  // @ts-expect-error the client must be a redis client
  new Flock({});
  console.log(wrong);
}
