/**
 * A DDP run on each tab's own pictures (dataset local, runElastic's `localData`): what the run
 * tells of them (each epoch's counts, each evaluation on every tab's own held-out pictures)
 * becomes the dashboard's events, and the trainer's evaluations (every evalEvery steps, after the
 * run) are the same evaluation, since no tab holds the others' test pictures.
 */
import type * as tf from '@tensorflow/tfjs';
import type { ProcessGroup } from '../../src/index.ts';
import type { LocalDataset } from '../../src/datasets/local.ts';
import { evaluateLocal, type LocalEvaluation } from '../../src/elastic/local_eval.ts';
import type { LocalDataEvent } from '../../src/parallel/ddp/local_data.ts';
import type { TrainEvent } from './events.ts';

/** The figures the trainer's evaluations carry: the group's accuracy; no loss (the held-out evaluation counts right answers). */
export type LocalFigures = { testAccuracy: number; testLoss: number };

export class LocalRun {
  /** The step the current epoch ends at (from its counts), or null before the first. */
  private epochEnd: number | null = null;
  /** The run's own evaluation at the last epoch end (or at the run's end), for onEpochEnd and the evaluation after the run at that step. */
  private last: { step: number; figures: LocalFigures } | null = null;

  constructor(
    readonly data: LocalDataset,
    private readonly emit: (e: TrainEvent) => void,
  ) {}

  /** runElastic's onLocalData. */
  readonly onLocalData = (e: LocalDataEvent): void => {
    if (e.type === 'local-counts') {
      this.epochEnd = e.step + e.stepsLeft;
      this.emit({ type: 'local-counts', epoch: e.epoch, step: e.step, samples: e.samples, remaining: e.remaining, left: e.left });
      if (e.left !== null && e.left > 0)
        this.emit({
          type: 'log',
          level: 'info',
          message: `${e.left} picture${e.left === 1 ? '' : 's'} of this epoch left with the tab${e.left === 1 ? '' : 's'} that went: the epoch goes on over the pictures still here`,
        });
      return;
    }
    this.last = { step: e.step, figures: this.told(e, e.epoch, e.step) };
  };

  /** Whether `step` ends the current epoch (the run then evaluates there itself). */
  endsEpoch(step: number): boolean {
    return this.epochEnd === step;
  }

  /** The run's evaluation at `step` (an epoch's end, the run's end), if it made one there. */
  evaluatedAt(step: number): LocalFigures | undefined {
    return this.last?.step === step ? this.last.figures : undefined;
  }

  /** Every rank evaluates on its own held-out pictures (a collective, as the run's at epoch ends). */
  async evaluate(pg: ProcessGroup, model: tf.LayersModel, step: number, epoch: number): Promise<LocalFigures> {
    return this.told(await evaluateLocal(pg, model, this.data.heldOut), epoch, step);
  }

  private told(e: LocalEvaluation, epoch: number, step: number): LocalFigures {
    this.emit({ type: 'local-eval', epoch, step, own: e.own, ranks: e.ranks, group: e.group });
    return { testAccuracy: e.group.accuracy ?? Number.NaN, testLoss: Number.NaN };
  }
}
