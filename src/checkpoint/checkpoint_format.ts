/**
 * The checkpoint container: the model (TF.js artifacts), the optimizer state and free-form
 * metadata in one binary file, checked by a SHA-256 over everything. The server (streaming from
 * disk) and the clients read it; `checkpoint.ts` saves and loads it over HTTP. Runs in browsers
 * and in Node (no node: imports, no Buffer).
 *
 * The container (all integers little-endian):
 *
 *   0   8 bytes  magic "BDDPCKPT"
 *   8   u32      format version (1)
 *   12  u32      H: header bytes (UTF-8 JSON: meta, model without weightData, optimizer specs)
 *   16  u64      M: model weight bytes
 *   24  u64      O: optimizer weight bytes
 *   32  H bytes  header
 *       M bytes  model weightData
 *       O bytes  optimizer weightData
 *       32 bytes SHA-256 of every byte before it
 *
 * The section lengths sit in the fixed preamble rather than in the JSON so that a reader (the
 * server, streaming from disk) can tell a truncated file from the first 32 bytes and its size.
 */
import { isObject, type WeightSpec } from '../wire/tfjs_artifacts.ts';

// The weight format and topology reading are the wire's (datasets and nn read them too); importable from here as before.
export { isObject, topologyLayers, type LayerJson, type WeightSpec } from '../wire/tfjs_artifacts.ts';

export interface Checkpoint {
  /** JSON-serialisable metadata: step, epoch, sampler position, the job's configuration, generation ... (free-form but an object). */
  meta: Record<string, unknown>;
  /**
   * The model in TF.js format: what `model.save(tf.io.withSaveHandler(...))` gives: modelTopology
   * (object), weightSpecs, weightData (ArrayBuffer). Other JSON fields of the artifacts
   * (format, trainingConfig, ...) are kept too when present.
   */
  model: { modelTopology: unknown; weightSpecs: WeightSpec[]; weightData: ArrayBuffer };
  /** Optimizer state: named tensors as specs + data (same shape as weightSpecs/weightData). */
  optimizer: { weightSpecs: WeightSpec[]; weightData: ArrayBuffer };
}

export const CHECKPOINT_MAGIC = 'BDDPCKPT';
export const CHECKPOINT_VERSION = 1;
/** Magic, version and the three section lengths. */
export const PREAMBLE_BYTES = 32;
export const CHECKSUM_BYTES = 32;

/**
 * A checkpoint part's name: one share of a run's state that is saved, kept and loaded apart from
 * the others (a pipeline stage's, `?part=` on the server's routes). Lower case so that two parts
 * never share a folder on a case-insensitive disk.
 */
export const CHECKPOINT_PART = /^[a-z0-9][a-z0-9-]{0,31}$/;
/** CHECKPOINT_PART in words, for refusals. */
export const CHECKPOINT_PART_RULE = '1-32 characters of a-z 0-9 and "-", the first a letter or digit';

const MAGIC_BYTES = new TextEncoder().encode(CHECKPOINT_MAGIC);

export type CorruptKind = 'truncated' | 'trailing-data' | 'bad-magic' | 'bad-version' | 'checksum' | 'header';

/** A container failed verification. `reason` says what was wrong, without the file's name. */
export class CheckpointCorruptError extends Error {
  override name = 'CheckpointCorruptError';
  constructor(
    readonly kind: CorruptKind,
    readonly reason: string,
    /** Which checkpoint, when known. */
    readonly checkpoint?: string,
  ) {
    super(checkpoint === undefined ? `corrupt checkpoint: ${reason}` : `checkpoint ${checkpoint} is corrupt: ${reason}`);
  }
}

// ---------------------------------------------------------------------------------------------
// The container

/** The sections' sizes, read from the preamble. */
export interface ContainerLayout {
  headerBytes: number;
  modelBytes: number;
  optimizerBytes: number;
  /** Bytes of the whole container, checksum included. */
  total: number;
}

/** What the JSON header holds: the checkpoint without its binary sections. */
export interface CheckpointHeader {
  meta: Record<string, unknown>;
  model: { modelTopology: unknown; weightSpecs: WeightSpec[] } & Record<string, unknown>;
  optimizer: { weightSpecs: WeightSpec[] };
}

/**
 * Checks the preamble against the container's real size. `head` is the first bytes (up to
 * PREAMBLE_BYTES), `available` how many bytes the container really has. Throws
 * CheckpointCorruptError for bad magic, an unknown version, truncation or trailing bytes.
 */
