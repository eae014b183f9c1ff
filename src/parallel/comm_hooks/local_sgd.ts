/**
 * Post-local SGD (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", 2020), as torch's
 * `post_localSGD_hook` and `PeriodicModelAverager` (torch.distributed.algorithms.model_averaging):
 *
 * - `postLocalSGD({ startStep })` is a comm hook that averages gradients, as plain DDP does, for
 *   steps 1 .. startStep, and afterwards hands each rank its own gradients back untouched: no
 *   communication at all, each replica takes local SGD steps;
 * - `PeriodicModelAverager({ period, warmupSteps })` averages the replicas' weights every
 *   `period` steps after `warmupSteps`: call `average` after each optimizer step.
 *
 * Used together with warmupSteps = startStep, replicas stay identical through the warm-up (averaged
 * gradients) and drift apart between averagings after it.
 *
 * Checkpoints: neither keeps state of its own. What they do at a step depends on the step number
 * alone (the bucket's step, the step passed to `average`), so resuming at step k needs only k,
 * which the training state already holds. torch's averager counts steps itself; here the caller
 * passes them. As torch's, the averager averages parameters only, not the optimizer's state
 * (momentum and the like stay each rank's own).
 *
 * torch's hook can go on averaging within a subgroup (one machine's ranks) after the switch; this
 * one is the `subgroup=None` case: purely local.
 */
import type * as tf from '@tensorflow/tfjs';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { assignFlatWeights } from '../replicas.ts';
import { flatTrainableWeights } from '../replicas.ts';
import type { CommHook, GradBucket } from './types.ts';

export interface PostLocalSGDOptions {
  /** Steps 1 .. startStep average gradients (torch: start_localSGD_iter); later steps are local. */
  startStep: number;
}

/** torch's `post_localSGD_hook` (without a subgroup): averaged gradients up to `startStep`, then local ones. */
export function postLocalSGD(options: PostLocalSGDOptions): CommHook {
  const { startStep } = options;
  if (!Number.isSafeInteger(startStep) || startStep < 0)
    throw new RangeError(`postLocalSGD: startStep must be an integer >= 0, got ${startStep}`);
  return {
    name: 'postLocalSGD',
    reduce(pg: ProcessGroup, bucket: GradBucket): Promise<Float32Array> {
      if (bucket.step <= startStep) return pg.allReduce(bucket.buffer, 'avg');
      return Promise.resolve(bucket.buffer);
    },
  };
}

export interface PeriodicModelAveragerOptions {
  /** Average every `period` steps (>= 1). */
  period: number;
  /** No averaging for steps 1 .. warmupSteps (default 0). */
  warmupSteps?: number;
}

/**
 * torch's `PeriodicModelAverager`: after the optimizer step of `step` (1-based), averages the
 * model's trainable weights over `pg` when step > warmupSteps and (step - warmupSteps) is a
 * multiple of `period`. So with period 4 and warm-up 10 it averages after steps 14, 18, 22, ...
 * (torch counts its calls from 0 and averages at the first one past the warm-up: one step sooner).
 */
export class PeriodicModelAverager {
  readonly period: number;
  readonly warmupSteps: number;

  constructor(options: PeriodicModelAveragerOptions) {
    const { period, warmupSteps = 0 } = options;
    if (!Number.isSafeInteger(period) || period < 1)
      throw new RangeError(`PeriodicModelAverager: period must be an integer >= 1, got ${period}`);
    if (!Number.isSafeInteger(warmupSteps) || warmupSteps < 0)
      throw new RangeError(`PeriodicModelAverager: warmupSteps must be an integer >= 0, got ${warmupSteps}`);
    this.period = period;
    this.warmupSteps = warmupSteps;
  }

  /** Whether `average` averages at `step`. */
  averagesAt(step: number): boolean {
    return step > this.warmupSteps && (step - this.warmupSteps) % this.period === 0;
  }

  /**
   * Collective at the steps it averages (every rank of `pg` calls it with the same step): one
   * all-reduce of all trainable weights in float32, divided by the world size, assigned back, so
   * that the replicas are bit-identical afterwards. Resolves with whether it averaged.
   */
  async average(pg: ProcessGroup, model: tf.LayersModel, step: number): Promise<boolean> {
    if (!this.averagesAt(step)) return false;
    await this.averageNow(pg, model);
    return true;
  }

  /** Collective: averages the replicas now, whatever the step (runElastic does at the end of a run that ends between averagings). */
  async averageNow(pg: ProcessGroup, model: tf.LayersModel): Promise<void> {
    const flat = await flatTrainableWeights(model);
    await pg.allReduce(flat, 'avg');
    assignFlatWeights(model, flat, 'the model averaging');
  }
}
