/**
 * PowerSGD gradient compression as a DDP comm hook: torch's `powerSGD_hook` (Vogels et al.,
 * "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization", 2019).
 *
 * For the first `startIter` steps the hook all-reduces buckets uncompressed (vanilla DDP). After,
 * per bucket:
 * - parameters that are not at least 2-D, or whose rank-r factors would not be at least
 *   `minCompressionRate` times smaller than the parameter, are averaged uncompressed, together in
 *   one flat all-reduce;
 * - every other parameter is viewed as a matrix M (n x m: its other dimensions by its last, see
 *   `matrixOf`), plus
 *   this rank's error from the previous step (error feedback). With Q (m x r, orthogonalized; drawn
 *   from a seeded generator identical on every rank the first time, then the previous step's with
 *   warm start): P = M Q, all-reduced (the bucket's P's in one flat buffer), orthogonalized;
 *   Q = M^T P, all-reduced and divided by the world size (one flat buffer); the parameter's
 *   averaged gradient is approximated by P Q^T, and this rank's new error is M - P Q^T.
 *
 * So a bucket sends (n + m) r elements per compressed parameter instead of n m, in three
 * all-reduces (the uncompressed one and P's together, then Q's). Everything after an all-reduce is
 * computed from all-reduced values only, in the same order on every rank, so every rank returns
 * bit-identical gradients (and keeps bit-identical Q's).
 *
 * The math (powersgd_math.ts) is plain JS over Float32Array: sums in double precision, every
 * stored value rounded to float32. Only integer operations and correctly rounded arithmetic
 * (+ - * / sqrt) are used, so the results are identical on every JS engine.
 *
 * Where this differs from torch, on purpose:
 * - Q is drawn from an integer hash of (seed, step, bucket, parameter), as an approximately normal
 *   variate (the sum of four uniforms), not from torch's global generator: it needs no state to
 *   resume and is the same on every engine (Math.log / Math.cos may not be). Its only use is a
 *   random start for the power iteration, so the distribution does not matter.
 * - Errors are kept for the compressed parameters only. torch keeps `input - output` for the whole
 *   bucket, which for an uncompressed parameter is (this rank's gradient - the average): summed
 *   over ranks that is zero, so adding it back changes the next average by rounding only.
 * - A column of P or Q that is all zeros (a parameter whose gradient is zero everywhere) with
 *   `orthogonalizationEpsilon` 0 stays zero instead of becoming NaN (torch divides 0 by 0).
 * - 1-D parameters are never compressed, even with `minCompressionRate` < 1.
 * - torch refuses `start_powerSGD_iter` <= 1 with error feedback or warm start because its DDP
 *   rebuilds buckets after the first step; buckets here never change, so any `startIter` >= 0 is
 *   allowed.
 * - Orthogonalization is always Gram-Schmidt (torch switches to QR for ranks above 2).
 *
 * Ordering: the hook runs its collectives in the order its `reduce` calls were made (one bucket's
 * all-reduce of Q may overlap the next bucket's P), so concurrent calls from DDP, one per bucket,
 * issue the same sequence of collectives on every rank.
 */
import { checkWireDtype, type WireDtype } from '../../wire/half.ts';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import type { CommHook, CommHookState, GradBucket, LoadCommHookStateOptions } from './types.ts';
import { allFinite } from '../../wire/finite.ts';
import { fillRandom, matMul, matMulT, matTMul, matrixOf, orthogonalize } from './powersgd_math.ts';

export { orthogonalize } from './powersgd_math.ts';

