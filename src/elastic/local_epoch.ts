/**
 * An epoch over the union of the ranks' own samples (runElastic's `localData`, datasets/local.ts):
 * each rank walks its own seeded order of its own samples, and each step's global batch is split
 * between the ranks in proportion to the samples each has left in the epoch, so that the ranks
 * finish the epoch together whatever their amounts (largest remainder, never more than a rank
 * has: a rank whose samples are done gets none).
 *
 * The ranks agree on the split from one exchange per epoch and round: each rank's own row
 * [samples left, samples held, new to the epoch], gathered through the server, which places each
 * row at its sender's rank (a member speaks only for itself). Every later split is arithmetic on
 * those rows, the same on every rank. A row that is not three sane integers counts as a rank with
 * no samples: a member can only take its own samples out of the union.
 */
import type { ProcessGroup } from '../c10d/process_group.ts';
import { DatasetError } from '../datasets/dataset.ts';
import { MAX_LOCAL_SAMPLES, type LocalDataset } from '../datasets/local.ts';
import type { Progress } from '../checkpoint/state_dict.ts';

/** What the ranks said in the exchange, in rank order. */
export interface LocalCounts {
  /** Each rank's samples left in the epoch. */
  remaining: number[];
  /** Each rank's samples in all. */
  samples: number[];
  /** Whether each rank is new to the epoch (it joined since the epoch began: all its samples are left). */
  joined: boolean[];
}

/** The exchange's rows read, each for its own rank; a malformed row is a rank without samples. */
export function countsFromRows(rows: readonly (readonly number[])[]): LocalCounts {
  const out: LocalCounts = { remaining: [], samples: [], joined: [] };
  for (const row of rows) {
    const [remaining, samples, joined] = row;
    const sane =
      row.length === 3 &&
      Number.isSafeInteger(samples) &&
      Number.isSafeInteger(remaining) &&
      samples! >= 0 &&
      samples! <= MAX_LOCAL_SAMPLES &&
      remaining! >= 0 &&
      remaining! <= samples! &&
      (joined === 0 || joined === 1);
    out.remaining.push(sane ? remaining! : 0);
    out.samples.push(sane ? samples! : 0);
    out.joined.push(sane && joined === 1);
  }
  return out;
}

/**
 * `count` samples split in proportion to `remaining` (largest remainder, ties to the lower rank),
 * never more than a rank's remaining: count <= sum(remaining). The same on every rank.
 */
export function splitByRemaining(count: number, remaining: readonly number[]): number[] {
  const total = remaining.reduce((a, b) => a + b, 0);
  if (!(Number.isSafeInteger(count) && count >= 0 && count <= total))
    throw new RangeError(`splitByRemaining: ${count} samples from ranks holding ${total}`);
  if (count === total) return [...remaining];
  // Exact integer arithmetic: count * r fits a double well below 2^53 (count <= batch, r <= 2^24).
  const counts = remaining.map((r) => Math.floor((count * r) / total));
  const fracs = remaining.map((r, i) => ({ i, rest: count * r - counts[i]! * total }));
  let left = count - counts.reduce((a, b) => a + b, 0);
  fracs.sort((a, b) => b.rest - a.rest || a.i - b.i);
  // The `left` largest remainders are all positive (they sum to left * total): none exceeds its rank's remaining.
  for (let j = 0; left > 0; j++, left--) counts[fracs[j]!.i]!++;
  return counts;
}

/** The rest of an epoch in one round, from the exchange's counts: each step's split and this rank's samples. */
export class LocalEpochRest {
  readonly counts: LocalCounts;
  readonly stepsLeft: number;
  /** Steps of a whole epoch of the union at this global batch. */
  readonly fullEpochSteps: number;
  /** Samples of the union left in the epoch. */
  readonly unionLeft: number;
  /** The step the split is known for, each rank's remaining before it, and this rank's offset in its order. */
  private at = 0;
  private rem: number[];
  private offset: number;
  private split: number[] | null = null;

  constructor(
    counts: LocalCounts,
    private readonly rank: number,
    private readonly globalBatch: number,
    /** This rank's order of its own samples in the epoch, and how many of them it trained already. */
    private readonly order: Uint32Array,
    consumed: number,
  ) {
    this.counts = counts;
    this.rem = [...counts.remaining];
    this.offset = consumed;
    this.unionLeft = this.rem.reduce((a, b) => a + b, 0);
    this.stepsLeft = Math.ceil(this.unionLeft / globalBatch);
    this.fullEpochSteps = Math.ceil(counts.samples.reduce((a, b) => a + b, 0) / globalBatch);
  }

  /** Step k's split (k counts from this rest's first step; only forward, one step past the last asked). */
  splitAt(k: number): number[] {
    this.seek(k);
    return this.split!;
  }

  /** This rank's samples of step k (indices into its LocalDataset) and the step's samples over all ranks. */
  batchAt(k: number): { indices: number[]; globalSamples: number; counts: number[] } {
    const counts = this.splitAt(k);
    const mine = counts[this.rank]!;
    const indices = Array.from(this.order.subarray(this.offset, this.offset + mine));
    return { indices, globalSamples: counts.reduce((a, b) => a + b, 0), counts };
  }

