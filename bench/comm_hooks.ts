/**
 * `npm run bench:comm-hooks` (root for the shaped LAN): DDP communication hooks against the link.
 * For each model (the train job's MNIST MLP and CNN), rank count, link rate (the launcher's LAN in
 * a box, --lan; 0 = loopback) and hook (the job's comm-hook: none, fp16, bf16, powersgd:RANK,
 * localsgd:H, diloco:H[:...][:streamP]; alone: each rank a run of its own with no link, the upper
 * bound of throughput), trains one epoch of the first --train-size MNIST samples and records the step time
 * (the breakdown's, over the whole run, and the wall time per step after the hook's START), bytes
 * sent per step, those bytes against none's (same model and rank count), the communication share
 * of the step, samples/s, test accuracy and whether the replicas ended identical. Writes
 * bench/results/comm_hooks.json and comm_hooks.md and prints the table. A failed run is recorded
 * and the others go on; the exit code is 1 if any failed. Not root (or no iproute2): loopback only.
 *
 * Options: --models mlp,cnn (MODEL:N gives the model a hidden layer of N units, the job's --hidden:
 * cnn:1024 is the CNN with a 1024-wide dense layer before its classifier), --backend (the job's;
 * default webgpu), --optimizer adam|sgd (adam, the job's), --lr (the job's default for the optimizer), --nprocs 2,4, --rates 100,20 (0 = loopback),
 * --hooks none,fp16,powersgd:1,powersgd:2,powersgd:4,localsgd:4,localsgd:16, --start 10 (START of
 * powersgd and localsgd when the hook does not give one), --epochs 1, --batch-size 64 (per rank),
 * --train-size 4096, --test-size 0 (the whole test set), --steps (a cap; default: whole epochs),
 * --timeout 3600 (seconds per run), --out-dir (default bench/results), --name comm_hooks (the files'
 * name: NAME.json and NAME.md, so that several grids can sit side by side), --merge a.json,b.json
 * (rows of earlier parts of a matrix, from their NAME.json, put in the table and goals with this run's). A hook
 * item may end in @wBYTES: that run's links get a credit window of BYTES (the job's linkWindowBytes).
 * --delay MS (0): on shaped links, each host's packets out are held MS ms (the launcher's
 * --lan-delay, a user-space delay line: this kernel has no netem), a round trip 2 x MS longer.
 */
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { checkLanSupport } from '../launcher/lan.ts';
import { launch } from '../launcher/run.ts';
import { PROJECT_ROOT } from '../signaling/server.ts';
import {
  ALONE,
  DILOCO_GOAL,
  DILOCO_GOAL_TEXT,
  GOAL,
  GOAL_TEXT,
  compareWithNone,
  dilocoVerdicts,
  goalLine,
  goalVerdicts,
  num,
  r1,
  r4,
  resultsTable,
  type BenchSetup,
  type Breakdown,
  type Row,
} from './comm_hooks_report.ts';

const { values } = parseArgs({
  options: {
    models: { type: 'string', default: 'mlp,cnn' },
    backend: { type: 'string', default: 'webgpu' },
    optimizer: { type: 'string', default: 'adam' },
    lr: { type: 'string' },
    nprocs: { type: 'string', default: '2,4' },
    rates: { type: 'string', default: '100,20' },
    hooks: { type: 'string', default: 'none,fp16,powersgd:1,powersgd:2,powersgd:4,localsgd:4,localsgd:16' },
    start: { type: 'string', default: '10' },
    epochs: { type: 'string', default: '1' },
    'batch-size': { type: 'string', default: '64' },
    'train-size': { type: 'string', default: '4096' },
    'test-size': { type: 'string', default: '0' },
    steps: { type: 'string' },
    timeout: { type: 'string', default: '3600' },
    'out-dir': { type: 'string' },
    name: { type: 'string', default: 'comm_hooks' },
    merge: { type: 'string' },
    delay: { type: 'string', default: '0' },
  },
});

const list = (s: string) =>
  s
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean);
const positiveInt = (name: string, s: string, least = 1): number => {
  const n = Number(s);
  if (!Number.isSafeInteger(n) || n < least) throw new Error(`--${name} must be an integer >= ${least}, got "${s}"`);
  return n;
};

