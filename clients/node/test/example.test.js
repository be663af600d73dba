'use strict';

// The README's example is examples/basic.mjs: the README must show that file's code, and the
// file must run against a server with the module.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { promisify } = require('node:util');
const { it, before } = require('node:test');
const { startServer } = require('./helpers');

const ROOT = path.resolve(__dirname, '..');
const EXAMPLE = path.join(ROOT, 'examples', 'basic.mjs');

let server;
before(async () => {
  server = await startServer();
});

it('the README shows examples/basic.mjs verbatim', () => {
  const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
  const code = fs.readFileSync(EXAMPLE, 'utf8');
  assert.ok(readme.includes('```js\n' + code + '```'), 'README.md must contain examples/basic.mjs in a ```js block');
});

it('examples/basic.mjs runs against a server and releases its lock', async () => {
  const { stdout } = await promisify(execFile)(process.execPath, [EXAMPLE], {
    env: { ...process.env, REDIS_URL: server.url },
    timeout: 30000,
  });
  assert.match(stdout, /^using returned 42$/m);
  const token = BigInt(/^fencing token (\d+)$/m.exec(stdout)[1]);
  assert.ok(token > BigInt(Number.MAX_SAFE_INTEGER));
  assert.equal(await server.info('invoice:42'), null);
});
