'use strict';

// The README's examples are the files in examples/: the README must show each file's code, and
// each file must run against a server with the module.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { promisify } = require('node:util');
const { it, before } = require('node:test');
const { startServer } = require('./helpers');

const ROOT = path.resolve(__dirname, '..');
const EXAMPLES = ['basic.mjs', 'several.mjs'];

let server;
before(async () => {
  server = await startServer();
});

const run = async (name) => {
  const { stdout } = await promisify(execFile)(process.execPath, [path.join(ROOT, 'examples', name)], {
    env: { ...process.env, REDIS_URL: server.url },
    timeout: 30000,
  });
  return stdout;
};

for (const name of EXAMPLES) {
  it(`the README shows examples/${name} verbatim`, () => {
    const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
    const code = fs.readFileSync(path.join(ROOT, 'examples', name), 'utf8');
    assert.ok(readme.includes('```js\n' + code + '```'), `README.md must contain examples/${name} in a \`\`\`js block`);
  });
}

it('examples/basic.mjs runs against a server and releases its lock', async () => {
  const stdout = await run('basic.mjs');
  assert.match(stdout, /^using returned 42$/m);
  const token = BigInt(/^fencing token (\d+)$/m.exec(stdout)[1]);
  assert.ok(token > BigInt(Number.MAX_SAFE_INTEGER));
  assert.equal(await server.info('invoice:42'), null);
  assert.equal(await server.probe.hget('invoice:42:row', 'status'), 'paid', 'the row was written through the lock');
});

it('examples/several.mjs runs against a server: a token per key, and every key released', async () => {
  const stdout = await run('several.mjs');
  const tokens = /^fencing tokens (\d+) (\d+)$/m.exec(stdout).slice(1).map(BigInt);
  assert.notEqual(tokens[0], tokens[1]);
  assert.match(stdout, /^moved 100$/m);
  for (const key of ['{transfer-7}:from', '{transfer-7}:to']) assert.equal(await server.info(key), null);
});
