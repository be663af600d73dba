// `make bench-clients`: what the Node client costs a caller, against what it replaces.
//
//   node bench/overhead.js PORT pairs REDLOCK_DIR   uncontended acquire + release through the
//       public API, one async loop, one lock, side by side with node-redlock (the `redlock` package,
//       v5, installed by scripts/bench-clients.sh into REDLOCK_DIR) in the same run, both over one
//       ioredis client of the same server: p50 and p99 of a pair
//   node bench/overhead.js PORT grants   8 async loops taking one lock in turn, each holding it
//       100 us (busy: a timer cannot wait less than 1 ms, and a loop that holds the event loop is
//       what a CPU-bound critical section does) then releasing, for BENCH_SECONDS: grants/s through
//       Flock against the same loops sending the raw FLOCK commands, each blocking on an ioredis
//       connection of its own (in rounds taken in turn)
//
// Prints Markdown table rows (the headers are scripts/bench-clients.sh's). BENCH_PAIRS (2000),
// BENCH_SECONDS (3) and BENCH_WORKERS (8) in the environment change the sizes.
'use strict';
const path = require('node:path');
const Redis = require('ioredis');
const { Flock } = require('../src/index.js');

const PAIRS = Number(process.env.BENCH_PAIRS ?? 2000);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 3);
const LOOPS = Number(process.env.BENCH_WORKERS ?? 8);
const HOLD_NS = 100000n;
// The pairs are timed in blocks that alternate between the two locks, so that a burst of load on
// the shared machine falls on both alike.
const BLOCK = 100;
// Enough pairs for V8 to have compiled both paths (200 left the first blocks 2x slower).
const WARMUP = 3000;
// The contended seconds are taken in this many rounds of each way, in turn.
const ROUNDS = 6;

const quantile = (samples, q) => {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
};
const ms = (ns) => Number(ns) / 1e6;

async function pairs(port, redlockDir) {
  const { default: Redlock } = require(path.resolve(redlockDir, 'node_modules/redlock'));
  const redis = new Redis({ port });
  // Each as its README shows it: new Flock(redis).acquire(key) (a session grant: FLOCK.ACQUIRE ...
  // WAIT 2000 INBOX sid, then FLOCK.RELEASE), and new Redlock([redis]).acquire([key], 30000) (a
  // Lua SET NX PX, a Lua compare-and-delete).
  const flock = new Flock(redis);
  const redlock = new Redlock([redis]);
  const pair = {
    flock: async () => (await flock.acquire('pairs:flock')).release(),
    redlock: async () => (await redlock.acquire(['pairs:redlock'], 30000)).release(),
  };
  const times = { flock: [], redlock: [] };
  const block = async (name, n, record = true) => {
    for (let i = 0; i < n; i++) {
      const start = process.hrtime.bigint();
      await pair[name]();
      if (record) times[name].push(ms(process.hrtime.bigint() - start));
    }
  };
  for (const name of Object.keys(pair)) await block(name, WARMUP, false);
  for (let i = 0; i < PAIRS / BLOCK; i++) {
    for (const name of i % 2 === 0 ? ['flock', 'redlock'] : ['redlock', 'flock']) await block(name, BLOCK);
  }
  const [f50, f99, o50, o99] = [quantile(times.flock, 0.5), quantile(times.flock, 0.99), quantile(times.redlock, 0.5), quantile(times.redlock, 0.99)];
  console.log(
    `| Node \`Flock\` (ioredis) | node-redlock \`redlock\` ${require(path.resolve(redlockDir, 'node_modules/redlock/package.json')).version.replace(/^v/, '')} ` +
      `| ${times.flock.length} | ${f50.toFixed(3)} | ${f99.toFixed(3)} | ${o50.toFixed(3)} | ${o99.toFixed(3)} | ${(f50 / o50).toFixed(2)}x | ${(f99 / o99).toFixed(2)}x |`,
  );
  await flock.quit();
  redis.disconnect();
}

function busy(ns) {
  const until = process.hrtime.bigint() + ns;
  while (process.hrtime.bigint() < until);
}

// Runs LOOPS loops of `take(i)` (resolving to a release function) for `seconds`, counted into
// `tally` ({ grants: per loop, elapsed: s }).
async function contended(take, seconds, tally) {
  let stop = false;
  const loop = async (i) => {
    while (!stop) {
      const release = await take(i);
      busy(HOLD_NS);
      tally.grants[i]++;
      await release();
    }
  };
  const start = process.hrtime.bigint();
  const loops = Array.from({ length: LOOPS }, (_, i) => loop(i));
  await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  stop = true;
  tally.elapsed += Number(process.hrtime.bigint() - start) / 1e9;
  await Promise.all(loops);
}

async function grants(port) {
  const conns = Array.from({ length: LOOPS }, () => new Redis({ port }));
  const redis = new Redis({ port });
  const flock = new Flock(redis);
  const ways = {
    raw: async (i) => {
      const owner = `raw-${i}`;
      await conns[i].call('FLOCK.ACQUIRE', 'grants:raw', owner, '30000', 'WAIT', '0');
      return () => conns[i].call('FLOCK.RELEASE', 'grants:raw', owner);
    },
    flock: async () => {
      const lock = await flock.acquire('grants:flock', { wait: Infinity });
      return () => lock.release();
    },
  };
  const tally = () => ({ grants: new Array(LOOPS).fill(0), elapsed: 0 });
  const tallies = { raw: tally(), flock: tally() };
  // A warm-up round of each (connections, the session, V8's compiling), then rounds taken in
  // turn, so that a burst of load on the shared machine falls on both alike.
  for (const take of Object.values(ways)) await contended(take, 0.5, tally());
  for (let r = 0; r < ROUNDS; r++) {
    for (const name of r % 2 === 0 ? ['raw', 'flock'] : ['flock', 'raw']) await contended(ways[name], SECONDS / ROUNDS, tallies[name]);
  }
  const rate = (t) => t.grants.reduce((a, b) => a + b, 0) / t.elapsed;
  const [raw, api] = [rate(tallies.raw), rate(tallies.flock)];
  console.log(
    `| Node \`Flock\` (ioredis) | ${LOOPS} async loops | 100 us busy | ${raw.toFixed(0)} | ${api.toFixed(0)} | ${(api / raw).toFixed(2)}x ` +
      `| ${Math.min(...tallies.flock.grants)}-${Math.max(...tallies.flock.grants)} |`,
  );
  await flock.quit();
  redis.disconnect();
  for (const c of conns) c.disconnect();
}

(async () => {
  const port = Number(process.argv[2]);
  const what = process.argv[3];
  if (what === 'pairs') await pairs(port, process.argv[4]);
  else if (what === 'grants') await grants(port);
  else throw new Error(`unknown measurement ${what}: pairs or grants`);
})().catch((err) => {
  console.error(err);
  process.exit(1);
});
