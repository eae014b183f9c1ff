/**
 * Checkpoints, as torchrun's save_checkpoint / load_checkpoint: containers (checkpoint_format.ts)
 * saved to and loaded from the server's disk over HTTP, under `/api/checkpoints/<session>/`.
 *
 * A run whose state is split (a pipeline's stages, each saving its own share) saves each share
 * as a `part` (`?part=` on the routes, signaling/checkpoints.ts): a part keeps its own last few,
 * and the session's own checkpoints and the other parts never see its files. Every stage resumes
 * from its part at the same step: `loadCheckpoint(url, session, { part, step })`.
 */
import { DistTimeoutError } from '../wire/errors.ts';
import { SESSION_NAME } from '../wire/protocol.ts';
import {
  CHECKPOINT_PART,
  CHECKPOINT_PART_RULE,
  CheckpointCorruptError,
  decodeCheckpoint,
  encodeCheckpoint,
  isObject,
  type Checkpoint,
} from './checkpoint_format.ts';

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
  /**
   * Save, load or list this part of the session's checkpoints (a pipeline stage's share of the
   * state, e.g. "stage-0") rather than the session's own. Parts are kept apart: each keeps its own
   * last few, and none sees another's files or the session's. 1-32 of a-z 0-9 -, the first a
   * letter or digit (CHECKPOINT_PART); anything else throws RangeError before any request.
   */
  part?: string;
}

