/**
 * DiLoCo's options and what its regroup (`rejoin`) takes and reports: the hook's surface, apart
 * from the hook (diloco.ts) so that the outer-step logic there stays one file.
 */
import type { WireDtype } from '../../c10d/process_group.ts';
import type { AggregationSpec } from '../robust/aggregators.ts';
import type { AttackPlan } from '../robust/attacks.ts';

export interface DiLoCoOptions {
  /** Inner steps between two outer steps of each fragment (the paper's H), >= 1. */
  syncEvery: number;
  /** The outer SGD's learning rate (default 0.7, the paper's). */
  outerLr?: number;
  /** The outer SGD's momentum (default 0.9, the paper's); 0: plain outer SGD. */
  outerMomentum?: number;
  /** Nesterov momentum (default true, the paper's; needs a momentum). */
  nesterov?: boolean;
  /**
   * What the pseudo-gradients travel as: 'float32' (default), 'float16' / 'bfloat16' (half the
   * bytes) or 'int8' (blocks of 32 with a power-of-two scale: 1.03 bytes a value); the reduction
   * stays float32 and every rank decodes the same average.
   */
  wire?: WireDtype;
  /** Streaming DiLoCo: the fragments the weights are cut into, each with its own staggered outer step (default 1: the whole model at once). At most syncEvery. */
  fragments?: number;
  /** Inner steps an outer all-reduce runs behind, overlapped with compute (default 0: the ranks wait for it). Less than syncEvery / fragments. */
  overlap?: number;
  /**
   * How the ranks' pseudo-gradients are combined: the mean (default, by all-reduce), or a robust
   * kind (DDPOptions.aggregation's: trimmed-mean, median, centered-clip) gathered from every rank
   * (`pg.meshAllGather`, float32 whatever `wire` says). Every rank must ask for the same.
   */
  aggregation?: AggregationSpec;
  /** FOR MEASURING DEFENCES ONLY (robust/attacks.ts): the last `attackers` ranks play this on their pseudo-gradients. */
  attack?: AttackPlan;
}

/** What a rank held before a round's state transfer overwrote it: its own weights, for `rejoin`. */
export interface DiLoCoHeld {
  weights: Float32Array;
  /** Its committed steps, and its outer step count (over all fragments), then. */
  step: number;
  outerSteps: number;
  /** Per fragment, the samples this rank trained since the fragment's last outer step (null: the run counts no samples, see countStep). */
  samples: number[] | null;
}

/** How the round's start went: whether an outer step was taken, and how many ranks' inner steps it took in. */
export interface DiLoCoRejoin {
  outerStep: boolean;
  contributors: number;
}
