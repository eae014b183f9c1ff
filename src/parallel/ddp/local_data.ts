/**
 * runElastic's `localData` (datasets/local.ts): what its round's steps do differently. Each
 * epoch's rest in a round starts with the counts exchange (elastic/local_epoch.ts), each step takes
 * this rank's share of the split and weighs its gradient by it, and each epoch ends with the
 * evaluation on every rank's own held-out samples (elastic/local_eval.ts). What the run tells of
 * it goes to `onLocalData` as LocalDataEvents.
 */
import type * as tf from '@tensorflow/tfjs';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import type { Progress } from '../../checkpoint/state_dict.ts';
import type { LocalDataset } from '../../datasets/local.ts';
import { LocalProgress, type LocalEpochRest } from '../../elastic/local_epoch.ts';
import { evaluateLocal, type LocalEvaluation } from '../../elastic/local_eval.ts';

export type LocalDataEvent =
  /**
   * An epoch's rest starts in a round: every rank's samples left in the epoch and held (each as
   * the rank itself said), which ranks are new to the epoch, the samples that left with ranks
   * gone since this rank's last step (null when this rank cannot tell: it is new), and the steps left.
   */
  | {
      type: 'local-counts';
      round: string;
      rank: number;
      epoch: number;
      step: number;
      remaining: number[];
      samples: number[];
      joined: boolean[];
      left: number | null;
      stepsLeft: number;
    }
  /** An epoch ended (or the run, mid-epoch): this rank's accuracy on its own held-out samples, every rank's and the group's. */
  | ({ type: 'local-evaluation'; round: string; rank: number; epoch: number; step: number } & LocalEvaluation);

/** A run's local data: this rank's progress through its samples (across rounds) and what it last evaluated. */
export class LocalDataRun {
  readonly progress: LocalProgress;
  lastEvaluation: LocalEvaluation | null = null;
  /** The step the last evaluation saw the model of (-1: none yet). */
  evaluatedAt = -1;

  constructor(
    readonly dataset: LocalDataset,
    o: { seed?: number; shuffle?: boolean },
    private readonly tell: (e: LocalDataEvent) => void,
  ) {
    this.progress = new LocalProgress(dataset, o.seed ?? 0, o.shuffle ?? true);
  }

  /** The counts exchange and the epoch's rest in this round, told. */
  async plan(pg: ProcessGroup, round: string, p: Progress, globalBatch: number): Promise<LocalEpochRest> {
    const { rest, left } = await this.progress.plan(pg, p, globalBatch);
    const { remaining, samples, joined } = rest.counts;
    this.tell({
      type: 'local-counts',
      round,
      rank: pg.rank,
      epoch: p.epoch,
      step: p.step,
      remaining,
      samples,
      joined,
      left,
      stepsLeft: rest.stepsLeft,
    });
    return rest;
  }

  /** Step k of `rest` committed as step `p.step` (p already moved on). */
  commit(rest: LocalEpochRest, k: number, p: Progress): void {
    this.progress.commit(p.epoch, p.step, rest.consumedAfter(k), rest.unionLeftAfter(k));
  }

  /** The epoch's end: every rank evaluates on its own held-out samples (a collective), told. */
  async evaluate(pg: ProcessGroup, model: tf.LayersModel, round: string, p: Progress): Promise<void> {
    const e = await evaluateLocal(pg, model, this.dataset.heldOut);
    this.lastEvaluation = e;
    this.evaluatedAt = p.step;
    this.tell({ type: 'local-evaluation', round, rank: pg.rank, epoch: p.epoch, step: p.step, ...e });
  }
}
