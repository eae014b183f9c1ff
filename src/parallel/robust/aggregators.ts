/**
 * Robust aggregation of the ranks' contributions (gradients, DiLoCo's pseudo-gradients): what a
 * rank computes once it holds every rank's own block (exchange.ts), in place of the mean, so that
 * one member's finite but hostile contribution (scaled by 1e3, sign-flipped, noise, a small
 * consistent shift) cannot move every replica at will.
 *
 * - `trimmed-mean` (Yin et al. 2018, coordinate-wise): per coordinate, the `trim` largest and
 *   `trim` smallest values are cut and the rest averaged. With k contributions the trim used is
 *   min(trim, floor((k - 1) / 2)), so that at least one value is left (an elastic group that
 *   shrank below 2 * trim + 1 ranks keeps training: the result says which trim it used).
 * - `median` (coordinate-wise): torch.median's: for an even count, the LOWER of the two middle
 *   values (torch.median(x, dim=0).values), never their average. Pure selection: each coordinate
 *   of the result is one of the inputs, bit for bit.
 * - `centered-clip` (Karimireddy, He, Jaggi 2021, "Learning from History for Byzantine Robust
 *   Optimization"): v <- v + (1/k) sum_i clip(x_i - v, tau), clip(z, tau) = z * min(1, tau/||z||),
 *   `iterations` times, v starting at the previous aggregate (the paper's momentum: the caller
 *   keeps it, see RobustReducer), zeros at first. `tau: 'auto'` takes, at each iteration, the
 *   lower median of the distances ||x_i - v||: scale-free, for runs whose gradient norms nobody
 *   knows in advance (the create form's choice).
 * - `mean`: the plain mean, in rank order (for comparison; DDP's mean is its ring all-reduce).
 *
 * Determinism (every rank must get the same bits from the same blocks, on every backend and
 * engine): plain JavaScript on Float32Arrays, no TF.js kernels; sums in float64 in a fixed order
 * (rank order, or the sorted order of a coordinate's values, ties by rank), only +, -, *, / and
 * Math.sqrt (correctly rounded in IEEE-754 double everywhere), then Math.fround. Sorting by value
 * puts equal values next to each other whatever the ranks' order, so a coordinate's trimmed sum
 * does not depend on which rank sent what.
 *
 * A contribution holding a NaN or an infinity is refused (never enters the aggregate) and named in
 * the judgments, with the first offending index. Each rank's judgment says how it fared: its L2
 * norm, its distance to the aggregate, the fraction of its coordinates that did not enter the
 * aggregate (trimmed; for the median: not the one selected), and its clip scale (centered clip).
 */

/** How the contributions are combined. */
export type AggregationSpec =
  | { kind: 'mean' }
  | { kind: 'trimmed-mean'; trim: number }
  | { kind: 'median' }
  | { kind: 'centered-clip'; tau: number | 'auto'; iterations?: number };

export type AggregationKind = AggregationSpec['kind'];

/** Centered clipping's iterations when left out (the paper finds 1 enough with momentum; a few help from a cold start). */
export const DEFAULT_CLIP_ITERATIONS = 3;
/** The most iterations centered clipping takes (each is a pass over every contribution). */
export const MAX_CLIP_ITERATIONS = 100;

/** How one rank's contribution fared. */
export interface RankJudgment {
  rank: number;
  /** 'used': in the aggregate; 'absent': no block (no samples this step); 'refused': a non-finite value. */
  status: 'used' | 'absent' | 'refused';
  /** L2 norm of the contribution (float64); null when absent or refused. */
  norm: number | null;
  /** L2 distance from the contribution to the aggregate (float64); null when absent or refused. */
  distance: number | null;
  /** Fraction of its coordinates that did not enter the aggregate: trimmed (trimmed mean), not selected (median); 0 otherwise. */
  trimmed: number;
  /** Centered clip: the last iteration's scale min(1, tau / ||x - v||) (1: not clipped); 1 for the other kinds. */
  clipScale: number;
  /** Why it was refused or left out, in words. */
  reason?: string;
  /** Refused: the first index holding a non-finite value. */
  nonfiniteIndex?: number;
}

export interface Aggregation {
  kind: AggregationKind;
  values: Float32Array;
  /** One per rank, in rank order. */
  judgments: RankJudgment[];
  /** Contributions in the aggregate. */
  used: number;
  /** trimmed-mean: the trim applied per side (see the top of this file); 0 for the other kinds. */
  trim: number;
  /** centered-clip: the tau of the last iteration (a number even when asked for 'auto'); 0 for the other kinds. */
  tau: number;
}

/** No contribution could enter the aggregate (all absent or refused): nothing to apply. */
export class NoContributionError extends Error {
  override name = 'NoContributionError';
  constructor(readonly judgments: RankJudgment[]) {
    super(
      `no contribution could be aggregated: ${judgments.map((j) => `rank ${j.rank} ${j.status}${j.reason ? ` (${j.reason})` : ''}`).join(', ')}`,
    );
  }
}

