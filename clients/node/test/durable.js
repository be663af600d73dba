'use strict';

// What the durable-grant test files share (docs/client-protocol.md, "Durable grants"): a master
// with one replica, Flocks asking for 0, 1 and 2 replicas, and the check of a NOTDURABLE failure.

const assert = require('node:assert/strict');
const { before } = require('node:test');
const { LockNotDurableError } = require('..');
const { eachClient, flockOf, startReplicated } = require('./helpers');

// How long a grant waits for replicas that are not there (a cost of every failing case), and so
// for the one replica's acknowledgement: with every core of the machine busy, 200 ms was once
// too short for it (the error said 0 of 2 replicas, not 1).
const TIMEOUT = 500;

/** A master with one replica, in sync, started before the file's tests: `{ master, replica }`. */
function replicatedServers() {
  const servers = {};
  before(async () => {
    [servers.master, servers.replica] = await startReplicated(1);
  });
  return servers;
}

/** Flocks of `kind` on `port`: plain, one (durableReplicas 1) and two (2, of which there is 1). */
async function durableFlocks(kind, port) {
  return {
    plain: await flockOf(kind, port),
    one: await flockOf(kind, port, { durableReplicas: 1, durableTimeout: 2000 }),
    two: await flockOf(kind, port, { durableReplicas: 2, durableTimeout: TIMEOUT }),
  };
}

/**
 * `eachClient`, with the client's durableFlocks on `servers.master`, made before its tests: `body(kind,
 * K, flocks)` declares them.
 */
function eachDurableClient(servers, body) {
  eachClient((kind, K) => {
    const flocks = {};
    before(async () => {
      Object.assign(flocks, await durableFlocks(kind, servers.master.port));
    });
    body(kind, K, flocks);
  });
}

/** Asserts `promise` rejects with NOTDURABLE for `key` (1 of 2 replicas) after about TIMEOUT ms. */
async function rejectsNotDurable(promise, key, since = Date.now()) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof LockNotDurableError, `LockNotDurableError, got ${err.stack}`);
    assert.equal(err.code, 'NOTDURABLE');
    assert.equal(err.key, key);
    assert.equal(err.reached, 1);
    assert.equal(err.replicas, 2);
    assert.match(err.message, /1 of 2 replica/);
    return true;
  });
  const took = Date.now() - since;
  assert.ok(took >= TIMEOUT - 20 && took < TIMEOUT + 2000, `failed after ${took} ms (durableTimeout ${TIMEOUT})`);
}

module.exports = { TIMEOUT, eachDurableClient, rejectsNotDurable, replicatedServers };
