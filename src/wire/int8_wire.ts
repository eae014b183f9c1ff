/**
 * 8-bit values on the wire, block-scaled (the layout of OCP's MXINT8): the values go in blocks of
 * 32, each block one byte of shared scale, a power of two 2^k, and 32 signed bytes q with
 * value = q * 2^k, |q| <= 127. A block's k is the smallest that fits its largest magnitude, so
 * a block loses at most 8 bits relative to its largest value: fine for the pseudo-gradients of
 * DiLoCo (the Streaming DiLoCo paper sends 4-bit ones), coarse for small values beside large ones.
 *
 * A power-of-two scale makes the rounding exact arithmetic and idempotent: decoding is exact,
 * and a decoded block encodes to the same bytes again (its largest value still needs the same k).
 * What the ring relies on for every rank to end bit-identical, as with the 16-bit wires.
 *
 * A block holding a NaN or an infinity travels as a block of NaN (scale byte 0xff), so the check
 * for non-finite values downstream still sees it. Blocks whose largest value is below 2^-120 or so
 * travel as zeros (k is at least -127).
 */

export const INT8_BLOCK = 32;
const MIN_EXPONENT = -127;
const MAX_EXPONENT = 127;
/** The scale byte of a block that held a NaN or an infinity. */
const NONFINITE = 0xff;
const FLOAT32_MAX = 3.4028234663852886e38;

/** Bytes that `n` values take on the int8 wire: one per value and one per block of 32. */
export function int8Bytes(n: number): number {
  return n + Math.ceil(n / INT8_BLOCK);
}

/** The smallest k (>= -127) with round(max / 2^k) <= 127. */
function blockExponent(max: number): number {
  if (max === 0) return MIN_EXPONENT;
  let k = Math.max(MIN_EXPONENT, Math.ceil(Math.log2(max / 127)));
  // Math.log2 may be off by an ulp: settle k exactly.
  while (k < MAX_EXPONENT && Math.round(max * 2 ** -k) > 127) k++;
  while (k > MIN_EXPONENT && Math.round(max * 2 ** -(k - 1)) <= 127) k--;
  return k;
}

/** Encodes `src` as int8 blocks into `dst` (at least `int8Bytes(src.length)` long, a fresh array without it). */
export function encodeInt8(src: Float32Array, dst: Uint8Array = new Uint8Array(int8Bytes(src.length))): Uint8Array {
  const q = new Int8Array(dst.buffer, dst.byteOffset, dst.byteLength);
  let out = 0;
  for (let start = 0; start < src.length; start += INT8_BLOCK) {
    const end = Math.min(src.length, start + INT8_BLOCK);
    let max = 0;
    let finite = true;
    for (let i = start; i < end; i++) {
      const a = Math.abs(src[i]!);
      if (!(a <= Number.MAX_VALUE)) finite = false;
      else if (a > max) max = a;
    }
    if (!finite) {
      dst[out++] = NONFINITE;
      for (let i = start; i < end; i++) q[out++] = 0;
      continue;
    }
    const k = blockExponent(max);
    dst[out++] = k - MIN_EXPONENT;
    const inv = 2 ** -k;
    // Rounding up must not carry a value near float32's largest past it, to infinity.
    const limit = Math.floor(FLOAT32_MAX * inv);
    // Half away from zero, the same on every rank (plain arithmetic on float32 inputs).
    for (let i = start; i < end; i++) {
      const v = src[i]! * inv;
      const r = Math.min(limit, Math.round(Math.abs(v)));
      q[out++] = v < 0 ? -r : r;
    }
  }
  return dst;
}

/** Decodes `count` values from int8 blocks `src` into `dst[at..]`. */
export function decodeInt8(src: Uint8Array, dst: Float32Array, at = 0, count = dst.length - at): void {
  const q = new Int8Array(src.buffer, src.byteOffset, src.byteLength);
  let from = 0;
  for (let start = 0; start < count; start += INT8_BLOCK) {
    const end = Math.min(count, start + INT8_BLOCK);
    const code = src[from++]!;
    if (code === NONFINITE) {
      for (let i = start; i < end; i++) dst[at + i] = NaN;
      from += end - start;
      continue;
    }
    const scale = 2 ** (code + MIN_EXPONENT);
    for (let i = start; i < end; i++) dst[at + i] = q[from++]! * scale;
  }
}

/** Rounds `values` in place to what the int8 wire carries (encode, then decode). */
export function roundToInt8(values: Float32Array): Float32Array {
  decodeInt8(encodeInt8(values), values);
  return values;
}
