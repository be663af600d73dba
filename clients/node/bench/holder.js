// The Node holder of clients/python/bench/knows_first.py (`make bench-clients`, who knows first):
//
//   node bench/holder.js PROXY-PORT MODE MS KEYS PREFIX
//
// holds KEYS locks through a Flock over an ioredis client whose every connection (Flock's own are
// its duplicates) goes through the partition proxy on PROXY-PORT: session grants with
// `sessionTimeoutMs` MS (MODE `session`), a fixed `lease` of MS (`lease`), or `sessions: false`
// with a `watchdogLease` of MS (`watchdog`). Each loss is the time `lock.signal`'s abort event ran
// (process.hrtime, which is CLOCK_MONOTONIC), with the LockLostError's reason; each local deadline
// is `lock.expiration` (ms since the epoch, the public API) read just after the cut and moved to
// the monotonic clock. Protocol: see knows_first.py.
'use strict';
const readline = require('node:readline');
const Redis = require('ioredis');
const { Flock } = require('../src/index.js');

const [proxyPort, mode, ms, keys, prefix] = [Number(process.argv[2]), process.argv[3], Number(process.argv[4]), Number(process.argv[5]), process.argv[6]];
const mono = () => Number(process.hrtime.bigint()) / 1e9;
const sleep = (t) => new Promise((resolve) => setTimeout(resolve, t));

(async () => {
  const settings = { session: { sessionTimeoutMs: ms }, lease: {}, watchdog: { sessions: false, watchdogLease: ms } }[mode];
  const redis = new Redis({ port: proxyPort });
  const flock = new Flock(redis, settings);
  const lost = {};
  const locks = [];
  for (let i = 0; i < keys; i++) {
    const key = `${prefix}:${i}`;
    const lock = await flock.acquire(key, mode === 'lease' ? { lease: ms, wait: 10000 } : { wait: 10000 });
    lock.signal.addEventListener('abort', () => (lost[key] = [mono(), lock.signal.reason?.reason ?? String(lock.signal.reason)]));
    locks.push([key, lock]);
  }
  console.log('held');
  const deadline = {};
  for await (const line of readline.createInterface({ input: process.stdin })) {
    if (line.trim() === 'cut') {
      // The grants' deadlines move no more: no reply gets through the proxy now.
      await sleep(5);
      for (const [key, lock] of locks) {
        const expiration = lock.expiration;
        if (expiration > 0) deadline[key] = mono() + (expiration - Date.now()) / 1000;
      }
    } else if (line.trim() === 'report') {
      console.log(JSON.stringify({ lost, deadline }));
      process.exit(0);
    }
  }
})().catch((err) => {
  console.error(err);
  process.exit(1);
});
