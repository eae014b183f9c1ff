import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { buildScript } from '../../launcher/build_script.ts';
import { ensureBuilt } from '../../signaling/build.ts';
import { PROJECT_ROOT } from '../../signaling/server.ts';

/**
 * The pages under test are the built ones, as `npm start` serves them; the examples' pages too,
 * built here once (after the page, two builds at a time) instead of by the first test that
 * launches each: every launch after finds its page up to date (launcher/build_script.ts).
 * `npm test` runs this file as a script beside vitest's timed tests (`tsx test/e2e/global-setup.ts`),
 * so that Playwright's own call finds everything up to date and takes a second, not twenty.
 */
export default async function globalSetup(): Promise<void> {
  const examples = (await readdir(join(PROJECT_ROOT, 'examples'))).filter((f) => /^\d\d_.*\.ts$/.test(f)).sort();
  const scripts = examples.map((f) => join(PROJECT_ROOT, 'examples', f));
  // The page first: its build empties dist/, examples' pages (dist/scripts/) included, so an
  // example built beside it could be wiped and then rebuilt by the test that launches it.
  await ensureBuilt();
  await Promise.all(
    [0, 1].map(async (lane) => {
      for (const s of scripts.filter((_, i) => i % 2 === lane)) await prebuild(s);
    }),
  );
}

/** A script that does not build fails the tests that launch it, with the launcher's message, not the whole run. */
async function prebuild(script: string): Promise<void> {
  await buildScript(script, () => {}).catch((e: Error) =>
    console.log(`(global setup: ${script} did not build; its tests will say why: ${e.message.split('\n')[0]})`),
  );
}

// Run as a script: `npm test` starts it, at a lower priority, beside vitest's timed project.
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) await globalSetup();
