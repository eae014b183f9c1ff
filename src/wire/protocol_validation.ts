/**
 * Validation of the wire protocol (`protocol.ts`): both ends parse every frame here, so nothing
 * either side acts on has a field of the wrong type or out of range. A bad client frame becomes
 * a `ProtocolViolation` that names the field; the server answers it with an error reply.
 */
import {
  CONTROL_ACTIONS,
  HOST_ACTIONS,
  SESSION_TOKEN,
  DEFAULT_LIMITS,
  ErrorCode,
  FAULT_KINDS,
  MAX_CLAIM_KEYS,
  MAX_FAULT_ENTRIES,
  MAX_FAULT_REASON,
  MAX_GATHER_TAG,
  MAX_GATHER_VALUES,
  type HostAction,
  type TokenEvent,
  type ControlEvent,
  type ErrorMessage,
  type FaultsEvent,
  type Limits,
  type PeerLeftEvent,
  type RendezvousClosedEvent,
  type ReplyMessage,
  type Request,
  type RequestFields,
  type RequestType,
  type RoundEvent,
  type ServerMessage,
  type SignalEvent,
  type WaitingEvent,
  type WireValue,
} from './protocol.ts';
import { ServerMessageError } from './errors.ts';

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

/** Largest group the protocol describes (ranks are 0..MAX_WORLD-1). */
export const MAX_WORLD = 4096;

/**
 * Largest member id (ids count up from 1 per session, never reused while the server runs, since
 * links and places are keyed by them). Any safe integer, so a session cannot run out of ids (at a
 * million joins a second, 2^53 lasts 285 years; 2^24 lasted minutes of a reconnect loop and then
 * locked the session); one below the maximum so that `MAX_MEMBER_ID + 1` is still exact. Ids go
 * over the wire as JSON numbers and in link names as decimal digits, never as float32 or u32.
 */
export const MAX_MEMBER_ID = Number.MAX_SAFE_INTEGER - 1;

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
  const keys = v.map((_, i) => key(v as unknown as Obj, String(i), id, limits));
  // A key named twice would be waited for, stored or sent back twice: always a client bug.
  const first = new Map<string, number>();
  for (const [i, k] of keys.entries()) {
    const j = first.get(k);
    if (j !== undefined) {
      throw new ProtocolViolation(
        ErrorCode.DUPLICATE_KEYS,
        `field "${field}" names key ${JSON.stringify(k)} twice (at ${j} and ${i}); name each key once`,
        id,
      );
    }
    first.set(k, i);
  }
  return keys;
}

function describe(v: unknown): string {
  if (v === undefined) return 'nothing';
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  if (typeof v === 'string') return v.length > 40 ? `a ${v.length}-character string` : JSON.stringify(v);
  if (typeof v === 'number') return String(v);
  return `a ${typeof v}`;
}

/** A request type's validator: its fields from the frame `raw` (request `id`), checked against `limits`. */
type FieldsOf<T extends RequestType> = (raw: Obj, id: number, limits: Limits) => RequestFields[T];

/** The longest wait a blocking request may ask for. */
const timeout = (raw: Obj, id: number, limits: Limits): number => int(raw, 'timeoutMs', id, 0, limits.maxTimeoutMs);

/**
 * Every request type's validator, by type. A table, not a switch, so that each type's checks
 * stand alone; its mapped type makes adding a request type without a validator fail to compile.
 */
