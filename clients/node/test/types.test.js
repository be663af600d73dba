'use strict';

// index.d.ts is written by hand: it must compile a typed usage of both client libraries, and
// declare exactly what the package exports at run time.

const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { it } = require('node:test');

const ROOT = path.resolve(__dirname, '..');

it('tsc --noEmit accepts test/types/usage.ts (ioredis and node-redis clients, every call shape)', () => {
  const tsc = require.resolve('typescript/bin/tsc');
  execFileSync(process.execPath, [tsc, '-p', path.join(__dirname, 'types')], { cwd: ROOT, stdio: 'inherit' });
});

it('index.d.ts declares the names the package exports', () => {
  const declared = [...fs.readFileSync(path.join(ROOT, 'index.d.ts'), 'utf8').matchAll(/^export (?:class|const) (\w+)/gm)].map((m) => m[1]);
  const exported = Object.keys(require('..')).filter((name) => name !== 'default');
  assert.deepEqual(declared.sort(), exported.sort());
});

it('import finds every name that require() does (Node reads them from the CommonJS source)', async () => {
  const namespace = await import(require.resolve('..'));
  const exported = Object.keys(require('..'));
  assert.deepEqual(Object.keys(namespace).sort(), [...new Set([...exported, 'default'])].sort());
  for (const name of exported) assert.equal(namespace[name], require('..')[name], name);
});