/** Refuses a spec no aggregation can run with, saying what was given. */
export function checkAggregationSpec(spec: AggregationSpec): void {
  switch (spec.kind) {
    case 'mean':
    case 'median':
      return;
    case 'trimmed-mean':
      if (!Number.isSafeInteger(spec.trim) || spec.trim < 0)
        throw new RangeError(`trimmed-mean: trim must be an integer >= 0 (values cut per side and coordinate), got ${String(spec.trim)}`);
      return;
    case 'centered-clip': {
      if (spec.tau !== 'auto' && !(typeof spec.tau === 'number' && Number.isFinite(spec.tau) && spec.tau > 0))
        throw new RangeError(`centered-clip: tau must be a positive finite number or 'auto', got ${String(spec.tau)}`);
      const it = spec.iterations ?? DEFAULT_CLIP_ITERATIONS;
      if (!Number.isSafeInteger(it) || it < 1 || it > MAX_CLIP_ITERATIONS)
        throw new RangeError(
          `centered-clip: iterations must be an integer from 1 to ${MAX_CLIP_ITERATIONS}, got ${String(spec.iterations)}`,
        );
      return;
    }
    default: {
      const unknown: never = spec;
      throw new RangeError(
        `unknown aggregation ${JSON.stringify((unknown as { kind?: unknown }).kind)}: use mean, trimmed-mean, median or centered-clip`,
      );
    }
  }
}

/** The first index of a NaN or an infinity, or -1. */
function firstNonfinite(values: Float32Array): number {
  for (let i = 0; i < values.length; i++) if (!Number.isFinite(values[i]!)) return i;
  return -1;
}

function l2(values: Float32Array): number {
  let s = 0;
  for (let i = 0; i < values.length; i++) s += values[i]! * values[i]!;
  return Math.sqrt(s);
}

function distance(a: Float32Array, b: Float32Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) {
    const d = a[i]! - b[i]!;
    s += d * d;
  }
  return Math.sqrt(s);
}

/**
 * Aggregates `blocks` (one per rank, in rank order; null: the rank sent none) with `spec`.
 * `center`: centered clipping's starting point (the previous aggregate; zeros when null).
 * Throws NoContributionError when no block is usable, RangeError for blocks of different lengths.
 */
export function aggregate(
  spec: AggregationSpec,
  blocks: ReadonlyArray<Float32Array | null>,
  center: Float32Array | null = null,
): Aggregation {
  checkAggregationSpec(spec);
  const lengths = new Set(blocks.filter((b): b is Float32Array => b !== null).map((b) => b.length));
  if (lengths.size > 1) throw new RangeError(`aggregate: the blocks have different lengths (${[...lengths].join(', ')})`);
  const judgments: RankJudgment[] = blocks.map((b, rank) => {
    if (b === null)
      return { rank, status: 'absent', norm: null, distance: null, trimmed: 0, clipScale: 1, reason: 'no block (no samples)' };
    const bad = firstNonfinite(b);
    if (bad >= 0)
      return {
        rank,
        status: 'refused',
        norm: null,
        distance: null,
        trimmed: 0,
        clipScale: 1,
        reason: `non-finite value ${b[bad]} at index ${bad}`,
        nonfiniteIndex: bad,
      };
    return { rank, status: 'used', norm: l2(b), distance: 0, trimmed: 0, clipScale: 1 };
  });
  const used = judgments.filter((j) => j.status === 'used').map((j) => j.rank);
  if (used.length === 0) throw new NoContributionError(judgments);
  const xs = used.map((r) => blocks[r]!);
  const n = xs[0]!.length;
  if (center !== null && center.length !== n) throw new RangeError(`aggregate: the center has ${center.length} values, the blocks ${n}`);
  let out: { values: Float32Array; trimmedCounts?: Int32Array; clipScales?: Float64Array; trim?: number; tau?: number };
  switch (spec.kind) {
    case 'mean':
      out = { values: meanOf(xs, n) };
      break;
    case 'trimmed-mean':
      out = trimmedMean(xs, n, Math.min(spec.trim, Math.floor((xs.length - 1) / 2)));
      break;
    case 'median':
      out = lowerMedian(xs, n);
      break;
    case 'centered-clip':
      out = centeredClip(xs, n, spec.tau, spec.iterations ?? DEFAULT_CLIP_ITERATIONS, center);
      break;
  }
  used.forEach((rank, k) => {
    const j = judgments[rank]!;
    j.distance = distance(xs[k]!, out.values);
    if (out.trimmedCounts) j.trimmed = n === 0 ? 0 : out.trimmedCounts[k]! / n;
    if (out.clipScales) j.clipScale = out.clipScales[k]!;
  });
  return { kind: spec.kind, values: out.values, judgments, used: used.length, trim: out.trim ?? 0, tau: out.tau ?? 0 };
}

