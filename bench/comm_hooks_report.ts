/**
 * What bench/comm_hooks.ts makes of its rows: the bytes against none's, the goals' verdicts and
 * the Markdown table. Pure: the rows and the bench's settings in, text and figures out.
 */

/** The bench's settings, as its JSON records them (`options`). */
export interface BenchSetup {
  models: string[];
  backend: string;
  optimizer: string;
  lr: string | null;
  nprocs: number[];
  rates: number[];
  hooks: string[];
  start: number;
  epochs: number;
  batchSize: number;
  trainSize: number;
  testSize: number;
  steps: number | null;
}

/** --hooks alone: no communication at all, the upper bound of throughput. */
export const ALONE = 'alone';

/** The goal this benchmark checks (see goalVerdicts). */
export const GOAL = { model: 'cnn', rateMbit: 20, hook: 'powersgd:2', baseline: 'none', minSpeedup: 3, maxAccuracyDrop: 0.01 };
export const GOAL_TEXT = `Goal: at ${GOAL.rateMbit} Mbit/s on the ${GOAL.model.toUpperCase()}, PowerSGD rank 2 (${GOAL.hook}) at least ${GOAL.minSpeedup}x faster per step than ${GOAL.baseline}, with test accuracy within ${GOAL.maxAccuracyDrop * 100} point of ${GOAL.baseline}'s.`;

export interface Breakdown {
  compute: number;
  readback: number;
  allreduce: number;
  apply: number;
}

export interface Row {
  model: string;
  nprocs: number;
  /** null: loopback. */
  rateMbit: number | null;
  /** Each host's one-way delay on a shaped LAN (--delay; absent: none). */
  delayMs?: number;
  /** As asked (--hooks), and as passed to the job (with START). */
  hook: string;
  hookParam: string;
  ok: boolean;
  errors?: string[];
  steps: number | null;
  seconds: number | null;
  /** Mean step over the timed steps (2 .. N) from the breakdown, or seconds / steps without one. */
  stepMs: number | null;
  stepMsFrom: 'breakdown' | 'seconds/steps' | null;
  /** Wall time per step after START (steps START+2 .. N, between rank 0's step lines; eval intervals left out): the hook in force. */
  stepMsAfterStart: number | null;
  stepsAfterStart: number;
  breakdownMs: Breakdown | null;
  /** All-reduce (not hidden) over the step, from the breakdown. */
  commShare: number | null;
  /** Bytes each rank sent per step (mean over ranks), from the summary. */
  bytesPerStep: number | null;
  /** Bytes each rank sent per step after the hook's START (the summary's bytesPerStepAfterStart; the whole run's for none, fp16, bf16). */
  bytesPerStepAfterStart: number | null;
  /** bytesPerStepAfterStart / none's bytesPerStep at the same model and rank count (measured): the hook's own ratio, its warm-up left out. */
  bytesVsNone: number | null;
  /** Of the communication's span per step, the share that ran behind the backward's readback (rank 0's summary overlap.hiddenShare). */
  hiddenShare: number | null;
  /** The summary's compressionRatio (bytes against the float32 ring all-reduce of the same gradients). */
  compressionRatio: number | null;
  samplesPerSec: number | null;
  /** The group's samples per second of wall time after START: ranks x batch / step ms after START (alone: the runs' together). */
  wallSamplesPerSec: number | null;
  testAccuracy: number | null;
  identical: boolean | null;
  /** The summary's commHook as the ranks reported it. */
  commHook: Record<string, unknown> | null;
  backends: string[] | null;
}

export const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);
export const r1 = (x: number) => Math.round(x * 10) / 10;
export const r2 = (x: number) => Math.round(x * 100) / 100;
export const r4 = (x: number) => Math.round(x * 10_000) / 10_000;