const REQUEST_FIELDS: { [T in RequestType]: FieldsOf<T> } = {
  hello: (raw, id) => {
    const hello = { session: str(raw, 'session', id, 64), version: int(raw, 'version', id, 0, 1e9), token: str(raw, 'token', id, 128) };
    // Its format is checked by the server, like the token's: a malformed one is UNAUTHORIZED.
    return {
      ...hello,
      ...(raw.host === undefined ? {} : { host: str(raw, 'host', id, 128) }),
      ...(raw.admin === undefined ? {} : { admin: str(raw, 'admin', id, 128) }),
    };
  },
  set: (raw, id, limits) => ({ key: key(raw, 'key', id, limits), value: value(raw, 'value', id) }),
  get: (raw, id, limits) => ({ key: key(raw, 'key', id, limits), timeoutMs: timeout(raw, id, limits) }),
  add: (raw, id, limits) => ({
    key: key(raw, 'key', id, limits),
    amount: int(raw, 'amount', id, Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER),
  }),
  compareSet: (raw, id, limits) => ({
    key: key(raw, 'key', id, limits),
    expected: value(raw, 'expected', id),
    desired: value(raw, 'desired', id),
  }),
  wait: (raw, id, limits) => ({ keys: keyList(raw, 'keys', id, limits), timeoutMs: timeout(raw, id, limits) }),
  check: (raw, id, limits) => ({ keys: keyList(raw, 'keys', id, limits) }),
  deleteKey: (raw, id, limits) => ({ key: key(raw, 'key', id, limits) }),
  numKeys: () => ({}),
  append: (raw, id, limits) => ({ key: key(raw, 'key', id, limits), value: value(raw, 'value', id) }),
  multiGet: (raw, id, limits) => ({ keys: keyList(raw, 'keys', id, limits), timeoutMs: timeout(raw, id, limits) }),
  multiSet: (raw, id, limits) => {
    const keys = keyList(raw, 'keys', id, limits);
    const vs = raw.values;
    if (!Array.isArray(vs)) fail(id, `field "values" must be an array, got ${describe(vs)}`);
    if (vs.length !== keys.length) fail(id, `multiSet has ${keys.length} keys but ${vs.length} values`);
    return { keys, values: vs.map((_, i) => value(vs as unknown as Obj, String(i), id)) };
  },
  rendezvous: rendezvousFields,
  control: controlFields,
  heartbeat: heartbeatFields,
  iceServers: () => ({}),
  pulse: () => ({}),
  closeRendezvous: () => ({}),
  claim: (raw, id, limits) => {
    const keys = keyList(raw, 'keys', id, limits);
    if (keys.length === 0 || keys.length > MAX_CLAIM_KEYS)
      fail(id, `field "keys" must name 1 to ${MAX_CLAIM_KEYS} places, got ${keys.length}`);
    if (typeof raw.take !== 'boolean') fail(id, `field "take" must be true or false, got ${describe(raw.take)}`);
    return { keys, take: raw.take as boolean };
  },
  regroup: (raw, id) => {
    const fromRound = int(raw, 'fromRound', id, 0, Number.MAX_SAFE_INTEGER);
    const failed = raw.failed;
    if (failed !== undefined && typeof failed !== 'boolean') fail(id, `field "failed" must be true or false, got ${describe(failed)}`);
    return failed === undefined ? { fromRound } : { fromRound, failed };
  },
  signal: (raw, id) => {
    const to = int(raw, 'to', id, 0, MAX_WORLD - 1);
    const data = raw.data;
    if (!isObj(data) || typeof data.channel !== 'string' || data.channel.length > 128 || !('body' in data)) {
      fail(id, 'field "data" must be an object { channel: string, body }');
    }
    return { to, data: { channel: data.channel as string, body: data.body } };
  },
  gather: gatherFields,
};

function rendezvousFields(raw: Obj, id: number): RequestFields['rendezvous'] {
  const min = int(raw, 'min', id, 1, MAX_WORLD);
  const max = int(raw, 'max', id, 1, MAX_WORLD);
  if (max < min) fail(id, `field "max" (${max}) must be at least "min" (${min})`);
  const spectate = raw.spectate;
  if (spectate !== undefined && typeof spectate !== 'boolean')
    fail(id, `field "spectate" must be true or false, got ${describe(spectate)}`);
  const base = spectate === undefined ? { min, max } : { min, max, spectate };
  if (raw.rank === undefined) return base;
  if (min !== max) fail(id, `field "rank" can only be given for a fixed world size (min = max), not for ${min}..${max}`);
  return { ...base, rank: int(raw, 'rank', id, Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER) };
}

function controlFields(raw: Obj, id: number): RequestFields['control'] {
  const action = raw.action;
  if (typeof action !== 'string' || !(HOST_ACTIONS as readonly string[]).includes(action)) {
    fail(id, `field "action" must be one of ${HOST_ACTIONS.map((a) => `"${a}"`).join(', ')}, got ${describe(action)}`);
  }
  const a = action as HostAction;
  if (a === 'remove') return { action: a, ...removeTarget(raw, id) };
  for (const f of ['rank', 'round', 'member'])
    if (raw[f] !== undefined) fail(id, `field "${f}" goes with action "remove" only, not "${a}"`);
  if (a !== 'min') {
    if (raw.min !== undefined) fail(id, `field "min" goes with action "min" only, not "${a}"`);
    return { action: a };
  }
  // The upper bound is the group's max, which only the server knows; it checks that too.
  return { action: a, min: int(raw, 'min', id, 1, MAX_WORLD) };
}

