/**
 * What crosses between RPC workers: a message is a JSON head and the bytes of its tensors and
 * typed arrays after it. JavaScript cannot pickle a function or a class, so a value is JSON-able
 * data, a TF.js tensor (its dtype, shape and bytes kept), a Float32Array, Int32Array or
 * Uint8Array, or an RRef (passed by reference); anything else is refused with the path to it.
 * In the JSON, those travel as objects keyed "$t", "$a", "$r" (and "$n", "$u" for non-finite
 * numbers and undefined); a user's own object with any such key is wrapped ({"$o": ...}), so no
 * data is ever taken for one.
 *
 * Layout: u32 magic, u32 JSON length, the JSON (UTF-8), zero padding to 8 bytes, then each
 * attachment's bytes at the offset the head gives, each padded to 8.
 */
import * as tf from '@tensorflow/tfjs';
import { RpcSerializationError } from './errors.ts';

const MAGIC = 0x52504331; // "RPC1"
/** Nesting deeper than this is refused on both ends (a hostile message cannot blow the stack). */
export const MAX_DEPTH = 64;
/** Tensors and arrays in one message. */
export const MAX_ATTACHMENTS = 4096;
const TENSOR_DTYPES = ['float32', 'int32', 'bool'] as const;
type TensorDtype = (typeof TENSOR_DTYPES)[number];
const ARRAY_KINDS = ['f32', 'i32', 'u8'] as const;
type ArrayKind = (typeof ARRAY_KINDS)[number];
const SPECIAL_KEYS = new Set(['$t', '$a', '$r', '$n', '$u', '$o']);

/** An RRef as it travels: its owner's rank, the value's id there, and the fork this copy is. */
export interface WireRRef {
  owner: number;
  id: string;
  fork: string;
}

interface Attachment {
  offset: number;
  bytes: number;
}

/** How RRefs in a value become wire references and back (the agent's, rref.ts). */
export interface RRefCodec<R> {
  /** The reference to send for `rref` to rank `to` (may first register a fork with the owner). */
  /** `ctx`: the distributed autograd context of the message that carries it. */
  toWire(value: unknown, to: number, ctx?: string): Promise<WireRRef> | undefined;
  fromWire(wire: WireRRef, from: number): R;
}

/**
 * Encodes `head` and the user values `values` (each under its key) into one message's bytes.
 * `tensors`, when given, receives the message's tensors in their order (distributed autograd
 * records what crossed).
 */
export async function encodeMessage(
  head: Record<string, unknown>,
  values: Record<string, unknown>,
  rrefs: RRefCodec<unknown>,
  to: number,
  tensors: tf.Tensor[] = [],
): Promise<Uint8Array> {
  const blobs: Uint8Array[] = [];
  const encoded: Record<string, unknown> = { ...head };
  const ctx = typeof head.ctx === 'string' ? head.ctx : undefined;
  for (const [key, value] of Object.entries(values)) encoded[key] = await encodeValue(value, key, 0, { blobs, rrefs, to, tensors, ctx });
  const attachments: Attachment[] = [];
  let offset = 0;
  for (const b of blobs) {
    attachments.push({ offset, bytes: b.length });
    offset += pad8(b.length);
  }
  encoded.att = attachments;
  const json = new TextEncoder().encode(JSON.stringify(encoded));
  const start = pad8(8 + json.length);
  const out = new Uint8Array(start + offset);
  const view = new DataView(out.buffer);
  view.setUint32(0, MAGIC, true);
  view.setUint32(4, json.length, true);
  out.set(json, 8);
  for (let i = 0; i < blobs.length; i++) out.set(blobs[i]!, start + attachments[i]!.offset);
  return out;
}

interface EncodeState {
  blobs: Uint8Array[];
  rrefs: RRefCodec<unknown>;
  to: number;
  tensors: tf.Tensor[];
  ctx: string | undefined;
}