export interface PowerSGDOptions {
  /** The rank r of the approximation (torch: matrix_approximation_rank). Default 1. */
  matrixApproximationRank?: number;
  /** Steps 1 .. startIter all-reduce uncompressed (torch: start_powerSGD_iter). Default 10. */
  startIter?: number;
  /** Keep each rank's compression error and add it to the next step's gradient. Default true. */
  useErrorFeedback?: boolean;
  /** Start each step's power iteration from the previous step's Q. Default true. */
  warmStart?: boolean;
  /** Compress a parameter only when n m > minCompressionRate (n + m) r. Default 2. */
  minCompressionRate?: number;
  /** Added to the norm when normalising a column (torch: orthogonalization_epsilon). Default 0. */
  orthogonalizationEpsilon?: number;
  /** Seeds the Q's drawn at random (any safe integer; the same on every rank). Default 0. */
  seed?: number;
  /**
   * What every all-reduce of the hook (the warm-up's, the uncompressed parameters', P's and Q's)
   * sends on the wire: 'float16' or 'bfloat16' halve the bytes again, as torch's
   * `fp16_compress_wrapper(powerSGD_hook)` / `bf16_compress_wrapper` do. The reductions stay in
   * float32 and every rank still gets the same bits (see `pg.allReduce`); the rounding of P and Q
   * ends up in the error feedback like the rest of the approximation's error. Default 'float32'.
   */
  wire?: WireDtype;
}

/** What one step's buckets sent (elements each rank all-reduced) against what DDP would have sent. */
export interface PowerSGDStats {
  /** The step these counts are for (0 before the first bucket). */
  step: number;
  /** Elements this rank contributed to all-reduces: uncompressed parameters plus the P's and Q's. */
  elementsSent: number;
  /** The buckets' sizes: what uncompressed all-reduces would have sent. */
  elementsDense: number;
}

/** A PowerSGD state that does not fit this hook or this model. */
export class PowerSGDStateError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PowerSGDStateError';
  }
}

/** torch's `powerSGD_hook` with its `PowerSGDState`: a comm hook that compresses gradients to low rank. */
export function powerSGD(options: PowerSGDOptions = {}): PowerSGDHook {
  return new PowerSGDHook(options);
}

/** What the hook keeps for one parameter of one bucket. */
interface Entry {
  shape: number[];
  /** The averaged Q of the last step (warm start), m x r row-major. */
  q?: Float32Array;
  /** This rank's error, n x m row-major (the parameter's own layout). */
  error?: Float32Array;
}

/** One parameter of a bucket, planned for compression. */
interface Compressed {
  key: string;
  /** The parameter's index in the model's trainable weights. */
  index: number;
  shape: number[];
  offset: number;
  n: number;
  m: number;
  r: number;
  /** The matrix: this rank's gradient plus its error. */
  M: Float32Array;
  pAt: number;
  qAt: number;
}

/** A bucket's parameters split for one compressed step, with the offsets of each in the flat buffers. */
interface BucketPlan {
  /** Parameters averaged uncompressed, together in one flat all-reduce. */
  plain: Array<{ offset: number; size: number }>;
  compressed: Compressed[];
  plainSize: number;
  pSize: number;
  qSize: number;
}

/** The uncompressed parameters of `buffer`, one after another. */
function packPlain(buffer: Float32Array, plan: BucketPlan): Float32Array {
  const flat = new Float32Array(plan.plainSize);
  let at = 0;
  for (const { offset, size } of plan.plain) {
    flat.set(buffer.subarray(offset, offset + size), at);
    at += size;
  }
  return flat;
}

/** Puts the averaged uncompressed parameters back where they were in `buffer`. */
function unpackPlain(buffer: Float32Array, plan: BucketPlan, flat: Float32Array): void {
  let at = 0;
  for (const { offset, size } of plan.plain) {
    buffer.set(flat.subarray(at, at + size), offset);
    at += size;
  }
}