const models = list(values.models!);
/** A --models item as the job's options: "cnn:1024" is model cnn with hidden 1024. */
function modelParams(model: string): Record<string, string> {
  const [kind = '', hidden, ...rest] = model.split(':');
  if (!['mlp', 'cnn'].includes(kind) || rest.length > 0 || (hidden !== undefined && !/^\d{1,4}$/.test(hidden))) {
    throw new Error(`--models items are mlp or cnn, optionally :N for a hidden layer of N units (cnn:1024), got "${model}"`);
  }
  return { model: kind, ...(hidden !== undefined ? { hidden } : {}) };
}
models.forEach(modelParams);
const backend = values.backend!;
if (!['webgpu', 'webgl', 'wasm', 'cpu'].includes(backend))
  throw new Error(`--backend must be webgpu, webgl, wasm or cpu, got "${backend}"`);
const optimizer = values.optimizer!;
if (optimizer !== 'sgd' && optimizer !== 'adam') throw new Error(`--optimizer must be sgd or adam, got "${optimizer}"`);
const nprocs = list(values.nprocs!).map((s) => positiveInt('nprocs', s, 2));
let rates = list(values.rates!).map((s) => {
  const n = Number(s);
  if (!Number.isFinite(n) || n < 0) throw new Error(`--rates must be Mbit/s >= 0 (0: loopback), got "${s}"`);
  return n;
});
const hooks = list(values.hooks!);
const start = positiveInt('start', values.start!, 0);
const epochs = positiveInt('epochs', values.epochs!);
const batchSize = positiveInt('batch-size', values['batch-size']!);
const trainSize = positiveInt('train-size', values['train-size']!, 0);
const testSize = positiveInt('test-size', values['test-size']!, 0);
const stepsCap = values.steps === undefined ? null : positiveInt('steps', values.steps);
const timeoutSec = positiveInt('timeout', values.timeout!);
/** --delay MS: every shaped host's packets out held MS ms (the LAN's delay line): a round trip rank to rank 2 x MS longer. */
const delayMs = positiveInt('delay', values.delay!, 0);
if (!/^[\w.-]{1,64}$/.test(values.name!))
  throw new Error(`--name must be a file name of letters, digits, _ . - (at most 64), got "${values.name}"`);

/**
 * A hook as the job's comm-hook value: powersgd and localsgd get START unless they give one. A
 * hook may end in @wBYTES, the links' credit window for that run (the job's linkWindowBytes):
 * diloco:64:stream4x8@w4194304.
 */
function hookParam(hook: string): string {
  const [kind, ...args] = hook.replace(/@w\d+$/, '').split(':');
  // powersgd:R:fp16 (a 16-bit wire, last) gets its START before the wire.
  const wire = kind === 'powersgd' && (args.at(-1) === 'fp16' || args.at(-1) === 'bf16') ? args.pop()! : null;
  if ((kind === 'powersgd' || kind === 'localsgd') && args.length === 1) args.push(String(start));
  return [kind, ...args, ...(wire ? [wire] : [])].join(':');
}

/** The links' credit window a --hooks item asks for (@wBYTES), or null for the job's default. */
function linkWindowOf(hook: string): string | null {
  return /@w(\d+)$/.exec(hook)?.[1] ?? null;
}

/** The hook's START (steps of plain all-reduce first); 0 for hooks without one. */
function hookStart(param: string): number {
  const [kind, , s] = param.split(':');
  return (kind === 'powersgd' || kind === 'localsgd') && s !== undefined ? Number(s) : 0;
}

// The LAN in a box needs root and iproute2: without them, loopback only.
let lanNote: string | null = null;
if (rates.some((r) => r > 0)) {
  try {
    checkLanSupport();
  } catch (err) {
    lanNote = `No shaped LAN (${(err as Error).message.split(':')[0]}): loopback only, instead of --rates ${rates.join(',')}.`;
    console.log(`[bench] ${(err as Error).message}`);
    console.log(`[bench] ${lanNote}`);
    rates = [0];
  }
}

/** Rank 0's step and eval lines, timed as they reach the launcher. */
class StepClock {
  private last: { step: number; at: number } | null = null;
  private evalSinceLast = false;
  private readonly intervals: Array<{ step: number; ms: number }> = [];

  line(line: string): void {
    const at = performance.now();
    const m = /^\[rank 0\] epoch \d+ step (\d+)\/\d+ loss/.exec(line);
    if (m) {
      const step = Number(m[1]);
      if (this.last && step === this.last.step + 1 && !this.evalSinceLast) this.intervals.push({ step, ms: at - this.last.at });
      this.last = { step, at };
      this.evalSinceLast = false;
    } else if (/^\[rank 0\] .*test accuracy/.test(line)) {
      this.evalSinceLast = true;
    }
  }

