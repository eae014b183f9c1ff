/**
 * `npm run bench:background`: does a tab in the background slow the run down (or hang it)?
 * Runs `--nproc 2 --tabs --job train --dataset synthetic --steps 150` twice through the launcher,
 * once with all ranks visible and once with `--hide 1@5` (rank 1's tab goes to the background at
 * step 5), with the browser's default throttling. Prints samples/s of each and the ratio, and
 * writes bench/results/background.json. A third run hides rank 1 with Chrome's intensive
 * throttling forced to start after 10 s hidden (--intensive-throttling-after 10). Options:
 * --steps N (default 150), --nproc N (default 2).
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch, type Fault } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';

const { values } = parseArgs({
  options: {
    steps: { type: 'string', default: '150' },
    nproc: { type: 'string', default: '2' },
  },
});
const nproc = Number(values.nproc);
const steps = values.steps!;

async function run(hide: boolean, intensiveThrottlingAfterSec?: number) {
  const faults: Fault[] = hide ? [{ kind: 'hide', rank: 1, step: 5 }] : [];
  const t0 = Date.now();
  const { ok, summary } = await launch({
    nproc,
    job: 'train',
    session: `bg-${hide ? 'hide' : 'visible'}-${Date.now().toString(36)}`,
    timeoutSec: 600,
    jobParams: { dataset: 'synthetic', steps },
    faults,
    tabs: true,
    ...(intensiveThrottlingAfterSec === undefined ? {} : { intensiveThrottlingAfterSec }),
    log: (line) => {
      if (line.startsWith('[launch]')) console.log(line);
    },
  });
  return {
    variant: `${hide ? 'hide 1@5' : 'all visible'}${intensiveThrottlingAfterSec === undefined ? '' : `, intensive throttling after ${intensiveThrottlingAfterSec} s`}`,
    ok,
    samplesPerSec: typeof summary.samplesPerSec === 'number' ? summary.samplesPerSec : null,
    seconds: summary.seconds ?? null,
    wallSeconds: (Date.now() - t0) / 1000,
    visibility: summary.visibility ?? null,
    hidden: summary.hidden ?? null,
    errors: summary.errors ?? null,
  };
}

const visible = await run(false);
console.log(`all visible: ${visible.samplesPerSec} samples/s (ok=${visible.ok})`);
const hidden = await run(true);
console.log(`hide 1@5:    ${hidden.samplesPerSec} samples/s (ok=${hidden.ok})`);
const intensive = await run(true, 10);
console.log(`hide 1@5, intensive throttling after 10 s: ${intensive.samplesPerSec} samples/s (ok=${intensive.ok})`);
const ratioOf = (r: { samplesPerSec: number | null }) =>
  visible.samplesPerSec && r.samplesPerSec ? Math.round((r.samplesPerSec / visible.samplesPerSec) * 1000) / 1000 : null;
const ratio = ratioOf(hidden);
console.log(`ratio hidden/visible: ${ratio}; with intensive throttling: ${ratioOf(intensive)}`);
const out = {
  command: `npm run launch -- --nproc ${nproc} --tabs [--hide 1@5] --job train --dataset synthetic --steps ${steps}`,
  date: new Date().toISOString(),
  cpus: cpus().length,
  runs: [visible, hidden, intensive],
  ratio,
  ratioIntensive: ratioOf(intensive),
};
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(join(dir, 'background.json'), `${JSON.stringify(out, null, 2)}\n`);
console.log(`wrote ${join(dir, 'background.json')}`);
process.exitCode = visible.ok && hidden.ok && intensive.ok ? 0 : 1;
