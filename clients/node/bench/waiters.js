// `make bench-clients`: one process's waiting promises through the Node client. Prints how many
// connections the waits add, the server memory per waiter (INFO used_memory once idle buffers
// shrank) and how long a holder takes to hear of FLOCK.FORCERELEASE. Arguments: port, waiters.
'use strict';
const Redis = require('ioredis');
const { Flock } = require('../src/index.js');
const port = Number(process.argv[2]), n = Number(process.argv[3]);
const info = async (r, section, field) => Number((await r.info(section)).split('\r\n').find(l => l.startsWith(field + ':')).split(':')[1]);
const sleep = ms => new Promise(r => setTimeout(r, ms));
async function settled(r) { await sleep(4000); let last = await info(r, 'memory', 'used_memory');
  for (let i = 0; i < 30; i++) { await sleep(500); const now = await info(r, 'memory', 'used_memory'); if (Math.abs(now - last) <= now / 1000) return now; last = now; } return last; }
(async () => {
  const admin = new Redis({ port });
  const redis = new Redis({ port });
  const flock = new Flock(redis);
  const holder = await flock.acquire('m', { wait: 0 });
  const c0 = await info(admin, 'clients', 'connected_clients');
  const m0 = await settled(admin);
  const waits = [];
  for (let i = 0; i < n; i++) waits.push(flock.acquire('m', { wait: 60000 }).then(l => l.release()));
  while ((await info(admin, 'everything', 'flock_waiters')) < n) await sleep(10);
  const c1 = await info(admin, 'clients', 'connected_clients');
  const m1 = await settled(admin);
  process.stdout.write(`| Node \`flock.acquire\` (promises) | ${n} | ${c1 - c0} | ${Math.round((m1 - m0) / n)} B |`);
  await holder.release();
  await Promise.all(waits);
  const f = await flock.acquire('f', { wait: 0 });
  const sent = process.hrtime.bigint();
  const heard = new Promise(r => f.signal.addEventListener('abort', () => r(process.hrtime.bigint())));
  await admin.call('FLOCK.FORCERELEASE', 'f');
  const at = await heard;
  console.log(` ${(Number(at - sent) / 1e6).toFixed(2)} ms |`);
  await flock.quit(); redis.disconnect(); admin.disconnect();
})();
