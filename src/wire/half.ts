/**
 * 16-bit floats on the wire: IEEE half precision (float16) and bfloat16, both rounded to nearest
 * even. A pipeline stage's float16 activations (`packHalf`/`unpackHalf`) and the collectives'
 * 16-bit wire (`pg.allReduce(buf, op, { wire })`, ring.ts) use them. Values live in float32
 * everywhere else: only what travels is 16-bit.
 *
 * - float16: 5 exponent bits, 10 mantissa bits. Relative error at most 2^-11 for normal values
 *   (|x| in [2^-14, 65504]); smaller values go subnormal then to zero; larger ones to infinity.
 * - bfloat16: float32's 8 exponent bits, 7 mantissa bits (the top half of a float32). Relative
 *   error at most 2^-8, float32's range.
 * Infinities keep their sign; NaN stays NaN (a quiet NaN of the same sign).
 *
 * Decoding is exact (every 16-bit value is a float32), so a value encoded, decoded and encoded
 * again gives the same bits: what the ring relies on for every rank to end bit-identical.
 */

import { int8Bytes, roundToInt8 } from './int8_wire.ts';

/**
 * What a collective's values travel as. `float32` is the default; the 16-bit ones halve the bytes;
 * `int8` (int8_wire.ts: blocks of 32 with a power-of-two scale each) takes a little over a quarter.
 */
export type WireDtype = 'float32' | 'float16' | 'bfloat16' | 'int8';
export const WIRE_DTYPES: readonly WireDtype[] = ['float32', 'float16', 'bfloat16', 'int8'];
/** The 16-bit wire formats. */
export type HalfDtype = 'float16' | 'bfloat16';

/** A wire dtype's code in frame headers (framing.ts). */
export const WIRE_DTYPE_CODES: Record<WireDtype, number> = { float32: 0, float16: 1, bfloat16: 2, int8: 3 };
export const WIRE_DTYPE_NAMES: Record<number, WireDtype> = { 0: 'float32', 1: 'float16', 2: 'bfloat16', 3: 'int8' };

/** Bytes per element on the wire (int8: without its blocks' scale bytes, which `wirePayloadBytes` counts). */
export function wireBytes(dtype: WireDtype): 1 | 2 | 4 {
  return dtype === 'float32' ? 4 : dtype === 'int8' ? 1 : 2;
}

/** Bytes that `n` values take on the wire. */
export function wirePayloadBytes(dtype: WireDtype, n: number): number {
  return dtype === 'int8' ? int8Bytes(n) : n * wireBytes(dtype);
}

/** Throws a RangeError naming the allowed values for anything but a WireDtype. */
export function checkWireDtype(dtype: unknown): WireDtype {
  if (typeof dtype !== 'string' || !(WIRE_DTYPES as readonly string[]).includes(dtype)) {
    throw new RangeError(`unknown wire dtype ${JSON.stringify(dtype) ?? String(dtype)}; use ${WIRE_DTYPES.join(', ')}`);
  }
  return dtype as WireDtype;
}

// --- Single values --------------------------------------------------------------------------------

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The float16 bits of float32 bits `x` (round to nearest even). */
function halfOfBits(x: number): number {
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0); // inf, NaN
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00; // overflow: infinity
  if (e <= 0) {
    if (e < -10) return sign; // underflow: zero
    mant |= 0x800000;
    const shift = 14 - e;
    const half = mant >>> shift;
    const rest = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    return sign | (half + (rest > mid || (rest === mid && half & 1) ? 1 : 0));
  }
  const half = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  // A carry out of the mantissa rolls into the exponent, which is what rounding up means.
  return sign | (half + (rest > 0x1000 || (rest === 0x1000 && half & 1) ? 1 : 0));
}

/** The bfloat16 bits of float32 bits `x` (round to nearest even; NaN stays a quiet NaN). */
function bfloatOfBits(x: number): number {
  if ((x & 0x7fffffff) >>> 0 > 0x7f800000) return ((x >>> 16) | 0x0040) & 0xffff;
  // The largest non-NaN input plus the bias stays below 2^32: no wrap. Overflow rounds to infinity.
  return ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
}

/** `v` as IEEE float16 bits. */
export function toFloat16Bits(v: number): number {
  f32[0] = v;
  return halfOfBits(u32[0]!);
}

/** The value of IEEE float16 bits `h`. */
export function fromFloat16Bits(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant ? NaN : sign * Infinity;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** `v` as bfloat16 bits. */
export function toBfloat16Bits(v: number): number {
  f32[0] = v;
  return bfloatOfBits(u32[0]!);
}

/** The value of bfloat16 bits `h` (exact: the top half of a float32). */
export function fromBfloat16Bits(h: number): number {
  u32[0] = (h & 0xffff) << 16;
  return f32[0]!;
}

// --- Arrays ---------------------------------------------------------------------------------------

/** Every float16 value as float32, made on first use (256 KiB): decoding is a lookup. */
let halfTable: Float32Array | undefined;
function halves(): Float32Array {
  if (!halfTable) {
    halfTable = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) halfTable[h] = fromFloat16Bits(h);
  }
  return halfTable;
}

/** Encodes `src` into `dst` (same length) as `dtype`'s 16-bit values. */
export function encode16(dtype: HalfDtype, src: Float32Array, dst: Uint16Array): void {
  const bits = new Uint32Array(src.buffer, src.byteOffset, src.length);
  const n = Math.min(src.length, dst.length);
  if (dtype === 'float16') for (let i = 0; i < n; i++) dst[i] = halfOfBits(bits[i]!);
  else for (let i = 0; i < n; i++) dst[i] = bfloatOfBits(bits[i]!);
}

/** Decodes `count` 16-bit values of `dtype` from `src[from..]` into `dst[at..]`. */
export function decode16(dtype: HalfDtype, src: Uint16Array, dst: Float32Array, at = 0, count = src.length, from = 0): void {
  if (dtype === 'float16') {
    const table = halves();
    for (let i = 0; i < count; i++) dst[at + i] = table[src[from + i]!]!;
  } else {
    const out = new Uint32Array(dst.buffer, dst.byteOffset, dst.length);
    for (let i = 0; i < count; i++) out[at + i] = src[from + i]! << 16;
  }
}

/** Rounds `values` in place to what `dtype` can hold (encode, then decode); float32 leaves them as they are. */
export function roundToWire(dtype: WireDtype, values: Float32Array): Float32Array {
  if (dtype === 'float32') return values;
  if (dtype === 'int8') return roundToInt8(values);
  const bits = new Uint16Array(values.length);
  encode16(dtype, values, bits);
  decode16(dtype, bits, values);
  return values;
}

/** float32 values as IEEE half floats (round to nearest even), two to a float32 slot. */
export function packHalf(values: Float32Array): Float32Array {
  const out = new Float32Array(Math.ceil(values.length / 2));
  encode16('float16', values, new Uint16Array(out.buffer, 0, values.length));
  return out;
}

/** The `count` values `packHalf` packed, as float32. */
export function unpackHalf(packed: Float32Array, count: number): Float32Array {
  const out = new Float32Array(count);
  decode16('float16', new Uint16Array(packed.buffer, packed.byteOffset, packed.length * 2), out, 0, count);
  return out;
}
