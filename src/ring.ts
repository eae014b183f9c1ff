/**
 * The ring schedule: which segment each rank sends and receives at each step of a ring
 * reduce-scatter and all-gather. Pure arithmetic, tested exhaustively.
 *
 * The buffer is cut into `worldSize` segments whose lengths differ by at most one. Rank r sends
 * to r+1 and receives from r-1. After the reduce-scatter, rank r holds the fully reduced
 * segment r (the layout torch's reduce_scatter gives); the all-gather then passes each owner's
 * segment around the ring. Each segment is reduced once, on its owner, in one fixed order, and
 * then copied: every rank ends with bit-identical values.
 */

export interface Segment {
  start: number;
  end: number;
}

/** Cuts `length` elements into `parts` contiguous segments; the first `length % parts` get one more. */
export function segments(length: number, parts: number): Segment[] {
  const base = Math.floor(length / parts);
  const extra = length % parts;
  const out: Segment[] = [];
  let start = 0;
  for (let i = 0; i < parts; i++) {
    const size = base + (i < extra ? 1 : 0);
    out.push({ start, end: start + size });
    start += size;
  }
  return out;
}

const mod = (a: number, n: number) => ((a % n) + n) % n;

export function rightOf(rank: number, worldSize: number): number {
  return mod(rank + 1, worldSize);
}

export function leftOf(rank: number, worldSize: number): number {
  return mod(rank - 1, worldSize);
}

export interface RingStep {
  /** Segment index this rank sends to its right neighbour. */
  send: number;
  /** Segment index this rank receives from its left neighbour. */
  recv: number;
}

/** Reduce-scatter, step s of n-1: send segment r-s-1, receive (and reduce into) segment r-s-2. */
export function reduceScatterStep(rank: number, worldSize: number, step: number): RingStep {
  return { send: mod(rank - step - 1, worldSize), recv: mod(rank - step - 2, worldSize) };
}

/** All-gather, step s of n-1: send segment r-s, receive (and copy) segment r-s-1. */
export function allGatherStep(rank: number, worldSize: number, step: number): RingStep {
  return { send: mod(rank - step, worldSize), recv: mod(rank - step - 1, worldSize) };
}

/** The whole schedule for one rank, for tests and for reading. */
export function ringSchedule(rank: number, worldSize: number): { reduceScatter: RingStep[]; allGather: RingStep[] } {
  const steps = Array.from({ length: Math.max(0, worldSize - 1) }, (_, s) => s);
  return {
    reduceScatter: steps.map((s) => reduceScatterStep(rank, worldSize, s)),
    allGather: steps.map((s) => allGatherStep(rank, worldSize, s)),
  };
}
