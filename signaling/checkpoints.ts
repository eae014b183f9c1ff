/**
 * The HTTP routes of the checkpoint store (signaling/checkpoint_store.ts), under `/api/checkpoints/`:
 *
 *   POST|PUT /api/checkpoints/<session>          upload a container (src/checkpoint/checkpoint.ts); 201 {name, bytes, step}
 *   GET      /api/checkpoints/<session>          list: {session, checkpoints: [{name, bytes, step, mtime}]}, oldest first
 *   GET      /api/checkpoints/<session>/latest   the newest checkpoint that verifies; headers x-checkpoint-name,
 *                                                x-checkpoint-skipped (JSON [{name, reason}] of newer corrupt ones);
 *                                                204 (no body) when there is none (not a 404: every training tab
 *                                                asks at its start, and a browser logs each 404 as an error), 409
 *                                                when none verifies
 *   GET      /api/checkpoints/<session>/<name>   that checkpoint, as stored (the client verifies it)
 *
 * Parts: each route takes an optional `?part=<part>` (e.g. `POST /api/checkpoints/<session>?part=stage-0`,
 * `GET /api/checkpoints/<session>/latest?part=stage-0`). A part is one share of a run's state saved
 * apart from the others (each pipeline stage saves its own): it lives in its own folder, keeps its
 * own last `keep`, and its list and `latest` see only its files; without `?part` the routes see
 * only the session's own files, as before parts existed, and pruning them never touches a part.
 * A part's name must match CHECKPOINT_PART (src/checkpoint/checkpoint_format.ts: 1-32 of a-z 0-9 -, the
 * first a letter or digit), given once; anything else is refused with 400 'bad-part' before the
 * token is checked or the disk touched. Parts need the session's token and count in the disk
 * budget like everything else. Other query parameters are ignored.
 *
 * Every route needs `Authorization: Bearer <the session's token>` (signaling/session_tokens.ts):
 * 401 when it is missing or malformed, 403 when it is wrong or nobody has connected to the session
 * yet. Nothing on disk is touched before that check. Uploads must be `application/octet-stream`
 * (so that a cross-site form or text/plain "simple" request cannot store anything) with a
 * Content-Length; the container's preamble and header are checked from the first bytes before a
 * file is created. Refusals: 400 corrupt/incomplete, 401, 403, 408 too slow, 411 no length,
 * 413 too large, 415 wrong type, 503 too many uploads at once (retry-after), 507 disk budget.
 *
 * Errors are JSON {error, message}. Where and how the files are kept (the .tmp, verify, fsync and
 * rename of a save, names that sort by write time, pruning): signaling/checkpoint_store.ts.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { FileHandle } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import type { SessionTokens } from './session_tokens.ts';
import { ROTATED_TOKEN_MESSAGE } from '../src/wire/protocol.ts';
import { CHECKPOINT_NAME, CheckpointRefused, checkpointStore, validSession, type ByteSource, type Skipped } from './checkpoint_store.ts';
import { CHECKPOINT_PART, CHECKPOINT_PART_RULE, CHECKSUM_BYTES, PREAMBLE_BYTES } from '../src/checkpoint/checkpoint_format.ts';

export interface CheckpointHandlerOptions {
  /** Where checkpoints are kept: one folder per session. Created when needed. */
  dir: string;
  /** The sessions' tokens: every route checks `Authorization: Bearer <token>` against them. */
  tokens: SessionTokens;
  /** How many checkpoints each session keeps (and each part of it, apart); older ones are deleted after a save. Default 3. */
  keep?: number;
  /** Largest upload accepted, in bytes. Default 256 MiB. */
  maxBytes?: number;
  /**
   * Disk budget for all sessions together: stored checkpoints plus uploads in progress (counted
   * at their Content-Length). An upload that would pass it is refused with 507. Default 4 GiB.
   */
  maxDiskBytes?: number;
  /** Uploads received at the same time; more are refused with 503 and retry-after. Default 4. */
  maxConcurrentUploads?: number;
  /** Longest an upload's body may take to arrive; slower ones get 408 and their .tmp is removed. Default 60 s. */
  uploadTimeoutMs?: number;
  /** Longest an upload may send nothing (a stalled client) before it gets 408. Default 15 s. */
  uploadIdleTimeoutMs?: number;
  /** Where notes about corrupt or refused checkpoints go. Default: nowhere. */
  log?: (line: string) => void;
  /**
   * Called each time a stored checkpoint is read and hashed in full (an upload, or a `latest`
   * that had not verified the file as it is now). For diagnostics and tests.
   */
  onVerify?: (path: string, bytes: number) => void;
}

