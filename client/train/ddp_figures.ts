/**
 * The DDP trainer's figures: a step's bytes for the vote (the hook's, DiLoCo's outer steps,
 * local SGD's averagings), the summary's `commHook` and overlap, the step's timeline, the
 * global batch's loss, and the bare all-reduce measured after the run.
 */
import type { ProcessGroup } from '../../src/index.ts';
import type { StepTimeline } from '../../src/elastic/timeline.ts';
import { allReduceBytes } from '../../src/c10d/collective_bytes.ts';
import { type DiLoCo, fragmentRanges, fragmentsSyncingAt } from '../../src/parallel/diloco/diloco.ts';
import { denseStepBytes, plainAllReduceBytes, TRAIN_FRAME_BYTES, type CommSetup } from './comm.ts';
import type { CommMetrics } from './harness.ts';

/**
 * This rank's timeline, mean ms per timed step: compute, readback, waitSlowest and wire (the
 * exposed all-reduce, split), apply, batch (the rest of the step function: the batch's tensors,
 * the metrics), then what runElastic measured around the step: average (local SGD), vote (the
 * step-boundary all-gather), page (onStep: the dashboard's events, evaluations; replica checks,
 * checkpoints) and other; total is the wall time per step.
 */
export function stepTimeline(
  own: Record<'compute' | 'readback' | 'waitSlowest' | 'wire' | 'apply' | 'batch', number>,
  steps: number,
  run: StepTimeline,
): Record<string, number | null> {
  const mean = (v: number) => (steps > 0 ? v / steps : null);
  const measured = (v: number) => (run.steps > 0 ? v : null);
  const { average, vote, page, other, total } = run;
  return {
    ...Object.fromEntries(Object.entries(own).map(([k, v]) => [k, mean(v)])),
    ...Object.fromEntries(Object.entries({ average, vote, page, other, total }).map(([k, v]) => [k, measured(v)])),
  };
}

/** Median ms of the buckets' float32 all-reduces, one after the other, over `iters` rounds (each after a barrier). */
export async function bareBucketsAllReduce(
  pg: ProcessGroup,
  buckets: ReadonlyArray<{ start: number; end: number }>,
  iters = 5,
): Promise<number | null> {
  if (pg.worldSize < 2 || buckets.length === 0) return null;
  const times: number[] = [];
  for (let i = 0; i <= iters; i++) {
    await pg.barrier();
    const t0 = performance.now();
    for (const b of buckets) await pg.allReduce(new Float32Array(b.end - b.start), 'avg');
    if (i > 0) times.push(performance.now() - t0); // the first warms up
  }
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)]!;
}

/** With DiLoCo, the ranks vote at least this often (runElastic's voteEvery): a stop or a joiner waits at most this many steps. */
export const DILOCO_VOTE_EVERY = 16;

/**
 * A step's bytes for the vote: what the backward's reductions sent (plus, with localsgd, the
 * model averaging runElastic does after this step, when it averages: one float32 all-reduce of
 * every trainable weight, computed), and what the float32 all-reduce of the buckets would have.
 */
export function stepBytes(
  comm: CommSetup,
  sent: { commBytes: number; carriedValues: number },
  step: number,
  ddp: { buckets: ReadonlyArray<{ start: number; end: number }>; parameterCount: number },
  pg: ProcessGroup,
): CommMetrics {
  const averaging = comm.averager?.averagesAt(step)
    ? plainAllReduceBytes(ddp.parameterCount, pg.rank, pg.worldSize)
    : outerStepBytes(comm, ddp.parameterCount, pg, step);
  return {
    commBytes: sent.commBytes + averaging,
    commDenseBytes: denseStepBytes(ddp.buckets, pg.rank, pg.worldSize, TRAIN_FRAME_BYTES, sent.carriedValues),
  };
}

/** Whether some DiLoCo fragment takes its outer step after `step` (DiLoCo.syncsAt's rule). */
export function syncsAt(comm: CommSetup, step: number): boolean {
  return comm.diloco !== undefined && fragmentsSyncingAt(step, comm.diloco.syncEvery, comm.diloco.fragments ?? 1).length > 0;
}

