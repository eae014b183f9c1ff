/**
 * The step-boundary vote of elastic runs: one small all-gather that carries each rank's stop and
 * join wishes with its metrics for the step (or, for runs that vote every few steps, for each
 * step since the last vote), so that every rank decides the same thing.
 */
import type { ProcessGroup } from '../c10d/process_group.ts';

/** A rank's figures for one step, by name; every rank must return the same names. */
export type StepMetrics = Record<string, number>;

export interface StepVote<M extends StepMetrics> {
  /** The first rank that asked to stop (null when the run goes on). */
  stoppedBy: number | null;
  /** Some rank has members waiting to join. */
  regroup: boolean;
  /** Every rank's metrics, in rank order. */
  metrics: M[];
  /** Every rank's own work at this step in ms (balanced batches' cost figures), in rank order; 0 where unknown. */
  works: number[];
}

/**
 * [stop, join wanted, work ms, ...this rank's metrics] from every rank (the work balances batches:
 * runElastic's `balanceBatches`). `stopVote` 'all' stops only when
 * every rank asks at the same step.
 */
export async function stepVote<M extends StepMetrics>(
  pg: ProcessGroup,
  mine: M,
  wishes: { stop: boolean; join: boolean; stopVote?: 'any' | 'all'; work?: number },
): Promise<StepVote<M>> {
  const v = await stepsVote(pg, [mine], wishes);
  return { stoppedBy: v.stoppedBy, regroup: v.regroup, metrics: v.steps[0]!, works: v.works };
}

/** A vote over several steps: every rank's metrics of each step since the last vote. */
export interface StepsVote<M extends StepMetrics> {
  stoppedBy: number | null;
  regroup: boolean;
  /** For each step voted on, in order: every rank's metrics, in rank order. */
  steps: M[][];
  /** Every rank's own work at the last step in ms; 0 where unknown. */
  works: number[];
}

/**
 * The vote of runs that do not meet at every step (DiLoCo's inner steps communicate nothing, and a
 * vote per step would be a meeting point per step): the wishes now, with this rank's metrics of
 * each of the steps since the last vote (`mine`, one entry per step, every rank the same count),
 * in one all-gather.
 */
export async function stepsVote<M extends StepMetrics>(
  pg: ProcessGroup,
  mine: M[],
  wishes: { stop: boolean; join: boolean; stopVote?: 'any' | 'all'; work?: number },
): Promise<StepsVote<M>> {
  const names = mine.length > 0 ? Object.keys(mine[0]!).sort() : [];
  const buf = new Float32Array(3 + mine.length * names.length);
  buf[0] = wishes.stop ? 1 : 0;
  buf[1] = wishes.join ? 1 : 0;
  buf[2] = wishes.work ?? 0;
  mine.forEach((m, k) => names.forEach((name, i) => (buf[3 + k * names.length + i] = m[name]!)));
  const all = await pg.allGather(buf);
  let stoppedBy: number | null = null;
  let stopVotes = 0;
  let regroup = false;
  const steps: M[][] = mine.map(() => []);
  const works: number[] = [];
  for (let r = 0; r < pg.worldSize; r++) {
    const row = all.subarray(r * buf.length, (r + 1) * buf.length);
    if (row[0] === 1) {
      stopVotes++;
      stoppedBy ??= r;
    }
    if (row[1] === 1) regroup = true;
    // A peer's figure is untrusted: anything but a positive finite time is unknown (0).
    works.push(Number.isFinite(row[2]!) && row[2]! > 0 ? row[2]! : 0);
    steps.forEach((step, k) => step.push(Object.fromEntries(names.map((name, i) => [name, row[3 + k * names.length + i]!])) as M));
  }
  if (wishes.stopVote === 'all' && stopVotes < pg.worldSize) stoppedBy = null;
  return { stoppedBy, regroup, steps, works };
}
