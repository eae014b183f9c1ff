/**
 * The rest of an epoch for one rank of a DistributedSampler, cut into steps: what every training
 * loop of the library (runElastic, runPipeline) walks through between its votes.
 */
import { DistributedSampler } from '../sampler.ts';
import type { Progress } from '../state_dict.ts';

export interface EpochPlan {
  /** This sampler rank's samples for the rest of the epoch, padding included. */
  indices: number[];
  /** Where the sampler's padding starts in `indices`. */
  firstPadding: number;
  /** The rank's share of the whole epoch (torch's num_samples). */
  samples: number;
  stepsLeft: number;
  /** Steps in a whole epoch at this size. */
  fullEpochSteps: number;
}

export interface EpochOptions {
  numReplicas: number;
  rank: number;
  batchSize: number;
  shuffle?: boolean;
  seed?: number;
  dropLast?: boolean;
}

/** The rest of the epoch `progress` is in, for sampler rank `o.rank` of `o.numReplicas`. */
export function planEpoch(length: number, progress: Progress, o: EpochOptions): EpochPlan {
  const sampler = new DistributedSampler(length, { numReplicas: o.numReplicas, rank: o.rank, shuffle: o.shuffle, seed: o.seed, dropLast: o.dropLast });
  sampler.loadStateDict({ epoch: progress.epoch, position: progress.position });
  const indices = sampler.indices();
  return {
    indices,
    firstPadding: indices.length - sampler.numPadding,
    samples: sampler.numSamples,
    stepsLeft: Math.ceil(indices.length / o.batchSize),
    fullEpochSteps: Math.ceil(new DistributedSampler(length, { numReplicas: o.numReplicas, rank: 0, dropLast: o.dropLast }).numSamples / o.batchSize),
  };
}

/** Step `k`'s samples, and how many of them (at the end) are the sampler's padding. */
export function batchOf(plan: EpochPlan, k: number, batchSize: number): { indices: number[]; padding: number } {
  const from = k * batchSize;
  const to = Math.min(from + batchSize, plan.indices.length);
  return { indices: plan.indices.slice(from, to), padding: Math.max(0, to - Math.max(from, plan.firstPadding)) };
}
