/**
 * The wire protocol between the signaling server (the rank-0 store) and its clients.
 *
 * Like TCPStore's shared `QueryType` enum, this one module is imported by both ends: every
 * message type, its fields, its result and its validation live here, and both ends switch on
 * the type exhaustively. Messages are JSON text frames; store values travel as base64 so that
 * arbitrary bytes survive. Tensors never travel here: they go peer to peer.
 */

export const PROTOCOL_VERSION = 1;

/** Limits the server enforces; each is a named option of `startServer` with these defaults. */
export const DEFAULT_LIMITS = {
  /** Largest WebSocket frame accepted; a larger one closes the socket with 1009. */
  maxFrameBytes: 1 << 20,
  /** Most keys one session may hold. */
  maxKeysPerSession: 10_000,
  /** Most bytes (keys + values) one session may hold. */
  maxBytesPerSession: 64 << 20,
  /** Longest key, in characters. */
  maxKeyLength: 512,
  /** Most keys named in one request (wait, check, multiGet, multiSet). */
  maxKeysPerRequest: 1_000,
  /** Most protocol errors a socket may cause before it is closed as abusive. */
  maxErrorsPerSocket: 100,
  /** Longest a blocking store call may wait on the server. */
  maxTimeoutMs: 3_600_000,
} as const;

export type Limits = { -readonly [K in keyof typeof DEFAULT_LIMITS]: number };

/** Default timeout of blocking store calls, as in torch's Store (300 s). */
export const DEFAULT_STORE_TIMEOUT_MS = 300_000;

/** Session names: short, URL-safe. */
export const SESSION_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

/**
 * Refusal codes. Each is a stable value a client can match on; the message beside it says
 * what was wrong for a person.
 */
export const ErrorCode = {
  /** The frame was not valid JSON. */
  BAD_JSON: 'BAD_JSON',
  /** The message lacked a field or a field had the wrong type or range. */
  BAD_MESSAGE: 'BAD_MESSAGE',
  /** The message type is not one this server knows. */
  UNKNOWN_TYPE: 'UNKNOWN_TYPE',
  /** A request came before `hello` chose a session. */
  NO_SESSION: 'NO_SESSION',
  /** A second `hello` on one socket. */
  ALREADY_IN_SESSION: 'ALREADY_IN_SESSION',
  /** The session name is not allowed. */
  BAD_SESSION: 'BAD_SESSION',
  /** The client speaks another protocol version. */
  BAD_VERSION: 'BAD_VERSION',
  /** A blocking store call waited its whole timeout. */
  TIMEOUT: 'TIMEOUT',
  /** `add` on a key whose value is not an integer. */
  NOT_AN_INTEGER: 'NOT_AN_INTEGER',
  /** The session holds too many keys. */
  QUOTA_KEYS: 'QUOTA_KEYS',
  /** The session holds too many bytes. */
  QUOTA_BYTES: 'QUOTA_BYTES',
  /** `join` with a world size other than the session's. */
  WORLD_SIZE_MISMATCH: 'WORLD_SIZE_MISMATCH',
  /** `join` with a rank outside 0..worldSize-1. */
  RANK_OUT_OF_RANGE: 'RANK_OUT_OF_RANGE',
  /** `join` with a rank another member holds. */
  DUPLICATE_RANK: 'DUPLICATE_RANK',
  /** `join` to a session that already has worldSize members. */
  SESSION_FULL: 'SESSION_FULL',
  /** A second `join` on one socket. */
  ALREADY_JOINED: 'ALREADY_JOINED',
  /** `signal` before `join`. */
  NOT_JOINED: 'NOT_JOINED',
  /** `signal` to a rank that is not a member of the session. */
  UNKNOWN_PEER: 'UNKNOWN_PEER',
  /** `rendezvous` with min/max other than the session's, or on a session of fixed size. */
  ELASTIC_MISMATCH: 'ELASTIC_MISMATCH',
} as const;
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

/** WebSocket close codes the server uses (4000-4999 are for applications). */
export const CloseCode = {
  /** ws's own code for a frame over `maxFrameBytes`. */
  MESSAGE_TOO_BIG: 1009,
  /** The socket sent more than `maxErrorsPerSocket` bad messages. */
  TOO_MANY_ERRORS: 4001,
  /** The server is shutting down. */
  SERVER_CLOSING: 4002,
  /** An elastic member sent nothing for longer than the heartbeat timeout (a frozen tab). */
  EVICTED: 4003,
} as const;