/** An expected refusal: answered as {error: code, message} without a stack in the log. */
class Refusal extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}

const PREFIX = '/api/checkpoints';
/** What a 503 suggests; uploads are short, so a few seconds is enough for a slot to free. */
const RETRY_AFTER_S = 5;
/** `Authorization: Bearer <token>`; the scheme is case-insensitive (RFC 7235). */
const BEARER = /^Bearer +(\S+) *$/i;
/** The HTTP status of each refusal of the store. */
const STORE_REFUSAL_STATUS = { corrupt: 400, 'too-large': 413, 'insufficient-storage': 507 } as const;

export function checkpointHandler(options: CheckpointHandlerOptions): (req: IncomingMessage, res: ServerResponse) => Promise<boolean> {
  const tokens = options.tokens;
  const keep = options.keep ?? 3;
  const maxBytes = options.maxBytes ?? 256 * 1024 * 1024;
  const maxDiskBytes = options.maxDiskBytes ?? 4 * 1024 * 1024 * 1024;
  const maxConcurrentUploads = options.maxConcurrentUploads ?? 4;
  const uploadTimeoutMs = options.uploadTimeoutMs ?? 60_000;
  const uploadIdleTimeoutMs = options.uploadIdleTimeoutMs ?? 15_000;
  const log = options.log ?? (() => {});
  const onVerify = options.onVerify;
  const positiveInteger = (name: string, v: number) => {
    if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`${name} must be a positive integer, got ${v}`);
  };
  positiveInteger('keep', keep);
  if (!Number.isSafeInteger(maxBytes) || maxBytes < PREAMBLE_BYTES + CHECKSUM_BYTES) {
    throw new RangeError(`maxBytes must be an integer of at least ${PREAMBLE_BYTES + CHECKSUM_BYTES}, got ${maxBytes}`);
  }
  positiveInteger('maxDiskBytes', maxDiskBytes);
  positiveInteger('maxConcurrentUploads', maxConcurrentUploads);
  positiveInteger('uploadTimeoutMs', uploadTimeoutMs);
  positiveInteger('uploadIdleTimeoutMs', uploadIdleTimeoutMs);

  const store = checkpointStore({ dir: options.dir, keep, maxDiskBytes, log, onVerify });
  /** Uploads being received now. */
  let activeUploads = 0;

  return async (req, res) => {
    let url: URL;
    try {
      url = new URL(req.url ?? '/', 'http://x');
    } catch {
      return false; // not a path at all: not ours to answer
    }
    const pathname = url.pathname;
    if (pathname !== PREFIX && !pathname.startsWith(`${PREFIX}/`)) return false;
    try {
      await route(req, res, url);
    } catch (err) {
      if (err instanceof Refusal) {
        log(`[checkpoints] ${req.method} ${pathname} from ${req.socket.remoteAddress ?? 'unknown'}: ${err.status} ${err.code}: ${err.message}`);
        if (res.headersSent) {
          res.destroy();
          return true;
        }
        // An unread body is not worth reading (it may be large, or stalled): close after answering.
        if (!req.complete) res.setHeader('connection', 'close');
        for (const [k, v] of Object.entries(err.headers)) res.setHeader(k, v);
        sendError(res, err.status, err.code, err.message);
        return true;
      }
      log(`[checkpoints] ${req.method} ${pathname} failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
      if (!res.headersSent) sendError(res, 500, 'internal', `the server could not handle this: ${String(err)}`);
      else res.destroy();
    }
    return true;
  };

  async function route(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    const pathname = url.pathname;
    const parts = pathname.slice(PREFIX.length + 1).split('/');
    if (parts.length > 1 && parts.at(-1) === '') parts.pop();
    let segments: string[];
    try {
      segments = parts.map(decodeURIComponent);
    } catch {
      return sendError(res, 400, 'bad-path', `the path ${pathname} is not valid percent-encoding`);
    }
    const [session, name, ...extra] = segments;
    if (!session) return sendError(res, 404, 'not-found', `name a session: ${PREFIX}/<session>`);
    if (!validSession(session)) {
      return sendError(res, 400, 'bad-session', `session name ${JSON.stringify(session)} is not allowed: use 1-64 of A-Z a-z 0-9 _ . - (not "." or "..")`);
    }
    const partNames = url.searchParams.getAll('part');
    const part = partNames[0];
    if (partNames.length > 1) return sendError(res, 400, 'bad-part', `give one part (?part=<part>), not ${partNames.length}`);
    if (part !== undefined && !CHECKPOINT_PART.test(part)) {
      return sendError(res, 400, 'bad-part', `part name ${JSON.stringify(part.slice(0, 100))} is not allowed: use ${CHECKPOINT_PART_RULE}`);
    }
    if (extra.length > 0) return sendError(res, 404, 'not-found', `no such resource: ${pathname}`);
    // Before anything reads or writes the session's folder.
    const token = await authorize(req, session);
    const folder = store.folder(session, part);
    const where = part === undefined ? `session "${session}"` : `part "${part}" of session "${session}"`;

    if (name === undefined) {
      if (req.method === 'POST' || req.method === 'PUT') return upload(req, res, session, token, folder);
      if (req.method === 'GET') return sendJson(res, 200, { session, ...(part === undefined ? {} : { part }), checkpoints: await store.list(folder) });
      return methodNotAllowed(res, 'GET, POST, PUT');
    }
    if (req.method !== 'GET') return methodNotAllowed(res, 'GET');
    if (name === 'latest') return sendLatest(res, where, folder);
    if (!CHECKPOINT_NAME.test(name)) {
      const list = `${PREFIX}/${session}${part === undefined ? '' : `?part=${part}`}`;
      return sendError(res, 400, 'bad-name', `${JSON.stringify(name)} is not a checkpoint name (list them at ${list})`);
    }
    const fh = await store.openCheckpoint(folder, name);
    if (fh === null) return sendError(res, 404, 'not-found', `${where} has no checkpoint ${name}`);
    await sendFile(res, fh, name, []);
  }

  /** The request's token when it is the session's; throws a 401 or 403 Refusal otherwise. */
  async function authorize(req: IncomingMessage, session: string): Promise<string> {
    const header = req.headers.authorization;
    const token = header === undefined ? undefined : BEARER.exec(header)?.[1];
    if (token === undefined) {
      throw new Refusal(
        401,
        'unauthorized',
        `checkpoints of session "${session}" need the session's token: send "Authorization: Bearer <token>" (the #token=... of the session's link)`,
        { 'www-authenticate': 'Bearer realm="checkpoints"' },
      );
    }
    switch (await tokens.verify(session, token)) {
      case 'ok':
        return token;
      case 'missing':
        throw new Refusal(
          401,
          'unauthorized',
          `the bearer token is not a session token (22-128 characters of A-Z a-z 0-9 _ -): send the #token=... of session "${session}"'s link`,
          { 'www-authenticate': 'Bearer realm="checkpoints", error="invalid_token"' },
        );
      case 'wrong':
        if (tokens.wasRotated(session, token)) throw new Refusal(403, 'forbidden', `session "${session}": ${ROTATED_TOKEN_MESSAGE}`);
        throw new Refusal(403, 'forbidden', `wrong token for session "${session}": use the token of the session's link`);
      case 'unknown':
        throw new Refusal(403, 'forbidden', `session "${session}" has no token yet: connect to the session first (its first connection fixes the token), then use that token`);
    }
  }

  /** Stores an upload in `folder`: the session's folder, or one of its parts'. */
  async function upload(req: IncomingMessage, res: ServerResponse, session: string, token: string, folder: string): Promise<void> {
    const type = (req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
    if (type !== 'application/octet-stream') {
      const sent = type === '' ? 'no Content-Type' : `Content-Type ${JSON.stringify(type)}`;
      throw new Refusal(415, 'unsupported-media-type', `a checkpoint upload must be sent as "Content-Type: application/octet-stream", not with ${sent}`);
    }
    const lengthHeader = req.headers['content-length'];
    if (lengthHeader === undefined) {
      // The length is what the disk budget reserves and what the preamble is checked against.
      throw new Refusal(411, 'length-required', 'a checkpoint upload needs a Content-Length header: send the whole container as one body (fetch with a Uint8Array does), not chunked');
    }
    const declared = Number(lengthHeader); // node's parser has already refused a malformed one
    if (declared > maxBytes) throw tooLarge(`${declared} bytes`);
    if (activeUploads >= maxConcurrentUploads) {
      throw new Refusal(
        503,
        'busy',
        `the server is receiving ${activeUploads} checkpoint uploads, the most it takes at once (maxConcurrentUploads): retry in ${RETRY_AFTER_S} s`,
        { 'retry-after': String(RETRY_AFTER_S) },
      );
    }
    // Claimed before the first await, so that concurrent uploads each see the others (the store
    // reserves their disk the same way).
    activeUploads++;
    try {
      const saved = await store.save(
        folder,
        declared,
        () => new BodyReader(req, declared, uploadTimeoutMs, uploadIdleTimeoutMs),
        async () => {
          // The token must outlive this process once the session has a checkpoint; checked again in
          // case the session was dropped and claimed by someone else while the body arrived.
          await tokens.persist(session);
          if ((await tokens.verify(session, token)) !== 'ok') throw new Refusal(403, 'forbidden', `session "${session}" now has another token: nothing was stored`);
        },
      );
      sendJson(res, 201, { name: saved.name, bytes: saved.bytes, step: saved.step });
    } catch (err) {
      if (err instanceof CheckpointRefused) throw new Refusal(STORE_REFUSAL_STATUS[err.code], err.code, err.message);
      throw err;
    } finally {
      activeUploads--;
    }
  }

  function tooLarge(what: string): Refusal {
    return new Refusal(413, 'too-large', `checkpoint upload is ${what}; this server accepts at most ${maxBytes} bytes (checkpointHandler maxBytes)`);
  }

  /** `where` names the folder for messages: `session "<session>"` or `part "<part>" of session "<session>"`. */
  async function sendLatest(res: ServerResponse, where: string, folder: string): Promise<void> {
    const { found, skipped } = await store.latest(folder);
    for (const s of skipped) log(`[checkpoints] ${where}: skipping ${s.name}: ${s.reason}`);
    if (found) return sendFile(res, found.fh, found.name, skipped);
    if (skipped.length === 0) {
      res.statusCode = 204;
      res.end();
      return;
    }
    // Not "none": starting afresh would soon prune checkpoints someone may want to rescue.
    const list = skipped.map((s) => `${s.name} (${s.reason})`).join('; ');
    sendError(res, 409, 'all-corrupt', `${where} has ${skipped.length} checkpoint(s) and none verifies: ${list}`);
  }
}

