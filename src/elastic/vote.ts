/**
 * The step-boundary vote of elastic runs: one small all-gather that carries each rank's stop and
 * join wishes with its metrics for the step (or, for runs that vote every few steps, for each
 * step since the last vote), so that every rank decides the same thing. A vote can also ride on
 * the gradients' all-reduce (`carriedVote`): then it costs no meeting of its own.
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
  wishes: VoteWishes,
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
export async function stepsVote<M extends StepMetrics>(pg: ProcessGroup, mine: M[], wishes: VoteWishes): Promise<StepsVote<M>> {
  const names = metricNames(mine);
  const row = voteRow(mine, names, wishes);
  return readVote(await pg.allGather(row), pg.worldSize, row.length, mine.length, names, wishes.stopVote);
}

/** What a rank puts to the vote: its stop and join wishes and its own work at the step, in ms. */
export interface VoteWishes {
  stop: boolean;
  join: boolean;
  stopVote?: 'any' | 'all';
  work?: number;
}

/**
 * The same vote as values that ride on a 'sum' all-reduce the ranks run anyway (the gradients'
 * last bucket: `DistributedDataParallel.carry`): this rank's row at its rank's place, zeros in the
 * others', so the sums are every rank's row in rank order, exactly as the all-gather returns them
 * (x + 0 is x). `read` decodes the sums.
 */
export function carriedVote<M extends StepMetrics>(
  pg: ProcessGroup,
  mine: M[],
  wishes: VoteWishes,
): { values: Float32Array; read(sums: Float32Array): StepsVote<M> } {
  const names = metricNames(mine);
  const row = voteRow(mine, names, wishes);
  const n = pg.worldSize;
  const values = new Float32Array(n * row.length);
  values.set(row, pg.rank * row.length);
  return {
    values,
    read: (sums) => {
      if (sums.length !== values.length) throw new RangeError(`a carried vote came back with ${sums.length} values; ${values.length} were sent`);
      return readVote(sums, n, row.length, mine.length, names, wishes.stopVote);
    },
  };
}

const metricNames = (mine: StepMetrics[]): string[] => (mine.length > 0 ? Object.keys(mine[0]!).sort() : []);

/** One rank's row: [stop, join wanted, work ms, ...its metrics of each step, by name]. */
function voteRow(mine: StepMetrics[], names: string[], wishes: VoteWishes): Float32Array {
  const row = new Float32Array(3 + mine.length * names.length);
  row[0] = wishes.stop ? 1 : 0;
  row[1] = wishes.join ? 1 : 0;
  row[2] = wishes.work ?? 0;
  mine.forEach((m, k) => names.forEach((name, i) => (row[3 + k * names.length + i] = m[name]!)));
  return row;
}

/** Every rank's rows (`all`, in rank order) read into the decision every rank reaches alike. */
function readVote<M extends StepMetrics>(all: Float32Array, n: number, rowLength: number, stepCount: number, names: string[], stopVote: 'any' | 'all' | undefined): StepsVote<M> {
  let stoppedBy: number | null = null;
  let stopVotes = 0;
  let regroup = false;
  const steps: M[][] = Array.from({ length: stepCount }, () => []);
  const works: number[] = [];
  for (let r = 0; r < n; r++) {
    const row = all.subarray(r * rowLength, (r + 1) * rowLength);
    if (row[0] === 1) {
      stopVotes++;
      stoppedBy ??= r;
    }
    if (row[1] === 1) regroup = true;
    // A peer's figure is untrusted: anything but a positive finite time is unknown (0).
    works.push(Number.isFinite(row[2]!) && row[2]! > 0 ? row[2]! : 0);
    steps.forEach((step, k) => step.push(Object.fromEntries(names.map((name, i) => [name, row[3 + k * names.length + i]!])) as M));
  }
  if (stopVote === 'all' && stopVotes < n) stoppedBy = null;
  return { stoppedBy, regroup, steps, works };
}