export function readPreamble(head: Uint8Array, available: number): ContainerLayout {
  const magicSeen = head.subarray(0, MAGIC_BYTES.length);
  if (magicSeen.some((b, i) => b !== MAGIC_BYTES[i])) {
    const hex = [...magicSeen].map((b) => b.toString(16).padStart(2, '0')).join(' ');
    throw new CheckpointCorruptError('bad-magic', `bad magic: expected "${CHECKPOINT_MAGIC}", found bytes ${hex}`);
  }
  if (head.length < PREAMBLE_BYTES || available < PREAMBLE_BYTES) {
    const minimum = PREAMBLE_BYTES + CHECKSUM_BYTES;
    throw new CheckpointCorruptError('truncated', `truncated: expected at least ${minimum} bytes, got ${available}`);
  }
  const view = new DataView(head.buffer, head.byteOffset, PREAMBLE_BYTES);
  const version = view.getUint32(8, true);
  if (version !== CHECKPOINT_VERSION) {
    throw new CheckpointCorruptError(
      'bad-version',
      `unsupported format version ${version}; this build reads version ${CHECKPOINT_VERSION}`,
    );
  }
  const headerBytes = view.getUint32(12, true);
  const modelBytes = Number(view.getBigUint64(16, true));
  const optimizerBytes = Number(view.getBigUint64(24, true));
  const total = PREAMBLE_BYTES + headerBytes + modelBytes + optimizerBytes + CHECKSUM_BYTES;
  if (!Number.isSafeInteger(total)) {
    throw new CheckpointCorruptError('header', `unreadable header: section lengths add up to an impossible ${total} bytes`);
  }
  if (available < total) {
    throw new CheckpointCorruptError('truncated', `truncated: expected ${total} bytes, got ${available}`);
  }
  if (available > total) {
    throw new CheckpointCorruptError('trailing-data', `trailing data: expected ${total} bytes, got ${available}`);
  }
  return { headerBytes, modelBytes, optimizerBytes, total };
}

export function checksumMismatch(): CheckpointCorruptError {
  return new CheckpointCorruptError('checksum', 'checksum mismatch: the SHA-256 stored in the file does not match its contents');
}

/** Parses and checks the JSON header. Throws CheckpointCorruptError('header') when it is unreadable. */
export function parseHeader(bytes: Uint8Array): CheckpointHeader {
  const bad = (what: string) => new CheckpointCorruptError('header', `unreadable header: ${what}`);
  let raw: unknown;
  try {
    raw = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
  } catch (err) {
    throw bad(err instanceof Error ? err.message : String(err));
  }
  if (!isObject(raw)) throw bad('not a JSON object');
  const { meta, model, optimizer } = raw;
  if (!isObject(meta)) throw bad('"meta" is not an object');
  if (!isObject(model) || !('modelTopology' in model)) throw bad('"model" has no modelTopology');
  if (!isObject(optimizer)) throw bad('"optimizer" is not an object');
  for (const [where, specs] of [
    ['model', model.weightSpecs],
    ['optimizer', optimizer.weightSpecs],
  ] as const) {
    if (!Array.isArray(specs) || !specs.every(isWeightSpec)) throw bad(`"${where}.weightSpecs" is not a list of {name, shape, dtype}`);
  }
  return raw as unknown as CheckpointHeader;
}