  /** This rank's samples of step k + 1 as the split stands (prefetch), without moving past step k. */
  peekNext(k: number): number[] {
    const counts = this.splitAt(k);
    const rem = this.rem.map((r, i) => r - counts[i]!);
    const total = rem.reduce((a, b) => a + b, 0);
    if (total === 0) return [];
    const next = splitByRemaining(Math.min(this.globalBatch, total), rem);
    const from = this.offset + counts[this.rank]!;
    return Array.from(this.order.subarray(from, from + next[this.rank]!));
  }

  /** This rank's samples trained in the epoch once step k commits. */
  consumedAfter(k: number): number {
    return this.offset + this.splitAt(k)[this.rank]!;
  }

  /** The union's samples left in the epoch once step k commits. */
  unionLeftAfter(k: number): number {
    const counts = this.splitAt(k);
    return this.rem.reduce((a, r, i) => a + r - counts[i]!, 0);
  }

  private seek(k: number): void {
    if (k < this.at || k >= this.stepsLeft) throw new RangeError(`step ${k} of an epoch's rest of ${this.stepsLeft} steps, at ${this.at}`);
    if (this.split === null) this.split = this.splitOf(this.rem);
    while (this.at < k) {
      const s = this.split;
      this.offset += s[this.rank]!;
      this.rem = this.rem.map((r, i) => r - s[i]!);
      this.at++;
      this.split = this.splitOf(this.rem);
    }
  }

  private splitOf(rem: number[]): number[] {
    return splitByRemaining(
      Math.min(
        this.globalBatch,
        rem.reduce((a, b) => a + b, 0),
      ),
      rem,
    );
  }
}

/**
 * This rank's own progress through its samples, kept across rounds: how many it had trained
 * after each committed step of the epoch, so that a round that resumes from any of them (a step
 * trained again, a checkpoint) goes on from the right place, and a rank new to the epoch (a
 * joiner, or one whose record does not reach that step) brings all its samples.
 */
export class LocalProgress {
  private epoch = -1;
  /** step -> this rank's samples trained in `epoch` after it (bounded by the epoch's steps). */
  private readonly after = new Map<number, number>();
  /** The union's samples left after this rank's last committed step, and its step (the 'left' figure of the next round). */
  private lastUnionLeft: { epoch: number; step: number; left: number } | null = null;

  constructor(
    readonly dataset: LocalDataset,
    private readonly seed: number,
    private readonly shuffle: boolean,
  ) {}

  /** Where this rank stands at `p` (a new epoch: nothing trained). */
  standing(p: Progress): { consumed: number; joined: boolean } {
    if (p.position === 0) return { consumed: 0, joined: false };
    const c = p.epoch === this.epoch ? this.after.get(p.step) : undefined;
    return c === undefined ? { consumed: 0, joined: true } : { consumed: c, joined: false };
  }

  /** Step `step` of `epoch` committed with this rank at `consumed` samples and the union's `unionLeft` left. */
  commit(epoch: number, step: number, consumed: number, unionLeft: number): void {
    if (epoch !== this.epoch) {
      this.epoch = epoch;
      this.after.clear();
    }
    this.after.set(step, consumed);
    this.lastUnionLeft = { epoch, step, left: unionLeft };
  }

  /**
   * Samples of the epoch that left with ranks since this rank's last step (what the union had
   * left then, less what the ranks that were there still have); null when unknown (this rank is
   * new, or the round resumed elsewhere).
   */
  leftSince(p: Progress, counts: LocalCounts): number | null {
    const last = this.lastUnionLeft;
    if (!last || last.epoch !== p.epoch || last.step !== p.step || p.position === 0) return null;
    const stayed = counts.remaining.reduce((a, r, i) => a + (counts.joined[i] ? 0 : r), 0);
    return Math.max(0, last.left - stayed);
  }

  /** This rank's order of its samples in `epoch`. */
  order(epoch: number): Uint32Array {
    return this.dataset.order(epoch, this.seed, this.shuffle);
  }

  /**
   * The exchange at the start of an epoch's rest in a round: every rank's row through the server,
   * and the rest planned from them. Throws when no rank holds a sample at an epoch's start.
   */
  async plan(pg: ProcessGroup, p: Progress, globalBatch: number): Promise<{ rest: LocalEpochRest; left: number | null }> {
    const { consumed, joined } = this.standing(p);
    const order = this.order(p.epoch);
    const rows = await pg.gatherRows([order.length - consumed, order.length, joined ? 1 : 0]);
    const counts = countsFromRows(rows);
    const rest = new LocalEpochRest(counts, pg.rank, globalBatch, order, consumed);
    if (rest.unionLeft === 0 && p.position === 0)
      throw new DatasetError(
        `no rank of the group holds a sample (local samples per rank: [${counts.samples.join(', ')}]): add samples to a LocalDataset before training`,
      );
    return { rest, left: this.leftSince(p, counts) };
  }
}