/**
 * What DiLoCo's outer all-reduces started after `step` send from this rank (its pseudo-gradient's
 * fragments whose turn it is, in the wire type), computed; every fragment's when `step` is
 * undefined (one outer step of the whole model). 0 without DiLoCo.
 */
export function outerStepBytes(comm: CommSetup, parameterCount: number, pg: ProcessGroup, step?: number): number {
  const d = comm.diloco;
  if (!d) return 0;
  const ranges = fragmentRanges(parameterCount, d.fragments ?? 1);
  const turn = step === undefined ? ranges.map((_, f) => f) : fragmentsSyncingAt(step, d.syncEvery, d.fragments ?? 1);
  return turn.reduce(
    (sum, f) =>
      sum +
      allReduceBytes(ranges[f]!.end - ranges[f]!.start, pg.rank, pg.worldSize, {
        frameBytes: TRAIN_FRAME_BYTES,
        wire: d.wire ?? 'float32',
      }),
    0,
  );
}

/**
 * The summary's `commHook`: the option as given (`name`: one of COMM_HOOK_NAMES, src/jobs/comm_hook_spec.ts)
 * and its numbers, and `registered`, the name of the hook the last round's DDP reduced with (its
 * own `allreduce` without one). PowerSGD adds its last step's counts (`lastStats`: elements this
 * rank all-reduced, and those an uncompressed all-reduce would have); localsgd the averagings in
 * the timed steps and what one sends from this rank; diloco its outer steps and what one sends.
 */
export function commHookSummary(
  comm: CommSetup,
  registered: string,
  parameterCount: number,
  pg: ProcessGroup,
  averagings: number,
): Record<string, unknown> {
  const spec = comm.spec;
  switch (spec.kind) {
    case 'powersgd': {
      const stats = comm.powerSGD!.lastStats;
      return {
        name: spec.kind,
        registered,
        rank: spec.rank,
        startIter: spec.startIter,
        wire: spec.wire,
        statsStep: stats.step,
        elementsSent: stats.elementsSent,
        elementsDense: stats.elementsDense,
      };
    }
    case 'localsgd':
      return {
        name: spec.kind,
        registered,
        period: spec.period,
        startStep: spec.startStep,
        averagings,
        averageBytes: plainAllReduceBytes(parameterCount, pg.rank, pg.worldSize),
      };
    case 'diloco':
      return {
        name: spec.kind,
        registered,
        syncEvery: spec.syncEvery,
        outerLr: spec.outerLr,
        outerMomentum: spec.outerMomentum,
        wire: spec.wire,
        stream: spec.stream,
        overlap: spec.overlap,
        outerSteps: averagings,
        outerStepBytes: outerStepBytes(comm, parameterCount, pg),
      };
    default:
      return { name: spec.kind, registered };
  }
}

/** DiLoCo's outer all-reduces: mean span and exposed wait per all-reduce, and the share of the span hidden behind inner steps. */
export function dilocoOverlap(d: DiLoCo): { commMs: number; exposedMs: number; hiddenShare: number; allReduces: number } | null {
  const c = d.comm;
  if (c.allReduces === 0 || c.spanMs <= 0) return null;
  const exposed = Math.min(c.exposedMs, c.spanMs);
  return {
    commMs: c.spanMs / c.allReduces,
    exposedMs: exposed / c.allReduces,
    hiddenShare: 1 - exposed / c.spanMs,
    allReduces: c.allReduces,
  };
}

/** Mean communication span and exposed wait per step, and the share of the span hidden behind the backward. */
export function overlapOf(steps: number, span: number, exposed: number): { commMs: number; exposedMs: number; hiddenShare: number } | null {
  if (steps === 0 || span <= 0) return null;
  const commMs = span / steps;
  const exposedMs = Math.min(exposed / steps, commMs);
  return { commMs, exposedMs, hiddenShare: 1 - exposedMs / commMs };
}

/** The step's loss over the global batch: each rank's mean loss weighted by its samples (a rank without samples has none). */
export function weightedLoss(metrics: ReadonlyArray<{ loss: number | null; samples: number }>): number {
  let samples = 0;
  let sum = 0;
  for (const m of metrics) {
    if (m.loss === null || !(m.samples > 0)) continue;
    samples += m.samples;
    sum += m.loss * m.samples;
  }
  return samples > 0 ? sum / samples : NaN;
}
