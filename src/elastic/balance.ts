/**
 * Balanced batches (runElastic's `balance`): how long each rank takes for a batch, learned
 * from the steps, and the split of a step's samples that makes the slowest rank's time shortest.
 *
 * A rank's step costs `overhead + samples x perSample` milliseconds: for a small model most of a
 * step is fixed cost (kernel launches, readbacks), so a device 4x slower than the others is 4x
 * slower even with one sample. Splitting in proportion to samples/s would leave such a rank the
 * slowest however few samples it gets; with the fixed cost known, a rank too slow to help at all
 * gets no samples (it computes nothing that step and still receives the averaged gradients, so
 * its replica stays identical), and now and then one unit, to see whether it got faster (a tab
 * back from the background).
 *
 * Every figure comes from the step vote, which every rank receives alike: every rank computes the
 * same models and the same split, with plain double arithmetic. Each rank's figures come from
 * that rank alone (the vote's rows are placed by the server), but they are its own claims: a rank
 * cannot claim to be more than 20 times cheaper per sample than the group's median, nor take more
 * than `maxShare(n)` of a step's samples (half, or two thirds with three ranks), so a rank that
 * lies about its times cannot draw the whole batch and leave the others none; anything but a
 * positive finite time is unknown.
 */
import { splitBatch } from './epoch.ts';

/** A rank's predicted step time for n samples: overhead + n * perSample (ms). */
export interface RankCost {
  overhead: number;
  perSample: number;
}

/** How many batch sizes a rank's history keeps (the most recent ones). */
const SIZES_KEPT = 4;
/** keepSplit: the last split stays while it predicts a step at most this much longer than the best. */
const KEEP_MARGIN = 1.2;
/** A rank is never predicted cheaper per sample than the median over this. */
const CHEAPEST_VS_MEDIAN = 20;

/**
 * The most of a step's samples one rank may hold, whatever it claims about its speed: half the
 * step (two thirds with three ranks, everything with one or two, where one rank is half the
 * group anyway). A fast tab among slow ones holds at most this; the others always share the rest.
 */
export function maxShare(worldSize: number): number {
  return Math.min(1, Math.max(0.5, 2 / Math.max(1, worldSize)));
}

/** Each rank's measured step times by batch size, smoothed: the cost models come from them. */
export class StepCosts {
  /** Per rank: batch size -> smoothed ms (insertion order: oldest first). */
  private readonly seen: Array<Map<number, number>>;

  constructor(readonly worldSize: number) {
    this.seen = Array.from({ length: worldSize }, () => new Map<number, number>());
  }

  /**
   * The step's figures: rank r trained `counts[r]` samples in `works[r]` ms of its own work
   * (0 or anything but a positive finite number: unknown, e.g. a step that compiled kernels).
   * A size seen before is smoothed (half the new figure, half the history).
   */
  observe(counts: readonly number[], works: readonly number[]): void {
    for (let r = 0; r < this.worldSize; r++) {
      const n = counts[r] ?? 0;
      const t = works[r] ?? 0;
      if (!(n > 0) || !Number.isFinite(t) || !(t > 0)) continue;
      const sizes = this.seen[r]!;
      const before = sizes.get(n);
      sizes.delete(n);
      sizes.set(n, before === undefined ? t : 0.5 * before + 0.5 * t);
      if (sizes.size > SIZES_KEPT) sizes.delete(sizes.keys().next().value!);
    }
  }

  /** Whether any rank has a figure yet (until then the split is even). */
  get known(): boolean {
    return this.seen.some((s) => s.size > 0);
  }

  /**
   * Every rank's cost model. A rank measured at two sizes or more gets a least-squares line; one
   * measured at one size gets the group's typical overhead ratio (overhead / perSample of the
   * ranks with lines, 0 when there are none); a rank not measured yet gets the median model.
   */
  models(): RankCost[] {
    const fitted = this.seen.map((sizes) => fitLine([...sizes]));
    const ratios = fitted.filter((f): f is RankCost => f !== null).map((f) => f.overhead / f.perSample);
    const ratio = median(ratios) ?? 0;
    const models: Array<RankCost | null> = this.seen.map((sizes, r) => {
      if (fitted[r]) return fitted[r];
      if (sizes.size === 0) return null;
      const [n, t] = [...sizes][0]!;
      const perSample = t / (n + ratio);
      return { overhead: ratio * perSample, perSample };
    });
    const known = models.filter((m): m is RankCost => m !== null);
    const typical: RankCost = {
      overhead: median(known.map((m) => m.overhead)) ?? 0,
      perSample: median(known.map((m) => m.perSample)) ?? 1,
    };
    const floor = typical.perSample / CHEAPEST_VS_MEDIAN;
    return models.map((m) => (m === null ? typical : { overhead: m.overhead, perSample: Math.max(m.perSample, floor) }));
  }
}

