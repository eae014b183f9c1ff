#!/usr/bin/env node
// `npm run build:lib` (and `npm pack`'s prepack): the package's JavaScript in lib/, from the
// TypeScript of src/ (the library, with its .d.ts), launcher/ and signaling/ (the `browser-ddp`
// command) and client/script/ (the page the launcher builds around a script), by tsc with
// tsconfig.build.json; then the files tsc does not copy that those modules load beside them.
import { spawnSync } from 'node:child_process';
import { cpSync, readdirSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const lib = join(root, 'lib');
// From scratch: a module deleted from the sources must not live on in the package.
rmSync(lib, { recursive: true, force: true });
const tsc = createRequire(join(root, 'package.json')).resolve('typescript/bin/tsc');
const built = spawnSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json')], { stdio: 'inherit' });
if (built.status !== 0) {
  console.error(`build:lib: tsc -p tsconfig.build.json failed (exit ${built.status ?? built.signal}): fix the errors above`);
  process.exit(1);
}
// The page's styles (client/**/*.css, imported by its modules) and the --lan delay line (launcher/lan.ts).
const copies = [
  ...readdirSync(join(root, 'client'), { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.css'))
    .map((f) => join('client', f)),
  join('launcher', 'lan_delay.py'),
];
for (const file of copies) cpSync(join(root, file), join(lib, file));
console.log(`build:lib: lib/ built (${copies.length} files copied beside the JavaScript)`);
