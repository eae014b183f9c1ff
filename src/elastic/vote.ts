/**
 * The step-boundary vote of elastic runs: one small all-gather that carries each rank's stop and
 * join wishes with its metrics for the step, so that every rank decides the same thing.
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
  const names = Object.keys(mine).sort();
  const buf = new Float32Array(3 + names.length);
  buf[0] = wishes.stop ? 1 : 0;
  buf[1] = wishes.join ? 1 : 0;
  buf[2] = wishes.work ?? 0;
  names.forEach((name, i) => (buf[3 + i] = mine[name]!));
  const all = await pg.allGather(buf);
  let stoppedBy: number | null = null;
  let stopVotes = 0;
  let regroup = false;
  const metrics: M[] = [];
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
    metrics.push(Object.fromEntries(names.map((name, i) => [name, row[3 + i]!])) as M);
  }
  if (wishes.stopVote === 'all' && stopVotes < pg.worldSize) stoppedBy = null;
  return { stoppedBy, regroup, metrics, works };
}
