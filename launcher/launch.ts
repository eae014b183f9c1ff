/**
 * The launcher (this project's torchrun):
 *   npm run launch -- --nproc N [options] SCRIPT.ts [script arguments]   a user's training script
 *   npm run launch -- --nproc N --job NAME [options] [--JOBOPTION VALUE]  a built-in job of the page
 * Starts a server unless --server is given, opens N headless ranks as pages of one Chromium
 * (or, with --tabs, as tabs of a headful Chromium under Xvfb with default background throttling;
 * with --browser firefox or --browsers chromium,firefox,..., some or all as Firefox processes),
 * prefixes each rank's console with its rank, and prints one JSON summary as its last line.
 * For a job, options it does not know become URL parameters of the job (e.g. --sizes 0,1,7).
 * Launcher options come before the script's path and all take a value; everything after the
 * path is the script's.
 */
import { writeFile } from 'node:fs/promises';
import { launch, type LaunchOptions } from './run.ts';
import { parseLaunchArgs } from './launch_args.ts';
import { exitAsSignalled } from './signals.ts';
import { USAGE } from './usage.ts';

async function main(): Promise<number> {
  let opts: LaunchOptions;
  try {
    const parsed = parseLaunchArgs(process.argv.slice(2));
    if (parsed === 'help') {
      console.log(USAGE);
      return 0;
    }
    opts = parsed;
  } catch (err) {
    console.error((err as Error).message);
    return 2;
  }
  // --dump-weights FILE: rank 0 returns its final weights and the launcher writes them.
  const dumpTo = opts.jobParams['dump-weights'] ?? opts.jobParams.dumpWeights;
  delete opts.jobParams['dump-weights'];
  delete opts.jobParams.dumpWeights;
  if (dumpTo) opts.jobParams.returnWeights = 'true';
  const { ok, summary, results } = await launch(opts);
  if (ok && dumpTo) {
    const weights = results.find((r) => typeof r.weights === 'string')?.weights;
    if (typeof weights !== 'string') {
      console.error(`[launch] --dump-weights: job "${opts.job}" returned no weights`);
      console.log(JSON.stringify({ ...summary, ok: false, errors: ['no weights to dump'] }));
      return 1;
    }
    const bytes = Buffer.from(weights, 'base64');
    await writeFile(dumpTo, bytes);
    console.log(`[launch] wrote ${bytes.length / 4} float32 weights (little-endian, trainableWeights order) to ${dumpTo}`);
  }
  console.log(JSON.stringify(summary));
  return ok ? 0 : 1;
}

exitAsSignalled();
process.exitCode = await main();
