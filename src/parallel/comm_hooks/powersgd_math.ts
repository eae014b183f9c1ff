/**
 * The linear algebra PowerSGD runs (powersgd.ts), in plain JS over Float32Array: sums in double
 * precision, every stored value rounded to float32, and only integer operations and correctly
 * rounded arithmetic (+ - * / sqrt), so that every rank on every JS engine gets the same bits.
 */
import { hash32 } from '../../wire/hash.ts';

/**
 * The matrix a parameter is viewed as: every dimension but the last by the last (a scalar is 1 x
 * 1). TF.js keeps the output dimension last (a dense kernel is [in, out], a convolution's [kh, kw,
 * in, out]), so this is torch's out x (in kh kw) view transposed: a convolution becomes
 * (kh kw in) x out, which compresses, where its first dimension (kh) by the rest would not.
 */
export function matrixOf(shape: readonly number[]): { n: number; m: number } {
  const m = shape.length === 0 ? 1 : shape[shape.length - 1]!;
  const n = shape.slice(0, -1).reduce((a, b) => a * b, 1);
  return { n, m };
}

/**
 * Gram-Schmidt over the columns of `a` (rows x cols, row-major), in place, as torch's
 * `_orthogonalize_gram_schmidt`: normalise column i (by its norm + eps), then remove its
 * projection from every later column. A zero column with eps 0 stays zero.
 */
export function orthogonalize(a: Float32Array, rows: number, cols: number, eps: number): void {
  for (let c = 0; c < cols; c++) {
    let ss = 0;
    for (let i = 0; i < rows; i++) {
      const v = a[i * cols + c]!;
      ss += v * v;
    }
    const norm = Math.sqrt(ss) + eps;
    if (norm === 0) {
      for (let i = 0; i < rows; i++) a[i * cols + c] = 0;
    } else {
      for (let i = 0; i < rows; i++) a[i * cols + c] = a[i * cols + c]! / norm;
    }
    for (let d = c + 1; d < cols; d++) {
      let dot = 0;
      for (let i = 0; i < rows; i++) dot += a[i * cols + c]! * a[i * cols + d]!;
      for (let i = 0; i < rows; i++) a[i * cols + d] = a[i * cols + d]! - dot * a[i * cols + c]!;
    }
  }
}

/** out (n x r) = M (n x m) Q (m x r). */
export function matMul(M: Float32Array, Q: Float32Array, out: Float32Array, n: number, m: number, r: number): void {
  const acc = new Float64Array(r);
  for (let i = 0; i < n; i++) {
    acc.fill(0);
    for (let j = 0; j < m; j++) {
      const v = M[i * m + j]!;
      for (let k = 0; k < r; k++) acc[k] += v * Q[j * r + k]!;
    }
    for (let k = 0; k < r; k++) out[i * r + k] = acc[k]!;
  }
}

/** out (m x r) = M^T (M: n x m) P (n x r). */
export function matTMul(M: Float32Array, P: Float32Array, out: Float32Array, n: number, m: number, r: number): void {
  const acc = new Float64Array(m * r);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < m; j++) {
      const v = M[i * m + j]!;
      for (let k = 0; k < r; k++) acc[j * r + k] += v * P[i * r + k]!;
    }
  }
  out.set(acc);
}

/** out (n x m) = P (n x r) Q^T (Q: m x r). */
export function matMulT(P: Float32Array, Q: Float32Array, out: Float32Array, n: number, m: number, r: number): void {
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < m; j++) {
      let s = 0;
      for (let k = 0; k < r; k++) s += P[i * r + k]! * Q[j * r + k]!;
      out[i * m + j] = s;
    }
  }
}

/**
 * Fills `out` with approximately standard normal values (the sum of four uniforms, centred and
 * scaled) from a generator seeded by (seed, step, bucket, parameter): the same on every rank and
 * every engine, different at every step.
 */
export function fillRandom(out: Float32Array, seed: number, step: number, bucket: number, param: number): void {
  const lo = seed >>> 0;
  const hi = Math.floor(seed / 2 ** 32) >>> 0;
  let state = hash32(hash32(hash32(hash32(hash32(lo) ^ hi) ^ (step >>> 0)) ^ (bucket >>> 0)) ^ (param >>> 0));
  const next = (): number => {
    state = (state + 0x6d2b79f5) | 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
  const scale = Math.sqrt(3);
  for (let i = 0; i < out.length; i++) out[i] = (next() + next() + next() + next() - 2) * scale;
}
