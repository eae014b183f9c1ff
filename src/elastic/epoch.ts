/**
 * The rest of an epoch for one rank of a DistributedSampler, cut into steps: what every training
 * loop of the library (runElastic, runPipeline) walks through between its votes.
 */
import { DistributedSampler } from '../datasets/sampler.ts';
import type { Progress } from '../checkpoint/state_dict.ts';

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
  const sampler = new DistributedSampler(length, {
    numReplicas: o.numReplicas,
    rank: o.rank,
    shuffle: o.shuffle,
    seed: o.seed,
    dropLast: o.dropLast,
  });
  sampler.loadStateDict({ epoch: progress.epoch, position: progress.position });
  const indices = sampler.indices();
  return {
    indices,
    firstPadding: indices.length - sampler.numPadding,
    samples: sampler.numSamples,
    stepsLeft: Math.ceil(indices.length / o.batchSize),
    fullEpochSteps: Math.ceil(
      new DistributedSampler(length, { numReplicas: o.numReplicas, rank: 0, dropLast: o.dropLast }).numSamples / o.batchSize,
    ),
  };
}

/** Step `k`'s samples, and how many of them (at the end) are the sampler's padding. */
export function batchOf(plan: EpochPlan, k: number, batchSize: number): { indices: number[]; padding: number } {
  const from = k * batchSize;
  const to = Math.min(from + batchSize, plan.indices.length);
  return { indices: plan.indices.slice(from, to), padding: Math.max(0, to - Math.max(from, plan.firstPadding)) };
}

/**
 * Batches balanced by speed (runElastic's `balance`): every step takes the next
 * `batchSize * worldSize` samples of the epoch's global order (the DistributedSampler's, so the
 * position means the same in both modes and a regroup can switch between them) and splits them
 * between the ranks by their shares, so a device at 1/5 of the others' speed gets about 1/5 of
 * their samples. Every sample of the epoch is trained exactly once; when the epoch's last step
 * has fewer samples than ranks, the first samples of the order are repeated (torch's padding).
 */
export interface GlobalEpochPlan {
  /** The rest of the epoch's global order. */
  order: number[];
  stepsLeft: number;
  /** Steps in a whole epoch at this size. */
  fullEpochSteps: number;
}

export function planGlobalEpoch(length: number, progress: Progress, o: Omit<EpochOptions, 'rank'>): GlobalEpochPlan {
  const sampler = new DistributedSampler(length, { numReplicas: 1, rank: 0, shuffle: o.shuffle, seed: o.seed, dropLast: false });
  sampler.loadStateDict({ epoch: progress.epoch, position: progress.position });
  const order = sampler.indices();
  const globalBatch = o.batchSize * o.numReplicas;
  return { order, stepsLeft: Math.ceil(order.length / globalBatch), fullEpochSteps: Math.ceil(length / globalBatch) };
}

/**
 * Step `k`'s samples for `rank` when `split(count)` gives every rank's count of the step's
 * `count` samples (the same on every rank: see balance.ts): its indices (none when the split
 * gives it none), how many of them repeat earlier samples (padding), the step's samples over all
 * ranks, and every rank's count. A last step shorter than the group is padded from the start of
 * the order, so that a split that gives every rank a sample can.
 */
export function balancedBatchOf(
  plan: GlobalEpochPlan,
  k: number,
  globalBatch: number,
  split: (count: number) => number[],
  rank: number,
  worldSize: number,
): { indices: number[]; padding: number; globalSamples: number; counts: number[] } {
  const from = k * globalBatch;
  const real = plan.order.slice(from, Math.min(from + globalBatch, plan.order.length));
  const padding = Math.max(0, worldSize - real.length);
  const samples = real.concat(Array.from({ length: padding }, (_, i) => plan.order[i % plan.order.length]!));
  const counts = split(samples.length);
  if (counts.length !== worldSize || counts.reduce((a, b) => a + b, 0) !== samples.length) {
    throw new RangeError(`balancedBatchOf: a split of ${samples.length} samples over ${worldSize} ranks, got [${counts.join(', ')}]`);
  }
  const start = counts.slice(0, rank).reduce((a, b) => a + b, 0);
  const indices = samples.slice(start, start + counts[rank]!);
  const paddingHere = Math.max(0, start + counts[rank]! - Math.max(start, real.length));
  return { indices, padding: paddingHere, globalSamples: samples.length, counts };
}

/**
 * `count` samples split in proportion to `weights` (largest remainder; every rank at least one
 * when count >= ranks; ties to the lower rank). Pure arithmetic on the same inputs: every rank
 * computes the same split. A weight that is not a positive finite number counts as the median.
 * `quantum` > 1 splits in units of that many samples (what is left over goes to the fastest
 * rank), so that a rank's batch takes few distinct sizes: each new size compiles kernels.
 */
export function splitBatch(count: number, weights: readonly number[], quantum = 1): number[] {
  const n = weights.length;
  if (n === 0) return [];
  const valid = weights.filter((w) => Number.isFinite(w) && w > 0).sort((a, b) => a - b);
  const median = valid.length > 0 ? valid[Math.floor(valid.length / 2)]! : 1;
  const w = weights.map((x) => (Number.isFinite(x) && x > 0 ? x : median));
  const units = Math.floor(count / quantum);
  if (quantum > 1 && units >= n) {
    const counts = splitBatch(units, w).map((u) => u * quantum);
    const fastest = w.indexOf(Math.max(...w));
    counts[fastest]! += count - units * quantum;
    return counts;
  }
  const total = w.reduce((a, b) => a + b, 0);
  const min = count >= n ? 1 : 0;
  const spare = count - min * n;
  const raw = w.map((x) => (spare * x) / total);
  const counts = raw.map((x) => min + Math.floor(x));
  let left = count - counts.reduce((a, b) => a + b, 0);
  const order = raw.map((x, r) => ({ r, frac: x - Math.floor(x) })).sort((a, b) => b.frac - a.frac || a.r - b.r);
  for (let i = 0; left > 0; i = (i + 1) % n, left--) counts[order[i]!.r]!++;
  return counts;
}
