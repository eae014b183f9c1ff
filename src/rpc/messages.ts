/**
 * The RPC agents' messages (agent.ts) and their validation: every head a peer sends is checked
 * here before the agent acts on it, and the agent switches on `t` exhaustively. User values (a
 * call's args, a reply's result) travel beside the head and are decoded by codec.ts.
 */

/** A remote exception as it crosses: its class name and message. */
export interface RemoteFailure {
  error: { type: string; message: string };
}

export type Head =
  /** A worker's name, sent once to every other worker at start. */
  | { t: 'hello'; name: string }
  /**
   * Calls `fn` with the message's `args`; with `rref`, the caller made an RRef and the result stays
   * here. `ctx`: the distributed autograd context the call runs in (dist_autograd.ts).
   */
  | { t: 'call'; id: number; fn: string; rref?: { id: string; fork: string }; ctx?: string }
  /** Calls method `method` of the owned value `rref` with the message's `args`; with `result`, keeps the result here (rref.remote()). */
  | { t: 'method'; id: number; rref: string; method: string; ctx?: string; result?: { id: string; fork: string } }
  /** The owned value `rref`, as the result. */
  | { t: 'fetch'; id: number; rref: string; ctx?: string }
  /** The message's `grad` for tensor `index` of message `key` its receiver sent, in context `ctx`. */
  | { t: 'grad'; id: number; ctx: string; key: string; index: number }
  /** Context `ctx` ended (sent by the worker that opened it). */
  | { t: 'ctx'; ctx: string }
  /**
   * Registers fork `fork` of the owned value `rref` (for a reference about to be sent); `ctx`: the
   * message that carries it is in that context (the fork's holder may then fetch in it).
   */
  | { t: 'fork'; id: number; rref: string; fork: string; ctx?: string }
  /** Ends fork `fork` of the owned value `rref` (sent by the fork's holder). */
  | { t: 'release'; rref: string; fork: string }
  /** The answer to call `id`: the message's `result`, or `error`. */
  | { t: 'reply'; id: number; error?: RemoteFailure['error']; ctx?: string }
  /** This worker began its graceful shutdown: it starts no call of its own any more. */
  | { t: 'leaving' }
  /** This worker finished its graceful shutdown's part. */
  | { t: 'done' };

type WithoutId<T> = T extends unknown ? Omit<T, 'id'> : never;
/** A request's head before the agent numbers it. */
export type RequestHead = WithoutId<Exclude<Extract<Head, { id: number }>, { t: 'reply' }>>;

const ID = /^\d{1,10}\.\d{1,15}$/;
const KEY = /^(a:\d{1,15}|r:\d{1,10}:\d{1,15})$/;
const FORK = /^\d{1,10}\.\d{1,10}\.\d{1,15}$/;
const NAME = /^[A-Za-z0-9_\-:.]{1,128}$/;
const MAX_TEXT = 4096;

function fail(why: string): never {
  throw new TypeError(`an RPC message ${why}`);
}

function text(v: unknown, field: string, max = 200): string {
  if (typeof v !== 'string' || v.length === 0 || v.length > max) fail(`has no valid "${field}" (a string of 1 to ${max} characters)`);
  return v;
}

function callId(v: unknown): number {
  if (!Number.isSafeInteger(v) || (v as number) < 1) fail('has no valid "id" (a positive integer)');
  return v as number;
}

function matching(v: unknown, re: RegExp, field: string): string {
  if (typeof v !== 'string' || !re.test(v)) fail(`has no valid "${field}"`);
  return v;
}

/** The optional context id of a head. */
function ctxOf(h: Record<string, unknown>): { ctx?: string } {
  return h.ctx === undefined ? {} : { ctx: matching(h.ctx, ID, 'ctx') };
}

/** A value the caller asks this worker to keep: its id and the caller's fork. */
function newValue(v: unknown, field: string): { id: string; fork: string } {
  const r = (v ?? {}) as Record<string, unknown>;
  return { id: matching(r.id, ID, `${field}.id`), fork: matching(r.fork, FORK, `${field}.fork`) };
}

/** The head of a message from a peer, checked; throws TypeError saying what is wrong. */
export function checkHead(h: Record<string, unknown>): Head {
  const t = h.t;
  switch (t) {
    case 'hello':
      return { t, name: matching(h.name, NAME, 'name') };
    case 'leaving':
    case 'done':
      return { t };
    case 'call': {
      const head: Head = { t, id: callId(h.id), fn: text(h.fn, 'fn'), ...ctxOf(h) };
      return h.rref === undefined ? head : { ...head, rref: newValue(h.rref, 'rref') };
    }
    case 'method': {
      const head: Head = { t, id: callId(h.id), rref: matching(h.rref, ID, 'rref'), method: text(h.method, 'method'), ...ctxOf(h) };
      return h.result === undefined ? head : { ...head, result: newValue(h.result, 'result') };
    }
    case 'fetch':
      return { t, id: callId(h.id), rref: matching(h.rref, ID, 'rref'), ...ctxOf(h) };
    case 'grad': {
      const index = h.index;
      if (!Number.isSafeInteger(index) || (index as number) < 0) fail('has no valid "index"');
      return { t, id: callId(h.id), ctx: matching(h.ctx, ID, 'ctx'), key: matching(h.key, KEY, 'key'), index: index as number };
    }
    case 'ctx':
      return { t, ctx: matching(h.ctx, ID, 'ctx') };
    case 'fork':
      return { t, id: callId(h.id), rref: matching(h.rref, ID, 'rref'), fork: matching(h.fork, FORK, 'fork'), ...ctxOf(h) };
    case 'release':
      return { t, rref: matching(h.rref, ID, 'rref'), fork: matching(h.fork, FORK, 'fork') };
    case 'reply': {
      const id = callId(h.id);
      if (h.error === undefined) return { t, id, ...ctxOf(h) };
      const e = (h.error ?? {}) as Record<string, unknown>;
      return {
        t,
        id,
        error: { type: text(e.type, 'error.type'), message: typeof e.message === 'string' ? e.message.slice(0, MAX_TEXT) : '' },
      };
    }
    default:
      return fail(`has unknown type ${JSON.stringify(t)?.slice(0, 40)}`);
  }
}
