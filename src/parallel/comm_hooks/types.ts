/**
 * DDP communication hooks (torch's `register_comm_hook`): what reduces each bucket's gradients
 * across ranks in `DistributedDataParallel.backward`, in place of the plain all-reduce.
 *
 * How DDP calls a hook: `reduce(pg, bucket)` once per bucket of every synchronised backward, in
 * bucket order, as soon as that bucket's gradients are on the host, without waiting for the
 * previous bucket's reduction (the reductions overlap the readback of the next buckets). The
 * collectives of a group are matched across ranks by the order they are issued in, so:
 * - collectives a hook issues synchronously in `reduce` (before its first `await`) are in bucket
 *   order on every rank;
 * - a hook that issues further collectives after an `await` (PowerSGD's second all-reduce) must
 *   make their order the same on every rank itself, e.g. by chaining each bucket's work after
 *   the previous bucket's (a promise tail), or by issuing nothing until `isLast`.
 * The returned gradients must be the same bits on every rank (replicas stay identical only if
 * they are), `bucket.buffer.length` long; DDP copies them into the bucket unless they are the
 * bucket's own buffer (reduced in place).
 *
 * A hook's state (error feedback, warm-start matrices, its own counters) is part of the training
 * state: `stateDict()` / `loadStateDict()`, through `ddp.commHookState()` /
 * `ddp.loadCommHookState()`.
 */
import type { ProcessGroup } from '../../c10d/process_group.ts';
import type { HookState } from '../../elastic/hook_state.ts';
/** One DDP bucket as a hook sees it (torch's GradBucket). */
export interface GradBucket {
  /** The bucket's index (0 is the first reduced, holding the last parameters). */
  index: number;
  /** The bucket's flat gradients (this rank's, not yet averaged). The hook may reduce in place. */
  buffer: Float32Array;
  /** The parameters in the bucket: index into the model's trainable weights, shape, and where it starts in `buffer` (elements). */
  parameters: Array<{ index: number; shape: number[]; offset: number; size: number }>;
  /** The step being trained (1-based), for hooks that change behaviour with it (PowerSGD's start_iter, post-local SGD). */
  step: number;
  /** Whether this is the step's last bucket. */
  isLast: boolean;
}
/** State a hook keeps across steps, for checkpoints and joiners: plain numbers in `meta`, arrays in `tensors` (the agent carries it as a HookState). */
export type CommHookState = HookState;
/** How `loadStateDict` takes a state. */
export interface LoadCommHookStateOptions {
  /**
   * The state is another rank's, not this rank's own: a joiner warm-starting from a live
   * replica's hook, or a rank other than 0 resuming from a checkpoint (which holds rank 0's).
   * The hook then takes only what is the same on every rank (PowerSGD: the Q matrices and the
   * iteration) and starts what is each rank's own afresh (PowerSGD: the error feedback, zero, as
   * for a rank that restarts in torch; another rank's error added here would count that rank's
   * compression error twice in the average). Default false: the state is this rank's own.
   */
  otherRank?: boolean;
}
/** torch's comm hook: returns the bucket's gradients averaged over `pg` (the same on every rank). */
export interface CommHook {
  readonly name: string;
  /**
   * The hook keeps each rank's gradients its own (DiLoCo's inner steps): DDP hands it the mean
   * over this rank's samples, not weighted by the rank's share of an uneven step (setBatchShare);
   * a hook that averages later weighs by samples itself. Default false.
   */
  readonly localSteps?: boolean;
  reduce(pg: ProcessGroup, bucket: GradBucket): Promise<Float32Array>;
  stateDict?(): CommHookState;
  loadStateDict?(state: CommHookState, options?: LoadCommHookStateOptions): void;
}
