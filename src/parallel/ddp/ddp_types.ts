/**
 * DistributedDataParallel's options (`DDPOptions`, `BackwardOptions`) and what a backward returns
 * (`BackwardResult`, with `BackwardTimings`: where its time went). Internal: users import them
 * from ddp.ts (or the package's index).
 */
import type * as tf from '@tensorflow/tfjs';
import type { Straggler } from '../../runtime/straggler.ts';
import type { AggregationSpec } from '../robust/aggregators.ts';
import type { AttackPlan } from '../robust/attacks.ts';

export interface DDPOptions {
  /** Bucket size cap in MiB (torch: bucket_cap_mb). Default 25. */
  bucketCapMB?: number;
  /** The first bucket's cap in MiB (torch: 1 MiB). */
  firstBucketCapMB?: number;
  /** Key prefix for the shape check in the group's store; distinct per DDP instance in one group. */
  name?: string;
  /**
   * Fail `backward` with NonFiniteGradientError when an averaged gradient is NaN or infinite, and
   * drop the gradients so that no update is applied (torch: clip_grad_norm_'s error_if_nonfinite).
   * A pass over the gradients already on the host; no device readback. Default true (torch's is
   * false): one rank's NaN, a hostile member's included, would otherwise reach every replica.
   */
  errorIfNonfinite?: boolean;
  /**
   * The step number (1-based) of the first synchronised backward, which hooks see as
   * `GradBucket.step`: a DDP made again in the middle of a run (a new elastic round) continues
   * its hooks' count. Default 1.
   */
  startStep?: number;
  /**
   * Check the parameters' shapes across ranks and broadcast rank 0's weights when made (torch's
   * `init_sync`). Default true. False only where every rank already holds the same weights, as
   * after an elastic round's state transfer (every rank loaded the same bytes, each checked
   * against its own model): at 32 tabs on two cores the two cost a regroup over a second.
   */
  initSync?: boolean;
  /**
   * How the ranks' gradients are combined. `{ kind: 'mean' }` (the default): the average, by
   * bucketed ring all-reduces. A robust kind (`trimmed-mean`, `median`, `centered-clip`: see
   * robust/aggregators.ts) gathers every rank's whole gradient straight from that rank
   * (`pg.meshAllGather`: (N-1) x the gradient sent per rank, N/2 times the ring's) and
   * aggregates it on every rank alike, so that one member's hostile gradient cannot move every
   * replica; each rank's own mean gradient counts once (uneven batch shares weigh nothing there),
   * a rank with no samples in the step contributes no block, and a non-finite one is refused.
   * Not with a communication hook (other than the plain `allreduceHook()`), nor with `carry`.
   * Every rank must ask for the same. `ddp.lastAggregation` holds the last step's judgments.
   */
  aggregation?: AggregationSpec;
  /**
   * FOR MEASURING DEFENCES ONLY (robust/attacks.ts): the last `attackers` ranks of the group
   * play this attack on their own gradient before it is reduced. Default: none.
   */
  attack?: AttackPlan;
}

export interface BackwardTimings {
  /** Forward and backward, until the loss is on the host. */
  compute: number;
  /** Gradient readback from the device (includes waiting for the backward to finish). */
  readback: number;
  /** Waiting for all-reduces not hidden behind readback. */
  allreduce: number;
  /** Waited by `options.straggler` (a rank slowed on purpose), 0 without one. */
  slowed: number;
  /**
   * From the first bucket's reduction starting to the last one's ending (0 without reductions):
   * the communication's span. `comm - allreduce` of it ran while buckets were still read back,
   * hidden behind the backward.
   */
  comm: number;
}

export interface BackwardOptions {
  /**
   * Tensors, other than the model's weights, to differentiate the loss by as well (made
   * variables by the caller): a pipeline stage's input activations, whose gradients it sends to
   * the stage before it. Their gradients come back in `inputGrads`, in this order, and are the
   * caller's to dispose.
   */
  inputs?: tf.Variable[];
  /**
   * A rank slowed on purpose (see straggler.ts): after each bucket's readback (the first with the
   * forward and backward before it) it waits in proportion to the time that took, before the
   * bucket's all-reduce starts. So the other ranks wait for it in their all-reduces, as they would for a
   * slower device. Its waits are `timings.slowed`, apart from `compute` and `readback`.
   */
  straggler?: Pick<Straggler, 'after'>;
}

export interface BackwardResult {
  loss: number;
  timings: BackwardTimings;
  /**
   * Bytes this rank sent for this backward's reductions (`pg.bytesSent()` after they all
   * finished, less before the first started: frames with their headers); 0 under `noSync`.
   */
  commBytes: number;
  /** Values that rode on this backward's last reduction (`DistributedDataParallel.carry`), over all ranks; their bytes are in commBytes. */
  carriedValues: number;
  /** The gradients of `options.inputs` (empty without inputs). */
  inputGrads: tf.Tensor[];
}
