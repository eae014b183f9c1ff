/**
 * The launcher starts without TF.js: loading it took over a second of every `npm run launch`
 * (and of every e2e test that runs the command), for nothing the launcher does. The check walks
 * the launcher's static imports (type-only ones and import() left out: they load nothing at start).
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '..');

/** The modules a file loads when it loads: `import ... from`, `export ... from` and bare imports, not `import type`. */
function loadedSpecifiers(text: string): string[] {
  const statements = [...text.matchAll(/(?:^|\n)\s*(?:import|export)\s+(?!type\s)[^;'"]*?\sfrom\s*['"]([^'"]+)['"]/g)];
  const bare = [...text.matchAll(/(?:^|\n)\s*import\s*['"]([^'"]+)['"]/g)];
  return [...statements, ...bare].map((m) => m[1]!);
}

/** Every package the static import graph from `entry` reaches, with the chain that reaches it first. */
function packagesReached(entry: string): Map<string, string[]> {
  const packages = new Map<string, string[]>();
  const seen = new Set([entry]);
  const queue: string[][] = [[entry]];
  while (queue.length > 0) {
    const chain = queue.shift()!;
    const file = chain.at(-1)!;
    for (const spec of loadedSpecifiers(readFileSync(join(ROOT, file), 'utf8'))) {
      if (!spec.startsWith('.')) {
        if (!spec.startsWith('node:') && !packages.has(spec)) packages.set(spec, chain);
        continue;
      }
      const base = relative(ROOT, join(ROOT, dirname(file), spec));
      const target = [base, base.replace(/\.js$/, '.ts'), `${base}.ts`].find(
        (p) => existsSync(join(ROOT, p)) && statSync(join(ROOT, p)).isFile(),
      );
      if (!target || seen.has(target)) continue;
      seen.add(target);
      queue.push([...chain, target]);
    }
  }
  return packages;
}

describe('the launcher', () => {
  it('loads no TF.js at start', () => {
    const reached = packagesReached('launcher/launch.ts');
    // The walk sees packages at all: the launcher drives Chromium through playwright-core.
    expect([...reached.keys()]).toContain('playwright-core');
    const tf = [...reached].filter(([p]) => p.startsWith('@tensorflow/')).map(([p, chain]) => `${chain.join(' -> ')} -> ${p}`);
    expect(tf, 'the launcher imports TF.js through these (move what it needs into a module without TF.js)').toEqual([]);
  });
});
