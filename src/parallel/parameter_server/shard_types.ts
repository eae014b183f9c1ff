/**
 * What a parameter-server shard takes and reports: pushes, their outcomes, its statistics, options
 * and state dict. Apart from the shard (shard.ts) so that its apply/pull logic stays one file.
 */
import type * as tf from '@tensorflow/tfjs';
import type { TensorBundle } from '../../checkpoint/state_dict.ts';

/** What a worker sends a shard. */
export interface Push {
  /** The worker's id: an integer in [0, numWorkers). */
  worker: number;
  /** The worker's step id: a non-negative integer, increasing with each push of that worker. */
  stepId: number;
  /** The shard version the gradients were computed at (from the worker's pull). */
  version: number;
  /** Gradients of the shard's parameters, flat, in shard order (`layout.shards[k]`). */
  grads: Float32Array;
}

/** Why a push was refused. */
export type RefusalReason =
  /** The worker id is not an integer in [0, numWorkers). */
  | 'bad-worker'
  /** The step id is not a non-negative safe integer. */
  | 'bad-step'
  /** The version is not an integer in [0, current version]: a later one was never pulled here (a push from before this shard was restored from a checkpoint, say). */
  | 'bad-version'
  /** The gradients are not a Float32Array of the shard's length. */
  | 'bad-length'
  /** The gradients hold a NaN or an infinity. */
  | 'nonfinite';

export const REFUSAL_REASONS: readonly RefusalReason[] = ['bad-worker', 'bad-step', 'bad-version', 'bad-length', 'nonfinite'];

export type ApplyResult =
  /** Applied: `version` is the new version; the gradients were multiplied by `scale`. `checkpointDue` when the new version is a multiple of `checkpointEvery`. */
  | { status: 'applied'; version: number; staleness: number; scale: number; checkpointDue: boolean }
  /** Dropped: staleness above maxStaleness. */
  | { status: 'stale'; version: number; staleness: number }
  /** Dropped: the step id is not above the worker's last applied one (`lastStep`). */
  | { status: 'duplicate'; version: number; lastStep: number }
  /** Refused: malformed or not finite; `detail` says what was wrong. */
  | { status: 'refused'; version: number; reason: RefusalReason; detail: string };

export interface ShardStats {
  version: number;
  applied: number;
  stale: number;
  duplicate: number;
  refused: number;
  refusedBy: Record<RefusalReason, number>;
  /** Pushes applied or dropped as stale, by staleness: bucket i counts staleness i, the last bucket everything from its index up. */
  stalenessHistogram: number[];
  /** Per worker that pushed (well-formed worker id): pushes received, applied, last handled (applied or stale) step id (-1: none). By worker id. */
  workers: Array<{ worker: number; pushes: number; applied: number; lastStep: number }>;
}

export interface ParameterServerShardOptions {
  /** Initial values of the shard's parameters, in shard order; copied into the shard's own variables. */
  initial: tf.Tensor[];
  /** Makes the shard's optimizer; called again on each loadStateDict (a fresh optimizer takes the loaded state). */
  optimizer: () => tf.Optimizer;
  /** This shard's index k (names its checkpoint part `ps-<k>`). Default 0. */
  index?: number;
  /** Names of the parameters in the state dict (cosmetic: loading matches by position). Default `param-<i>`. */
  names?: string[];
  /** Drop pushes whose staleness exceeds this. Default Infinity (never). */
  maxStaleness?: number;
  /** Multiply a push's gradients by 1/(1+staleness) (see the module comment for Adam). Default false. */
  scaleLrByStaleness?: boolean;
  /** Worker ids are integers in [0, numWorkers). Default 1024. */
  numWorkers?: number;
  /** Most workers the shard keeps records of (pushes, last step id); past it, the lowest id's go. Default 4096. */
  maxWorkerRecords?: number;
  /** Buckets of the staleness histogram (the last one collects the tail). Default 32. */
  histogramBuckets?: number;
  /** Flag `checkpointDue` every this many applied updates (0: never). Default 0. */
  checkpointEvery?: number;
}

/** A shard's state: parameters, optimizer state, version and the workers' last applied step ids. */
export interface ShardStateDict {
  index: number;
  version: number;
  /** [worker, last applied step id], by worker. */
  lastSteps: Array<[number, number]>;
  params: TensorBundle;
  optimizer: TensorBundle;
  /**
   * Adam's running beta powers (beta1^t, beta2^t as it multiplied them), when the optimizer is
   * an Adam: TF.js's setWeights recomputes them with pow(), which can differ from the running
   * product in the last bit, so the shard carries them to continue bit-identically.
   */
  betaPowers?: number[];
}

/** A state dict that does not fit this shard (refused before anything is loaded). */
export class ShardStateError extends Error {
  override name = 'ShardStateError';
}