export class PowerSGDHook implements CommHook {
  readonly name = 'powerSGD';
  readonly options: Readonly<Required<PowerSGDOptions>>;
  /** By `${bucket}/${parameter}`. */
  private entries = new Map<string, Entry>();
  /** The shapes reduce() has seen, by `${bucket}/${parameter}` (to check a loaded state early). */
  private readonly seen = new Map<string, number[]>();
  private iter = 0;
  private stats: PowerSGDStats & { done: boolean } = { step: 0, elementsSent: 0, elementsDense: 0, done: false };
  /** Resolves once the previous reduce() call has issued all its collectives. */
  private issued: Promise<void> = Promise.resolve();

  constructor(options: PowerSGDOptions = {}) {
    const o = {
      matrixApproximationRank: options.matrixApproximationRank ?? 1,
      startIter: options.startIter ?? 10,
      useErrorFeedback: options.useErrorFeedback ?? true,
      warmStart: options.warmStart ?? true,
      minCompressionRate: options.minCompressionRate ?? 2,
      orthogonalizationEpsilon: options.orthogonalizationEpsilon ?? 0,
      seed: options.seed ?? 0,
      wire: checkWireDtype(options.wire ?? 'float32'),
    };
    if (!Number.isSafeInteger(o.matrixApproximationRank) || o.matrixApproximationRank < 1) {
      throw new RangeError(`PowerSGD: matrixApproximationRank must be an integer >= 1, got ${o.matrixApproximationRank}`);
    }
    if (!Number.isSafeInteger(o.startIter) || o.startIter < 0)
      throw new RangeError(`PowerSGD: startIter must be an integer >= 0, got ${o.startIter}`);
    if (!Number.isFinite(o.minCompressionRate) || o.minCompressionRate < 0) {
      throw new RangeError(`PowerSGD: minCompressionRate must be a finite number >= 0, got ${o.minCompressionRate}`);
    }
    if (!Number.isFinite(o.orthogonalizationEpsilon) || o.orthogonalizationEpsilon < 0) {
      throw new RangeError(`PowerSGD: orthogonalizationEpsilon must be a finite number >= 0, got ${o.orthogonalizationEpsilon}`);
    }
    if (!Number.isSafeInteger(o.seed)) throw new RangeError(`PowerSGD: seed must be a safe integer, got ${o.seed}`);
    this.options = Object.freeze(o);
  }

  /**
   * The counts of the latest step: summed over its buckets reduced so far (all of them once its
   * last bucket is done). elementsDense / elementsSent is the compression ratio.
   */
  get lastStats(): PowerSGDStats {
    const { step, elementsSent, elementsDense } = this.stats;
    return { step, elementsSent, elementsDense };
  }

  /** The last step whose last bucket this hook reduced (torch's state.iter); 0 before any. */
  get iteration(): number {
    return this.iter;
  }

  reduce(pg: ProcessGroup, bucket: GradBucket): Promise<Float32Array> {
    const previous = this.issued;
    let open!: () => void;
    this.issued = new Promise<void>((resolve) => (open = resolve));
    const run = async () => {
      try {
        await previous;
        return await this.reduceInOrder(pg, bucket, open);
      } finally {
        open();
      }
    };
    return run();
  }

