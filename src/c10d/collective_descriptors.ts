/**
 * What each collective's frames say it is (its descriptor: kind, reduce op, element count, root,
 * wire dtype) and the checks of what picks it (the reduce op, a forced algorithm). Every rank
 * computes them from the same inputs, so ranks that issue different collectives get a
 * CollectiveMismatchError, not a hang. Apart from the process group (process_group.ts), which
 * runs the collectives these describe.
 */
import { Collective, ReduceOp, type Descriptor, type ReduceOpName } from '../wire/framing.ts';
import { WIRE_DTYPE_CODES, type WireDtype } from '../wire/half.ts';
import type { AllReduceAlgorithm } from './latency_collectives.ts';

/** A reduction's descriptor; RangeError for an op that is none of sum, avg, max, min. */
export function reduceDescriptor(collective: Collective, numel: number, op: ReduceOpName): Descriptor {
  if (!(op in ReduceOp)) throw new RangeError(`unknown reduce op ${JSON.stringify(op)}; use sum, avg, max or min`);
  return { collective, reduceOp: ReduceOp[op], numel, root: 0 };
}

/** RangeError unless `forced` (a per-call option) is an algorithm this collective runs: tree is for allReduce only. */
export function checkAlgorithm(forced: AllReduceAlgorithm | 'auto' | undefined, allReduce: boolean): void {
  const known = allReduce ? ['auto', 'ring', 'doubling', 'tree'] : ['auto', 'ring', 'doubling'];
  if (forced !== undefined && !known.includes(forced)) {
    throw new RangeError(
      `algorithm must be ${known.map((a) => `'${a}'`).join(', ')}${allReduce ? '' : ' (tree is for allReduce only)'}, got ${String(forced)}`,
    );
  }
}

/** An all-reduce of `numel` values by `algorithm`, sent as `wire`. */
export function allReduceDescriptor(algorithm: AllReduceAlgorithm, numel: number, op: ReduceOpName, wire: WireDtype): Descriptor {
  const collective =
    algorithm === 'ring' ? Collective.allReduce : algorithm === 'tree' ? Collective.allReduceTree : Collective.allReduceDoubling;
  return { ...reduceDescriptor(collective, numel, op), dtype: WIRE_DTYPE_CODES[wire] };
}

/** A broadcast of `numel` values from `src` by `algorithm` (ring, or else a binomial tree). */
export function broadcastDescriptor(algorithm: AllReduceAlgorithm, numel: number, src: number): Descriptor {
  const collective = algorithm === 'ring' ? Collective.broadcast : Collective.broadcastTree;
  return { collective, reduceOp: 0, numel, root: src };
}

/** An all-gather of `numel` values per rank by `algorithm` (ring, or else Bruck's). */
export function allGatherDescriptor(algorithm: AllReduceAlgorithm, numel: number): Descriptor {
  const collective = algorithm === 'ring' ? Collective.allGather : Collective.allGatherBruck;
  return { collective, reduceOp: 0, numel, root: 0 };
}
