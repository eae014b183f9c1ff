#!/usr/bin/env node
// `browser-ddp launch ...` and `browser-ddp start`: the launcher (torchrun) and the server of this
// package, from any project that depends on it (`npm install /path/to/browser-ddp`), as
// `npm run launch` and `npm start` are inside the clone. Plain JavaScript: it only starts tsx on
// the TypeScript entry, from the package's own folder (a symlinked dependency resolves to it).
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const entries = { launch: 'launcher/launch.ts', start: 'signaling/main.ts' };
const [command, ...args] = process.argv.slice(2);
if (!Object.hasOwn(entries, command ?? '')) {
  console.error(`usage: browser-ddp launch [launcher options] SCRIPT.ts [script args]   (as npm run launch -- ...)
       browser-ddp start [--https]                                   (as npm start)
got: ${command === undefined ? 'no command' : JSON.stringify(command)}`);
  process.exit(2);
}
let tsx;
try {
  tsx = createRequire(join(root, 'package.json')).resolve('tsx/cli');
} catch {
  console.error(`browser-ddp ${command}: tsx is not installed in ${root}: run npm ci there (depend on the package by its folder, npm install /path/to/browser-ddp)`);
  process.exit(1);
}
const child = spawn(process.execPath, [tsx, join(root, entries[command]), ...args], { stdio: 'inherit' });
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => child.kill(signal));
child.on('exit', (code, signal) => process.exit(code ?? (signal ? 128 : 1)));