  /** Runs once every earlier call has issued its collectives; calls `issued` after issuing its own. */
  private async reduceInOrder(pg: ProcessGroup, bucket: GradBucket, issued: () => void): Promise<Float32Array> {
    checkBucket(bucket);
    const buffer = bucket.buffer;
    if (this.stats.done || this.stats.step !== bucket.step)
      this.stats = { step: bucket.step, elementsSent: 0, elementsDense: 0, done: false };
    this.stats.elementsDense += buffer.length;

    if (bucket.step <= this.options.startIter) {
      this.stats.elementsSent += buffer.length;
      const reduced = pg.allReduce(buffer, 'avg', { wire: this.options.wire });
      issued();
      const out = await reduced;
      this.finish(bucket);
      return out;
    }

    const plan = this.plan(bucket);
    this.stats.elementsSent += plan.plainSize + plan.pSize + plan.qSize;
    const flat = packPlain(buffer, plan);
    const { P, Q } = this.firstFactors(plan, bucket);
    const wire = this.options.wire;
    const plainDone = plan.plainSize > 0 ? pg.allReduce(flat, 'avg', { wire }) : Promise.resolve(flat);
    plainDone.catch(() => {});
    const pDone = plan.pSize > 0 ? pg.allReduce(P, 'sum', { wire }) : Promise.resolve(P);
    // The all-reduce of P need not be divided by the world size: P is orthogonalized next.
    const Pall = await pDone;
    for (const c of plan.compressed) {
      const p = Pall.subarray(c.pAt, c.pAt + c.n * c.r);
      orthogonalize(p, c.n, c.r, this.options.orthogonalizationEpsilon);
      matTMul(c.M, p, Q.subarray(c.qAt, c.qAt + c.m * c.r), c.n, c.m, c.r);
    }
    const qDone = plan.qSize > 0 ? pg.allReduce(Q, 'avg', { wire }) : Promise.resolve(Q);
    issued();
    const [plainAvg, Qall] = await Promise.all([plainDone, qDone]);
    unpackPlain(buffer, plan, plainAvg);
    this.approximate(plan.compressed, Pall, Qall, buffer);
    this.finish(bucket);
    return buffer;
  }

  /** Which parameters of `bucket` go uncompressed and which as P and Q; each compressed one's M is its gradient plus its error. */
  private plan(bucket: GradBucket): BucketPlan {
    const r0 = this.options.matrixApproximationRank;
    const plan: BucketPlan = { plain: [], compressed: [], plainSize: 0, pSize: 0, qSize: 0 };
    for (const param of bucket.parameters) {
      const key = `${bucket.index}/${param.index}`;
      const entry = this.entries.get(key);
      if (entry && !sameShape(entry.shape, param.shape)) {
        throw new PowerSGDStateError(
          `PowerSGD: parameter ${param.index} in bucket ${bucket.index} has shape [${param.shape.join(', ')}], but the hook's state is for shape [${entry.shape.join(', ')}]`,
        );
      }
      this.seen.set(key, [...param.shape]);
      const { n, m } = matrixOf(param.shape);
      const r = Math.min(n, m, r0);
      if (param.shape.length < 2 || !((n + m) * r * this.options.minCompressionRate < n * m)) {
        plan.plain.push({ offset: param.offset, size: param.size });
        plan.plainSize += param.size;
        continue;
      }
      const M = bucket.buffer.slice(param.offset, param.offset + param.size);
      if (this.options.useErrorFeedback && entry?.error) {
        const e = entry.error;
        for (let i = 0; i < M.length; i++) M[i] += e[i]!;
      }
      plan.compressed.push({
        key,
        index: param.index,
        shape: [...param.shape],
        offset: param.offset,
        n,
        m,
        r,
        M,
        pAt: plan.pSize,
        qAt: plan.qSize,
      });
      plan.pSize += n * r;
      plan.qSize += m * r;
    }
    return plan;
  }

  /** Q (warm, or drawn the same on every rank), orthogonalized; P = M Q. */
  private firstFactors(plan: BucketPlan, bucket: GradBucket): { P: Float32Array; Q: Float32Array } {
    const P = new Float32Array(plan.pSize);
    const Q = new Float32Array(plan.qSize);
    for (const c of plan.compressed) {
      const q = Q.subarray(c.qAt, c.qAt + c.m * c.r);
      const warm = this.options.warmStart ? this.entries.get(c.key)?.q : undefined;
      if (warm) q.set(warm);
      else fillRandom(q, this.options.seed, bucket.step, bucket.index, c.index);
      orthogonalize(q, c.m, c.r, this.options.orthogonalizationEpsilon);
      matMul(c.M, q, P.subarray(c.pAt, c.pAt + c.n * c.r), c.n, c.m, c.r);
    }
    return { P, Q };
  }

