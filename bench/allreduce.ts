/**
 * `npm run bench:allreduce`: the ring all-reduce against the full mesh and against the single-link
 * bound, at 2 and 4 ranks (override with --nprocs 2,3,4), sizes 4 KB to 16 MB. Writes
 * bench/results/allreduce.json and allreduce.md and prints the table.
 *
 * `npm run bench:lan` (root): the same on the launcher's LAN in a box, every link shaped to
 * --lan MBIT (40 in the npm script) each way, at 2, 4 and 6 ranks, 64 KiB to 4 MiB; busbw is also held
 * against the shaped rate, with the links' credit window on and off (--compare-window). Writes
 * bench/results/lan.json and lan.md.
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
    /** Also run every world size with the links' credit window off (and 256 KiB frames): the behaviour before flow control. */
    'compare-window': { type: 'boolean', default: false },
    /** Shape every rank's link to this many Mbit/s each way (the launcher's --lan; root). */
    lan: { type: 'string' },
    /** Only re-render the Markdown table from the last results. */
    'table-only': { type: 'boolean', default: false },
  },
});

interface Row {
  elements: number;
  bytes: number;
  /** The algorithm the tuner picked (older results: the ring). */
  algorithm?: string;
  ms: number;
  algbwMBps: number;
  busbwMBps: number;
  maxAbsErr: number;
  identical: boolean;
  meshMs: number | null;
}

interface Run {
  /** 'on' (the default credit window) or 'off' (linkWindowBytes 0, 256 KiB frames). */
  flow?: 'on' | 'off';
  /** Share of the machine's CPU time busy during the run (from /proc/stat; null off Linux). */
  cpuBusy?: number | null;
  worldSize: number;
  /** Why the run failed, if it did (only runs with flow control off may). */
  error?: string;
  linkMBps: number;
  duplexMBps: number;
  results: Row[];
}

const dir = join(PROJECT_ROOT, 'bench', 'results');
const lanMbit = values.lan === undefined ? undefined : Number(values.lan);
if (lanMbit !== undefined && !(lanMbit > 0)) throw new Error(`--lan takes Mbit/s, got ${values.lan}`);
/** The shaped rate in MB/s, the bound busbw is held against on the LAN. */
const rateMBps = lanMbit === undefined ? undefined : lanMbit / 8;
const name = lanMbit === undefined ? 'allreduce' : 'lan';
let runs: Run[] = [];
let date = new Date().toISOString().slice(0, 10);
let machine = `${cpus().length} cores (${cpus()[0]?.model ?? 'unknown CPU'}), Chromium headless, ${
  lanMbit === undefined
    ? 'WebRTC over loopback'
    : `each rank its own Chromium in its own network namespace, links shaped to ${lanMbit} Mbit/s (${rateMBps} MB/s) each way with tbf`
}`;
let iters = Number(values.iters);
if (values['table-only']) {
  const saved = JSON.parse(await readFile(join(dir, `${name}.json`), 'utf8')) as {
    date: string;
    machine: string;
    iters: number;
    runs: Run[];
  };
  ({ runs, date, machine, iters } = saved);
}
/** Busy and total jiffies of all CPUs so far (Linux), for the share of the machine a run kept busy. */
async function cpuTimes(): Promise<{ busy: number; total: number } | undefined> {
  try {
    const [, ...fields] = (await readFile('/proc/stat', 'utf8')).split('\n')[0]!.trim().split(/\s+/);
    const v = fields.map(Number);
    const total = v.reduce((a, b) => a + b, 0);
    return { busy: total - (v[3] ?? 0) - (v[4] ?? 0), total };
  } catch {
    return undefined;
  }
}

