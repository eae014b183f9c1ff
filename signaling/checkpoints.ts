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
import type { SessionTokens } from './session_tokens.ts';
import { CHECKPOINT_NAME, CheckpointRefused, checkpointStore, validSession, type CheckpointStore } from './checkpoint_store.ts';
import { BodyReader, Refusal, answerFailure, authorize, methodNotAllowed, sendError, sendFile, sendJson } from './checkpoint_http.ts';
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

const PREFIX = '/api/checkpoints';
/** What a 503 suggests; uploads are short, so a few seconds is enough for a slot to free. */
const RETRY_AFTER_S = 5;
/** The HTTP status of each refusal of the store. */
const STORE_REFUSAL_STATUS = { corrupt: 400, 'too-large': 413, 'insufficient-storage': 507 } as const;

export function checkpointHandler(options: CheckpointHandlerOptions): (req: IncomingMessage, res: ServerResponse) => Promise<boolean> {
  const routes = new CheckpointRoutes(options);
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
      await routes.route(req, res, url);
    } catch (err) {
      answerFailure(req, res, pathname, err, routes.log);
    }
    return true;
  };
}

/** A route's target: the session, the checkpoint name (or 'latest', or none: the list), the part. */
interface Target {
  session: string;
  name: string | undefined;
  part: string | undefined;
}

/** The routes' state: the store, the limits, and the uploads being received now. */
class CheckpointRoutes {
  readonly log: (line: string) => void;
  private readonly tokens: SessionTokens;
  private readonly maxBytes: number;
  private readonly maxConcurrentUploads: number;
  private readonly uploadTimeoutMs: number;
  private readonly uploadIdleTimeoutMs: number;
  private readonly store: CheckpointStore;
  /** Uploads being received now. */
  private activeUploads = 0;

