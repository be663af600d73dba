// One process of the mixed fleet (test_mixed_fleet.py) on the Node client:
// TASKS async tasks take the keys at random with redis-flock over ioredis and
// log each request, grant and release through the fleet's script, until the
// script's answer to a request's log says the test has seen enough (or SECONDS
// pass). Prints its counts as one JSON line. NODE_PATH must hold
// clients/node/node_modules.
//
// node worker.js PORT SHA SECONDS TASKS KEY...
'use strict';
const path = require('node:path');
const Redis = require('ioredis');
const { Flock, LockBusyError } = require(path.resolve(__dirname, '../../../node/src/index.js'));

const [port, sha, seconds, tasks, ...keys] = process.argv.slice(2);
const who = `flock-node-${process.pid}`;
const counts = { side: 'flock (Node)', grants: 0, timeouts: 0, wrongtype: 0, errors: [] };
const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

async function main() {
  const redis = new Redis(Number(port), '127.0.0.1');
  const flock = new Flock(redis);
  // Answers 1 once the test has seen enough.
  const log = (key, what, delta) =>
    redis.evalsha(sha, 3, 'fleet:events', `fleet:occupancy:${key}`, 'fleet:stop', `${key} flock ${who} ${what}`, delta);
  const end = Date.now() + Number(seconds) * 1000;
  const task = async () => {
    while (Date.now() < end) {
      const key = keys[Math.floor(Math.random() * keys.length)];
      if ((await log(key, 'req', 0)) === 1) break;
      let lock;
      try {
        lock = await flock.acquire(key, { lease: 5000, wait: 10000 });
      } catch (e) {
        if (e instanceof LockBusyError) counts.timeouts += 1;
        else if (String(e.message).startsWith('WRONGTYPE')) counts.wrongtype += 1;
        else counts.errors.push(String(e));
        continue;
      }
      counts.grants += 1;
      await log(key, 'acq', 1);
      await sleep(1 + Math.random() * 2);
      await log(key, 'rel', -1);
      await lock.release();
      await sleep(Math.random() * 10);
    }
  };
  await Promise.all(Array.from({ length: Number(tasks) }, task));
  await flock.quit();
  redis.disconnect();
  console.log(JSON.stringify(counts));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
