/**
 * Stragglers on demand (the launcher's `--slow RANK:FACTOR`): a rank made FACTOR times slower.
 *
 * A slower device is modelled by stretching this rank's own measured compute: after its compute
 * of a step (forward, backward, readback) the rank waits (FACTOR - 1) x the time that compute
 * took, so its compute takes FACTOR times as long in all. The wait goes where a slower device
 * would make the others wait: before each all-reduce bucket (DistributedDataParallel's
 * `backward({ straggler })`) and before a pipeline stage sends its activations or gradients on
 * (`stage.step({ straggler })`), so the other ranks' figures show the straggler too.
 *
 * Why in proportion and not a fixed delay: the compute time changes with the model, the batch,
 * the backend and the machine (and the first step compiles shaders), and a slowdown that follows
 * the real step time keeps "4 times slower" true whatever those are. The wait is a timer, not
 * work: the tab stays responsive (its links and heartbeats go on), as a rank on a slow GPU does
 * while its GPU is busy.
 *
 * The spec maps ranks to factors. Which rank a tab is can change in an elastic run (every round
 * numbers its members anew), so a caller looks its factor up with the rank of the current round,
 * each step.
 */

/** A `--slow` spec (or the train job's `slow` option) that cannot be read; `problem` says why. */
export class StragglerSpecError extends Error {
  override name = 'StragglerSpecError';
  constructor(
    /** The whole spec as given. */
    readonly spec: string,
    /** What is wrong, naming the offending RANK:FACTOR item. */
    readonly problem: string,
  ) {
    super(problem);
  }
}

/** How a spec is written, for messages. */
export const SLOW_SPEC_RULE =
  'RANK:FACTOR items separated by commas (e.g. 3:4 or 1:2.5,3:4), RANK an integer from 0 to the world size - 1, each rank once, FACTOR a number of at least 1';

/** A decimal number, signed or not, or an infinity (refused later, by name). */
const NUMBER = /^[+-]?((\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?|Infinity)$/;

/**
 * Reads "RANK:FACTOR[,RANK:FACTOR...]" into rank -> factor. `worldSize`, when given, bounds the
 * ranks (0 .. worldSize - 1). Throws StragglerSpecError naming the bad item: not RANK:FACTOR, a
 * factor below 1 or not finite, a rank out of range, or the same rank twice. An empty spec is
 * no straggler at all.
 */
export function parseSlow(spec: string, worldSize?: number): Record<number, number> {
  const slow: Record<number, number> = {};
  if (spec.trim() === '') return slow;
  for (const raw of spec.split(',')) {
    const item = raw.trim();
    if (item === '') throw new StragglerSpecError(spec, `an empty item in "${spec}": give RANK:FACTOR items separated by single commas`);
    const m = /^([^:]*):([^:]*)$/.exec(item);
    if (!m || m[1]!.trim() === '' || m[2]!.trim() === '') throw new StragglerSpecError(spec, `"${item}" is not RANK:FACTOR (e.g. 3:4)`);
    const rankText = m[1]!.trim();
    const factorText = m[2]!.trim();
    const rank = Number(rankText);
    if (!/^\d+$/.test(rankText) || !Number.isSafeInteger(rank))
      throw new StragglerSpecError(spec, `"${item}": RANK "${rankText}" is not an integer of at least 0`);
    if (!NUMBER.test(factorText)) throw new StragglerSpecError(spec, `"${item}": FACTOR "${factorText}" is not a number`);
    const factor = Number(factorText);
    if (!Number.isFinite(factor)) throw new StragglerSpecError(spec, `"${item}": FACTOR must be finite`);
    if (factor < 1) throw new StragglerSpecError(spec, `"${item}": FACTOR must be at least 1 (1 is full speed, 4 four times slower)`);
    if (worldSize !== undefined && rank >= worldSize) {
      throw new StragglerSpecError(
        spec,
        `"${item}": RANK ${rank} is out of range: the world has ${worldSize} rank(s), 0 to ${worldSize - 1}`,
      );
    }
    if (slow[rank] !== undefined) throw new StragglerSpecError(spec, `rank ${rank} is given twice ("${rank}:${slow[rank]}" and "${item}")`);
    slow[rank] = factor;
  }
  return slow;
}

/** The spec that `parseSlow` reads back to `slow`, ranks in order ("1:2.5,3:4"). */
export function formatSlow(slow: Record<number, number>): string {
  return Object.keys(slow)
    .map(Number)
    .sort((a, b) => a - b)
    .map((rank) => `${rank}:${slow[rank]}`)
    .join(',');
}

/** The factor of `rank` (the rank of the current round): 1 when the spec leaves it out. */
export function slowFactor(slow: Record<number, number> | null | undefined, rank: number): number {
  return slow?.[rank] ?? 1;
}

/**
 * Makes one rank FACTOR times slower: call `after(computeMs)` each time a piece of its compute is
 * done (a step's forward, backward and readback; or each micro-batch's pass of a pipeline stage),
 * with the time that piece took, before whatever the other ranks wait for (an all-reduce, an
 * activation sent on).
 *
 * It keeps a balance: a timer that fires late (browsers clamp short timers to a few ms) is
 * repaid by waiting that much less next time, so many short pieces still add up to
 * (factor - 1) x their compute, and a factor of 1 never waits. The credit is capped (a throttled
 * background tab's timer, seconds late, must not leave the rank at full speed for as long).
 */
/** Most ms a late timer may be repaid by shorter waits afterwards. */
const MAX_CREDIT_MS = 100;

export class Straggler {
  readonly factor: number;
  /** Ms still owed (negative: waited ahead). */
  private owed = 0;

  /** `factor` >= 1 and finite; 1 never waits. */
  constructor(factor: number) {
    if (!(Number.isFinite(factor) && factor >= 1))
      throw new RangeError(`a straggler's factor must be a finite number of at least 1, got ${factor}`);
    this.factor = factor;
  }

  /** Whether it waits at all. */
  get slow(): boolean {
    return this.factor > 1;
  }

  /**
   * Waits (factor - 1) x `computeMs`, less what earlier calls over-waited, and returns the ms it
   * waited (measured, timers run late); 0 at once with a factor of 1.
   */
  async after(computeMs: number): Promise<number> {
    if (this.factor === 1 || !(computeMs > 0) || !Number.isFinite(computeMs)) return 0;
    this.owed += (this.factor - 1) * computeMs;
    if (this.owed <= 0) return 0;
    const t0 = performance.now();
    await new Promise<void>((resolve) => setTimeout(resolve, this.owed));
    const waited = performance.now() - t0;
    this.owed = Math.max(this.owed - waited, -MAX_CREDIT_MS);
    return waited;
  }
}