// ---------------------------------------------------------------------------------------------
// Client -> server requests. Every request carries a numeric `id`; its reply echoes the id.

/** Base64 text of a store value. */
export type WireValue = string;

export interface RequestFields {
  hello: { session: string; version: number };
  set: { key: string; value: WireValue };
  get: { key: string; timeoutMs: number };
  add: { key: string; amount: number };
  compareSet: { key: string; expected: WireValue; desired: WireValue };
  wait: { keys: string[]; timeoutMs: number };
  check: { keys: string[] };
  deleteKey: { key: string };
  // eslint-disable-next-line @typescript-eslint/no-empty-object-type
  numKeys: {};
  append: { key: string; value: WireValue };
  multiGet: { keys: string[]; timeoutMs: number };
  multiSet: { keys: string[]; values: WireValue[] };
  /** Rendezvous: become a member of the session's group. */
  join: { worldSize: number; rank?: number };
  /** Relay an opaque WebRTC signaling payload to another member, addressed by rank. */
  signal: { to: number; data: SignalPayload };
  /**
   * Elastic rendezvous (torchrun's --nnodes MIN:MAX): become a member of a group whose size may
   * change. The server forms generations of the group and sends each member its rank in them.
   */
  rendezvous: { min: number; max: number };
  /** An elastic member is alive (any frame counts; this one exists for idle members). */
  heartbeat: {};
  /** Ask for a new generation (to admit waiting members) unless one newer than `fromGen` exists. */
  regroup: { fromGen: number };
}

/** What each request resolves to. */
export interface ResultOf {
  /** `instance` changes when the server restarts: link names include it, so old links never match. */
  hello: { session: string; instance: string };
  set: null;
  get: WireValue;
  add: number;
  compareSet: WireValue;
  wait: null;
  check: boolean;
  deleteKey: boolean;
  numKeys: number;
  append: null;
  multiGet: WireValue[];
  multiSet: null;
  join: { rank: number; worldSize: number };
  signal: null;
  rendezvous: { memberId: number };
  heartbeat: null;
  regroup: { gen: number };
}

export type RequestType = keyof RequestFields;
export type Request<T extends RequestType = RequestType> = T extends RequestType
  ? { type: T; id: number } & RequestFields[T]
  : never;

/** A signaling payload: opaque to the server, small, JSON. */
export interface SignalPayload {
  /** Which link this belongs to; lets a later group generation ignore an old one's signals. */
  channel: string;
  body: unknown;
}

// ---------------------------------------------------------------------------------------------
// Server -> client messages.

export interface ReplyMessage {
  type: 'reply';
  id: number;
  result: ResultOf[RequestType];
}

export interface ErrorMessage {
  type: 'error';
  /** The request this answers; absent when the frame could not be parsed far enough. */
  id?: number;
  code: ErrorCode;
  message: string;
  /** Facts behind the error (the keys waited for, the ranks involved, ...). */
  details?: Record<string, unknown>;
}

/** Sent to every member when membership changes. */
export interface MembersEvent {
  type: 'members';
  worldSize: number;
  ranks: number[];
}

/** A relayed signaling payload from another member. */
export interface SignalEvent {
  type: 'signal';
  from: number;
  data: SignalPayload;
}

/** A member's socket closed. */
export interface PeerLeftEvent {
  type: 'peer-left';
  rank: number;
  /** Why, when the server knows more than "its socket closed" (e.g. evicted for silence). */
  reason?: string;
}

/**
 * A new generation of an elastic group. Each member gets its own copy with its rank; `rank` is -1
 * for a member left waiting (the group is at its maximum). `paused` generations have fewer than
 * the minimum members: nobody trains until more join.
 */
export interface GenerationEvent {
  type: 'generation';
  gen: number;
  rank: number;
  worldSize: number;
  /** Member ids in rank order. */
  members: number[];
  paused: boolean;
  min: number;
  max: number;
}

/** Members are waiting to join the running generation at the next step boundary. */
export interface JoinPendingEvent {
  type: 'join-pending';
  gen: number;
  waiting: number;
}

export type ServerMessage = ReplyMessage | ErrorMessage | MembersEvent | SignalEvent | PeerLeftEvent | GenerationEvent | JoinPendingEvent;