  /** Takes the intervals of several runs' clocks (each its own rank 0), as if measured here. */
  adopt(clocks: StepClock[]): void {
    for (const c of clocks) this.intervals.push(...c.intervals);
  }

  /** Mean ms of steps >= `from`. */
  meanFrom(from: number): { ms: number | null; n: number } {
    const xs = this.intervals.filter((i) => i.step >= from);
    return { ms: xs.length ? r1(xs.reduce((s, i) => s + i.ms, 0) / xs.length) : null, n: xs.length };
  }
}

/** The job's options for `model` with comm-hook `param` (and any extra, such as a steps cap). */
function jobParams(model: string, param: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    ...modelParams(model),
    backend,
    optimizer,
    ...(values.lr !== undefined ? { lr: values.lr } : {}),
    dataset: 'mnist',
    epochs: String(epochs),
    'batch-size': String(batchSize),
    'train-size': String(trainSize),
    'test-size': String(testSize),
    // Only at epoch ends (and after the last step).
    'eval-every': '0',
    'comm-hook': param,
    // Every step's line, for the step clock.
    logEvery: '1',
    ...(stepsCap !== null ? { steps: String(stepsCap) } : {}),
    ...extra,
  };
}

/** Rank 0's every tenth step line (and the first and last), and every other line, to the terminal. */
function logLine(clock: StepClock, prefix = ''): (line: string) => void {
  return (line) => {
    clock.line(line);
    const step = /^\[[^\]]+\] epoch \d+ step (\d+)\/(\d+) loss/.exec(line);
    if (step && !(line.startsWith('[rank 0]') && (Number(step[1]) % 10 === 0 || step[1] === step[2] || step[1] === '1'))) return;
    console.log(prefix + line);
  };
}

/** One run of the job in a group of `nproc` tabs, on the shaped LAN at `rate` (0: loopback). */
async function runOnce(
  model: string,
  nproc: number,
  rate: number,
  param: string,
  clock: StepClock,
  window: string | null,
): Promise<Record<string, unknown>> {
  const { ok, summary } = await launch({
    nproc,
    job: 'train',
    session: `bench-hooks-${model.replace(/[^A-Za-z0-9]/g, '')}-${nproc}-${rate}-${param.replace(/[^A-Za-z0-9]/g, '')}-${Date.now().toString(36)}`,
    timeoutSec,
    jobParams: jobParams(model, param, window === null ? {} : { linkWindowBytes: window }),
    ...(rate > 0 ? { lan: { rateMbit: rate, ...(delayMs > 0 ? { delayMs } : {}) } } : {}),
    log: logLine(clock),
  });
  return { ...(summary as Record<string, unknown>), ok };
}

/**
 * `nproc` runs of one tab each at the same time (each its own Chromium, as on the LAN, and no
 * link to shape), each as many steps as a rank of the `nproc`-tab group takes: what the ranks
 * would do with no communication at all. Samples/s summed; step times, accuracy averaged.
 */
async function aloneRuns(model: string, nproc: number, clock: StepClock): Promise<Record<string, unknown>> {
  const groupSteps = Math.ceil((trainSize || 60_000) / (batchSize * nproc)) * epochs;
  const steps = String(stepsCap !== null ? Math.min(stepsCap, groupSteps) : groupSteps);
  const clocks = Array.from({ length: nproc }, () => new StepClock());
  const results = await Promise.all(
    clocks.map(async (c, k) => {
      const { ok, summary } = await launch({
        nproc: 1,
        job: 'train',
        session: `bench-alone-${model.replace(/[^A-Za-z0-9]/g, '')}-${k}-${Date.now().toString(36)}`,
        timeoutSec,
        // A rank's share of the test set, as in the group's evaluation: a whole test set at once on
        // each of these tabs keeps its page busy long enough to be taken for a frozen one.
        // Throughput only: a few test samples (a whole test share at once, on these tabs together, keeps
        // a page busy long enough for the server to take it for a frozen one).
        jobParams: jobParams(model, 'none', { steps, 'test-size': '200' }),
        log: logLine(c, `[alone ${k}] `),
      });
      return { ok, s: summary as Record<string, unknown> };
    }),
  );
  clock.adopt(clocks);
  const mean = (key: string) => {
    const xs = results.map((r) => num(r.s[key]));
    return xs.every((x) => x !== null) ? xs.reduce((a, b) => a + b!, 0) / xs.length : null;
  };
  const breakdowns = results.map((r) => r.s.breakdownMs as Record<string, number> | undefined);
  const breakdownMs = breakdowns.every((b) => b)
    ? Object.fromEntries(
        ['compute', 'readback', 'allreduce', 'apply'].map((k) => [k, breakdowns.reduce((a, b) => a + (b![k] ?? 0), 0) / breakdowns.length]),
      )
    : undefined;
  return {
    ok: results.every((r) => r.ok),
    errors: results.flatMap((r) => (Array.isArray(r.s.errors) ? (r.s.errors as unknown[]).map(String) : [])),
    steps: mean('steps'),
    seconds: mean('seconds'),
    breakdownMs,
    bytesPerStep: 0,
    samplesPerSec: results.every((r) => num(r.s.samplesPerSec) !== null)
      ? Math.round(results.reduce((a, r) => a + num(r.s.samplesPerSec)!, 0) * 10) / 10
      : null,
    testAccuracy: mean('testAccuracy'),
    backends: results.flatMap((r) => (Array.isArray(r.s.backends) ? r.s.backends : [])),
  };
}