/**
 * An upload's body, chunk by chunk, within a deadline for the whole body and a shorter one for
 * each wait (a client that stalls). Failures are Refusals: 408 on time, 400 when it broke off.
 */
class BodyReader implements ByteSource {
  private readonly chunks: AsyncIterator<Buffer>;
  private readonly deadline: number;
  private received = 0;
  /** The body's first bytes, kept by `firstBytes`. */
  private start: Buffer[] = [];
  private startBytes = 0;

  constructor(
    req: IncomingMessage,
    private readonly declared: number,
    private readonly totalMs: number,
    private readonly idleMs: number,
  ) {
    this.chunks = (req as AsyncIterable<Buffer>)[Symbol.asyncIterator]();
    this.deadline = Date.now() + totalMs;
  }

  /** All bytes received so far, after reading until there are at least `n` (first call first). */
  async firstBytes(n: number): Promise<Buffer> {
    while (this.startBytes < n) {
      const chunk = await this.next();
      if (chunk === null) break; // not reached: next() refuses a body shorter than declared
      this.start.push(chunk);
      this.startBytes += chunk.length;
    }
    this.start = [Buffer.concat(this.start, this.startBytes)];
    return this.start[0]!;
  }

  /** The next chunk, or null at the end of the body. */
  async next(): Promise<Buffer | null> {
    const left = this.deadline - Date.now();
    const idle = this.idleMs < left;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<'timeout'>((done) => {
      timer = setTimeout(() => done('timeout'), Math.max(0, idle ? this.idleMs : left));
    });
    let result: IteratorResult<Buffer> | 'timeout';
    try {
      // The losing next() stays pending until the connection closes; race() has handled its rejection.
      result = await Promise.race([this.chunks.next(), timeout]);
    } catch (err) {
      throw this.brokeOff(err instanceof Error ? err.message : String(err));
    } finally {
      clearTimeout(timer);
    }
    const got = `${this.received} of ${this.declared} bytes`;
    if (result === 'timeout' && idle) {
      throw new Refusal(408, 'timeout', `the checkpoint upload stalled: nothing arrived for ${this.idleMs} ms after ${got} (uploadIdleTimeoutMs); nothing was stored: save it again`);
    }
    if (result === 'timeout') {
      throw new Refusal(
        408,
        'timeout',
        `the checkpoint upload took too long: ${got} arrived in ${this.totalMs} ms, the most this server waits for one (uploadTimeoutMs); nothing was stored: retry over a faster connection or save a smaller checkpoint`,
      );
    }
    if (result.done) {
      if (this.received !== this.declared) throw this.brokeOff('the body ended early');
      return null;
    }
    this.received += result.value.length;
    if (this.received > this.declared) throw this.brokeOff('more bytes than its Content-Length'); // node's parser prevents it
    return result.value;
  }

