/** A short, stable fingerprint of float32 data, to compare replicas across ranks cheaply. */

/** FNV-1a (32-bit) over the bytes, as 8 hex digits. Equal hashes for bit-identical buffers. */
export function hashFloat32(data: Float32Array): string {
  const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  let h = 0x811c9dc5;
  for (let i = 0; i < bytes.length; i++) {
    h ^= bytes[i];
    h = Math.imul(h, 0x01000193);
  }
  return (h >>> 0).toString(16).padStart(8, '0');
}

/**
 * 48 bits over several byte arrays, in order, as two 24-bit halves (each exact in a float32, so
 * that a collective can carry it): FNV-1a in one lane, a multiply-rotate mix in the other.
 * Equal for bit-identical inputs; for comparing replicas, not against an adversary.
 */
export function digest48(parts: readonly Uint8Array[]): [number, number] {
  let a = 0x811c9dc5;
  let b = 0x9e3779b9;
  for (const bytes of parts) {
    for (let i = 0; i < bytes.length; i++) {
      a = Math.imul(a ^ bytes[i]!, 0x01000193);
      b = Math.imul((b ^ bytes[i]!) + i, 0x5bd1e995);
      b = (b << 13) | (b >>> 19);
    }
    // Where one part ends and the next begins counts: [ab][c] differs from [a][bc].
    a = Math.imul(a ^ bytes.length, 0x01000193);
    b = Math.imul(b ^ bytes.length, 0x5bd1e995);
  }
  return [(a >>> 0) & 0xffffff, ((b >>> 0) ^ (a >>> 24)) & 0xffffff];
}

/** A 32-bit integer hash (the "lowbias32" finaliser), for deriving seeds: the same on every engine. */
export function hash32(x: number): number {
  x = (x + 0x9e3779b9) | 0; // Keeps hash32(0) away from the fixed point 0.
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  x ^= x >>> 16;
  return x >>> 0;
}
