import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SCRIPTS, SCRIPT_NAMES } from '../src/scripts.js';

const pkg = dirname(dirname(fileURLToPath(import.meta.url)));
const rsc = join(pkg, '..', '..', 'rsc');

// The SHA1s docs/protocol.md lists.
const SHAS = {
  ack: '1160a2e50b459d38b03200483a7d647b1cd309d2',
  append: '470b0882e66ce8ed32fbae76750110c2721c0f60',
  claim: 'f6052e57b9d79e694b9bf5a7a3099def00dadc79',
  dead_letter: '52db476d90e15e367e53d80c85c94bbf9c80f12f',
  read: '6408da3732ff8d55c4dae898bd012ef23308286d',
  reclaim: '9bb21f2418b621f05fd355dcb7af7cbcc0a596ea',
  start: 'bdaa44c4120d9f0e373b77879b84afebba290212',
};

test('script SHA1s are the documented ones', () => {
  for (const name of SCRIPT_NAMES) assert.equal(SCRIPTS[name].sha, SHAS[name], name);
});

test('lua/ and vectors/ are byte-identical to the Python package', (t) => {
  if (!existsSync(join(rsc, 'lua', 'member'))) {
    t.skip('../../rsc not present (installed package)');
    return;
  }
  const names = readdirSync(join(rsc, 'lua', 'member')).filter((n) => n.endsWith('.lua')).sort();
  assert.deepEqual(names, readdirSync(join(pkg, 'lua')).filter((n) => n.endsWith('.lua')).sort(),
    'the same scripts (npm run sync)');
  for (const name of names) {
    assert.ok(readFileSync(join(rsc, 'lua', 'member', name)).equals(readFileSync(join(pkg, 'lua', name))),
      `lua/${name} differs from rsc/lua/member/${name}: npm run sync`);
  }
  assert.ok(readFileSync(join(rsc, 'conformance', 'vectors', 'jump-v1.json'))
    .equals(readFileSync(join(pkg, 'vectors', 'jump-v1.json'))), 'vectors/jump-v1.json differs: npm run sync');
});
