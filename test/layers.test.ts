/**
 * The house's layers, checked on the sources: the library (`src/`) depends on no application;
 * the launcher and the server share types with the pages through `src/` (the job contract),
 * never by importing `client/`. `signaling/main.ts` (the `npm start` command, a composition
 * root) is the one file allowed to read the page's link format. Inside `src/` the folders stand
 * on floors (FLOORS, docs/library.md): a file imports only from its own floor or lower. No
 * import cycle anywhere, and no source file over MAX_FILE_LINES lines.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
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

/** src/'s folders, bottom floor first; src/index.ts stands above them all. */
const FLOORS = ['wire', 'runtime', 'transport', 'c10d', 'datasets', 'nn', 'checkpoint', 'rpc', 'elastic', 'parallel', 'jobs'] as const;
/** The code the cycle check reads. */
const APPS = ['src', 'client', 'launcher', 'signaling'];
/** Where the length check looks (tests exempt), and what it leaves out. */
const LENGTH_DIRS = ['src', 'client', 'launcher', 'signaling', 'examples', 'scripts', 'bench'];
const LENGTH_EXEMPT = ['bench/results/'];
const MAX_FILE_LINES = 500;

/** Every module a file's text names: static imports and re-exports, side-effect imports, import() (types included). */
function specifiers(text: string): string[] {
  const patterns = [
    /(?:^|[\s;])(?:import|export)\s[^'"]*?from\s*['"]([^'"]+)['"]/g,
    /\bimport\s*\(\s*['"]([^'"]+)['"]\s*\)/g,
    /^\s*import\s*['"]([^'"]+)['"]/gm,
  ];
  return patterns.flatMap((re) => [...text.matchAll(re)].map((m) => m[1]!));
}

/** The repository file a relative specifier of `file` names (undefined: a package, or nothing there). */
function resolveImport(file: string, spec: string): string | undefined {
  if (!spec.startsWith('.')) return undefined;
  const base = relative(ROOT, join(ROOT, dirname(file), spec));
  return [base, base.replace(/\.js$/, '.ts'), `${base}.ts`, join(base, 'index.ts')].find(
    (p) => existsSync(join(ROOT, p)) && statSync(join(ROOT, p)).isFile(),
  );
}

/** file -> the repository files it imports, for the code under `dirs` (declaration files left out). */
function importGraph(dirs: string[]): Map<string, string[]> {
  const files = dirs.flatMap((d) => sources(d)).filter((f) => !f.endsWith('.d.ts'));
  return new Map(
    files.map((f) => [f, [...new Set(specifiers(readFileSync(join(ROOT, f), 'utf8')).flatMap((s) => resolveImport(f, s) ?? []))]]),
  );
}

/** A src/ file's floor: its folder's place in `floors`, the files at src/'s top (index.ts, its namespaces, the deprecated aliases) above them all; undefined for a folder without one. */
function floorOf(file: string, floors: readonly string[]): number | undefined {
  const parts = file.split('/');
  if (parts.length === 2) return floors.length; // the public surface: index.ts, its namespaces, the deprecated aliases
  const at = floors.indexOf(parts[1]!);
  return at < 0 ? undefined : at;
}

/** Each import inside src/ that points up a floor (or from a file with no floor), as "file (floor) -> target (floor)". */
function upwardImports(graph: Map<string, string[]>, floors: readonly string[]): string[] {
  const name = (f: string) => `${f} (${f.split('/').length === 2 ? 'top' : (f.split('/')[1] ?? '?')})`;
  return [...graph].flatMap(([file, targets]) => {
    if (!file.startsWith('src/')) return [];
    const mine = floorOf(file, floors);
    if (mine === undefined) return [`${file}: its folder has no floor in FLOORS`];
    return targets
      .filter((t) => t.startsWith('src/') && (floorOf(t, floors) ?? Number.POSITIVE_INFINITY) > mine)
      .map((t) => `${name(file)} -> ${name(t)}`);
  });
}

