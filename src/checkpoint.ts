/**
 * Checkpoints, as torchrun's save_checkpoint/load_checkpoint: the model (TF.js artifacts), the
 * optimizer state and free-form metadata in one binary container, kept on the server's disk.
 * Runs in browsers and in Node (no node: imports, no Buffer).
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
import { DistTimeoutError } from './errors.ts';
import { SESSION_NAME } from './protocol.ts';

export interface WeightSpec {
  name: string;
  shape: number[];
  dtype: string;
}

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

/** A checkpoint request failed: the server refused it, or it could not be reached. */
export class CheckpointError extends Error {
  override name = 'CheckpointError';
  constructor(
    message: string,
    readonly session: string,
    readonly url: string,
    /** The HTTP status; undefined when no response arrived. */
    readonly status?: number,
  ) {
    super(message);
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
    throw new CheckpointCorruptError('bad-version', `unsupported format version ${version}; this build reads version ${CHECKPOINT_VERSION}`);
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
  for (const [where, specs] of [['model', model.weightSpecs], ['optimizer', optimizer.weightSpecs]] as const) {
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
  for (const [where, data] of [['model', modelData], ['optimizer', c.optimizer.weightData]] as const) {
    // A TF.js WeightData may be ArrayBuffer[]; new Uint8Array() of that would silently give zeros.
    if (!isArrayBuffer(data)) throw new TypeError(`checkpoint ${where}.weightData must be one ArrayBuffer (join a list with tf.io.CompositeArrayBuffer.join)`);
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
// The client

export interface CheckpointRequestOptions {
  /** Default: the global fetch. */
  fetch?: typeof fetch;
  signal?: AbortSignal;
  /** How long the whole request (upload or download included) may take. Default 60 s. */
  timeoutMs?: number;
}

export interface LoadCheckpointOptions extends CheckpointRequestOptions {
  /** Load this checkpoint (a name from listCheckpoints) instead of the newest valid one. */
  name?: string;
}

export interface CheckpointInfo {
  name: string;
  bytes: number;
  /** meta.step of the checkpoint, or null when it had none. */
  step: number | null;
  /** When the file was written, ISO 8601. */
  mtime: string;
}

export interface LoadedCheckpoint {
  checkpoint: Checkpoint;
  name: string;
  /** Newer checkpoints the server passed over because they failed verification, newest first. */
  skipped: Array<{ name: string; reason: string }>;
}

export const DEFAULT_CHECKPOINT_TIMEOUT_MS = 60_000;

/** Uploads a checkpoint; the server verifies it, stores it atomically and keeps the last few. */
export async function saveCheckpoint(
  serverUrl: string,
  session: string,
  checkpoint: Checkpoint,
  options: CheckpointRequestOptions = {},
): Promise<{ name: string; bytes: number }> {
  const url = checkpointUrl(serverUrl, session);
  const body = await encodeCheckpoint(checkpoint);
  const res = await request('POST', url, session, 'saving a checkpoint', options, body);
  const reply = parseJson(res, url, session, 'saving a checkpoint');
  if (!isObject(reply) || typeof reply.name !== 'string' || typeof reply.bytes !== 'number') {
    throw new CheckpointError(`saving a checkpoint for session "${session}": the server's reply has no name and bytes (POST ${url})`, session, url, res.status);
  }
  return { name: reply.name, bytes: reply.bytes };
}

/**
 * Downloads the newest checkpoint of the session that verifies (or `options.name`), or null
 * when the session has none. `skipped` names newer checkpoints that were corrupt, and why.
 * When the session has checkpoints but none verifies, throws CheckpointError (HTTP 409) listing
 * them rather than returning null: a job that started afresh would soon prune them.
 */
export async function loadCheckpoint(
  serverUrl: string,
  session: string,
  options: LoadCheckpointOptions = {},
): Promise<LoadedCheckpoint | null> {
  const named = options.name;
  if (named !== undefined && (!/^[A-Za-z0-9_.-]{1,128}$/.test(named) || named === '.' || named === '..')) {
    throw new TypeError(`checkpoint name ${JSON.stringify(named)} is not valid (use a name from listCheckpoints)`);
  }
  const url = checkpointUrl(serverUrl, session, named ?? 'latest');
  const action = named === undefined ? 'loading the latest checkpoint' : `loading checkpoint ${named}`;
  const res = await request('GET', url, session, action, { ...options, noneIs404: named === undefined });
  if (res.status === 404) return null;
  const name = res.headers.get('x-checkpoint-name') ?? named ?? 'latest';
  const checkpoint = await decodeCheckpoint(res.body, name);
  return { checkpoint, name, skipped: parseSkipped(res.headers.get('x-checkpoint-skipped')) };
}

/** The session's checkpoints, oldest first. Empty when it has none. */
export async function listCheckpoints(serverUrl: string, session: string, options: CheckpointRequestOptions = {}): Promise<CheckpointInfo[]> {
  const url = checkpointUrl(serverUrl, session);
  const res = await request('GET', url, session, 'listing checkpoints', options);
  const reply = parseJson(res, url, session, 'listing checkpoints');
  if (!isObject(reply) || !Array.isArray(reply.checkpoints)) {
    throw new CheckpointError(`listing checkpoints for session "${session}": the server's reply has no checkpoint list (GET ${url})`, session, url, res.status);
  }
  return reply.checkpoints as CheckpointInfo[];
}

/** `http://host:port/` (or ws://, as given to the store) -> `http://host:port/api/checkpoints/<session>[/<tail>]`. */
function checkpointUrl(serverUrl: string, session: string, tail?: string): string {
  if (!SESSION_NAME.test(session) || session === '.' || session === '..') {
    throw new TypeError(`session name ${JSON.stringify(session)} is not allowed: use 1-64 of A-Z a-z 0-9 _ . -`);
  }
  const u = new URL(serverUrl);
  if (u.protocol === 'ws:') u.protocol = 'http:';
  else if (u.protocol === 'wss:') u.protocol = 'https:';
  else if (u.protocol !== 'http:' && u.protocol !== 'https:') {
    throw new TypeError(`server URL must be http(s):// or ws(s)://, got ${serverUrl}`);
  }
  u.pathname = `/api/checkpoints/${session}${tail === undefined ? '' : `/${tail}`}`;
  u.search = '';
  u.hash = '';
  return u.toString();
}

interface Fetched {
  status: number;
  headers: Headers;
  body: Uint8Array<ArrayBuffer>;
}

/**
 * One request with a deadline covering the body too. Non-2xx answers become CheckpointError
 * naming the session, the status and the server's message (except a "no checkpoint" 404 when
 * `noneIs404`, which the caller turns into null).
 */
async function request(
  method: 'GET' | 'POST',
  url: string,
  session: string,
  action: string,
  options: CheckpointRequestOptions & { noneIs404?: boolean },
  body?: Uint8Array<ArrayBuffer>,
): Promise<Fetched> {
  const timeoutMs = options.timeoutMs ?? DEFAULT_CHECKPOINT_TIMEOUT_MS;
  // Wrapped so the global fetch is never called with a foreign `this` (browsers throw "Illegal invocation").
  const fetchImpl = options.fetch ?? ((input: RequestInfo | URL, init?: RequestInit) => globalThis.fetch(input, init));
  const userSignal = options.signal;
  userSignal?.throwIfAborted();
  const controller = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort();
  }, timeoutMs);
  const onUserAbort = () => controller.abort(userSignal?.reason);
  userSignal?.addEventListener('abort', onUserAbort, { once: true });
  try {
    let status: number;
    let headers: Headers;
    let bytes: Uint8Array<ArrayBuffer>;
    try {
      const init: RequestInit = { method, signal: controller.signal };
      if (body) {
        init.body = body;
        init.headers = { 'content-type': 'application/octet-stream' };
      }
      const response = await fetchImpl(url, init);
      status = response.status;
      headers = response.headers;
      bytes = new Uint8Array(await response.arrayBuffer());
    } catch (err) {
      if (timedOut) throw new DistTimeoutError(`${method} ${url} (${action} for session "${session}")`, timeoutMs);
      if (userSignal?.aborted) throw userSignal.reason;
      const why = err instanceof Error ? (err.cause instanceof Error ? `${err.message}: ${err.cause.message}` : err.message) : String(err);
      throw new CheckpointError(`${action} for session "${session}" failed: could not reach the server: ${why} (${method} ${url})`, session, url);
    }
    if (status >= 200 && status < 300) return { status, headers, body: bytes };
    const { code, message } = serverError(bytes);
    if (status === 404 && options.noneIs404 && code === 'no-checkpoint') return { status, headers, body: bytes };
    throw new CheckpointError(`${action} for session "${session}" failed: HTTP ${status}: ${message} (${method} ${url})`, session, url, status);
  } finally {
    clearTimeout(timer);
    userSignal?.removeEventListener('abort', onUserAbort);
  }
}

/** The server answers errors as JSON {error, message}; anything else (a proxy's page) is shown as text. */
function serverError(body: Uint8Array): { code?: string; message: string } {
  const text = new TextDecoder().decode(body);
  try {
    const parsed: unknown = JSON.parse(text);
    if (isObject(parsed) && typeof parsed.message === 'string') {
      return { code: typeof parsed.error === 'string' ? parsed.error : undefined, message: parsed.message };
    }
  } catch {
    // not JSON: fall through
  }
  const trimmed = text.trim();
  return { message: trimmed.length === 0 ? '(no message)' : trimmed.length > 300 ? `${trimmed.slice(0, 300)}...` : trimmed };
}

function parseJson(res: Fetched, url: string, session: string, action: string): unknown {
  try {
    return JSON.parse(new TextDecoder().decode(res.body));
  } catch {
    throw new CheckpointError(`${action} for session "${session}": the server's reply is not JSON (${url})`, session, url, res.status);
  }
}

function parseSkipped(header: string | null): Array<{ name: string; reason: string }> {
  if (!header) return [];
  try {
    const parsed: unknown = JSON.parse(header);
    if (Array.isArray(parsed)) {
      return parsed.filter((s): s is { name: string; reason: string } => isObject(s) && typeof s.name === 'string' && typeof s.reason === 'string');
    }
  } catch {
    // A garbled report must not lose a good checkpoint.
  }
  return [];
}

// ---------------------------------------------------------------------------------------------
// Helpers

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

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
 * SHA-256. crypto.subtle exists only in secure contexts, so a page served over plain http from
 * another machine (HOST=0.0.0.0 on a LAN) falls back to the implementation below.
 */
export async function sha256(data: Uint8Array<ArrayBuffer>): Promise<Uint8Array> {
  const subtle = globalThis.crypto?.subtle;
  if (subtle) return new Uint8Array(await subtle.digest('SHA-256', data));
  return sha256Js(data);
}

// prettier-ignore
const K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);

/** Plain-JS SHA-256 (FIPS 180-4), for contexts without crypto.subtle. */
export function sha256Js(data: Uint8Array): Uint8Array {
  const h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
  const w = new Uint32Array(64);
  const rotr = (x: number, n: number) => (x >>> n) | (x << (32 - n));
  const block = (b: Uint8Array, o: number) => {
    for (let t = 0; t < 16; t++) w[t] = (b[o + 4 * t] << 24) | (b[o + 4 * t + 1] << 16) | (b[o + 4 * t + 2] << 8) | b[o + 4 * t + 3];
    for (let t = 16; t < 64; t++) {
      const s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >>> 3);
      const s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >>> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    let [a, b2, c, d, e, f, g, hh] = h;
    for (let t = 0; t < 64; t++) {
      const t1 = (hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t]) | 0;
      const t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b2) ^ (a & c) ^ (b2 & c))) | 0;
      hh = g;
      g = f;
      f = e;
      e = (d + t1) | 0;
      d = c;
      c = b2;
      b2 = a;
      a = (t1 + t2) | 0;
    }
    h[0] += a;
    h[1] += b2;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
  };
  const full = data.length - (data.length % 64);
  for (let o = 0; o < full; o += 64) block(data, o);
  // The last one or two blocks: the remainder, 0x80, zeros, the bit length as a big-endian u64.
  const rest = data.length - full;
  const tail = new Uint8Array(rest + 9 <= 64 ? 64 : 128);
  tail.set(data.subarray(full));
  tail[rest] = 0x80;
  const bits = data.length * 8;
  const tv = new DataView(tail.buffer);
  tv.setUint32(tail.length - 8, Math.floor(bits / 2 ** 32));
  tv.setUint32(tail.length - 4, bits >>> 0);
  for (let o = 0; o < tail.length; o += 64) block(tail, o);
  const out = new Uint8Array(32);
  const ov = new DataView(out.buffer);
  h.forEach((v, i) => ov.setUint32(4 * i, v));
  return out;
}