function heartbeatFields(raw: Obj, id: number): RequestFields['heartbeat'] {
  if (raw.heard === undefined) return {};
  const heard = raw.heard;
  if (typeof heard !== 'object' || heard === null || Array.isArray(heard))
    fail(id, `field "heard" must be an object {round, ranks}, got ${describe(heard)}`);
  const h = heard as Obj;
  const round = int(h, 'round', id, 0, Number.MAX_SAFE_INTEGER);
  const ranks = h.ranks;
  if (!Array.isArray(ranks) || ranks.length > MAX_WORLD)
    fail(id, `field "heard.ranks" must be an array of at most ${MAX_WORLD} ranks, got ${describe(ranks)}`);
  return { heard: { round, ranks: (ranks as unknown[]).map((_, i) => int(ranks as unknown as Obj, String(i), id, 0, MAX_WORLD - 1)) } };
}

function gatherFields(raw: Obj, id: number, limits: Limits): RequestFields['gather'] {
  const round = int(raw, 'round', id, 1, Number.MAX_SAFE_INTEGER);
  const timeoutMs = timeout(raw, id, limits);
  const tag = raw.tag;
  if (typeof tag !== 'string' || tag.length === 0 || tag.length > MAX_GATHER_TAG || !/^[\w.:/-]+$/.test(tag)) {
    fail(id, `field "tag" must be 1 to ${MAX_GATHER_TAG} characters of letters, digits and . : / _ -, got ${describe(tag)}`);
  }
  const values = raw.values;
  if (!Array.isArray(values) || values.length > MAX_GATHER_VALUES || !values.every((v) => typeof v === 'number' && Number.isFinite(v))) {
    fail(id, `field "values" must be an array of at most ${MAX_GATHER_VALUES} finite numbers`);
  }
  return { round, tag: tag as string, values: values as number[], timeoutMs };
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
  // Own keys only: "constructor" or "__proto__" is an unknown type, not a validator.
  if (!Object.hasOwn(REQUEST_FIELDS, type))
    throw new ProtocolViolation(ErrorCode.UNKNOWN_TYPE, `unknown message type ${describe(type)}`, id);
  const t = type as RequestType;
  const fields = (REQUEST_FIELDS[t] as FieldsOf<RequestType>)(raw, id, limits);
  return { type: t, id, ...fields } as Request;
}

/** A check of a server message: throws ServerMessageError saying `what` is bad unless `ok`. */
type Need = (ok: boolean, what: string) => void;

/** A safe integer in min..max. */
const isInt = (v: unknown, min: number, max: number) => typeof v === 'number' && Number.isSafeInteger(v) && v >= min && v <= max;

/** A `round` event's fields: its round, this tab's rank in a group of worldSize, and one distinct member id per rank. */
function checkRound(raw: Obj, need: Need): void {
  need(isInt(raw.round, 1, Number.MAX_SAFE_INTEGER), 'bad round');
  need(
    isInt(raw.worldSize, 0, MAX_WORLD) && isInt(raw.rank, -1, MAX_WORLD - 1) && (raw.rank as number) < Math.max(1, raw.worldSize as number),
    'bad rank or world size',
  );
  need(typeof raw.paused === 'boolean' && isInt(raw.min, 1, MAX_WORLD) && isInt(raw.max, 1, MAX_WORLD), 'bad paused, min or max');
  need(
    Array.isArray(raw.members) &&
      raw.members.length === (raw.paused ? 0 : raw.worldSize) &&
      raw.members.every((m) => isInt(m, 1, MAX_MEMBER_ID)) &&
      new Set(raw.members).size === raw.members.length,
    'bad members (one distinct member id per rank)',
  );
}

/** A `faults` event's fields: a count per fault kind and a bounded list of entries. */
function checkFaults(raw: Obj, need: Need): void {
  const counts = raw.counts;
  need(
    isObj(counts) && FAULT_KINDS.every((k) => isInt(counts[k], 0, Number.MAX_SAFE_INTEGER)),
    'bad counts (one non-negative integer per kind)',
  );
  const entries = raw.entries;
  need(Array.isArray(entries) && entries.length <= MAX_FAULT_ENTRIES, `bad entries (a list of at most ${MAX_FAULT_ENTRIES})`);
  const goodEntry = (e: unknown) =>
    isObj(e) &&
    (FAULT_KINDS as readonly unknown[]).includes(e.kind) &&
    isInt(e.round, 1, Number.MAX_SAFE_INTEGER) &&
    isInt(e.rank, 0, MAX_WORLD - 1) &&
    typeof e.reason === 'string' &&
    e.reason.length <= MAX_FAULT_REASON;
  need((entries as unknown[]).every(goodEntry), 'bad entry (kind, round, rank, reason)');
}