/** Bytes against none's, measured: same model and rank count (the same rate if there is one; bytes do not depend on it). */
export function compareWithNone(rows: Row[]): void {
  for (const r of rows) {
    if (r.bytesPerStepAfterStart === null) continue;
    const nones = rows.filter(
      (o) => o.ok && o.model === r.model && o.nprocs === r.nprocs && o.hook === 'none' && o.bytesPerStep !== null && o.bytesPerStep > 0,
    );
    const base = nones.find((o) => o.rateMbit === r.rateMbit) ?? nones[0];
    if (base) r.bytesVsNone = r4(r.bytesPerStepAfterStart / base.bytesPerStep!);
  }
}

/** The step time to compare hooks by: after START when measured, else the whole run's. */
const comparableStep = (r: Row): number | null => r.stepMsAfterStart ?? r.stepMs;

export interface GoalVerdict {
  model: string;
  nprocs: number;
  met: boolean | null;
  speedup: number | null;
  accuracyDrop: number | null;
  note: string;
}

/** The goal, for each CNN (cnn, cnn:N) and rank count measured at its rate with both hooks. */
export function goalVerdicts(rows: readonly Row[], { models, nprocs }: BenchSetup): GoalVerdict[] {
  const out: GoalVerdict[] = [];
  for (const model of models.filter((m) => m.split(':')[0] === GOAL.model)) {
    for (const n of nprocs) {
      const at = (hook: string) => rows.find((r) => r.model === model && r.nprocs === n && r.rateMbit === GOAL.rateMbit && r.hook === hook);
      const base = at(GOAL.baseline);
      const hook = at(GOAL.hook);
      if (!base || !hook) continue;
      const baseMs = comparableStep(base);
      const hookMs = comparableStep(hook);
      const what = `${model}, ${n} ranks`;
      if (
        !base.ok ||
        !hook.ok ||
        baseMs === null ||
        hookMs === null ||
        hookMs <= 0 ||
        base.testAccuracy === null ||
        hook.testAccuracy === null
      ) {
        out.push({
          model,
          nprocs: n,
          met: null,
          speedup: null,
          accuracyDrop: null,
          note: `${what}: not measured (a run failed or gave no step time or accuracy)`,
        });
        continue;
      }
      const speedup = r2(baseMs / hookMs);
      const drop = r4(base.testAccuracy - hook.testAccuracy);
      const met = speedup >= GOAL.minSpeedup && drop <= GOAL.maxAccuracyDrop;
      const pts = (x: number) => `${(x * 100).toFixed(2)} points`;
      out.push({
        model,
        nprocs: n,
        met,
        speedup,
        accuracyDrop: drop,
        note: `${what}: ${met ? 'met' : 'NOT met'}: ${speedup}x faster per step (${hookMs} ms against ${baseMs} ms${hook.stepMsAfterStart !== null && base.stepMsAfterStart !== null ? ', after START' : ', whole run'}), accuracy ${drop >= 0 ? `${pts(drop)} below` : `${pts(-drop)} above`} none's`,
      });
    }
  }
  return out;
}

/** Issue 33's goal: streaming DiLoCo where the link is the step. */
export const DILOCO_GOAL = {
  model: 'cnn',
  rateMbit: 20,
  nprocs: 4,
  minThroughput: 0.85,
  maxAccuracyDrop: 0.01,
  maxBytes: 0.01,
  minHidden: 0.8,
};
export const DILOCO_GOAL_TEXT = `DiLoCo goal: at ${DILOCO_GOAL.rateMbit} Mbit/s with ${DILOCO_GOAL.nprocs} ranks on the ${DILOCO_GOAL.model.toUpperCase()}, streaming DiLoCo keeps >= ${DILOCO_GOAL.minThroughput} x the samples/s (wall) of the runs with no communication (alone), at test accuracy within ${DILOCO_GOAL.maxAccuracyDrop * 100} point of none's, sending <= ${DILOCO_GOAL.maxBytes} of none's bytes per step, with >= ${DILOCO_GOAL.minHidden * 100}% of its communication hidden.`;

