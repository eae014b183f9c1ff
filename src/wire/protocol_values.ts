/**
 * The wire protocol's values (part of protocol.ts, which re-exports it): store values travel
 * as base64 text so that arbitrary bytes survive a JSON frame.
 */
// Bytes <-> base64 without Node's Buffer, so that the browser can use it too.

/** Base64 text of a store value. */
export type WireValue = string;

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder();

export function toBytes(v: Uint8Array | string): Uint8Array {
  return typeof v === 'string' ? textEncoder.encode(v) : v;
}

export function bytesToString(b: Uint8Array): string {
  return textDecoder.decode(b);
}

export function encodeValue(v: Uint8Array | string): WireValue {
  const bytes = toBytes(v);
  let bin = '';
  const CHUNK = 0x8000;
  for (let i = 0; i < bytes.length; i += CHUNK) {
    bin += String.fromCharCode(...bytes.subarray(i, i + CHUNK));
  }
  return btoa(bin);
}

export function decodeValue(v: WireValue): Uint8Array {
  const bin = atob(v);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
