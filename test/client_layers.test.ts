/**
 * The page's layers, checked on the sources (as layers.test.ts does for src/, launcher/ and
 * signaling/): the pages (composition roots: `client/pages/`, and `client/script/`, the page a
 * user's script runs in) -> `client/ui/` -> `client/train/` and `client/jobs/` -> the page's own
 * helpers (`client/*.ts`: reports, tokens, WebGPU, device hooks, the user agent) -> `src/`.
 * The training job never imports the dashboard or a page, and no client/ file imports itself
 * back through others.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '..');

function sources(dir: string): string[] {
  return readdirSync(join(ROOT, dir)).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(join(ROOT, path)).isDirectory()) return sources(path);
    return /\.ts$/.test(name) ? [path] : [];
  });
}

interface Edge {
  from: string;
  /** The imported file, relative to the repository root. */
  to: string;
  /** `import type` / `export type`: erased, no module is loaded. */
  typeOnly: boolean;
}

/** Each relative import of `file`: `import ... from`, `export ... from`, `import '...'` and `import('...')`. */
function importsOf(file: string): Edge[] {
  const text = readFileSync(join(ROOT, file), 'utf8');
  const found = [
    ...[...text.matchAll(/(?:^|[\s;])(import|export)\s+(type\s)?[^'";]*?from\s*'([^']+)'/g)].map((m) => ({
      spec: m[3]!,
      typeOnly: m[2] !== undefined,
    })),
    ...[...text.matchAll(/(?:^|[\s;])import\s*'([^']+)'/g)].map((m) => ({ spec: m[1]!, typeOnly: false })),
    ...[...text.matchAll(/\bimport\(\s*'([^']+)'\s*\)/g)].map((m) => ({ spec: m[1]!, typeOnly: false })),
  ];
  return found
    .filter(({ spec }) => spec.startsWith('.'))
    .map(({ spec, typeOnly }) => ({ from: file, to: relative(ROOT, join(ROOT, dirname(file), spec)), typeOnly }));
}

const FILES = sources('client');
const EDGES = FILES.flatMap(importsOf);

/** The layer a client/ file is in: its folder, or `client` for the files directly in client/. */
function folderOf(file: string): string {
  const parts = file.split('/');
  if (parts[0] !== 'client') return parts[0]!;
  return parts.length === 2 ? 'client' : `client/${parts[1]}`;
}

/** Higher imports lower, never the other way, nor across one level. */
const LEVEL: Record<string, number> = {
  'client/script': 5,
  'client/pages': 4,
  'client/ui': 3,
  'client/train': 2,
  'client/jobs': 2,
  client: 1,
  src: 0,
};

/** A cycle among `nodes` as the path that closes it ("a -> b -> a"), or each one found (depth first). */
function cycles(nodes: readonly string[], next: (node: string) => readonly string[]): string[] {
  const state = new Map<string, 'open' | 'done'>();
  const path: string[] = [];
  const found: string[] = [];
  const visit = (node: string): void => {
    state.set(node, 'open');
    path.push(node);
    for (const to of next(node)) {
      if (state.get(to) === 'open') found.push([...path.slice(path.indexOf(to)), to].join(' -> '));
      else if (!state.has(to)) visit(to);
    }
    path.pop();
    state.set(node, 'done');
  };
  for (const node of nodes) if (!state.has(node)) visit(node);
  return found;
}

const show = (e: Edge) => `${e.from} -> ${e.to}${e.typeOnly ? ' (type)' : ''}`;

describe('client layers', () => {
  it('client/train imports neither the dashboard (client/ui) nor a page', () => {
    const up = EDGES.filter(
      (e) => folderOf(e.from) === 'client/train' && ['client/ui', 'client/pages', 'client/script'].includes(folderOf(e.to)),
    );
    expect(up.map(show)).toEqual([]);
  });

  it('client/ui reads client/train only for types', () => {
    const values = EDGES.filter((e) => folderOf(e.from) === 'client/ui' && folderOf(e.to) === 'client/train' && !e.typeOnly);
    expect(values.map(show)).toEqual([]);
  });

  it('each folder of client/ imports only the layers below it', () => {
    const wrong = EDGES.filter((e) => {
      const from = LEVEL[folderOf(e.from)];
      const to = LEVEL[folderOf(e.to)];
      return folderOf(e.from) !== folderOf(e.to) && (from === undefined || to === undefined || to >= from);
    });
    expect(wrong.map(show)).toEqual([]);
  });

  it('no client/ file imports itself back, through any chain of imports (types included)', () => {
    const next = (file: string) => EDGES.filter((e) => e.from === file && FILES.includes(e.to)).map((e) => e.to);
    expect(cycles(FILES, next)).toEqual([]);
  });

  it('the checks see imports (they would catch one)', () => {
    // Every kind of import is read: a static one, a type-only one, a style sheet's, a dynamic one.
    expect(EDGES.some((e) => e.from === 'client/pages/main.ts' && e.to === 'client/pages/train_page.ts')).toBe(true);
    expect(EDGES.some((e) => e.from === 'client/ui/dashboard.ts' && e.to === 'client/train/events.ts' && e.typeOnly)).toBe(true);
    expect(EDGES.some((e) => e.from === 'client/pages/main.ts' && e.to === 'client/style.css')).toBe(true);
    expect(EDGES.some((e) => e.from === 'client/train/trainer.ts' && e.to === 'client/train/pipeline_trainer.ts')).toBe(true);
    const graph: Record<string, string[]> = { a: ['b'], b: ['c'], c: ['a'], d: ['a'] };
    expect(cycles(Object.keys(graph), (n) => graph[n] ?? [])).toEqual(['a -> b -> c -> a']);
  });
});
