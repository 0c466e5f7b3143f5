// The declarations in types/ are what the JSDoc of src/ generates now (npm run types).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

test('types/ is generated from the JSDoc of src/ (run npm run types after changing them)', () => {
  const out = mkdtempSync(join(tmpdir(), 'rsc-types-'));
  try {
    execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json',
      '--outDir', out], { cwd: root });
    const made = readdirSync(out).sort();
    assert.deepEqual(readdirSync(join(root, 'types')).sort(), made);
    for (const name of made) {
      assert.equal(readFileSync(join(root, 'types', name), 'utf8'), readFileSync(join(out, name), 'utf8'), name);
    }
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});
