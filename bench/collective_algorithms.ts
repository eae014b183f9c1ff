/**
 * `npm run bench:algorithms`: small all-reduces on the ring against recursive doubling, at
 * 4, 8 and 16 tabs (override with --nprocs), 1 KiB to 256 KiB (--sizes, in elements): where the
 * latency-optimal algorithm stops paying, the threshold the tuner uses
 * (DEFAULT_LATENCY_THRESHOLD_BYTES in src/c10d/latency_collectives.ts). Each size is timed with
 * both algorithms in the same run (the mean of --iters back to back, the slowest rank's). Writes
 * bench/results/collective_algorithms.json and .md and prints the table.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';
import { DEFAULT_LATENCY_THRESHOLD_BYTES } from '../src/c10d/latency_collectives.ts';

const { values } = parseArgs({
  options: {
    nprocs: { type: 'string', default: '4,8,16' },
    sizes: { type: 'string', default: '256,1024,4096,16384,65536' },
    iters: { type: 'string', default: '7' },
  },
});

interface Row {
  elements: number;
  bytes: number;
  algorithm: string;
  ms: number;
  ringMs: number;
  doublingMs: number;
  identical: boolean;
  maxAbsErr: number;
}

const runs: Array<{ worldSize: number; results: Row[] }> = [];
for (const n of values.nprocs!.split(',').map(Number)) {
  console.log(`--- ${n} ranks`);
  const { ok, summary } = await launch({
    nproc: n,
    job: 'allreduce',
    session: `algorithms-${n}-${Date.now().toString(36)}`,
    timeoutSec: 900,
    jobParams: { sizes: values.sizes!, iters: values.iters!, mesh: 'false', 'compare-algorithms': 'true' },
    log: (line) => console.log(line),
  });
  if (!ok) {
    console.error(JSON.stringify(summary));
    process.exit(1);
  }
  runs.push({ worldSize: n, results: summary.results as Row[] });
}

const size = (b: number) => (b >= 1 << 20 ? `${b / (1 << 20)} MiB` : `${b / 1024} KiB`);
const date = new Date().toISOString().slice(0, 10);
const machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Chromium headless, WebRTC over loopback`;
const lines = [
  `Small all-reduces, ring against recursive doubling, ${date}, ${machine}. Median of ${values.iters} iterations; time is the slowest rank's. The tuner's threshold: ${size(DEFAULT_LATENCY_THRESHOLD_BYTES)} (below it, doubling).`,
  '',
  '| ranks | size | ring ms | doubling ms | ring / doubling | tuner picks | exact | identical |',
  '| ---: | ---: | ---: | ---: | ---: | --- | --- | --- |',
  ...runs.flatMap((run) =>
    run.results.map(
      (r) =>
        `| ${run.worldSize} | ${size(r.bytes)} | ${r.ringMs} | ${r.doublingMs} | ${(r.ringMs / r.doublingMs).toFixed(2)}x | ${r.algorithm} | ${r.maxAbsErr === 0 ? 'yes' : `err ${r.maxAbsErr}`} | ${r.identical ? 'yes' : 'NO'} |`,
    ),
  ),
];
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(
  join(dir, 'collective_algorithms.json'),
  `${JSON.stringify({ date, machine, iters: Number(values.iters), runs }, null, 2)}\n`,
);
await writeFile(join(dir, 'collective_algorithms.md'), `${lines.join('\n')}\n`);
console.log(lines.join('\n'));
