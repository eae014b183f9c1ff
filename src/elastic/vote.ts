/**
 * The step-boundary vote of elastic runs: each rank's stop and join wishes with its metrics for
 * the step (or, for runs that vote every few steps, for each step since the last vote), so that
 * every rank decides the same thing. The rows travel through the server (`pg.gatherRows`), which
 * places each at its sender's rank: a rank's row speaks for that rank only, and every rank reads
 * the same rows. (They used to ride on the gradients' sum all-reduce, where any member could add
 * into any rank's row: stop a run as rank 0, or claim the others' work times.) A vote can be
 * started before the step (`startVote`) and read after it: its round trip to the server then
 * overlaps the step's own all-reduce and costs no meeting of its own.
 */
import type { ProcessGroup } from '../c10d/process_group.ts';

/**
 * A rank's figures for one step, by name; every rank must return the same names. null: the rank
 * has no such figure this step (a loss or an accuracy of a rank given no samples by balanced
 * batches), which is not 0: readers leave it out of the group's figures.
 */
export type StepMetrics = Record<string, number | null>;

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
 * runElastic's `balance`). `stopVote` 'all' stops only when
 * every rank asks at the same step.
 */
export async function stepVote<M extends StepMetrics>(pg: ProcessGroup, mine: M, wishes: VoteWishes): Promise<StepVote<M>> {
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
  return startVote(pg, mine, wishes);
}

/**
 * The same vote, started now (its row goes to the server at once) and read when the promise is
 * awaited: a runner starts it before a step's gradients are reduced and reads it after, so that
 * the vote's round trip overlaps the all-reduce. Every rank must start the same votes in the same
 * order. The promise never rejects unobserved (a step that fails first leaves it unread).
 */
export function startVote<M extends StepMetrics>(pg: ProcessGroup, mine: M[], wishes: VoteWishes): Promise<StepsVote<M>> {
  const names = metricNames(mine);
  const row = voteRow(mine, names, wishes);
  const vote = pg.gatherRows(row).then((rows) => readVote<M>(rows, row.length, mine.length, names, wishes.stopVote));
  vote.catch(() => {});
  return vote;
}

/** What a rank puts to the vote: its stop and join wishes and its own work at the step, in ms. */
export interface VoteWishes {
  stop: boolean;
  join: boolean;
  stopVote?: 'any' | 'all';
  work?: number;
}

const metricNames = (mine: StepMetrics[]): string[] => (mine.length > 0 ? Object.keys(mine[0]!).sort() : []);

/**
 * Non-finite metrics (a diverged loss) and missing ones (null) cross the wire as JSON numbers:
 * these codes, which no figure of a step reaches, stand for them.
 */
const NAN_CODE = Number.MAX_VALUE;
const NEG_INF_CODE = -Number.MAX_VALUE;
const POS_INF_CODE = 1.7976931348623155e308;
const NULL_CODE = -1.7976931348623155e308;

function encodeMetric(v: number | null): number {
  if (v === null) return NULL_CODE;
  if (Number.isNaN(v)) return NAN_CODE;
  if (v === Infinity) return POS_INF_CODE;
  if (v === -Infinity) return NEG_INF_CODE;
  return v;
}

function decodeMetric(v: number): number | null {
  if (v === NULL_CODE) return null;
  if (v === NAN_CODE) return NaN;
  if (v === POS_INF_CODE) return Infinity;
  if (v === NEG_INF_CODE) return -Infinity;
  return v;
}

/** One rank's row: [stop, join wanted, work ms, ...its metrics of each step, by name]. */
function voteRow(mine: StepMetrics[], names: string[], wishes: VoteWishes): number[] {
  const row = new Array<number>(3 + mine.length * names.length).fill(0);
  row[0] = wishes.stop ? 1 : 0;
  row[1] = wishes.join ? 1 : 0;
  row[2] = encodeMetric(wishes.work ?? 0);
  mine.forEach((m, k) => {
    names.forEach((name, i) => {
      row[3 + k * names.length + i] = encodeMetric(m[name] ?? null);
    });
  });
  return row;
}

/**
 * Every rank's row (in rank order) read into the decision every rank reaches alike. A row of the
 * wrong length (a hostile or broken rank's) counts as no wish and unknown (NaN) figures: every
 * rank reads the same rows, so every rank decides the same.
 */
function readVote<M extends StepMetrics>(
  rows: number[][],
  rowLength: number,
  stepCount: number,
  names: string[],
  stopVote: 'any' | 'all' | undefined,
): StepsVote<M> {
  let stoppedBy: number | null = null;
  let stopVotes = 0;
  let regroup = false;
  const steps: M[][] = Array.from({ length: stepCount }, () => []);
  const works: number[] = [];
  const n = rows.length;
  for (let r = 0; r < n; r++) {
    const given = rows[r]!;
    const row = given.length === rowLength ? given.map(decodeMetric) : new Array<number | null>(rowLength).fill(NaN);
    if (row[0] === 1) {
      stopVotes++;
      stoppedBy ??= r;
    }
    if (row[1] === 1) regroup = true;
    // A peer's figure is untrusted: anything but a positive finite time is unknown (0).
    const work = row[2] ?? 0;
    works.push(Number.isFinite(work) && work > 0 ? work : 0);
    steps.forEach((step, k) => {
      step.push(Object.fromEntries(names.map((name, i) => [name, row[3 + k * names.length + i]!])) as M);
    });
  }
  if (stopVote === 'all' && stopVotes < n) stoppedBy = null;
  return { stoppedBy, regroup, steps, works };
}
