/**
 * `npm run bench:ps`: parameter servers against DistributedDataParallel on this machine. Four
 * ranks train the same small job (the mlp on the synthetic set, 4096 samples, batch 32 per
 * worker; or MNIST with --dataset mnist, 8192 samples) with each strategy:
 *   ddp      DistributedDataParallel, 4 workers;
 *   ps       asynchronous parameter servers, 1 server + 3 workers (--strategy ps --ps 1);
 *   central  CentralStorage, 1 server + 3 workers, synchronous (--strategy central);
 * each without and with one straggler 4x slower (--slow 3:4). Two phases:
 *   A, same samples: --epochs E (2): samples/s of the workers, samples/s on the wall clock, test
 *     accuracy, seconds, and for PS runs the staleness of the pushes and where the samples went;
 *   B, same wall time: 50 epochs cut by --time-limit T (60 s): test accuracy and samples
 *     processed when the time ran out.
 * Writes bench/results/ps.json and ps.md and prints the tables. A run that fails is recorded
 * with its errors and the others go on; the exit code is then 1.
 *
 * Options: --configs "ddp:none,ddp:3:4,ps:none,ps:3:4,central:none,central:3:4" (STRATEGY:SLOW,
 * SLOW none or RANK:FACTOR; a bare STRATEGY means both none and 3:4), --seconds T (60),
 * --epochs E (2), --dataset synthetic|mnist, --phases A,B (both).
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { availableParallelism, cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';
import type { ParameterServerSummary } from '../launcher/summary_ps.ts';

const STRATEGIES = ['ddp', 'ps', 'central'] as const;
type Strategy = (typeof STRATEGIES)[number];
const RANKS = 4;
/** Phase B's epochs: more than any strategy trains in T seconds here, so the time limit ends every run. */
const PHASE_B_EPOCHS = 50;
const STRAGGLER = '3:4';

const { values } = parseArgs({
  options: {
    configs: { type: 'string', default: 'ddp:none,ddp:3:4,ps:none,ps:3:4,central:none,central:3:4' },
    seconds: { type: 'string', default: '60' },
    epochs: { type: 'string', default: '2' },
    dataset: { type: 'string', default: 'synthetic' },
    phases: { type: 'string', default: 'A,B' },
  },
});

function fail(message: string): never {
  console.error(`bench:ps: ${message}`);
  process.exit(2);
}

const dataset = values.dataset!;
if (dataset !== 'synthetic' && dataset !== 'mnist') fail(`--dataset must be synthetic or mnist, got "${dataset}"`);
const seconds = Number(values.seconds);
if (!(Number.isFinite(seconds) && seconds > 0)) fail(`--seconds must be a positive number, got "${values.seconds}"`);
const epochs = Number(values.epochs);
if (!(Number.isSafeInteger(epochs) && epochs >= 1)) fail(`--epochs must be a positive integer, got "${values.epochs}"`);
const phases = new Set(
  values
    .phases!.toUpperCase()
    .split(',')
    .map((p) => p.trim()),
);
if (phases.size === 0 || [...phases].some((p) => p !== 'A' && p !== 'B')) fail(`--phases takes A, B or A,B, got "${values.phases}"`);

const model = 'mlp';
const trainSize = dataset === 'mnist' ? 8192 : 4096;
const batchSize = 32;

interface Config {
  strategy: Strategy;
  /** --slow RANK:FACTOR, or null for none. */
  slow: string | null;
}

/** "ps:none,ddp:3:4,central": STRATEGY:SLOW items, a bare STRATEGY both without and with the straggler. */
function parseConfigs(spec: string): Config[] {
  const out: Config[] = [];
  for (const item of spec
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)) {
    const colon = item.indexOf(':');
    const strategy = (colon < 0 ? item : item.slice(0, colon)) as Strategy;
    if (!STRATEGIES.includes(strategy)) fail(`--configs: "${item}" must start with ddp, ps or central`);
    const slows = colon < 0 ? [null, STRAGGLER] : [item.slice(colon + 1) === 'none' ? null : item.slice(colon + 1)];
    for (const slow of slows) {
      if (slow !== null && !/^\d+:\d+(\.\d+)?$/.test(slow))
        fail(`--configs: "${item}": the straggler must be none or RANK:FACTOR (e.g. 3:4)`);
      if (slow !== null && Number(slow.split(':')[0]) >= RANKS)
        fail(`--configs: "${item}": rank ${slow.split(':')[0]} is not one of the ${RANKS} ranks`);
      if (!out.some((c) => c.strategy === strategy && c.slow === slow)) out.push({ strategy, slow });
    }
  }
  if (out.length === 0) fail('--configs names no configuration');
  return out;
}

