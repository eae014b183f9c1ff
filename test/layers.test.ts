/**
 * The house's layers, checked on the sources: the library (`src/`) depends on no application;
 * the launcher and the server share types with the pages through `src/` (the job contract),
 * never by importing `client/`. `signaling/main.ts` (the `npm start` command, a composition
 * root) is the one file allowed to read the page's link format.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '..');

function sources(dir: string): string[] {
  return readdirSync(join(ROOT, dir)).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(join(ROOT, path)).isDirectory()) return sources(path);
    return /\.(ts|mjs)$/.test(name) ? [path] : [];
  });
}

/** Each import of a file that reaches into one of `folders`, as "file -> specifier". */
function importsInto(dir: string, folders: string[], except: string[] = []): string[] {
  return sources(dir)
    .filter((f) => !except.includes(f))
    .flatMap((file) => {
      const text = readFileSync(join(ROOT, file), 'utf8');
      return [...text.matchAll(/(?:import|export)[^'"]*?from\s+'([^']+)'/g)]
        .map((m) => m[1]!)
        .filter((spec) => spec.startsWith('.') && folders.some((f) => relative(ROOT, join(ROOT, file, '..', spec)).startsWith(`${f}/`)))
        .map((spec) => `${file} -> ${spec}`);
    });
}

describe('layers', () => {
  it('src/ imports nothing from the applications (client, launcher, signaling)', () => {
    expect(importsInto('src', ['client', 'launcher', 'signaling'])).toEqual([]);
  });

  it('the launcher imports nothing from client/: the page reports and results it reads are typed in src/', () => {
    expect(importsInto('launcher', ['client'])).toEqual([]);
  });

  it('the server imports nothing from the launcher or the pages (but its npm start command, for the link it prints)', () => {
    expect(importsInto('signaling', ['client', 'launcher'], ['signaling/main.ts'])).toEqual([]);
  });

  it('the check sees imports (it would catch one)', () => {
    expect(importsInto('client', ['src']).length).toBeGreaterThan(0);
  });
});