/** The DiLoCo goal for each streaming diloco hook measured with alone and none beside it. */
export function dilocoVerdicts(rows: readonly Row[], { models }: BenchSetup): string[] {
  const out: string[] = [];
  for (const model of models.filter((m) => m.split(':')[0] === DILOCO_GOAL.model)) {
    const at = (hook: string, rate: number | null) =>
      rows.find(
        (r) => r.model === model && r.nprocs === DILOCO_GOAL.nprocs && r.hook === hook && (rate === undefined || r.rateMbit === rate),
      );
    const alone = rows.find((r) => r.model === model && r.nprocs === DILOCO_GOAL.nprocs && r.hook === ALONE && r.ok);
    const none = at('none', DILOCO_GOAL.rateMbit);
    for (const r of rows.filter(
      (x) => x.model === model && x.nprocs === DILOCO_GOAL.nprocs && x.rateMbit === DILOCO_GOAL.rateMbit && /^diloco:.*stream/.test(x.hook),
    )) {
      if (
        !r.ok ||
        !alone?.wallSamplesPerSec ||
        !r.wallSamplesPerSec ||
        !none?.ok ||
        none.testAccuracy === null ||
        r.testAccuracy === null
      ) {
        out.push(`${model}, ${r.hook}: not settled (it needs ok runs of ${r.hook}, alone and none)`);
        continue;
      }
      const throughput = r2(r.wallSamplesPerSec / alone.wallSamplesPerSec);
      const drop = r4(none.testAccuracy - r.testAccuracy);
      const bytes = r.bytesVsNone;
      const hidden = r.hiddenShare;
      const met =
        throughput >= DILOCO_GOAL.minThroughput &&
        drop <= DILOCO_GOAL.maxAccuracyDrop &&
        bytes !== null &&
        bytes <= DILOCO_GOAL.maxBytes &&
        hidden !== null &&
        hidden >= DILOCO_GOAL.minHidden;
      out.push(
        `${model}, ${r.hook}: ${met ? 'met' : 'NOT met'}: ${throughput} x alone's samples/s, accuracy ${(drop * 100).toFixed(2)} points ${drop >= 0 ? 'below' : 'above'} none's, ${bytes ?? '?'} of none's bytes, ${hidden === null ? '?' : Math.round(hidden * 100)}% hidden`,
      );
    }
  }
  return out;
}
/** The goal's line: met, not met or not settled, with each rank count's figures. */
export function goalLine(verdicts: readonly GoalVerdict[]): string {
  return verdicts.length === 0
    ? `${GOAL_TEXT} Not measured in this run (it needs --models ${GOAL.model} --rates ${GOAL.rateMbit} and hooks ${GOAL.baseline} and ${GOAL.hook}).`
    : `${GOAL_TEXT} ${verdicts.every((v) => v.met === true) ? 'Met' : verdicts.some((v) => v.met === null) ? 'Not settled' : 'NOT met'}: ${verdicts.map((v) => v.note).join('; ')}.`;
}

/** What the table's heading says besides the rows: the date, the machine, the LAN note and the goals. */
export interface TableHeading {
  date: string;
  machine: string;
  lanNote: string | null;
  goalLine: string;
  dilocoGoalLine: string | null;
}