  private brokeOff(why: string): Refusal {
    return new Refusal(400, 'incomplete', `the checkpoint upload broke off after ${this.received} of ${this.declared} bytes (${why}); nothing was stored: save it again`);
  }
}

/** Streams a checkpoint file (and closes it). */
async function sendFile(res: ServerResponse, fh: FileHandle, name: string, skipped: Skipped[]): Promise<void> {
  try {
    const { size } = await fh.stat();
    res.writeHead(200, {
      'content-type': 'application/octet-stream',
      'content-length': size,
      'cache-control': 'no-store',
      'x-checkpoint-name': name,
      'x-checkpoint-skipped': asciiJson(skipped),
    });
  } catch (err) {
    await fh.close();
    throw err;
  }
  await pipeline(fh.createReadStream({ start: 0, autoClose: true }), res);
}

function sendJson(res: ServerResponse, status: number, body: object): void {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
  res.end(JSON.stringify(body));
}

/** Errors are {error: a stable code, message: for a person}. */
function sendError(res: ServerResponse, status: number, error: string, message: string): void {
  sendJson(res, status, { error, message });
}

function methodNotAllowed(res: ServerResponse, allow: string): void {
  res.setHeader('allow', allow);
  sendError(res, 405, 'method', `use ${allow}`);
}

/** JSON with non-ASCII escaped: header values must be Latin-1, and reasons may quote any text. */
function asciiJson(value: unknown): string {
  return JSON.stringify(value).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}