const configs = parseConfigs(values.configs!);
const nameOf = (c: Config) => `${c.strategy}:${c.slow ?? 'none'}`;
const labelOf = (c: Config) =>
  `${c.strategy === 'ddp' ? `DDP (${RANKS} workers)` : c.strategy === 'ps' ? `PS async (1 server + ${RANKS - 1} workers)` : `CentralStorage (1 server + ${RANKS - 1} workers)`}${c.slow ? `, rank ${c.slow.split(':')[0]} ${c.slow.split(':')[1]}x slower` : ''}`;

/** The job's options, as strings, as the launcher's command line would pass them. */
function jobParams(c: Config, phase: 'A' | 'B'): Record<string, string> {
  return {
    model,
    dataset,
    'train-size': String(trainSize),
    'batch-size': String(batchSize),
    // Evaluate only at epoch ends (DDP) and at the end: the figures are about training.
    'eval-every': '0',
    ...(dataset === 'mnist' ? { 'test-size': '2000' } : {}),
    ...(c.strategy === 'ps' ? { strategy: 'ps', ps: '1' } : c.strategy === 'central' ? { strategy: 'central' } : {}),
    ...(c.slow ? { slow: c.slow } : {}),
    ...(phase === 'A' ? { epochs: String(epochs) } : { epochs: String(PHASE_B_EPOCHS), 'time-limit': String(seconds) }),
  };
}

interface Staleness {
  mean: number | null;
  p90: number | null;
  max: number | null;
  histogram: number[];
}

interface PsFigures {
  staleness: Staleness | null;
  samples: { target: number; applied: number; stale: number; refused: number; lost: number } | null;
  /** Server 0's updates (its final version). */
  updates: number | null;
}

interface RunRow {
  config: string;
  strategy: Strategy;
  slow: string | null;
  phase: 'A' | 'B';
  ok: boolean;
  errors?: string[];
  session: string;
  /** The workers' samples per second together (summary.samplesPerSec; each worker's first step left out). */
  samplesPerSec: number | null;
  /** Samples processed over the training time: see `wallSource`. */
  samplesPerSecWall: number | null;
  /** 'samplesPerSecWall': the PS summary's; 'samples/seconds': samples processed / summary.seconds (DDP). */
  wallSource: 'samplesPerSecWall' | 'samples/seconds' | null;
  /** Samples trained on (DDP: summary.samplesSeen, else steps x batch x ranks; PS: applied + stale at server 0). */
  samplesProcessed: number | null;
  testAccuracy: number | null;
  /** summary.seconds: the slowest rank's, page start to its summary. */
  seconds: number | null;
  /** summary.epochs: DDP the epoch it stopped in (whole epochs done), PS the samples handed out over the dataset's size. */
  epochs: number | null;
  steps: number | null;
  /** The run was ended by a stop request (phase B: the time limit) rather than by running out of epochs. */
  stopped: boolean;
  ps: PsFigures | null;
}

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);