const flows: Array<'on' | 'off'> = values['compare-window'] ? ['on', 'off'] : ['on'];
for (const n of values['table-only'] ? [] : values.nprocs!.split(',').map(Number)) {
  for (const flow of flows) {
    console.log(`--- ${n} ranks, flow control ${flow}`);
    const before = await cpuTimes();
    const { ok, summary } = await launch({
      nproc: n,
      job: 'allreduce',
      session: `bench-${n}-${Date.now().toString(36)}`,
      timeoutSec: 1800,
      jobParams: {
        sizes: values.sizes!,
        iters: values.iters!,
        ...(values.frameBytes ? { frameBytes: values.frameBytes } : {}),
        ...(flow === 'off' ? { linkWindowBytes: '0', frameBytes: '262144' } : {}),
      },
      ...(lanMbit === undefined ? {} : { lan: { rateMbit: lanMbit } }),
      log: (line) => console.log(line),
    });
    const after = await cpuTimes();
    if (!ok) {
      console.error(JSON.stringify(summary));
      // Without flow control a run can fail (a liveness frame stuck behind megabytes): that is a result too.
      if (flow === 'on') process.exit(1);
      runs.push({
        flow,
        cpuBusy: null,
        worldSize: n,
        linkMBps: 0,
        duplexMBps: 0,
        results: [],
        error: String((summary.errors as unknown[] | undefined)?.[0] ?? 'failed'),
      });
      continue;
    }
    const cpuBusy =
      before && after && after.total > before.total
        ? Math.round(((after.busy - before.busy) / (after.total - before.total)) * 100) / 100
        : null;
    runs.push({ ...(summary as unknown as Run), flow, cpuBusy });
  }
}

const size = (b: number) => (b >= 1 << 20 ? `${b / (1 << 20)} MiB` : `${b / 1024} KiB`);
const lines = [
  `All-reduce, ${date}, ${machine}. Median of ${iters} iterations; time is the slowest rank's.`,
  '',
  `| ranks | flow control | size | ms (algorithm) | algbw MB/s | busbw MB/s | link MB/s | duplex MB/s | busbw / link |${rateMBps ? ' busbw / shaped rate |' : ''} all links MB/s | mesh ms | vs mesh | CPU busy | exact | identical |`,
  `| --- | --- | --- | --- | --- | --- | --- | --- | --- |${rateMBps ? ' --- |' : ''} --- | --- | --- | --- | --- | --- |`,
];
for (const run of runs) {
  if (run.error)
    lines.push(`| ${run.worldSize} | ${run.flow ?? 'off'} | failed: ${run.error.replace(/\|/g, '/')} |${' |'.repeat(rateMBps ? 13 : 12)}`);
  for (const r of run.results) {
    const ratio = run.linkMBps ? (r.busbwMBps / run.linkMBps).toFixed(2) : '-';
    const speedup = r.meshMs ? `${(r.meshMs / r.ms).toFixed(2)}x` : '-';
    lines.push(
      `| ${run.worldSize} | ${run.flow ?? 'off'} | ${size(r.bytes)} | ${r.ms} (${r.algorithm ?? 'ring'}) | ${r.algbwMBps} | ${r.busbwMBps} | ${run.linkMBps} | ${run.duplexMBps} | ${ratio} |${rateMBps ? ` ${(r.busbwMBps / rateMBps).toFixed(2)} |` : ''} ${(r.busbwMBps * run.worldSize).toFixed(1)} | ${r.meshMs ?? '-'} | ${speedup} | ${run.cpuBusy === undefined || run.cpuBusy === null ? '-' : `${Math.round(run.cpuBusy * 100)}%`} | ${r.maxAbsErr === 0 ? 'yes' : `err ${r.maxAbsErr}`} | ${r.identical ? 'yes' : 'NO'} |`,
    );
  }
}
lines.push(
  '',
  'Link MB/s: one direction between ranks 0 and 1 with every other link idle. Duplex MB/s: the same link in both directions at once, each way (as every ring link runs). ' +
    'Flow control: on is the default credit window per link (128 KiB, 32 KiB frames); off is the behaviour before it (no window, 256 KiB frames). ' +
    "All links MB/s: busbw times the number of ring links, the bytes per second the whole ring moves. CPU busy: the share of the machine's cores busy during the run.",
);
const table = lines.join('\n');
await mkdir(dir, { recursive: true });
if (!values['table-only']) await writeFile(join(dir, `${name}.json`), `${JSON.stringify({ date, machine, iters, runs }, null, 2)}\n`);
await writeFile(join(dir, `${name}.md`), `${table}\n`);
console.log(`\n${table}`);