const rows: Row[] = [];
// --merge a.json,b.json: the rows of earlier parts of the same matrix, so that one table (and the goals) covers them all.
for (const file of values.merge ? list(values.merge) : []) {
  const earlier = JSON.parse(await readFile(resolve(file), 'utf8')) as { rows?: Row[] };
  if (!Array.isArray(earlier.rows)) throw new Error(`--merge ${file}: no rows in it (a ${values.name}.json of this bench?)`);
  rows.push(...earlier.rows.map((r) => ({ ...r, wallSamplesPerSec: r.wallSamplesPerSec ?? null })));
  console.log(`[bench] ${earlier.rows.length} rows from ${file}`);
}
const runs = models.length * nprocs.length * rates.length * hooks.length;
let runIndex = 0;
for (const model of models) {
  for (const nproc of nprocs) {
    for (const rate of rates) {
      for (const hook of hooks) {
        runIndex++;
        const param = hookParam(hook);
        const where = rate > 0 ? `--lan ${rate}${delayMs > 0 ? ` --lan-delay ${delayMs}` : ''}` : 'loopback';
        console.log(`--- [${runIndex}/${runs}] ${model}, ${nproc} ranks, ${where}, comm-hook ${param}`);
        const clock = new StepClock();
        const row: Row = {
          model,
          nprocs: nproc,
          rateMbit: rate > 0 ? rate : null,
          ...(rate > 0 && delayMs > 0 ? { delayMs } : {}),
          hook,
          hookParam: param,
          ok: false,
          steps: null,
          seconds: null,
          stepMs: null,
          stepMsFrom: null,
          stepMsAfterStart: null,
          stepsAfterStart: 0,
          breakdownMs: null,
          commShare: null,
          bytesPerStep: null,
          bytesPerStepAfterStart: null,
          bytesVsNone: null,
          hiddenShare: null,
          compressionRatio: null,
          samplesPerSec: null,
          wallSamplesPerSec: null,
          testAccuracy: null,
          identical: null,
          commHook: null,
          backends: null,
        };
        try {
          const s =
            hook === ALONE ? await aloneRuns(model, nproc, clock) : await runOnce(model, nproc, rate, param, clock, linkWindowOf(hook));
          const ok = s.ok === true;
          row.ok = ok;
          if (!ok)
            row.errors = Array.isArray(s.errors) ? (s.errors as unknown[]).map(String) : ['the run failed (no errors in its summary)'];
          row.steps = num(s.steps);
          row.seconds = num(s.seconds);
          const b = s.breakdownMs as Partial<Record<keyof Breakdown, unknown>> | undefined;
          if (b && num(b.compute) !== null && num(b.readback) !== null && num(b.allreduce) !== null && num(b.apply) !== null) {
            const bd: Breakdown = {
              compute: num(b.compute)!,
              readback: num(b.readback)!,
              allreduce: num(b.allreduce)!,
              apply: num(b.apply)!,
            };
            const stepMs = bd.compute + bd.readback + bd.allreduce + bd.apply;
            row.breakdownMs = bd;
            row.stepMs = r1(stepMs);
            row.stepMsFrom = 'breakdown';
            row.commShare = stepMs > 0 ? r4(bd.allreduce / stepMs) : null;
          } else if (row.seconds !== null && row.steps) {
            row.stepMs = r1((row.seconds * 1000) / row.steps);
            row.stepMsFrom = 'seconds/steps';
          }
          // After START the hook is in force; its first step (START + 1) sets it up, so from START + 2.
          const after = clock.meanFrom(hookStart(param) + 2);
          row.stepMsAfterStart = after.ms;
          row.stepsAfterStart = after.n;
          row.bytesPerStep = num(s.bytesPerStep);
          row.bytesPerStepAfterStart = num(s.bytesPerStepAfterStart) ?? row.bytesPerStep;
          const overlap = s.overlap as { hiddenShare?: unknown } | undefined;
          row.hiddenShare = overlap ? num(overlap.hiddenShare) : null;
          row.compressionRatio = num(s.compressionRatio);
          row.samplesPerSec = num(s.samplesPerSec);
          row.wallSamplesPerSec = row.stepMsAfterStart ? r1((nproc * batchSize * 1000) / row.stepMsAfterStart) : null;
          row.testAccuracy = num(s.testAccuracy);
          row.identical = typeof s.identical === 'boolean' ? s.identical : null;
          row.commHook = typeof s.commHook === 'object' && s.commHook !== null ? (s.commHook as Record<string, unknown>) : null;
          row.backends = Array.isArray(s.backends) ? (s.backends as unknown[]).map(String) : null;
          // A page that does not know the option trains without a hook and says nothing: not a result.
          const kind = param.split(':')[0];
          if (ok && kind !== 'none' && kind !== ALONE && row.commHook?.name !== kind) {
            row.ok = false;
            row.errors = [
              `asked for comm-hook ${param} but the summary's commHook is ${row.commHook ? JSON.stringify(row.commHook) : 'missing'}: does the train job know the comm-hook option yet?`,
            ];
          }
        } catch (err) {
          row.ok = false;
          row.errors = [(err as Error).message];
        }
        if (!row.ok) console.log(`[bench] FAILED ${model}, ${nproc} ranks, ${where}, ${param}: ${(row.errors ?? []).join('; ')}`);
        rows.push(row);
        await writeResults();
      }
    }
  }
}