function rowFrom(
  c: Config,
  phase: 'A' | 'B',
  session: string,
  ok: boolean,
  summary: Record<string, unknown>,
  results: Array<Record<string, unknown>>,
): RunRow {
  const base = { config: nameOf(c), strategy: c.strategy, slow: c.slow, phase, session };
  if (!ok) {
    return {
      ...base,
      ok,
      errors: (summary.errors as string[] | undefined) ?? ['failed'],
      samplesPerSec: null,
      samplesPerSecWall: null,
      wallSource: null,
      samplesProcessed: null,
      testAccuracy: null,
      seconds: null,
      epochs: null,
      steps: null,
      stopped: false,
      ps: null,
    };
  }
  const secondsTaken = num(summary.seconds);
  const psSummary = (summary.parameterServer ?? null) as ParameterServerSummary | null;
  let samplesProcessed: number | null;
  let wall: number | null;
  let wallSource: RunRow['wallSource'];
  let ps: PsFigures | null = null;
  if (psSummary) {
    const s = psSummary.samples;
    samplesProcessed = s ? s.applied + s.stale : null;
    // Top level when the launcher's summary carries it; else the ranks' own (all ranks agree on it).
    wall = num(summary.samplesPerSecWall) ?? num(results.find((r) => num(r.samplesPerSecWall) !== null)?.samplesPerSecWall);
    wallSource = wall === null ? null : 'samplesPerSecWall';
    const st = psSummary.staleness;
    ps = {
      staleness: st ? { mean: st.mean, p90: st.p90, max: st.max, histogram: st.histogram } : null,
      samples: s ? { target: s.target, applied: s.applied, stale: s.stale, refused: s.refused, lost: s.lost } : null,
      updates: psSummary.versions[0] ?? null,
    };
  } else {
    const seen = Array.isArray(summary.samplesSeen) ? (summary.samplesSeen as Array<{ samples: number }>) : [];
    const steps = num(summary.steps);
    samplesProcessed = seen.length > 0 ? seen.reduce((a, e) => a + e.samples, 0) : steps === null ? null : steps * batchSize * RANKS;
    wall = samplesProcessed !== null && secondsTaken ? samplesProcessed / secondsTaken : null;
    wallSource = wall === null ? null : 'samples/seconds';
  }
  const round = (x: number | null, digits = 1) => (x === null ? null : Math.round(x * 10 ** digits) / 10 ** digits);
  return {
    ...base,
    ok,
    samplesPerSec: round(num(summary.samplesPerSec)),
    samplesPerSecWall: round(wall),
    wallSource,
    samplesProcessed,
    testAccuracy: num(summary.testAccuracy),
    seconds: round(secondsTaken),
    epochs: num(summary.epochs),
    steps: num(summary.steps),
    // Server 0 alone knows a PS run was asked to stop: any rank's word counts.
    stopped: summary.stoppedBy !== undefined || results.some((r) => r.stoppedBy !== undefined),
    ps,
  };
}

const rows: RunRow[] = [];
for (const phase of ['A', 'B'] as const) {
  if (!phases.has(phase)) continue;
  for (const c of configs) {
    const session = `bench-ps-${phase.toLowerCase()}-${c.strategy}-${c.slow ? c.slow.replace(':', 'x') : 'none'}-${Date.now().toString(36)}`;
    const params = jobParams(c, phase);
    console.log(
      `--- phase ${phase}: ${labelOf(c)}; ${model} on ${dataset} (${trainSize} samples, batch ${batchSize}), ${phase === 'A' ? `${epochs} epoch(s)` : `${PHASE_B_EPOCHS} epochs cut at ${seconds} s`}`,
    );
    const started = Date.now();
    const { ok, summary, results } = await launch({
      nproc: RANKS,
      job: 'train',
      session,
      timeoutSec: phase === 'A' ? 3600 : Math.ceil(seconds) + 900,
      jobParams: params,
      log: (line) => console.log(line),
    });
    const row = rowFrom(c, phase, session, ok, summary, results);
    rows.push(row);
    if (!ok) console.error(`--- FAILED (${Math.round((Date.now() - started) / 1000)} s): ${(row.errors ?? []).join('; ')}`);
    else
      console.log(
        `--- done in ${Math.round((Date.now() - started) / 1000)} s: ${row.samplesProcessed} samples, test accuracy ${pct(row.testAccuracy)}`,
      );
  }
}

function pct(x: number | null): string {
  return x === null ? '-' : `${(x * 100).toFixed(1)}%`;
}
const fig = (x: number | null | undefined) => (x === null || x === undefined ? '-' : String(x));

/** The staleness histogram's non-empty buckets, "s:count", the first 12 of them. */
function histogramText(h: number[]): string {
  const items = h.flatMap((n, s) => (n > 0 ? [`${s}:${n}`] : []));
  if (items.length === 0) return '-';
  return items.length > 12 ? `${items.slice(0, 12).join(' ')} …` : items.join(' ');
}