/** Every import cycle, one per strongly connected component (Tarjan's), as "a -> b -> ... -> a". */
function importCycles(graph: Map<string, string[]>): string[] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const cycles: string[] = [];
  const visit = (v: string) => {
    index.set(v, index.size);
    low.set(v, index.get(v)!);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const component: string[] = [];
    let w: string;
    do {
      w = stack.pop()!;
      onStack.delete(w);
      component.push(w);
    } while (w !== v);
    if (component.length > 1 || (graph.get(v) ?? []).includes(v)) cycles.push(cycleThrough(graph, new Set(component), v));
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return cycles;
}

/** One cycle from `start` back to it inside `component` (a breadth-first search), for the message. */
function cycleThrough(graph: Map<string, string[]>, component: Set<string>, start: string): string {
  const previous = new Map<string, string>();
  const queue = [start];
  while (queue.length > 0) {
    const v = queue.shift()!;
    for (const w of graph.get(v) ?? []) {
      if (!component.has(w) || previous.has(w)) continue;
      previous.set(w, v);
      if (w === start) {
        const path: string[] = [];
        for (let at = v; at !== start; at = previous.get(at)!) path.unshift(at);
        return [start, ...path, start].join(' -> ');
      }
      queue.push(w);
    }
  }
  return [...component].join(' <-> ');
}

/** Source files over `max` lines, as "file: N lines". */
function longFiles(max: number): string[] {
  return LENGTH_DIRS.filter((d) => existsSync(join(ROOT, d)))
    .flatMap((d) => sources(d))
    .filter((f) => !LENGTH_EXEMPT.some((x) => f.startsWith(x)))
    .map((f) => [f, readFileSync(join(ROOT, f), 'utf8').split('\n').length] as const)
    .filter(([, n]) => n > max)
    .map(([f, n]) => `${f}: ${n} lines`);
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

  it('src/ stands on floors (FLOORS, bottom first): each import points to its own floor or lower', () => {
    expect(upwardImports(importGraph(['src']), FLOORS)).toEqual([]);
    // Every folder of src/ has a floor (src/types holds declarations only).
    const folders = readdirSync(join(ROOT, 'src')).filter((n) => statSync(join(ROOT, 'src', n)).isDirectory() && n !== 'types');
    expect(folders.filter((f) => !(FLOORS as readonly string[]).includes(f))).toEqual([]);
  });

  it('the floor check sees imports (the floors upside down, it would catch one)', () => {
    expect(upwardImports(importGraph(['src']), [...FLOORS].reverse()).length).toBeGreaterThan(0);
  });

  it('no import cycle anywhere (src, client, launcher, signaling)', () => {
    expect(importCycles(importGraph(APPS))).toEqual([]);
  });

  it('the cycle check sees cycles (a circle of three files, and one turned back in the real graph)', () => {
    const circle = new Map([
      ['a.ts', ['b.ts']],
      ['b.ts', ['c.ts']],
      ['c.ts', ['a.ts']],
      ['d.ts', ['a.ts']],
    ]);
    expect(importCycles(circle)).toEqual(['a.ts -> b.ts -> c.ts -> a.ts']);
    const graph = importGraph(APPS);
    const before = importCycles(graph).length;
    // A file of the real graph that imports one file only, which imports nothing: made to import it back.
    const [from, [target]] = [...graph].find(([, t]) => t.length === 1 && graph.get(t[0]!)?.length === 0)! as [string, string[]];
    graph.set(target!, [from]);
    const after = importCycles(graph);
    expect(after).toHaveLength(before + 1);
    expect(after.filter((c) => c.includes(from) && c.includes(target!))).toHaveLength(1);
  });

  it(`no source file over ${MAX_FILE_LINES} lines (tests exempt)`, () => {
    expect(longFiles(MAX_FILE_LINES)).toEqual([]);
  });

  it('the length check reads the files (at a tenth of the limit, it would catch some)', () => {
    expect(longFiles(MAX_FILE_LINES / 10).length).toBeGreaterThan(0);
  });
});