async function encodeValue(v: unknown, path: string, depth: number, s: EncodeState): Promise<unknown> {
  if (depth > MAX_DEPTH) throw new RpcSerializationError(`nested deeper than ${MAX_DEPTH} levels`, path);
  if (v === null || typeof v === 'boolean' || typeof v === 'string') return v;
  if (v === undefined) return { $u: 1 };
  if (typeof v === 'number') return Number.isFinite(v) ? v : { $n: String(v) };
  if (v instanceof tf.Tensor) {
    if (!(TENSOR_DTYPES as readonly string[]).includes(v.dtype))
      throw new RpcSerializationError(`a ${v.dtype} tensor cannot be sent (float32, int32 and bool can)`, path);
    s.tensors.push(v);
    const data = await v.data();
    const bytes = v.dtype === 'bool' ? Uint8Array.from(data as Uint8Array) : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    return { $t: attach(s, bytes, path), dtype: v.dtype, shape: v.shape };
  }
  if (v instanceof Float32Array || v instanceof Int32Array || v instanceof Uint8Array) {
    const kind: ArrayKind = v instanceof Float32Array ? 'f32' : v instanceof Int32Array ? 'i32' : 'u8';
    return { $a: attach(s, new Uint8Array(v.buffer, v.byteOffset, v.byteLength), path), kind };
  }
  const rref = s.rrefs.toWire(v, s.to, s.ctx);
  if (rref) return { $r: await rref };
  if (Array.isArray(v)) {
    const out: unknown[] = [];
    for (let i = 0; i < v.length; i++) out.push(await encodeValue(v[i], `${path}[${i}]`, depth + 1, s));
    return out;
  }
  if (typeof v === 'object' && (Object.getPrototypeOf(v) === Object.prototype || Object.getPrototypeOf(v) === null)) {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) out[k] = await encodeValue(x, `${path}.${k}`, depth + 1, s);
    return Object.keys(out).some((k) => SPECIAL_KEYS.has(k)) ? { $o: out } : out;
  }
  const what = typeof v === 'function' ? 'a function' : typeof v === 'object' ? `a ${v.constructor?.name ?? 'class'} instance` : typeof v;
  throw new RpcSerializationError(
    `${what} cannot be sent to another worker: send JSON-able data, tensors, typed arrays or RRefs (functions are called by their registered name)`,
    path,
  );
}

function attach(s: EncodeState, bytes: Uint8Array, path: string): number {
  if (s.blobs.length >= MAX_ATTACHMENTS)
    throw new RpcSerializationError(`more than ${MAX_ATTACHMENTS} tensors and arrays in one message`, path);
  s.blobs.push(bytes.slice());
  return s.blobs.length - 1;
}

function pad8(n: number): number {
  return Math.ceil(n / 8) * 8;
}

/** A decoded message: its head, and a function that decodes a user value of it. */
export interface DecodedMessage {
  head: Record<string, unknown>;
  /**
   * Decodes the field `key`; tensors come out as new tensors the caller owns, or as what `onTensor`
   * makes of each (given the tensor and its index in the message). Throws RpcSerializationError.
   */
  value<R>(key: string, rrefs: RRefCodec<R>, from: number, onTensor?: (t: tf.Tensor, index: number) => tf.Tensor): unknown;
}

/** Reads a message's head; throws RpcSerializationError (path "message") on anything malformed. */
export function decodeMessage(bytes: Uint8Array): DecodedMessage {
  const bad = (why: string) => new RpcSerializationError(why, 'message');
  if (bytes.length < 8) throw bad(`${bytes.length} bytes is shorter than an RPC message's 8-byte start`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint32(0, true) !== MAGIC) throw bad('not an RPC message (wrong magic)');
  const jsonLength = view.getUint32(4, true);
  if (8 + jsonLength > bytes.length) throw bad(`its head says ${jsonLength} bytes of JSON, the message has ${bytes.length - 8}`);
  let head: unknown;
  try {
    head = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(8, 8 + jsonLength)));
  } catch (err) {
    throw bad(`its head is not JSON: ${(err as Error).message}`);
  }
  if (typeof head !== 'object' || head === null || Array.isArray(head)) throw bad('its head is not a JSON object');
  const h = head as Record<string, unknown>;
  const start = pad8(8 + jsonLength);
  const att = h.att;
  if (!Array.isArray(att) || att.length > MAX_ATTACHMENTS) throw bad('its attachment list is missing or too long');
  const blobs = att.map((a, i) => {
    const { offset, bytes: n } = (a ?? {}) as Partial<Attachment>;
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(n) || offset! < 0 || n! < 0 || start + offset! + n! > bytes.length)
      throw bad(`attachment ${i} is outside the message`);
    return bytes.subarray(start + offset!, start + offset! + n!);
  });
  return {
    head: h,
    value: (key, rrefs, from, onTensor) => decodeValue(h[key], key, 0, { blobs, rrefs, from, onTensor, tensors: 0 }),
  };
}