const date = new Date().toISOString().slice(0, 10);
const machine = { nproc: availableParallelism(), cpu: cpus()[0]?.model?.trim() ?? 'unknown CPU', gpu: 'SwiftShader WebGPU' };
const machineText = `${machine.nproc} cores (nproc; ${machine.cpu}), ${machine.gpu}, Chromium headless, loopback WebRTC`;
const job = `${model} on ${dataset} (${trainSize} training samples${dataset === 'mnist' ? ', 2000 test samples' : ', 1024 test samples'}), batch ${batchSize} per worker, adam (lr 0.003), ${RANKS} ranks`;
const lines = [
  `Parameter servers vs DDP, ${date}, ${machineText}.`,
  '',
  `Job: ${job}. DDP: ${RANKS} workers; PS: asynchronous, 1 server + ${RANKS - 1} workers; CentralStorage: 1 server + ${RANKS - 1} workers, synchronous. Straggler: --slow ${STRAGGLER} (rank 3 ${STRAGGLER.split(':')[1]}x slower).`,
];
const rowsA = rows.filter((r) => r.phase === 'A');
const rowsB = rows.filter((r) => r.phase === 'B');
const failed = (r: RunRow) => `FAILED: ${(r.errors ?? []).join('; ').replaceAll('|', '\\|').slice(0, 200)}`;
const labelRow = (r: RunRow) => labelOf({ strategy: r.strategy, slow: r.slow });
if (rowsA.length > 0) {
  lines.push(
    '',
    `### Phase A: same samples (${epochs} epoch${epochs === 1 ? '' : 's'})`,
    '',
    '| configuration | samples/s (workers) | samples/s (wall)¹ | test accuracy | seconds | staleness mean / p90 / max | staleness histogram (updates behind: pushes) | samples applied / stale / lost |',
    '| --- | --- | --- | --- | --- | --- | --- | --- |',
    ...rowsA.map((r) => {
      if (!r.ok) return `| ${labelRow(r)} | ${failed(r)} | | | | | | |`;
      const st = r.ps?.staleness;
      const s = r.ps?.samples;
      return `| ${labelRow(r)} | ${fig(r.samplesPerSec)} | ${fig(r.samplesPerSecWall)}${r.wallSource === 'samples/seconds' ? '²' : ''} | ${pct(r.testAccuracy)} | ${fig(r.seconds)} | ${st ? `${fig(st.mean)} / ${fig(st.p90)} / ${fig(st.max)}` : '-'} | ${st ? histogramText(st.histogram) : '-'} | ${s ? `${s.applied} / ${s.stale} / ${s.lost}` : '-'} |`;
    }),
  );
}
if (rowsB.length > 0) {
  lines.push(
    '',
    `### Phase B: same wall time (${PHASE_B_EPOCHS} epochs cut by --time-limit ${seconds})`,
    '',
    '| configuration | test accuracy | samples processed³ | epochs (samples / train size) | stopped by the limit | seconds⁴ |',
    '| --- | --- | --- | --- | --- | --- |',
    ...rowsB.map((r) =>
      r.ok
        ? `| ${labelRow(r)} | ${pct(r.testAccuracy)} | ${fig(r.samplesProcessed)} | ${r.samplesProcessed === null ? '-' : (r.samplesProcessed / trainSize).toFixed(2)} | ${r.stopped ? 'yes' : 'no (finished)'} | ${fig(r.seconds)} |`
        : `| ${labelRow(r)} | ${failed(r)} | | | | |`,
    ),
  );
}
lines.push(
  '',
  "samples/s (workers) is the summary's samplesPerSec: every worker's samples over its own step time, added up, the first step (shader compilation) left out.",
  "¹ Samples processed over the training time. PS and CentralStorage: the summary's samplesPerSecWall, samples applied or dropped as stale over the time from the workers' first step to the end (the final evaluation included).",
  "² DDP's summary has no training-time rate: this is the samples trained (the summary's samplesSeen; epochs x train size for whole epochs) over summary.seconds, which also counts the page's start (backend, data, rendezvous), so it reads lower than a PS run's by that start-up time.",
  '³ DDP: samples trained (samplesSeen, else steps x batch x ranks); PS and CentralStorage: samples applied + stale at server 0 (lost samples, handed out to a worker that never pushed them, not counted).',
  '⁴ summary.seconds: the slowest rank, from its page start to its summary; the limit counts from each tab joining the group, and the final evaluation comes after it. DDP also evaluates at each epoch end, inside the limit.',
  'Staleness: how many updates server 0 had applied between a worker pulling the weights and its push arriving (0 for CentralStorage, which is synchronous).',
);
const table = lines.join('\n');
const dir = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(dir, { recursive: true });
await writeFile(
  join(dir, 'ps.json'),
  `${JSON.stringify(
    {
      date,
      machine,
      settings: {
        model,
        dataset,
        trainSize,
        batchSize,
        optimizer: 'adam',
        ranks: RANKS,
        straggler: STRAGGLER,
        phaseA: { epochs },
        phaseB: { epochs: PHASE_B_EPOCHS, timeLimitSec: seconds },
      },
      phaseA: rowsA,
      phaseB: rowsB,
    },
    null,
    2,
  )}\n`,
);
await writeFile(join(dir, 'ps.md'), `${table}\n`);
console.log(`\n${table}`);
if (rows.some((r) => !r.ok)) process.exitCode = 1;