// ---------------------------------------------------------------------------------------------
// Validation.

export class ProtocolViolation extends Error {
  override name = 'ProtocolViolation';
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly id?: number,
  ) {
    super(message);
  }
}

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function fail(id: number | undefined, message: string): never {
  throw new ProtocolViolation(ErrorCode.BAD_MESSAGE, message, id);
}

function str(m: Obj, field: string, id: number, maxLength: number): string {
  const v = m[field];
  if (typeof v !== 'string') fail(id, `field "${field}" must be a string, got ${describe(v)}`);
  if (v.length > maxLength) fail(id, `field "${field}" is ${v.length} characters; the limit is ${maxLength}`);
  return v;
}

function key(m: Obj, field: string, id: number, limits: Limits): string {
  const k = str(m, field, id, limits.maxKeyLength);
  if (k.length === 0) fail(id, `field "${field}" must not be empty`);
  return k;
}

function int(m: Obj, field: string, id: number, min: number, max: number): number {
  const v = m[field];
  if (typeof v !== 'number' || !Number.isSafeInteger(v)) {
    fail(id, `field "${field}" must be an integer, got ${describe(v)}`);
  }
  if (v < min || v > max) fail(id, `field "${field}" is ${v}; allowed is ${min}..${max}`);
  return v;
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

function value(m: Obj, field: string, id: number): WireValue {
  const v = m[field];
  if (typeof v !== 'string' || v.length % 4 !== 0 || !BASE64.test(v)) {
    fail(id, `field "${field}" must be base64 text, got ${describe(v)}`);
  }
  return v;
}

function keyList(m: Obj, field: string, id: number, limits: Limits): string[] {
  const v = m[field];
  if (!Array.isArray(v)) fail(id, `field "${field}" must be an array of keys, got ${describe(v)}`);
  if (v.length > limits.maxKeysPerRequest) {
    fail(id, `field "${field}" names ${v.length} keys; the limit is ${limits.maxKeysPerRequest}`);
  }
  return v.map((_, i) => key(v as unknown as Obj, String(i), id, limits));
}

function describe(v: unknown): string {
  if (v === undefined) return 'nothing';
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  if (typeof v === 'string') return v.length > 40 ? `a ${v.length}-character string` : JSON.stringify(v);
  if (typeof v === 'number') return String(v);
  return `a ${typeof v}`;
}

/**
 * Parses and validates one client frame. Throws `ProtocolViolation` with the code and a message
 * that says what was wrong; the server turns that into an error reply.
 */
export function parseRequest(text: string, limits: Limits = DEFAULT_LIMITS): Request {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new ProtocolViolation(ErrorCode.BAD_JSON, 'the frame is not valid JSON');
  }
  if (!isObj(raw)) throw new ProtocolViolation(ErrorCode.BAD_MESSAGE, 'a message must be a JSON object');
  const idRaw = raw.id;
  if (typeof idRaw !== 'number' || !Number.isSafeInteger(idRaw) || idRaw < 0) {
    throw new ProtocolViolation(ErrorCode.BAD_MESSAGE, `field "id" must be a non-negative integer, got ${describe(idRaw)}`);
  }
  const id = idRaw;
  const type = raw.type;
  if (typeof type !== 'string') fail(id, `field "type" must be a string, got ${describe(type)}`);
  const t = type as RequestType;
  const timeout = () => int(raw, 'timeoutMs', id, 0, limits.maxTimeoutMs);
  switch (t) {
    case 'hello':
      return { type: t, id, session: str(raw, 'session', id, 64), version: int(raw, 'version', id, 0, 1e9) };
    case 'set':
      return { type: t, id, key: key(raw, 'key', id, limits), value: value(raw, 'value', id) };
    case 'get':
      return { type: t, id, key: key(raw, 'key', id, limits), timeoutMs: timeout() };
    case 'add':
      return {
        type: t,
        id,
        key: key(raw, 'key', id, limits),
        amount: int(raw, 'amount', id, Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER),
      };
    case 'compareSet':
      return {
        type: t,
        id,
        key: key(raw, 'key', id, limits),
        expected: value(raw, 'expected', id),
        desired: value(raw, 'desired', id),
      };
    case 'wait':
      return { type: t, id, keys: keyList(raw, 'keys', id, limits), timeoutMs: timeout() };
    case 'check':
      return { type: t, id, keys: keyList(raw, 'keys', id, limits) };
    case 'deleteKey':
      return { type: t, id, key: key(raw, 'key', id, limits) };
    case 'numKeys':
      return { type: t, id };
    case 'append':
      return { type: t, id, key: key(raw, 'key', id, limits), value: value(raw, 'value', id) };
    case 'multiGet':
      return { type: t, id, keys: keyList(raw, 'keys', id, limits), timeoutMs: timeout() };
    case 'multiSet': {
      const keys = keyList(raw, 'keys', id, limits);
      const vs = raw.values;
      if (!Array.isArray(vs)) fail(id, `field "values" must be an array, got ${describe(vs)}`);
      if (vs.length !== keys.length) fail(id, `multiSet has ${keys.length} keys but ${vs.length} values`);
      return { type: t, id, keys, values: vs.map((_, i) => value(vs as unknown as Obj, String(i), id)) };
    }
    case 'join': {
      const worldSize = int(raw, 'worldSize', id, 1, 4096);
      if (raw.rank === undefined) return { type: t, id, worldSize };
      return { type: t, id, worldSize, rank: int(raw, 'rank', id, Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER) };
    }
    case 'rendezvous': {
      const min = int(raw, 'min', id, 1, 4096);
      const max = int(raw, 'max', id, 1, 4096);
      if (max < min) fail(id, `field "max" (${max}) must be at least "min" (${min})`);
      return { type: t, id, min, max };
    }
    case 'heartbeat':
      return { type: t, id };
    case 'regroup':
      return { type: t, id, fromGen: int(raw, 'fromGen', id, 0, Number.MAX_SAFE_INTEGER) };
    case 'signal': {
      const to = int(raw, 'to', id, 0, 4095);
      const data = raw.data;
      if (!isObj(data) || typeof data.channel !== 'string' || data.channel.length > 128 || !('body' in data)) {
        fail(id, 'field "data" must be an object { channel: string, body }');
      }
      return { type: t, id, to, data: { channel: data.channel as string, body: data.body } };
    }
    default: {
      // Exhaustive: adding a request type without handling it here fails to compile.
      const unknown: never = t;
      throw new ProtocolViolation(ErrorCode.UNKNOWN_TYPE, `unknown message type ${describe(unknown)}`, id);
    }
  }
}