/**
 * Parses a server frame on the client side. Throws on anything malformed: a client acts only on
 * messages whose fields it has checked.
 */
export function parseServerMessage(text: string): ServerMessage {
  const raw: unknown = JSON.parse(text);
  if (!isObj(raw) || typeof raw.type !== 'string') throw new ServerMessageError('server sent a frame that is not a message');
  const t = raw.type as ServerMessage['type'];
  const need: Need = (ok, what) => {
    if (!ok) throw new ServerMessageError(`server sent a bad "${t}" message: ${what}`, t);
  };
  switch (t) {
    case 'reply':
      need(isInt(raw.id, 0, Number.MAX_SAFE_INTEGER) && 'result' in raw, 'no id or result');
      return raw as unknown as ReplyMessage;
    case 'error':
      need(typeof raw.code === 'string' && typeof raw.message === 'string', 'no code or message');
      need(raw.id === undefined || isInt(raw.id, 0, Number.MAX_SAFE_INTEGER), 'bad id');
      need(raw.details === undefined || isObj(raw.details), 'bad details');
      return raw as unknown as ErrorMessage;
    case 'signal':
      need(
        isInt(raw.from, 0, MAX_WORLD - 1) && isInt(raw.member, 1, MAX_MEMBER_ID) && isObj(raw.data) && typeof raw.data.channel === 'string',
        'bad sender or data',
      );
      return raw as unknown as SignalEvent;
    case 'peer-left':
      need(
        isInt(raw.round, 0, Number.MAX_SAFE_INTEGER) && isInt(raw.rank, 0, MAX_WORLD - 1) && typeof raw.reason === 'string',
        'bad round, rank or reason',
      );
      return raw as unknown as PeerLeftEvent;
    case 'round':
      checkRound(raw, need);
      return raw as unknown as RoundEvent;
    case 'waiting':
      // Members and spectators may outnumber the largest group (spectators wait beyond it).
      need(isInt(raw.round, 0, Number.MAX_SAFE_INTEGER) && isInt(raw.waiting, 0, MAX_WORLD), 'bad round or waiting');
      need(
        isInt(raw.members, 0, Number.MAX_SAFE_INTEGER) && isInt(raw.spectators, 0, Number.MAX_SAFE_INTEGER),
        'bad members or spectators',
      );
      need(isInt(raw.min, 1, MAX_WORLD) && isInt(raw.max, 1, MAX_WORLD), 'bad min or max');
      return raw as unknown as WaitingEvent;
    case 'control':
      need(
        typeof raw.action === 'string' && (CONTROL_ACTIONS as readonly string[]).includes(raw.action) && raw.by === 'host',
        'bad action or sender',
      );
      need(raw.action === 'min' ? isInt(raw.min, 1, MAX_WORLD) : raw.min === undefined, 'bad min');
      return raw as unknown as ControlEvent;
    case 'rendezvous-closed':
      need(isInt(raw.round, 0, Number.MAX_SAFE_INTEGER) && isInt(raw.by, 0, MAX_WORLD - 1), 'bad round or rank');
      return raw as unknown as RendezvousClosedEvent;
    case 'token':
      need(
        typeof raw.token === 'string' && SESSION_TOKEN.test(raw.token) && typeof raw.reason === 'string' && raw.reason.length <= 1_000,
        'bad token or reason',
      );
      return raw as unknown as TokenEvent;
    case 'faults': {
      checkFaults(raw, need);
      return raw as unknown as FaultsEvent;
    }
    default: {
      const unknown: never = t;
      throw new ServerMessageError(`server sent unknown message type ${String(unknown)}`, String(unknown));
    }
  }
}

/**
 * Whom a `control` 'remove' names: `rank` of the running round (with `round`, only while that
 * round runs) or `member`, one of the two.
 */
function removeTarget(raw: Obj, id: number): { rank: number; round?: number } | { member: number } {
  if (raw.min !== undefined) fail(id, 'field "min" goes with action "min" only, not "remove"');
  if ((raw.rank === undefined) === (raw.member === undefined))
    fail(
      id,
      'action "remove" names a tab by its field "rank" (in the running round) or its field "member" (its member id), one of the two',
    );
  if (raw.member !== undefined) {
    if (raw.round !== undefined) fail(id, 'field "round" goes with field "rank" only, not "member"');
    return { member: int(raw, 'member', id, 1, MAX_MEMBER_ID) };
  }
  const rank = int(raw, 'rank', id, 0, MAX_WORLD - 1);
  return raw.round === undefined ? { rank } : { rank, round: int(raw, 'round', id, 1, Number.MAX_SAFE_INTEGER) };
}