/** A line through (size, ms) points by least squares, kept physical (overhead >= 0, perSample > 0); null under two sizes. */
function fitLine(points: Array<[number, number]>): RankCost | null {
  if (points.length < 2) return null;
  const k = points.length;
  const mn = points.reduce((s, [n]) => s + n, 0) / k;
  const mt = points.reduce((s, [, t]) => s + t, 0) / k;
  let cov = 0;
  let vn = 0;
  for (const [n, t] of points) {
    cov += (n - mn) * (t - mt);
    vn += (n - mn) * (n - mn);
  }
  // Noise can tilt a line through near points the wrong way: a step never gets cheaper with more samples.
  const perSample = Math.max(vn > 0 ? cov / vn : 0, (mt / mn) * 1e-3);
  const overhead = mt - perSample * mn;
  if (overhead >= 0) return { overhead, perSample };
  // A negative overhead: time in proportion to the samples through the mean.
  return { overhead: 0, perSample: mt / mn };
}

function median(values: number[]): number | undefined {
  if (values.length === 0) return undefined;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

/** The step's predicted time: its slowest rank's (a rank with no samples computes nothing). */
export function predictedStep(counts: readonly number[], models: readonly RankCost[]): number {
  let worst = 0;
  counts.forEach((n, r) => {
    if (n > 0) worst = Math.max(worst, models[r]!.overhead + n * models[r]!.perSample);
  });
  return worst;
}

/**
 * `count` samples split in units of `quantum` to make the predicted step shortest: the smallest
 * time T such that the ranks that can finish their units within T hold them all, found by
 * bisection, then trimmed to exactly the units there are (the rank predicted slowest gives first;
 * ties to the higher rank). A rank whose overhead alone exceeds T gets none. `probe`: every rank
 * gets at least one unit (taken from the slowest), to measure ranks that had none. What does not
 * fill a unit goes to the rank with the most samples. No rank holds more than `maxShare(n)` of
 * the units, however cheap its model.
 */
export function splitByCost(count: number, models: readonly RankCost[], quantum: number, probe = false): number[] {
  const n = models.length;
  if (n === 0) return [];
  const q = Math.max(1, Math.floor(quantum));
  const unitSize = count >= q * n ? q : 1;
  const units = Math.floor(count / unitSize);
  const most = Math.ceil(units * maxShare(n));
  const capacity = (T: number) =>
    models.map((m) =>
      T >= m.overhead + m.perSample * unitSize ? Math.min(most, Math.floor((T - m.overhead) / (m.perSample * unitSize))) : 0,
    );
  const total = (caps: number[]) => caps.reduce((a, b) => a + b, 0);
  let lo = 0;
  let hi = Math.max(...models.map((m) => m.overhead + m.perSample * unitSize * units));
  for (let i = 0; i < 64 && hi - lo > 1e-9 * hi; i++) {
    const mid = (lo + hi) / 2;
    if (total(capacity(mid)) >= units) hi = mid;
    else lo = mid;
  }
  const caps = capacity(hi);
  const time = (r: number) => models[r]!.overhead + models[r]!.perSample * caps[r]! * unitSize;
  const slowest = (allowed: (r: number) => boolean) => {
    let at = -1;
    for (let r = 0; r < n; r++) if (allowed(r) && (at < 0 || time(r) >= time(at))) at = r;
    return at;
  };
  for (let excess = total(caps) - units; excess > 0; excess--) caps[slowest((r) => caps[r]! > 0)]!--;
  if (probe && units >= n) {
    for (let r = 0; r < n; r++) {
      if (caps[r]! > 0) continue;
      caps[slowest((s) => caps[s]! > 1)]!--;
      caps[r] = 1;
    }
  }
  const counts = caps.map((u) => u * unitSize);
  let largest = 0;
  for (let r = 1; r < n; r++) if (counts[r]! > counts[largest]!) largest = r;
  counts[largest]! += count - units * unitSize;
  return counts;
}

/**
 * Whether the split of the step before still serves: the same total over the same ranks, and the
 * step it predicts at most 20% longer than the new split's. Changing shapes costs more than a
 * finer split would gain (each new batch size compiles kernels on WebGPU and WebGL, seconds on a
 * software GPU), and tabs sharing a machine measure 10-25% apart from step to step: a smaller
 * margin re-splits identical tabs on noise.
 */
export function keepSplit(previous: readonly number[], ideal: readonly number[], models: readonly RankCost[]): boolean {
  if (previous.length !== ideal.length || models.length !== ideal.length) return false;
  if (previous.reduce((a, b) => a + b, 0) !== ideal.reduce((a, b) => a + b, 0)) return false;
  return predictedStep(previous, models) <= KEEP_MARGIN * predictedStep(ideal, models);
}

/** A rank given no samples gets one unit every this many steps, to be measured again. */
export const PROBE_EVERY = 64;
/** Decisions kept until their step is reported (votes may come several steps apart); older ones go. */
const DECISIONS_KEPT = 256;

/**
 * Why a step's samples were split as they were: every rank's cost model then (from the rank's
 * own measured times) and the step at which ranks given none get some again. The same on every
 * rank (every rank computes the split alike). A rank with `counts[r] === 0` has no loss and no
 * accuracy for the step.
 */
export interface StepBalance {
  counts: number[];
  /** Each rank's predicted cost per sample and fixed cost per step, ms. */
  perSampleMs: number[];
  overheadMs: number[];
  /** The next step (after this one) at which a rank given no samples gets a unit again. */
  probeAt: number;
}

/**
 * Balanced batches for one round: the costs learned from the votes, each step's split, and the
 * reasons for it (`decisionOf`). The last split is kept while it is nearly as fast as a new one
 * (new sizes compile kernels); every PROBE_EVERY steps, a rank that had no samples gets one unit,
 * so that its cost is measured again.
 */
export class BatchBalancer {
  private readonly costs: StepCosts;
  /** The last step's split (every rank's count), kept while it still fits the costs. */
  split: number[] | null = null;
  private readonly decisions = new Map<number, StepBalance>();

  /** `batchSize`: the per-rank batch (splits go in units of an eighth of it). */
  constructor(
    readonly worldSize: number,
    private readonly batchSize: number,
  ) {
    this.costs = new StepCosts(worldSize);
  }

  /** Step `step`'s split of `count` samples (recorded with its reasons once the costs are known). */
  splitOf(count: number, step: number): number[] {
    const costs = this.costs;
    const quantum = Math.max(1, Math.floor(this.batchSize / 8));
    if (!costs.known) {
      this.split = splitBatch(count, new Array<number>(costs.worldSize).fill(1), quantum);
      return this.split;
    }
    const models = costs.models();
    const probe = step % PROBE_EVERY === 0 && (this.split?.some((c) => c === 0) ?? false);
    const ideal = splitByCost(count, models, quantum, probe);
    const kept = !probe && this.split !== null && keepSplit(this.split, ideal, models);
    if (!kept) this.split = ideal;
    this.decisions.set(step, {
      counts: [...this.split!],
      perSampleMs: models.map((m) => m.perSample),
      overheadMs: models.map((m) => m.overhead),
      probeAt: (Math.floor(step / PROBE_EVERY) + 1) * PROBE_EVERY,
    });
    if (this.decisions.size > DECISIONS_KEPT) this.decisions.delete(this.decisions.keys().next().value!);
    return [...this.split!];
  }

  /** The votes' work times of a step that ran with `counts`. */
  observe(counts: readonly number[], works: readonly number[]): void {
    this.costs.observe(counts, works);
  }

  /** Step `step`'s split with its reasons, once (undefined before the costs were known). */
  decisionOf(step: number): StepBalance | undefined {
    const d = this.decisions.get(step);
    this.decisions.delete(step);
    return d;
  }
}
