/**
 * Checkpoints, as torchrun's save_checkpoint / load_checkpoint: containers (checkpoint_format.ts)
 * saved to and loaded from the server's disk over HTTP, under `/api/checkpoints/<session>/`.
 */
import { DistTimeoutError } from './errors.ts';
import { SESSION_NAME } from './protocol.ts';
import { decodeCheckpoint, encodeCheckpoint, isObject, type Checkpoint } from './checkpoint_format.ts';

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

export interface CheckpointRequestOptions {
  /** The session's secret: sent as `Authorization: Bearer <token>` (the routes refuse anything else). */
  token: string;
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
  options: CheckpointRequestOptions,
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
  options: LoadCheckpointOptions,
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
export async function listCheckpoints(serverUrl: string, session: string, options: CheckpointRequestOptions): Promise<CheckpointInfo[]> {
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
      const sent: Record<string, string> = { authorization: `Bearer ${options.token}` };
      const init: RequestInit = { method, signal: controller.signal, headers: sent };
      if (body) {
        init.body = body;
        sent['content-type'] = 'application/octet-stream';
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
