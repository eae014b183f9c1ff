#!/usr/bin/env node
// `browser-ddp launch ...` and `browser-ddp start`: the launcher (torchrun) and the server of this
// package, from any project that depends on it, as `npm run launch` and `npm start` are inside the
// clone. Plain JavaScript: in an installed package it runs the built entry (lib/, which `npm pack`
// builds) with this Node; in a clone (a folder dependency, which has the TypeScript and tsx) it
// runs the TypeScript entry through tsx, so a stale lib/ there is never what runs.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { constants } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const entries = { launch: 'launcher/launch', start: 'signaling/main' };
const [command, ...args] = process.argv.slice(2);
if (!Object.hasOwn(entries, command ?? '')) {
  console.error(`usage: browser-ddp launch [launcher options] SCRIPT.ts [script args]   (as npm run launch -- ...)
       browser-ddp start [--https]                                   (as npm start)
got: ${command === undefined ? 'no command' : JSON.stringify(command)}`);
  process.exit(2);
}
const source = join(root, `${entries[command]}.ts`);
const built = join(root, 'lib', `${entries[command]}.js`);
let tsx;
try {
  tsx = existsSync(source) ? createRequire(join(root, 'package.json')).resolve('tsx/cli') : undefined;
} catch {
  tsx = undefined; // a clone without its devDependencies: the built entry, if there is one
}
if (!tsx && !existsSync(built)) {
  console.error(
    `browser-ddp ${command}: ${root} has neither ${built} nor tsx: build the package there (npm run build:lib), or run npm ci there`,
  );
  process.exit(1);
}
const argv = tsx ? [tsx, source, ...args] : [built, ...args];
const child = spawn(process.execPath, argv, { stdio: 'inherit' });
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => child.kill(signal));
// Killed by a signal: 128 + its number, as a shell reports it.
child.on('exit', (code, signal) => process.exit(code ?? (signal ? 128 + (constants.signals[signal] ?? 0) : 1)));