/** Parses a server frame on the client side. Throws on anything malformed. */
export function parseServerMessage(text: string): ServerMessage {
  const raw: unknown = JSON.parse(text);
  if (!isObj(raw) || typeof raw.type !== 'string') throw new Error('server sent a frame that is not a message');
  const t = raw.type as ServerMessage['type'];
  switch (t) {
    case 'reply':
      if (typeof raw.id !== 'number') throw new Error('server reply without id');
      return raw as unknown as ReplyMessage;
    case 'error':
      if (typeof raw.code !== 'string' || typeof raw.message !== 'string') throw new Error('server error without code');
      return raw as unknown as ErrorMessage;
    case 'members':
      if (!Array.isArray(raw.ranks) || typeof raw.worldSize !== 'number') throw new Error('bad members event');
      return raw as unknown as MembersEvent;
    case 'signal':
      if (typeof raw.from !== 'number' || !isObj(raw.data)) throw new Error('bad signal event');
      return raw as unknown as SignalEvent;
    case 'peer-left':
      if (typeof raw.rank !== 'number') throw new Error('bad peer-left event');
      return raw as unknown as PeerLeftEvent;
    case 'generation':
      if (typeof raw.gen !== 'number' || typeof raw.rank !== 'number' || !Array.isArray(raw.members)) throw new Error('bad generation event');
      return raw as unknown as GenerationEvent;
    case 'join-pending':
      if (typeof raw.gen !== 'number' || typeof raw.waiting !== 'number') throw new Error('bad join-pending event');
      return raw as unknown as JoinPendingEvent;
    default: {
      const unknown: never = t;
      throw new Error(`server sent unknown message type ${String(unknown)}`);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Values: bytes <-> base64, without Node's Buffer so the browser can use it too.

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

/** Byte length of a base64 value without decoding it. */
export function decodedLength(v: WireValue): number {
  const pad = v.endsWith('==') ? 2 : v.endsWith('=') ? 1 : 0;
  return (v.length / 4) * 3 - pad;
}
