import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { buildScript } from '../../launcher/build_script.ts';
import { ensureBuilt } from '../../signaling/build.ts';
import { PROJECT_ROOT } from '../../signaling/server.ts';

/**
 * The pages under test are the built ones, as `npm start` serves them; the examples' pages too,
 * built here once (two builds at a time) instead of by the first test that launches each: every
 * launch after finds its page up to date (launcher/build_script.ts).
 */
export default async function globalSetup(): Promise<void> {
  const examples = (await readdir(join(PROJECT_ROOT, 'examples'))).filter((f) => /^\d\d_.*\.ts$/.test(f)).sort();
  const scripts = examples.map((f) => join(PROJECT_ROOT, 'examples', f));
  const quiet = () => {};
  await Promise.all([
    (async () => {
      await ensureBuilt();
      for (const s of scripts.filter((_, i) => i % 2 === 0)) await buildScript(s, quiet);
    })(),
    (async () => {
      for (const s of scripts.filter((_, i) => i % 2 === 1)) await buildScript(s, quiet);
    })(),
  ]);
}