  constructor(options: CheckpointHandlerOptions) {
    this.tokens = options.tokens;
    const keep = options.keep ?? 3;
    this.maxBytes = options.maxBytes ?? 256 * 1024 * 1024;
    const maxDiskBytes = options.maxDiskBytes ?? 4 * 1024 * 1024 * 1024;
    this.maxConcurrentUploads = options.maxConcurrentUploads ?? 4;
    this.uploadTimeoutMs = options.uploadTimeoutMs ?? 60_000;
    this.uploadIdleTimeoutMs = options.uploadIdleTimeoutMs ?? 15_000;
    this.log = options.log ?? (() => {});
    const positiveInteger = (name: string, v: number) => {
      if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`${name} must be a positive integer, got ${v}`);
    };
    positiveInteger('keep', keep);
    if (!Number.isSafeInteger(this.maxBytes) || this.maxBytes < PREAMBLE_BYTES + CHECKSUM_BYTES) {
      throw new RangeError(`maxBytes must be an integer of at least ${PREAMBLE_BYTES + CHECKSUM_BYTES}, got ${this.maxBytes}`);
    }
    positiveInteger('maxDiskBytes', maxDiskBytes);
    positiveInteger('maxConcurrentUploads', this.maxConcurrentUploads);
    positiveInteger('uploadTimeoutMs', this.uploadTimeoutMs);
    positiveInteger('uploadIdleTimeoutMs', this.uploadIdleTimeoutMs);
    this.store = checkpointStore({ dir: options.dir, keep, maxDiskBytes, log: this.log, onVerify: options.onVerify });
  }

  async route(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    const target = parseTarget(res, url);
    if (target === undefined) return;
    const { session, name, part } = target;
    // Before anything reads or writes the session's folder.
    const token = await authorize(this.tokens, req, session);
    const folder = this.store.folder(session, part);
    const where = part === undefined ? `session "${session}"` : `part "${part}" of session "${session}"`;

    if (name === undefined) {
      if (req.method === 'POST' || req.method === 'PUT') return this.upload(req, res, session, token, folder);
      if (req.method === 'GET')
        return sendJson(res, 200, { session, ...(part === undefined ? {} : { part }), checkpoints: await this.store.list(folder) });
      return methodNotAllowed(res, 'GET, POST, PUT');
    }
    if (req.method !== 'GET') return methodNotAllowed(res, 'GET');
    if (name === 'latest') return this.sendLatest(res, where, folder);
    if (!CHECKPOINT_NAME.test(name)) {
      const list = `${PREFIX}/${session}${part === undefined ? '' : `?part=${part}`}`;
      return sendError(res, 400, 'bad-name', `${JSON.stringify(name)} is not a checkpoint name (list them at ${list})`);
    }
    const fh = await this.store.openCheckpoint(folder, name);
    if (fh === null) return sendError(res, 404, 'not-found', `${where} has no checkpoint ${name}`);
    await sendFile(res, fh, name, []);
  }

  /** Stores an upload in `folder`: the session's folder, or one of its parts'. */
  private async upload(req: IncomingMessage, res: ServerResponse, session: string, token: string, folder: string): Promise<void> {
    const declared = this.admitUpload(req);
    // Claimed before the first await, so that concurrent uploads each see the others (the store
    // reserves their disk the same way).
    this.activeUploads++;
    try {
      const saved = await this.store.save(
        folder,
        declared,
        () => new BodyReader(req, declared, this.uploadTimeoutMs, this.uploadIdleTimeoutMs),
        async () => {
          // The token must outlive this process once the session has a checkpoint; checked again in
          // case the session was dropped and claimed by someone else while the body arrived.
          await this.tokens.persist(session);
          if ((await this.tokens.verify(session, token)) !== 'ok')
            throw new Refusal(403, 'forbidden', `session "${session}" now has another token: nothing was stored`);
        },
      );
      sendJson(res, 201, { name: saved.name, bytes: saved.bytes, step: saved.step });
    } catch (err) {
      if (err instanceof CheckpointRefused) throw new Refusal(STORE_REFUSAL_STATUS[err.code], err.code, err.message);
      throw err;
    } finally {
      this.activeUploads--;
    }
  }

  /** An upload's declared length, once its type, length and a free slot allow it; a Refusal otherwise. */
  private admitUpload(req: IncomingMessage): number {
    const type = (req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
    if (type !== 'application/octet-stream') {
      const sent = type === '' ? 'no Content-Type' : `Content-Type ${JSON.stringify(type)}`;
      throw new Refusal(
        415,
        'unsupported-media-type',
        `a checkpoint upload must be sent as "Content-Type: application/octet-stream", not with ${sent}`,
      );
    }
    const lengthHeader = req.headers['content-length'];
    if (lengthHeader === undefined) {
      // The length is what the disk budget reserves and what the preamble is checked against.
      throw new Refusal(
        411,
        'length-required',
        'a checkpoint upload needs a Content-Length header: send the whole container as one body (fetch with a Uint8Array does), not chunked',
      );
    }
    const declared = Number(lengthHeader); // node's parser has already refused a malformed one
    if (declared > this.maxBytes) {
      throw new Refusal(
        413,
        'too-large',
        `checkpoint upload is ${declared} bytes; this server accepts at most ${this.maxBytes} bytes (checkpointHandler maxBytes)`,
      );
    }
    if (this.activeUploads >= this.maxConcurrentUploads) {
      throw new Refusal(
        503,
        'busy',
        `the server is receiving ${this.activeUploads} checkpoint uploads, the most it takes at once (maxConcurrentUploads): retry in ${RETRY_AFTER_S} s`,
        { 'retry-after': String(RETRY_AFTER_S) },
      );
    }
    return declared;
  }

  /** `where` names the folder for messages: `session "<session>"` or `part "<part>" of session "<session>"`. */
  private async sendLatest(res: ServerResponse, where: string, folder: string): Promise<void> {
    const { found, skipped } = await this.store.latest(folder);
    for (const s of skipped) this.log(`[checkpoints] ${where}: skipping ${s.name}: ${s.reason}`);
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
 * The session, name and part a path names, checked before the token (nothing on disk is touched
 * for a path that names nothing); undefined once a 400 or 404 is sent.
 */
function parseTarget(res: ServerResponse, url: URL): Target | undefined {
  const pathname = url.pathname;
  const parts = pathname.slice(PREFIX.length + 1).split('/');
  if (parts.length > 1 && parts.at(-1) === '') parts.pop();
  let segments: string[];
  try {
    segments = parts.map(decodeURIComponent);
  } catch {
    sendError(res, 400, 'bad-path', `the path ${pathname} is not valid percent-encoding`);
    return undefined;
  }
  const [session, name, ...extra] = segments;
  const partNames = url.searchParams.getAll('part');
  const part = partNames[0];
  if (!session) sendError(res, 404, 'not-found', `name a session: ${PREFIX}/<session>`);
  else if (!validSession(session)) {
    sendError(
      res,
      400,
      'bad-session',
      `session name ${JSON.stringify(session)} is not allowed: use 1-64 of A-Z a-z 0-9 _ . - (not "." or "..")`,
    );
  } else if (partNames.length > 1) sendError(res, 400, 'bad-part', `give one part (?part=<part>), not ${partNames.length}`);
  else if (part !== undefined && !CHECKPOINT_PART.test(part)) {
    sendError(res, 400, 'bad-part', `part name ${JSON.stringify(part.slice(0, 100))} is not allowed: use ${CHECKPOINT_PART_RULE}`);
  } else if (extra.length > 0) sendError(res, 404, 'not-found', `no such resource: ${pathname}`);
  else return { session, name, part };
  return undefined;
}