export interface LoadCheckpointOptions extends CheckpointRequestOptions {
  /** Load this checkpoint (a name from listCheckpoints of the same part) instead of the newest valid one. */
  name?: string;
  /**
   * Load the newest checkpoint (of the part, when given) whose meta.step is this step, instead of
   * the newest of all: how every pipeline stage resumes at the same step. Returns null when
   * there is none at that step; newer ones at that step that fail verification are passed over
   * (and named in `skipped`), and when every one at that step does, throws CheckpointError with
   * status 409, as `latest` does. Not together with `name` (TypeError).
   */
  step?: number;
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

/**
 * Uploads a checkpoint (into `options.part` when given); the server verifies it, stores it
 * atomically and keeps the last few (of that part).
 */
export async function saveCheckpoint(
  serverUrl: string,
  session: string,
  checkpoint: Checkpoint,
  options: CheckpointRequestOptions,
): Promise<{ name: string; bytes: number }> {
  const url = checkpointUrl(serverUrl, session, options.part);
  const action = `saving a checkpoint${ofPart(options.part)}`;
  const body = await encodeCheckpoint(checkpoint);
  const res = await request('POST', url, session, action, options, body);
  const reply = parseJson(res, url, session, action);
  if (!isObject(reply) || typeof reply.name !== 'string' || typeof reply.bytes !== 'number') {
    throw new CheckpointError(
      `${action} for session "${session}": the server's reply has no name and bytes (POST ${url})`,
      session,
      url,
      res.status,
    );
  }
  return { name: reply.name, bytes: reply.bytes };
}

/**
 * Downloads the newest checkpoint of the session (or of `options.part`) that verifies, or
 * `options.name`, or the newest at `options.step`; null when there is none. `skipped` names newer
 * checkpoints that were corrupt, and why. When there are checkpoints but none verifies, throws
 * CheckpointError (HTTP 409) listing them rather than returning null: a job that started afresh
 * would soon prune them.
 */
export async function loadCheckpoint(serverUrl: string, session: string, options: LoadCheckpointOptions): Promise<LoadedCheckpoint | null> {
  const { name: named, step, part } = options;
  if (named !== undefined && (!/^[A-Za-z0-9_.-]{1,128}$/.test(named) || named === '.' || named === '..')) {
    throw new TypeError(`checkpoint name ${JSON.stringify(named)} is not valid (use a name from listCheckpoints)`);
  }
  if (step !== undefined) {
    if (named !== undefined) throw new TypeError('give loadCheckpoint a name or a step, not both');
    if (!Number.isSafeInteger(step) || step < 0) throw new RangeError(`step must be a non-negative integer, got ${step}`);
    return loadAtStep(serverUrl, session, step, options);
  }
  const url = checkpointUrl(serverUrl, session, part, named ?? 'latest');
  const action = named === undefined ? `loading the latest checkpoint${ofPart(part)}` : `loading checkpoint ${named}${ofPart(part)}`;
  const res = await request('GET', url, session, action, { ...options, noneIs404: named === undefined });
  // 204: none yet (a server before 204 said so with 404 'no-checkpoint').
  if (res.status === 204 || res.status === 404) return null;
  const name = res.headers.get('x-checkpoint-name') ?? named ?? 'latest';
  const checkpoint = await decodeCheckpoint(res.body, name);
  return { checkpoint, name, skipped: parseSkipped(res.headers.get('x-checkpoint-skipped')) };
}

/** The session's checkpoints (or `options.part`'s), oldest first. Empty when there are none. */
export async function listCheckpoints(serverUrl: string, session: string, options: CheckpointRequestOptions): Promise<CheckpointInfo[]> {
  const url = checkpointUrl(serverUrl, session, options.part);
  const action = `listing checkpoints${ofPart(options.part)}`;
  const res = await request('GET', url, session, action, options);
  const reply = parseJson(res, url, session, action);
  if (!isObject(reply) || !Array.isArray(reply.checkpoints)) {
    throw new CheckpointError(
      `${action} for session "${session}": the server's reply has no checkpoint list (GET ${url})`,
      session,
      url,
      res.status,
    );
  }
  return reply.checkpoints as CheckpointInfo[];
}

/**
 * The newest checkpoint whose meta.step is `step`: found in the list (the server names each file
 * after its meta.step), tried newest first; one that fails verification, or was pruned since the
 * list, is passed over.
 */
async function loadAtStep(
  serverUrl: string,
  session: string,
  step: number,
  options: LoadCheckpointOptions,
): Promise<LoadedCheckpoint | null> {
  const { name: _name, step: _step, ...rest } = options;
  const candidates = (await listCheckpoints(serverUrl, session, rest)).filter((c) => c.step === step).reverse();
  const skipped: Array<{ name: string; reason: string }> = [];
  for (const { name } of candidates) {
    let loaded: LoadedCheckpoint | null;
    try {
      loaded = await loadCheckpoint(serverUrl, session, { ...rest, name });
    } catch (err) {
      if (err instanceof CheckpointCorruptError) {
        skipped.push({ name, reason: err.reason });
        continue;
      }
      if (err instanceof CheckpointError && err.status === 404) continue; // pruned meanwhile
      throw err;
    }
    if (loaded === null) continue;
    if (loaded.checkpoint.meta.step !== step) {
      skipped.push({ name, reason: `its meta.step is ${JSON.stringify(loaded.checkpoint.meta.step)}, not ${step} as its name says` });
      continue;
    }
    return { ...loaded, skipped };
  }
  if (skipped.length === 0) return null;
  const url = checkpointUrl(serverUrl, session, options.part);
  const list = skipped.map((s) => `${s.name} (${s.reason})`).join('; ');
  throw new CheckpointError(
    `loading the checkpoint at step ${step}${ofPart(options.part)} for session "${session}" failed: ${skipped.length} checkpoint(s) at that step and none verifies: ${list}`,
    session,
    url,
    409,
  );
}

/** " of part "<part>"" for messages, or nothing. */
function ofPart(part: string | undefined): string {
  return part === undefined ? '' : ` of part "${part}"`;
}

/**
 * `http://host:port/` (or ws://, as given to the store) ->
 * `http://host:port/api/checkpoints/<session>[/<tail>][?part=<part>]`.
 */
function checkpointUrl(serverUrl: string, session: string, part: string | undefined, tail?: string): string {
  if (!SESSION_NAME.test(session) || session === '.' || session === '..') {
    throw new TypeError(`session name ${JSON.stringify(session)} is not allowed: use 1-64 of A-Z a-z 0-9 _ . -`);
  }
  if (part !== undefined && (typeof part !== 'string' || !CHECKPOINT_PART.test(part))) {
    throw new RangeError(
      `checkpoint part ${JSON.stringify(part)} is not allowed: use ${CHECKPOINT_PART_RULE} (${String(CHECKPOINT_PART)})`,
    );
  }
  const u = new URL(serverUrl);
  if (u.protocol === 'ws:') u.protocol = 'http:';
  else if (u.protocol === 'wss:') u.protocol = 'https:';
  else if (u.protocol !== 'http:' && u.protocol !== 'https:') {
    throw new TypeError(`server URL must be http(s):// or ws(s)://, got ${serverUrl}`);
  }
  u.pathname = `/api/checkpoints/${session}${tail === undefined ? '' : `/${tail}`}`;
  u.search = part === undefined ? '' : `?part=${part}`;
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
      throw new CheckpointError(
        `${action} for session "${session}" failed: could not reach the server: ${why} (${method} ${url})`,
        session,
        url,
      );
    }
    if (status >= 200 && status < 300) return { status, headers, body: bytes };
    const { code, message } = serverError(bytes);
    if (status === 404 && options.noneIs404 && code === 'no-checkpoint') return { status, headers, body: bytes };
    throw new CheckpointError(
      `${action} for session "${session}" failed: HTTP ${status}: ${message} (${method} ${url})`,
      session,
      url,
      status,
    );
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
      return parsed.filter(
        (s): s is { name: string; reason: string } => isObject(s) && typeof s.name === 'string' && typeof s.reason === 'string',
      );
    }
  } catch {
    // A garbled report must not lose a good checkpoint.
  }
  return [];
}
