/**
 * The package as a user gets it: `npm pack` (its prepack builds lib/ and the page), the tarball
 * installed into a fresh project, then used there: imported from plain Node, type-checked by tsc,
 * bundled into a Vite page, and `npx browser-ddp launch` running a script of that project on 2
 * ranks. Offline: the tarball is unpacked into node_modules/browser-ddp, as npm does, and only its
 * declared dependencies are linked in from this clone's node_modules, so an undeclared one fails.
 * The pack runs in a copy of the clone's files, so this clone's own dist/ and lib/ are untouched.
 */
import { execFile } from 'node:child_process';
import { chmod, cp, mkdir, mkdtemp, readdir, readFile, realpath, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { PROJECT_ROOT } from '../signaling/server.ts';

const run = promisify(execFile);
/**
 * Runs a command; on failure the error carries its output, so the assertion shows why. The builds
 * (`niced`) run at a lower priority: vitest runs other files beside this one, some timing heartbeats.
 */
async function sh(cmd: string, args: string[], cwd: string, timeout: number, niced = false): Promise<string> {
  if (niced) [cmd, args] = ['nice', ['-n', '10', cmd, ...args]];
  try {
    const { stdout, stderr } = await run(cmd, args, {
      cwd,
      timeout,
      maxBuffer: 64 << 20,
      env: { ...process.env, npm_config_update_notifier: 'false' },
    });
    return stdout + stderr;
  } catch (e) {
    const { stdout = '', stderr = '', message } = e as { stdout?: string; stderr?: string; message: string };
    throw new Error(`${cmd} ${args.join(' ')} in ${cwd} failed: ${message}\n${stdout}\n${stderr}`);
  }
}

interface PackageJson {
  name: string;
  bin?: Record<string, string>;
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
}

let work: string;
let tarball: string;
let files: string[];
let app: string;

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), 'ddp-package-'));
  // The clone's files as git sees them (tracked, and new ones not ignored): what CI's clone holds.
  const clone = join(work, 'clone');
  const listed = (await sh('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], PROJECT_ROOT, 30_000))
    .split('\0')
    .filter(Boolean);
  for (const file of listed) {
    if (file === 'node_modules' || !existsSync(join(PROJECT_ROOT, file))) continue;
    await mkdir(dirname(join(clone, file)), { recursive: true });
    await cp(join(PROJECT_ROOT, file), join(clone, file));
  }
  await symlink(await realpath(join(PROJECT_ROOT, 'node_modules')), join(clone, 'node_modules'));
  await sh('npm', ['pack', '--pack-destination', work], clone, 240_000, true);
  const pkg = JSON.parse(await readFile(join(clone, 'package.json'), 'utf8')) as { name: string; version: string };
  tarball = join(work, `${pkg.name}-${pkg.version}.tgz`);
  files = (await sh('tar', ['-tzf', tarball], work, 30_000))
    .split('\n')
    .filter(Boolean)
    .map((f) => f.replace(/^package\//, ''));

  // The fresh project: the tarball unpacked as npm installs it, its bin linked, its dependencies (only those) from this clone.
  app = join(work, 'app');
  const installed = join(app, 'node_modules', 'browser-ddp');
  await mkdir(installed, { recursive: true });
  await sh('tar', ['-xzf', tarball, '-C', installed, '--strip-components=1'], work, 30_000);
  const manifest = JSON.parse(await readFile(join(installed, 'package.json'), 'utf8')) as PackageJson;
  for (const dep of Object.keys({ ...manifest.dependencies, ...manifest.optionalDependencies })) {
    const from = join(PROJECT_ROOT, 'node_modules', dep);
    if (!existsSync(from)) throw new Error(`dependency ${dep} is not in this clone's node_modules: run npm ci`);
    await mkdir(dirname(join(app, 'node_modules', dep)), { recursive: true });
    await symlink(await realpath(from), join(app, 'node_modules', dep));
  }
  await mkdir(join(app, 'node_modules', '.bin'));
  for (const [name, file] of Object.entries(manifest.bin ?? {})) {
    await chmod(join(installed, file), 0o755);
    await symlink(join('..', 'browser-ddp', file), join(app, 'node_modules', '.bin', name));
  }
  await writeFile(
    join(app, 'package.json'),
    JSON.stringify({ name: 'app', private: true, type: 'module', dependencies: { 'browser-ddp': `file:${tarball}` } }),
  );
}, 300_000);

afterAll(async () => {
  if (work) await rm(work, { recursive: true, force: true });
});

describe('the package from npm pack', () => {
  test('ships the built library, its types, the launcher and the page; no tests, benches or TypeScript sources', async () => {
    const { size } = await stat(tarball);
    console.log(`npm pack: ${files.length} files, ${(size / 1e6).toFixed(2)} MB`);
    for (const f of [
      'package.json',
      'lib/src/index.js',
      'lib/src/index.d.ts',
      'lib/src/parallel/data_parallel/worker.js',
      'lib/launcher/launch.js',
      'lib/signaling/main.js',
      'lib/client/script/harness.js',
      'launcher/bin.mjs',
      'dist/index.html',
    ]) {
      expect(files, f).toContain(f);
    }
    const unwanted = files.filter(
      (f) => /^(test|bench|examples|docs|\.ci)\//.test(f) || (f.endsWith('.ts') && !f.endsWith('.d.ts')) || f.startsWith('dist/scripts/'),
    );
    expect(unwanted).toEqual([]);
    // The prebuilt page (TF.js and its wasm binaries) is most of it; the library's JavaScript a few hundred kB.
    expect(size).toBeLessThan(2_500_000);
    // One module per concept (files under 500 lines) makes many small files: a bound that catches a stray folder.
    expect(files.length).toBeLessThan(600);
  }, 10_000);

  test('imports in plain Node', async () => {
    // The namespaces and the deprecated aliases of the names that moved into them (test/public_surface.test.ts) survive the build.
    const code = `import { DistributedSampler, initProcessGroup, util, Mt19937, TCPStore, StoreClient } from 'browser-ddp';
const s = new DistributedSampler(10, { numReplicas: 2, rank: 1, shuffle: false });
console.log(JSON.stringify({ indices: [...s], init: typeof initProcessGroup, alias: Mt19937 === util.Mt19937 && typeof Mt19937 === 'function', tcp: TCPStore === StoreClient }));`;
    const out = await sh(process.execPath, ['--input-type=module', '-e', code], app, 60_000);
    expect(JSON.parse(out.trim().split('\n').at(-1)!)).toEqual({ indices: [1, 3, 5, 7, 9], init: 'function', alias: true, tcp: true });
  }, 70_000);

  test('its types resolve for tsc, and its own declarations check strictly (skipLibCheck off)', async () => {
    await writeFile(
      join(app, 'typed.ts'),
      `import { DistributedSampler, wire, type HalfDtype, type LaunchContext } from 'browser-ddp';
export function indices(ctx: LaunchContext): number[] {
  return [...new DistributedSampler(100, { numReplicas: ctx.nproc, rank: 0 })];
}
// A namespace's types, and a moved type under its deprecated top-level name, are the same.
export const dtype: wire.HalfDtype = 'float16' satisfies HalfDtype;
// @ts-expect-error: the sampler takes the dataset's length first, so its types are really there
new DistributedSampler({ numReplicas: 2, rank: 0 });
`,
    );
    await writeFile(
      join(app, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          target: 'ES2022',
          module: 'ESNext',
          moduleResolution: 'Bundler',
          lib: ['ES2022', 'DOM', 'DOM.Iterable'],
          types: [],
          strict: true,
          noEmit: true,
          skipLibCheck: false,
        },
        files: ['typed.ts'],
      }),
    );
    let output = '';
    try {
      await run(
        'nice',
        ['-n', '10', process.execPath, join(PROJECT_ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json'],
        { cwd: app, timeout: 120_000, maxBuffer: 16 << 20 },
      );
    } catch (e) {
      // tsc exits 1 or 2 when it reports errors; anything else (not found, killed) is no check at all.
      const { code, stdout } = e as { code?: unknown; stdout?: string };
      if (code !== 1 && code !== 2) throw e;
      output = stdout ?? '';
    }
    // TF.js's own declarations do not pass a strict check (why the clone has skipLibCheck); every other error is this package's.
    const errors = output.split('\n').filter((l) => /error TS\d+/.test(l) && !l.includes('/@tensorflow/'));
    expect(errors, output).toEqual([]);
  }, 130_000);

  test('a Vite page that imports it builds, its DataParallel worker included', async () => {
    await writeFile(join(app, 'index.html'), '<!doctype html>\n<script type="module" src="./page.ts"></script>\n');
    await writeFile(
      join(app, 'page.ts'),
      `import { DistributedSampler, DataParallel } from 'browser-ddp';\ndocument.body.textContent = JSON.stringify([...new DistributedSampler(4, { numReplicas: 1, rank: 0 })]) + typeof DataParallel;\n`,
    );
    // The project's own Vite (this clone's, as a devDependency of the project would be).
    await sh(
      process.execPath,
      [join(PROJECT_ROOT, 'node_modules', 'vite', 'bin', 'vite.js'), 'build', '--logLevel', 'warn'],
      app,
      120_000,
      true,
    );
    const page = await readFile(join(app, 'dist', 'index.html'), 'utf8');
    expect(page).toMatch(/<script type="module"[^>]*src="\/assets\/index-[^"]+\.js"/);
    const assets = await readdir(join(app, 'dist', 'assets'));
    expect(
      assets.some((a) => /^worker-.*\.js$/.test(a)),
      assets.join(' '),
    ).toBe(true);
  }, 130_000);

  test('npx browser-ddp launch runs a script of the project on 2 ranks', async () => {
    await writeFile(
      join(app, 'tiny.ts'),
      `import { initProcessGroup, type LaunchContext } from 'browser-ddp';
export default async function main(ctx: LaunchContext) {
  const pg = await initProcessGroup({ url: ctx.url, session: ctx.session, token: ctx.token, worldSize: ctx.nproc, timeoutMs: ctx.timeoutMs });
  const sum = await pg.allReduce(Float32Array.of(pg.rank + 1), 'sum');
  await pg.barrier();
  pg.destroy();
  return { sum: sum[0] };
}
`,
    );
    const out = await sh(
      'npx',
      ['--no', 'browser-ddp', 'launch', '--nproc', '2', '--backend', 'cpu', '--timeout', '120', 'tiny.ts'],
      app,
      180_000,
    );
    const summary = JSON.parse(
      out
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .at(-1) ?? '{}',
    ) as Record<string, unknown>;
    expect(summary, out).toMatchObject({ script: 'tiny.ts', worldSize: 2, sum: 3 });
  }, 190_000);
});
