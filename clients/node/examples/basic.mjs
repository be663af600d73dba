import Redis from 'ioredis';
import { Flock } from 'redis-flock';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const flock = new Flock(redis);

// redlock's using(): held while the routine runs (it lives with the session, nothing to renew);
// `signal` aborts if it is lost.
const total = await flock.using('invoice:42', 5000, async (signal) => {
  if (signal.aborted) throw signal.error;
  return 42;
});
console.log(`using returned ${total}`);

// By hand: queue (FIFO) for up to 10 s; no lease given, so it lives with the session until release().
const lock = await flock.acquire('invoice:42', { wait: 10000, signal: AbortSignal.timeout(10000) });
try {
  // Hand the fencing token (a bigint) to the storage you write to, so it can refuse stale holders.
  console.log(`fencing token ${lock.token}`);
  // Data in Redis: runs only while this grant holds the lock (FLOCK.FENCED), else StaleTokenError.
  await lock.fenced(['HSET', 'invoice:42:row', 'status', 'paid']);
} finally {
  await lock.release();
}

await flock.quit();
redis.disconnect();