/** The Markdown table: the heading, one table per model, and what each column means. */
export function resultsTable(rows: readonly Row[], setup: BenchSetup, heading: TableHeading): string {
  const { models, trainSize, steps: stepsCap, epochs, batchSize, optimizer, lr, start, testSize } = setup;
  const { date, machine, lanNote, goalLine, dilocoGoalLine } = heading;
  const work = `MNIST, first ${trainSize || 'all'} training samples, ${stepsCap !== null ? `at most ${stepsCap} steps of ` : ''}${epochs} epoch${epochs === 1 ? '' : 's'}, batch ${batchSize} per rank, ${optimizer}${lr !== null ? ` lr ${lr}` : ''}, START ${start} for powersgd and localsgd, test accuracy on ${testSize || 'all'} test samples`;
  const lines = [
    `DDP communication hooks, ${date}, ${machine}. ${work}.`,
    '',
    ...(lanNote ? [lanNote, ''] : []),
    goalLine,
    '',
    ...(dilocoGoalLine ? [dilocoGoalLine, ''] : []),
  ];
  for (const model of models) {
    const mine = rows.filter((r) => r.model === model);
    if (mine.length === 0) continue;
    lines.push(
      `### ${model}`,
      '',
      '| ranks | network | hook | step ms | step ms after START | bytes/step | bytes/step after START | vs none | communication share | hidden | samples/s | samples/s (wall) | test accuracy | identical |',
      '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |',
      ...mine.map(rowLine),
      '',
    );
  }
  lines.push(
    'Step ms: the mean step of the whole run (steps 2 .. N, averaged over ranks: compute + readback + all-reduce not hidden + apply), warm-up steps before START included. ' +
      'Step ms after START: wall time per step from step START + 2 on, when the hook is in force (from step 2 for hooks without a START: none, fp16, bf16; between rank 0 step lines as they reach the launcher; intervals with an evaluation left out; – when the run had no such steps). The goal compares these when both runs have them. ' +
      "Bytes/step: what each rank sent per step, mean over ranks (the job's bytesPerStep), warm-up included; after START: the steps with the hook in force (localsgd: its averagings spread over them). Vs none: bytes after START over none's at the same model and rank count. " +
      'Communication share: the all-reduce wait over the step. Hidden: of the communication’s span per step, the share that ran while the backward was still reading gradients back (rank 0); diloco: of its outer all-reduces’ time on the wire, the share the rank did not wait for. localsgd replicas are identical only right after an averaging step, diloco ones after a (full) outer step and at the end. ' +
      'Samples/s: the job’s, from each step’s own time (no vote, no outer step); samples/s (wall): ranks x batch over the wall time per step after START. alone: each rank a run of its own, at the same time, with no link at all (as many steps as a rank of the group): the upper bound of throughput; its accuracy is of a model that saw a rank’s share of the samples.',
  );
  return lines.join('\n');
}

/** A row of a model's table: a run's figures, or FAILED with its errors. */
function rowLine(r: Row): string {
  const net = r.rateMbit === null ? 'loopback' : `${r.rateMbit} Mbit/s${r.delayMs ? `, RTT +${2 * r.delayMs} ms` : ''}`;
  if (!r.ok)
    return `| ${r.nprocs} | ${net} | ${r.hook} | FAILED: ${(r.errors ?? []).join('; ').replace(/\|/g, '/').replace(/\s+/g, ' ').slice(0, 300)} |  |  |  |  |  |  |  |  |  |  |`;
  return `| ${r.nprocs} | ${net} | ${r.hook} | ${dash(r.stepMs)}${r.stepMsFrom === 'seconds/steps' ? ' (seconds/steps)' : ''} | ${dash(r.stepMsAfterStart)}${r.stepsAfterStart ? ` (${r.stepsAfterStart} steps)` : ''} | ${fmtBytes(r.bytesPerStep)} | ${fmtBytes(r.bytesPerStepAfterStart)} | ${dash(r.bytesVsNone, (v) => `${v} (${v > 0 ? r1(1 / v) : '∞'}x fewer)`)} | ${dash(r.commShare, (v) => `${Math.round(v * 100)}%`)} | ${dash(r.hiddenShare, (v) => `${Math.round(v * 100)}%`)} | ${dash(r.samplesPerSec, (v) => String(r1(v)))} | ${dash(r.wallSamplesPerSec, (v) => String(r1(v)))} | ${dash(r.testAccuracy, (v) => `${(v * 100).toFixed(2)}%`)} | ${r.identical === null ? '–' : r.identical ? 'yes' : 'NO'} |`;
}

const fmtBytes = (b: number | null) =>
  b === null ? '–' : b >= 1e6 ? `${r2(b / 1e6)} MB` : b >= 1e3 ? `${r1(b / 1e3)} kB` : `${Math.round(b)} B`;
const dash = (x: number | null | undefined, f: (v: number) => string = String) => (x === null || x === undefined ? '–' : f(x));