/** Serialises a checkpoint into one container. */
export async function encodeCheckpoint(c: Checkpoint): Promise<Uint8Array<ArrayBuffer>> {
  if (!isObject(c.meta)) throw new TypeError('checkpoint meta must be a plain object');
  const { weightData: modelData, ...modelJson } = c.model;
  if (isArrayBuffer(modelJson.modelTopology) || ArrayBuffer.isView(modelJson.modelTopology)) {
    throw new TypeError('checkpoint model.modelTopology must be a JSON object (binary GraphDef topologies are not supported)');
  }
  let headerText: string;
  try {
    headerText = JSON.stringify({ meta: c.meta, model: modelJson, optimizer: { weightSpecs: c.optimizer.weightSpecs } });
  } catch (err) {
    throw new TypeError(`checkpoint meta or model topology is not JSON-serialisable: ${err instanceof Error ? err.message : String(err)}`);
  }
  for (const [where, data] of [
    ['model', modelData],
    ['optimizer', c.optimizer.weightData],
  ] as const) {
    // A TF.js WeightData may be ArrayBuffer[]; new Uint8Array() of that would silently give zeros.
    if (!isArrayBuffer(data))
      throw new TypeError(`checkpoint ${where}.weightData must be one ArrayBuffer (join a list with tf.io.CompositeArrayBuffer.join)`);
  }
  const header = new TextEncoder().encode(headerText);
  const model = new Uint8Array(modelData);
  const optimizer = new Uint8Array(c.optimizer.weightData);
  const total = PREAMBLE_BYTES + header.length + model.length + optimizer.length + CHECKSUM_BYTES;

  const out = new Uint8Array(total);
  const view = new DataView(out.buffer);
  out.set(MAGIC_BYTES, 0);
  view.setUint32(8, CHECKPOINT_VERSION, true);
  view.setUint32(12, header.length, true);
  view.setBigUint64(16, BigInt(model.length), true);
  view.setBigUint64(24, BigInt(optimizer.length), true);
  let at = PREAMBLE_BYTES;
  for (const section of [header, model, optimizer]) {
    out.set(section, at);
    at += section.length;
  }
  out.set(await sha256(out.subarray(0, at)), at);
  return out;
}

/**
 * Reads a container back. Throws CheckpointCorruptError when it is truncated, has trailing bytes,
 * bad magic, an unknown version, a checksum mismatch or an unreadable header. `name`, when
 * given, is put in the error message.
 */
export async function decodeCheckpoint(data: Uint8Array | ArrayBuffer, name?: string): Promise<Checkpoint> {
  const bytes = ownBytes(data);
  try {
    const layout = readPreamble(bytes.subarray(0, PREAMBLE_BYTES), bytes.length);
    const bodyEnd = layout.total - CHECKSUM_BYTES;
    const digest = await sha256(bytes.subarray(0, bodyEnd));
    const stored = bytes.subarray(bodyEnd);
    if (digest.some((b, i) => b !== stored[i])) throw checksumMismatch();
    const headerEnd = PREAMBLE_BYTES + layout.headerBytes;
    const header = parseHeader(bytes.subarray(PREAMBLE_BYTES, headerEnd));
    const modelEnd = headerEnd + layout.modelBytes;
    // Copies, so that each weightData is an ArrayBuffer of exactly its section (what TF.js expects).
    return {
      meta: header.meta,
      model: { ...header.model, weightData: bytes.slice(headerEnd, modelEnd).buffer },
      optimizer: { weightSpecs: header.optimizer.weightSpecs, weightData: bytes.slice(modelEnd, bodyEnd).buffer },
    };
  } catch (err) {
    if (err instanceof CheckpointCorruptError && name !== undefined && err.checkpoint === undefined) {
      throw new CheckpointCorruptError(err.kind, err.reason, name);
    }
    throw err;
  }
}

// ---------------------------------------------------------------------------------------------
// Helpers

function isWeightSpec(v: unknown): v is WeightSpec {
  return (
    isObject(v) &&
    typeof v.name === 'string' &&
    typeof v.dtype === 'string' &&
    Array.isArray(v.shape) &&
    v.shape.every((d) => Number.isSafeInteger(d) && (d as number) >= 0)
  );
}

/** A Uint8Array over a plain ArrayBuffer (what crypto.subtle accepts), copying only when needed. */
function ownBytes(data: Uint8Array | ArrayBuffer): Uint8Array<ArrayBuffer> {
  if (isArrayBuffer(data)) return new Uint8Array(data);
  if (isArrayBuffer(data.buffer)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  return new Uint8Array(data);
}

/** By tag rather than instanceof, so buffers from another realm (a worker, a test environment) count. */
function isArrayBuffer(v: unknown): v is ArrayBuffer {
  return Object.prototype.toString.call(v) === '[object ArrayBuffer]';
}

/**
 * SHA-256 from the platform (crypto.subtle, in browsers and in Node). Browsers offer it only to
 * secure pages (https or localhost); elsewhere checkpoints cannot be verified, and saying so is
 * better than trusting an unchecked file.
 */
export async function sha256(data: Uint8Array<ArrayBuffer>): Promise<Uint8Array> {
  const subtle = globalThis.crypto?.subtle;
  if (!subtle) {
    throw new Error(
      'checkpoints need SHA-256 from crypto.subtle, which browsers offer only to secure pages: open the page over https or on localhost',
    );
  }
  return new Uint8Array(await subtle.digest('SHA-256', data));
}