/** Writes NAME.json and NAME.md from the rows so far (after every run: a long matrix keeps what it measured if it is stopped); returns the table. */
async function writeResults(): Promise<string> {
  compareWithNone(rows);
  const setup: BenchSetup = {
    models,
    backend,
    optimizer,
    lr: values.lr ?? null,
    nprocs,
    rates,
    hooks,
    start,
    epochs,
    batchSize,
    trainSize,
    testSize,
    steps: stepsCap,
  };
  const dilocoLines = dilocoVerdicts(rows, setup);
  const dilocoGoalLine = dilocoLines.length === 0 ? null : `${DILOCO_GOAL_TEXT} ${dilocoLines.join('; ')}.`;
  const verdicts = goalVerdicts(rows, setup);
  const goal = goalLine(verdicts);
  const date = new Date().toISOString().slice(0, 10);
  const machine = `${cpus().length} cores (${cpus()[0]?.model.trim() ?? 'unknown CPU'}), Chromium headless, backend ${backend}${backend === 'webgpu' ? ' (SwiftShader)' : ''}; --lan: each rank its own Chromium in its own network namespace, links shaped with tbf`;
  const table = resultsTable(rows, setup, { date, machine, lanNote, goalLine: goal, dilocoGoalLine });
  const dir = values['out-dir'] ? resolve(values['out-dir']) : join(PROJECT_ROOT, 'bench', 'results');
  await mkdir(dir, { recursive: true });
  await writeFile(
    join(dir, `${values.name}.json`),
    `${JSON.stringify(
      {
        date,
        machine,
        options: setup,
        ...(lanNote ? { lanNote } : {}),
        goal: { ...GOAL, text: GOAL_TEXT, verdicts, line: goal },
        dilocoGoal: { ...DILOCO_GOAL, text: DILOCO_GOAL_TEXT, verdicts: dilocoLines },
        rows,
      },
      null,
      2,
    )}\n`,
  );
  await writeFile(join(dir, `${values.name}.md`), `${table}\n`);
  return table;
}
console.log(`\n${await writeResults()}`);
const failed = rows.filter((r) => !r.ok);
if (failed.length > 0) {
  console.log(`\n[bench] ${failed.length} of ${rows.length} run(s) failed`);
  process.exit(1);
}