  /** Writes each compressed parameter's P Q^T into `buffer`, and keeps its error and Q for the next step. */
  private approximate(compressed: readonly Compressed[], Pall: Float32Array, Qall: Float32Array, buffer: Float32Array): void {
    // A NaN or an infinity in the reduced P or Q (one rank's non-finite gradient, a hostile
    // member's, or an honest spike past the fp16 wire's range): every rank sees the same, so every
    // rank keeps its error feedback and warm start as they were. The step's output is non-finite
    // (DDP's errorIfNonfinite refuses it); the next steps start from the last good state.
    const keepState = !allFinite(Pall) || !allFinite(Qall);
    for (const c of compressed) {
      const p = Pall.subarray(c.pAt, c.pAt + c.n * c.r);
      const q = Qall.subarray(c.qAt, c.qAt + c.m * c.r);
      const out = buffer.subarray(c.offset, c.offset + c.n * c.m);
      matMulT(p, q, out, c.n, c.m, c.r);
      if (keepState) continue;
      let entry = this.entries.get(c.key);
      if (!entry) {
        entry = { shape: c.shape };
        this.entries.set(c.key, entry);
      }
      if (this.options.useErrorFeedback) {
        entry.error ??= new Float32Array(c.M.length);
        const e = entry.error;
        for (let i = 0; i < e.length; i++) e[i] = c.M[i]! - out[i]!;
      }
      if (this.options.warmStart) entry.q = q.slice();
    }
  }

  private finish(bucket: GradBucket): void {
    if (bucket.isLast) {
      this.iter = bucket.step;
      this.stats.done = true;
    }
  }

  /**
   * meta: the options, `iter`, and each kept parameter's shape as `shape:<bucket>/<parameter>`
   * (JSON). tensors: `q:<bucket>/<parameter>` (the averaged Q, m x r, the same on every rank) and
   * `error:<bucket>/<parameter>` (this rank's error, the parameter's size). Copies.
   */
  stateDict(): CommHookState {
    const o = this.options;
    const meta: CommHookState['meta'] = {
      iter: this.iter,
      matrixApproximationRank: o.matrixApproximationRank,
      startIter: o.startIter,
      useErrorFeedback: o.useErrorFeedback,
      warmStart: o.warmStart,
      minCompressionRate: o.minCompressionRate,
      orthogonalizationEpsilon: o.orthogonalizationEpsilon,
      seed: o.seed,
      wire: o.wire,
    };
    const tensors: CommHookState['tensors'] = {};
    for (const [key, entry] of [...this.entries].sort(([a], [b]) => compareKeys(a, b))) {
      if (!entry.q && !entry.error) continue;
      meta[`shape:${key}`] = JSON.stringify(entry.shape);
      if (entry.q) tensors[`q:${key}`] = entry.q.slice();
      if (entry.error) tensors[`error:${key}`] = entry.error.slice();
    }
    return { name: this.name, meta, tensors };
  }

