import Redis from 'ioredis';
import { Flock } from 'redis-flock';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const flock = new Flock(redis);

// Both accounts or neither, in one server call, queued FIFO at both for up to 10 s. The braces
// are a hash tag: in a Cluster the keys of one acquire must share a slot.
const accounts = ['{transfer-7}:from', '{transfer-7}:to'];
const lock = await flock.acquire(accounts, { wait: 10000 });
try {
  console.log(`fencing tokens ${accounts.map((key) => lock.tokens.get(key)).join(' ')}`);
} finally {
  await lock.release(); // every key, in one call
}

// Each acquire() is an owner of its own unless given one: one `owner` for all of a worker's
// acquires lets the server see a cycle of waits through them (it answers LockDeadlockError).
const owner = `worker-${process.pid}`;
const moved = await flock.using(accounts, { owner }, async (signal) => (signal.aborted ? 0 : 100));
console.log(`moved ${moved}`);

await flock.quit();
redis.disconnect();