interface DecodeState {
  blobs: Uint8Array[];
  rrefs: RRefCodec<unknown>;
  from: number;
  onTensor: ((t: tf.Tensor, index: number) => tf.Tensor) | undefined;
  /** Tensors decoded so far (their index in the message). */
  tensors: number;
}

function decodeValue(v: unknown, path: string, depth: number, s: DecodeState): unknown {
  if (depth > MAX_DEPTH) throw new RpcSerializationError(`nested deeper than ${MAX_DEPTH} levels`, path);
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map((x, i) => decodeValue(x, `${path}[${i}]`, depth + 1, s));
  const o = v as Record<string, unknown>;
  if ('$t' in o) {
    const t = decodeTensor(o, path, s);
    const index = s.tensors++;
    return s.onTensor ? s.onTensor(t, index) : t;
  }
  if ('$a' in o) return decodeArray(o, path, s);
  if ('$r' in o) return s.rrefs.fromWire(checkRRef(o.$r, path), s.from);
  if ('$n' in o) {
    if (o.$n !== 'NaN' && o.$n !== 'Infinity' && o.$n !== '-Infinity')
      throw new RpcSerializationError(`"${String(o.$n)}" is not a number`, path);
    return Number(o.$n);
  }
  if ('$u' in o) return undefined;
  const inner = '$o' in o ? o.$o : o;
  if (typeof inner !== 'object' || inner === null || Array.isArray(inner))
    throw new RpcSerializationError('a wrapped object is not an object', path);
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(inner)) {
    // Never a key that would reach a prototype.
    if (k === '__proto__') throw new RpcSerializationError('the key "__proto__" is refused', path);
    out[k] = decodeValue(x, `${path}.${k}`, depth + 1, s);
  }
  return out;
}

function blobOf(index: unknown, path: string, s: DecodeState): Uint8Array {
  if (!Number.isInteger(index) || (index as number) < 0 || (index as number) >= s.blobs.length)
    throw new RpcSerializationError(`attachment ${String(index)} does not exist`, path);
  return s.blobs[index as number]!;
}

function decodeTensor(o: Record<string, unknown>, path: string, s: DecodeState): tf.Tensor {
  const blob = blobOf(o.$t, path, s);
  const dtype = o.dtype as TensorDtype;
  if (!TENSOR_DTYPES.includes(dtype))
    throw new RpcSerializationError(`tensor dtype "${String(o.dtype)}" is not float32, int32 or bool`, path);
  const shape = o.shape;
  if (!Array.isArray(shape) || shape.length > 8 || !shape.every((d) => Number.isSafeInteger(d) && d >= 0))
    throw new RpcSerializationError('a tensor shape is a list of at most 8 sizes >= 0', path);
  const size = shape.reduce((a: number, d: number) => a * d, 1);
  const width = dtype === 'bool' ? 1 : 4;
  if (size * width !== blob.length)
    throw new RpcSerializationError(
      `a ${dtype} tensor of shape [${shape.join(', ')}] needs ${size * width} bytes, got ${blob.length}`,
      path,
    );
  const copy = blob.slice();
  const values = dtype === 'float32' ? new Float32Array(copy.buffer) : dtype === 'int32' ? new Int32Array(copy.buffer) : copy;
  return tf.tensor(values, shape as number[], dtype);
}

function decodeArray(o: Record<string, unknown>, path: string, s: DecodeState): Float32Array | Int32Array | Uint8Array {
  const blob = blobOf(o.$a, path, s);
  const kind = o.kind as ArrayKind;
  if (!ARRAY_KINDS.includes(kind)) throw new RpcSerializationError(`array kind "${String(o.kind)}" is not f32, i32 or u8`, path);
  const copy = blob.slice();
  if (kind === 'u8') return copy;
  if (copy.length % 4 !== 0) throw new RpcSerializationError(`a ${kind} array of ${copy.length} bytes is not whole elements`, path);
  return kind === 'f32' ? new Float32Array(copy.buffer) : new Int32Array(copy.buffer);
}

function checkRRef(r: unknown, path: string): WireRRef {
  const o = (r ?? {}) as Partial<WireRRef>;
  if (
    !Number.isInteger(o.owner) ||
    (o.owner as number) < 0 ||
    typeof o.id !== 'string' ||
    typeof o.fork !== 'string' ||
    o.id.length > 64 ||
    o.fork.length > 64
  )
    throw new RpcSerializationError('an RRef reference needs an owner rank, an id and a fork', path);
  return { owner: o.owner as number, id: o.id, fork: o.fork };
}