  /**
   * Replaces the hook's state with `state` (from `stateDict`, on any rank for Q; errors are each
   * rank's own). Refuses, with PowerSGDStateError and leaving the hook as it was, a state of
   * another hook, one whose arrays do not fit their shapes or this hook's rank, or one whose
   * shapes differ from those this hook has reduced; a shape that differs from the model's later
   * fails that bucket's reduce(). With `options.otherRank` (the state is another rank's: a
   * joiner's warm start, a checkpoint of rank 0 loaded on another rank) the Q's and the
   * iteration are taken and the errors, checked all the same, are not: this rank's error
   * feedback starts at zero.
   */
  loadStateDict(state: CommHookState, options: LoadCommHookStateOptions = {}): void {
    const ownErrors = !options.otherRank;
    if (state.name !== this.name)
      throw new PowerSGDStateError(`PowerSGD: the state is a ${JSON.stringify(state.name)} hook's, not PowerSGD's`);
    const iter = state.meta.iter;
    if (typeof iter !== 'number' || !Number.isSafeInteger(iter) || iter < 0)
      throw new PowerSGDStateError(`PowerSGD: the state's iter must be an integer >= 0, got ${String(iter)}`);
    const r0 = this.options.matrixApproximationRank;
    const entries = new Map<string, Entry>();
    for (const [name, data] of Object.entries(state.tensors)) {
      const match = /^(q|error):(\d+)\/(\d+)$/.exec(name);
      if (!match)
        throw new PowerSGDStateError(
          `PowerSGD: unknown tensor ${JSON.stringify(name)} in the state (expected q:<bucket>/<parameter> or error:<bucket>/<parameter>)`,
        );
      const [, kind, b, p] = match;
      const key = `${Number(b)}/${Number(p)}`;
      const where = `parameter ${Number(p)} in bucket ${Number(b)}`;
      const shape = parseShape(state.meta[`shape:${key}`]);
      if (!shape) throw new PowerSGDStateError(`PowerSGD: the state has no valid shape:${key} for ${where}`);
      const seen = this.seen.get(key);
      if (seen && !sameShape(seen, shape)) {
        throw new PowerSGDStateError(
          `PowerSGD: the state is for ${where} of shape [${shape.join(', ')}], but this model's has shape [${seen.join(', ')}]`,
        );
      }
      if (!(data instanceof Float32Array)) throw new PowerSGDStateError(`PowerSGD: the state's ${name} is not a Float32Array`);
      // A poisoned checkpoint or a hostile rank's warm start: one NaN would spread to every later step.
      if (!allFinite(data)) throw new PowerSGDStateError(`PowerSGD: the state's ${name} for ${where} holds a NaN or an infinity`);
      const { n, m } = matrixOf(shape);
      const entry = entries.get(key) ?? { shape };
      entries.set(key, entry);
      if (kind === 'error') {
        if (data.length !== n * m)
          throw new PowerSGDStateError(
            `PowerSGD: the state's error for ${where} has ${data.length} elements, its shape [${shape.join(', ')}] ${n * m}`,
          );
        if (this.options.useErrorFeedback && ownErrors) entry.error = data.slice();
      } else {
        const saved = state.meta.matrixApproximationRank;
        if (saved !== r0) {
          throw new PowerSGDStateError(
            `PowerSGD: the state's Q matrices are of rank ${String(saved)}, but this hook's matrixApproximationRank is ${r0}`,
          );
        }
        const r = Math.min(n, m, r0);
        if (data.length !== m * r)
          throw new PowerSGDStateError(`PowerSGD: the state's Q for ${where} has ${data.length} elements, expected ${m} x ${r} = ${m * r}`);
        if (this.options.warmStart) entry.q = data.slice();
      }
    }
    this.entries = entries;
    this.iter = iter;
  }
}

function checkBucket(bucket: GradBucket): void {
  for (const p of bucket.parameters) {
    const size = p.shape.reduce((a, b) => a * b, 1);
    if (size !== p.size || p.offset < 0 || p.offset + p.size > bucket.buffer.length) {
      throw new RangeError(
        `PowerSGD: parameter ${p.index} in bucket ${bucket.index} (shape [${p.shape.join(', ')}], size ${p.size}, offset ${p.offset}) does not fit the bucket's ${bucket.buffer.length} elements`,
      );
    }
  }
}

function sameShape(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

function parseShape(value: unknown): number[] | undefined {
  if (typeof value !== 'string') return undefined;
  try {
    const shape = JSON.parse(value) as unknown;
    return Array.isArray(shape) && shape.every((d) => Number.isSafeInteger(d) && d >= 0) ? (shape as number[]) : undefined;
  } catch {
    return undefined;
  }
}

function compareKeys(a: string, b: string): number {
  const [ab, ap] = a.split('/').map(Number);
  const [bb, bp] = b.split('/').map(Number);
  return ab! - bb! || ap! - bp!;
}
