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
