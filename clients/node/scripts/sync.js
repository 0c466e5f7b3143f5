#!/usr/bin/env node
// Copies the data-plane scripts and the shared routing vectors from the Python package
// (../../rsc) into this package, byte for byte. Run after a script or the vectors change.
import { copyFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const rsc = join(here, '..', '..', 'rsc');
const luaDir = join(rsc, 'lua', 'member');
for (const name of readdirSync(luaDir).filter((n) => n.endsWith('.lua')).sort()) {
  copyFileSync(join(luaDir, name), join(here, 'lua', name));
  console.log(`lua/${name}`);
}
copyFileSync(join(rsc, 'conformance', 'vectors', 'jump-v1.json'), join(here, 'vectors', 'jump-v1.json'));
console.log('vectors/jump-v1.json');