/** The mean in rank order, float64, then rounded once. */
function meanOf(xs: Float32Array[], n: number): Float32Array {
  const out = new Float32Array(n);
  const k = xs.length;
  for (let i = 0; i < n; i++) {
    let s = 0;
    for (let r = 0; r < k; r++) s += xs[r]![i]!;
    out[i] = Math.fround(s / k);
  }
  return out;
}

/** Whether `a` sorts after `b`: by value, -0 before +0 (so that which zero a selection picks does not depend on the ranks' order). */
function after(a: number, b: number): boolean {
  return a > b || (a === 0 && b === 0 && 1 / a > 0 && 1 / b < 0);
}

/**
 * Sorts `order` (contribution indices) by `vals` ascending, -0 before +0, ties (then the very
 * same bits) by index: insertion sort, the counts here are small (the ranks of a session) and
 * the order is total, so it is the same on every engine.
 */
function sortByValue(order: Int32Array, vals: Float64Array): void {
  const k = order.length;
  for (let a = 0; a < k; a++) order[a] = a;
  for (let a = 1; a < k; a++) {
    const idx = order[a]!;
    const v = vals[idx]!;
    let b = a - 1;
    while (b >= 0 && (after(vals[order[b]!]!, v) || (vals[order[b]!]! === v && !after(v, vals[order[b]!]!) && order[b]! > idx))) {
      order[b + 1] = order[b]!;
      b--;
    }
    order[b + 1] = idx;
  }
}

function trimmedMean(xs: Float32Array[], n: number, trim: number): { values: Float32Array; trimmedCounts: Int32Array; trim: number } {
  const k = xs.length;
  const out = new Float32Array(n);
  const counts = new Int32Array(k);
  const vals = new Float64Array(k);
  const order = new Int32Array(k);
  const kept = k - 2 * trim;
  for (let i = 0; i < n; i++) {
    for (let r = 0; r < k; r++) vals[r] = xs[r]![i]!;
    sortByValue(order, vals);
    let s = 0;
    for (let a = trim; a < k - trim; a++) s += vals[order[a]!]!;
    out[i] = Math.fround(s / kept);
    for (let a = 0; a < trim; a++) {
      counts[order[a]!]!++;
      counts[order[k - 1 - a]!]!++;
    }
  }
  return { values: out, trimmedCounts: counts, trim };
}

function lowerMedian(xs: Float32Array[], n: number): { values: Float32Array; trimmedCounts: Int32Array } {
  const k = xs.length;
  const out = new Float32Array(n);
  const counts = new Int32Array(k);
  const vals = new Float64Array(k);
  const order = new Int32Array(k);
  const mid = Math.floor((k - 1) / 2);
  for (let i = 0; i < n; i++) {
    for (let r = 0; r < k; r++) vals[r] = xs[r]![i]!;
    sortByValue(order, vals);
    const chosen = order[mid]!;
    out[i] = xs[chosen]![i]!;
    for (let r = 0; r < k; r++) if (r !== chosen) counts[r]!++;
  }
  return { values: out, trimmedCounts: counts };
}

/** The lower median of `values` (sorted copy; ties need no order: equal numbers). */
function lowerMedianOf(values: Float64Array): number {
  const sorted = Float64Array.from(values).sort();
  return sorted[Math.floor((sorted.length - 1) / 2)]!;
}

function centeredClip(
  xs: Float32Array[],
  n: number,
  tauSpec: number | 'auto',
  iterations: number,
  center: Float32Array | null,
): { values: Float32Array; clipScales: Float64Array; tau: number } {
  const k = xs.length;
  const v = new Float64Array(n);
  if (center) for (let i = 0; i < n; i++) v[i] = center[i]!;
  const scales = new Float64Array(k);
  const dists = new Float64Array(k);
  const acc = new Float64Array(n);
  let tau = 0;
  for (let it = 0; it < iterations; it++) {
    for (let r = 0; r < k; r++) {
      const x = xs[r]!;
      let s = 0;
      for (let i = 0; i < n; i++) {
        const d = x[i]! - v[i]!;
        s += d * d;
      }
      dists[r] = Math.sqrt(s);
    }
    tau = tauSpec === 'auto' ? lowerMedianOf(dists) : tauSpec;
    for (let r = 0; r < k; r++) scales[r] = dists[r]! > tau ? tau / dists[r]! : 1;
    acc.fill(0);
    for (let r = 0; r < k; r++) {
      const x = xs[r]!;
      const s = scales[r]!;
      for (let i = 0; i < n; i++) acc[i] += (x[i]! - v[i]!) * s;
    }
    for (let i = 0; i < n; i++) v[i] += acc[i]! / k;
  }
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = Math.fround(v[i]!);
  return { values: out, clipScales: scales, tau };
}
