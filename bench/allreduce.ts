/**
 * `npm run bench:allreduce`: the ring all-reduce against the full mesh and against the single-link
 * bound, at 2 and 4 ranks (override with --nprocs 2,3,4), sizes 4 KB to 16 MB. Writes
 * bench/results/allreduce.json and allreduce.md and prints the table.
 */
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';

const { values } = parseArgs({
  options: {
    nprocs: { type: 'string', default: '2,4' },
    sizes: { type: 'string', default: '1024,16384,262144,1048576,4194304' },
    iters: { type: 'string', default: '5' },
    frameBytes: { type: 'string' },
    /** Only re-render the Markdown table from the last results. */
    'table-only': { type: 'boolean', default: false },
  },
});

interface Row {
  elements: number;
  bytes: number;
  ms: number;
  algbwMBps: number;
  busbwMBps: number;
  maxAbsErr: number;
  identical: boolean;
  meshMs: number | null;
}

interface Run {
  worldSize: number;
  linkMBps: number;
  duplexMBps: number;
  results: Row[];
}

const dir = join(PROJECT_ROOT, 'bench', 'results');
let runs: Run[] = [];
let date = new Date().toISOString().slice(0, 10);
let machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Chromium headless, WebRTC over loopback`;
let iters = Number(values.iters);
if (values['table-only']) {
  const saved = JSON.parse(await readFile(join(dir, 'allreduce.json'), 'utf8')) as { date: string; machine: string; iters: number; runs: Run[] };
  ({ runs, date, machine, iters } = saved);
}
for (const n of values['table-only'] ? [] : values.nprocs!.split(',').map(Number)) {
  console.log(`--- ${n} ranks`);
  const { ok, summary } = await launch({
    nproc: n,
    job: 'allreduce',
    session: `bench-${n}-${Date.now().toString(36)}`,
    timeoutSec: 1800,
    jobParams: { sizes: values.sizes!, iters: values.iters!, ...(values.frameBytes ? { frameBytes: values.frameBytes } : {}) },
    log: (line) => console.log(line),
  });
  if (!ok) {
    console.error(JSON.stringify(summary));
    process.exit(1);
  }
  runs.push(summary as unknown as Run);
}

const size = (b: number) => (b >= 1 << 20 ? `${b / (1 << 20)} MiB` : `${b / 1024} KiB`);
const lines = [
  `All-reduce, ${date}, ${machine}. Median of ${iters} iterations; time is the slowest rank's.`,
  '',
  '| ranks | size | ring ms | algbw MB/s | busbw MB/s | link MB/s | busbw / link | all links MB/s | mesh ms | ring vs mesh | exact | identical |',
  '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |',
];
for (const run of runs) {
  for (const r of run.results) {
    const ratio = run.linkMBps ? (r.busbwMBps / run.linkMBps).toFixed(2) : '-';
    const speedup = r.meshMs ? `${(r.meshMs / r.ms).toFixed(2)}x` : '-';
    lines.push(
      `| ${run.worldSize} | ${size(r.bytes)} | ${r.ms} | ${r.algbwMBps} | ${r.busbwMBps} | ${run.linkMBps} | ${ratio} | ${(r.busbwMBps * run.worldSize).toFixed(1)} | ${r.meshMs ?? '-'} | ${speedup} | ${r.maxAbsErr === 0 ? 'yes' : `err ${r.maxAbsErr}`} | ${r.identical ? 'yes' : 'NO'} |`,
    );
  }
}
lines.push(
  '',
  `Link MB/s: one direction between ranks 0 and 1 with every other link idle. The same link in both directions at once (as every ring link runs): ${runs
    .map((r) => `${r.duplexMBps} MB/s each way (measured in the ${r.worldSize}-rank run)`)
    .join(', ')}. All links MB/s: busbw times the number of ring links, the bytes per second the whole ring moves.`,
);
const table = lines.join('\n');
await mkdir(dir, { recursive: true });
if (!values['table-only']) await writeFile(join(dir, 'allreduce.json'), JSON.stringify({ date, machine, iters, runs }, null, 2) + '\n');
await writeFile(join(dir, 'allreduce.md'), table + '\n');
console.log('\n' + table);
