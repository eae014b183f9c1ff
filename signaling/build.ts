/** Builds the page with Vite when dist/ is missing or older than its sources. */
import { readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { PROJECT_ROOT } from './server.ts';

const SOURCES = ['index.html', 'vite.config.ts', 'client', 'src', 'package-lock.json'];

async function newestMtime(path: string): Promise<number> {
  const info = await stat(path).catch(() => undefined);
  if (!info) return 0;
  if (!info.isDirectory()) return info.mtimeMs;
  let newest = info.mtimeMs;
  for (const entry of await readdir(path)) newest = Math.max(newest, await newestMtime(join(path, entry)));
  return newest;
}

/** Returns true when it had to build. */
export async function ensureBuilt(log: (line: string) => void = console.log): Promise<boolean> {
  const built = await stat(join(PROJECT_ROOT, 'dist', 'index.html')).catch(() => undefined);
  const sources = Math.max(...(await Promise.all(SOURCES.map((s) => newestMtime(join(PROJECT_ROOT, s))))));
  if (built && built.mtimeMs >= sources) return false;
  log(built ? 'The page is older than its sources: rebuilding…' : 'Building the page…');
  const { build } = await import('vite');
  await build({ root: PROJECT_ROOT, logLevel: 'warn', configFile: join(PROJECT_ROOT, 'vite.config.ts') });
  return true;
}
