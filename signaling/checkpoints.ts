/**
 * Checkpoint storage on the server's disk, under `/api/checkpoints/`:
 *
 *   POST|PUT /api/checkpoints/<session>          upload a container (src/checkpoint.ts); 201 {name, bytes, step}
 *   GET      /api/checkpoints/<session>          list: {session, checkpoints: [{name, bytes, step, mtime}]}, oldest first
 *   GET      /api/checkpoints/<session>/latest   the newest checkpoint that verifies; headers x-checkpoint-name,
 *                                                x-checkpoint-skipped (JSON [{name, reason}] of newer corrupt ones);
 *                                                404 {error: 'no-checkpoint'} when there is none, 409 when none verifies
 *   GET      /api/checkpoints/<session>/<name>   that checkpoint, as stored (the client verifies it)
 *
 * Parts: each route takes an optional `?part=<part>` (e.g. `POST /api/checkpoints/<session>?part=stage-0`,
 * `GET /api/checkpoints/<session>/latest?part=stage-0`). A part is one share of a run's state saved
 * apart from the others (each pipeline stage saves its own): it lives in its own folder, keeps its
 * own last `keep`, and its list and `latest` see only its files; without `?part` the routes see
 * only the session's own files, as before parts existed, and pruning them never touches a part.
 * A part's name must match CHECKPOINT_PART (src/checkpoint_format.ts: 1-32 of a-z 0-9 -, the
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
 * Errors are JSON {error, message}. Files live in `<dir>/<session>/<name>.ckpt`, a part's in
 * `<dir>/<session>/parts/<part>/<name>.ckpt` (a folder name no checkpoint name can take); an upload is
 * written to a .tmp file, verified, fsynced and renamed, so a crash at any point leaves the
 * earlier checkpoints intact. Names are `<UTC time>-step-<step>`: sorting them sorts by write
 * time, so the newest is last even when a restarted run saves a lower step.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Stats } from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, open, readdir, rename, rmdir, stat, unlink, type FileHandle } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import { dirname, join, resolve } from 'node:path';
import { SESSION_NAME } from '../src/protocol.ts';
import type { SessionTokens } from './session_tokens.ts';
import {
  CHECKPOINT_PART,
  CHECKPOINT_PART_RULE,
  CHECKSUM_BYTES,
  PREAMBLE_BYTES,
  CheckpointCorruptError,
  checksumMismatch,
  parseHeader,
  readPreamble,
  type CheckpointHeader,
  type ContainerLayout,
} from '../src/checkpoint_format.ts';

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

export interface Skipped {
  name: string;
  reason: string;
}

export interface ValidCheckpoint {
  name: string;
  path: string;
  bytes: number;
  meta: Record<string, unknown>;
  /** Newer checkpoints that failed verification, newest first. */
  skipped: Skipped[];
}

/** A verified checkpoint, still open so that a concurrent prune cannot delete it before it is sent. */
interface OpenCheckpoint<T> {
  name: string;
  fh: FileHandle;
  size: number;
  /** What the verification gave. */
  verified: T;
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
/** The folder, inside a session's, that holds one folder per part. */
const PARTS_DIR = 'parts';
const EXT = '.ckpt';
const TMP_EXT = '.tmp';
/** `<YYYYMMDD>T<HHMMSSmmm>Z` with an optional `-step-<n>`. */
const CHECKPOINT_NAME = /^(\d{8})T(\d{2})(\d{2})(\d{2})(\d{3})Z(?:-step-(\d{1,16}))?$/;
/** A .tmp file nobody has written to for this long belongs to a crashed or abandoned upload. */
const STALE_TMP_MS = 15 * 60_000;
const READ_CHUNK = 1 << 20;
/** The JSON header is held in memory while it is checked, before anything is written: cap it. */
const MAX_HEADER_BYTES = 16 * 1024 * 1024;
/** Files whose verification `latest` remembers. */
const VERIFIED_CACHE_ENTRIES = 1024;
/** What a 503 suggests; uploads are short, so a few seconds is enough for a slot to free. */
const RETRY_AFTER_S = 5;
/** `Authorization: Bearer <token>`; the scheme is case-insensitive (RFC 7235). */
const BEARER = /^Bearer +(\S+) *$/i;

export function checkpointHandler(options: CheckpointHandlerOptions): (req: IncomingMessage, res: ServerResponse) => Promise<boolean> {
  const dir = resolve(options.dir);
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

  /** Uploads in progress in this process: their .tmp files are not stale, and not counted twice. */
  const uploading = new Set<string>();
  let activeUploads = 0;
  /** Content-Length of the uploads in progress: disk they are about to use. */
  let reservedBytes = 0;
  const verifiedFiles = new VerifiedFiles(VERIFIED_CACHE_ENTRIES);
  /** The last name's time, so that two saves in one millisecond still get ordered, distinct names. */
  let lastNameMs = 0;

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
    const sessionDir = join(dir, session);
    const folder = part === undefined ? sessionDir : join(sessionDir, PARTS_DIR, part);
    const where = part === undefined ? `session "${session}"` : `part "${part}" of session "${session}"`;

    if (name === undefined) {
      if (req.method === 'POST' || req.method === 'PUT') return upload(req, res, session, token, folder);
      if (req.method === 'GET') return sendJson(res, 200, { session, ...(part === undefined ? {} : { part }), checkpoints: await listCheckpointFiles(folder) });
      return methodNotAllowed(res, 'GET, POST, PUT');
    }
    if (req.method !== 'GET') return methodNotAllowed(res, 'GET');
    if (name === 'latest') return sendLatest(res, where, folder);
    if (!CHECKPOINT_NAME.test(name)) {
      const list = `${PREFIX}/${session}${part === undefined ? '' : `?part=${part}`}`;
      return sendError(res, 400, 'bad-name', `${JSON.stringify(name)} is not a checkpoint name (list them at ${list})`);
    }
    let fh: FileHandle;
    try {
      fh = await open(join(folder, name + EXT), 'r');
    } catch (err) {
      if (isCode(err, 'ENOENT')) return sendError(res, 404, 'not-found', `${where} has no checkpoint ${name}`);
      throw err;
    }
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
    // Claimed before the first await, so that concurrent uploads each see the others.
    activeUploads++;
    reservedBytes += declared;
    let reserved = true;
    let tmp: string | undefined;
    let fh: FileHandle | undefined;
    /** The topmost folder this upload made, until it stored a checkpoint in it. */
    let madeFolder: string | undefined;
    try {
      await checkDiskBudget(declared);
      const body = new BodyReader(req, declared, uploadTimeoutMs, uploadIdleTimeoutMs);
      let header: CheckpointHeader;
      let size: number;
      try {
        const head = await readContainerHead(body, declared);
        // New folders must themselves survive a crash, so the parent of each new one is synced too.
        const created = await mkdir(folder, { recursive: true });
        madeFolder = created;
        if (created !== undefined) {
          for (let made = folder; ; made = dirname(made)) {
            await syncDir(dirname(made));
            if (made === created || made === dir) break;
          }
        }
        tmp = join(folder, `upload-${Date.now()}-${randomBytes(6).toString('hex')}${TMP_EXT}`);
        uploading.add(tmp);
        fh = await open(tmp, 'wx+');
        await fh.write(head);
        size = head.length;
        for (let chunk = await body.next(); chunk !== null; chunk = await body.next()) {
          size += chunk.length;
          await fh.write(chunk);
        }
        await fh.sync();
        header = await verifyOpen(fh, size, tmp);
      } catch (err) {
        if (!(err instanceof CheckpointCorruptError)) throw err;
        throw new Refusal(400, 'corrupt', `checkpoint upload refused: ${err.reason} (nothing was stored: save the checkpoint again)`);
      }
      await fh.close();
      fh = undefined;
      const step = stepOf(header.meta);
      // The token must outlive this process once the session has a checkpoint; checked again in
      // case the session was dropped and claimed by someone else while the body arrived.
      await tokens.persist(session);
      if ((await tokens.verify(session, token)) !== 'ok') throw new Refusal(403, 'forbidden', `session "${session}" now has another token: nothing was stored`);
      const name = nextName(await checkpointNames(folder), step);
      const path = join(folder, name + EXT);
      await rename(tmp, path);
      madeFolder = undefined;
      uploading.delete(tmp);
      reservedBytes -= declared;
      reserved = false;
      // Verified above: `latest` need not hash it again while it stays as written.
      verifiedFiles.set(path, await stat(path), null);
      await syncDir(folder);
      await prune(folder);
      sendJson(res, 201, { name, bytes: size, step });
    } catch (err) {
      if (isCode(err, 'ENOSPC')) {
        throw new Refusal(507, 'insufficient-storage', `the server's disk is full: the checkpoint was not stored; ask the server's operator to free space`);
      }
      throw err;
    } finally {
      // Cleaned up before the refusal is answered, so a client that sees it finds no leftovers.
      await fh?.close().catch(() => {});
      if (tmp !== undefined && uploading.delete(tmp)) await unlink(tmp).catch(() => {});
      // A refused upload leaves no folder behind (the token file may have been written: then it stays).
      if (madeFolder !== undefined) {
        for (let f = folder; ; f = dirname(f)) {
          if (!(await rmdir(f).then(() => true, () => false))) break;
          if (f === madeFolder || f === dir) break;
        }
      }
      if (reserved) reservedBytes -= declared;
      activeUploads--;
    }
  }

  /** Refuses an upload (507) that would take the stored checkpoints of all sessions past maxDiskBytes. */
  async function checkDiskBudget(declared: number): Promise<void> {
    // reservedBytes includes this upload; the files of uploads in progress are left out of the scan.
    const stored = await storedBytes(dir, uploading);
    const used = stored + reservedBytes - declared;
    if (stored + reservedBytes <= maxDiskBytes) return;
    log(`[checkpoints] disk budget: ${stored} bytes stored in ${dir}, ${reservedBytes - declared} being uploaded, limit ${maxDiskBytes}`);
    throw new Refusal(
      507,
      'insufficient-storage',
      `the server's checkpoint storage is full: ${used} bytes are stored or being uploaded (all sessions) and this upload of ${declared} bytes would pass its limit of ${maxDiskBytes} bytes (maxDiskBytes); ask the server's operator to delete old checkpoints or raise the limit`,
    );
  }

  /**
   * Reads the preamble and the JSON header from the body and checks them against the declared
   * length, before anything is written. Returns the bytes read so far (to be written first).
   */
  async function readContainerHead(body: BodyReader, declared: number): Promise<Buffer> {
    const preamble = await body.firstBytes(Math.min(declared, PREAMBLE_BYTES));
    const layout = readPreamble(preamble.subarray(0, PREAMBLE_BYTES), declared);
    if (layout.headerBytes > MAX_HEADER_BYTES) {
      throw new Refusal(413, 'too-large', `the checkpoint's JSON header is ${layout.headerBytes} bytes; this server reads headers of at most ${MAX_HEADER_BYTES} bytes (keep large data in the weight sections)`);
    }
    const headerEnd = PREAMBLE_BYTES + layout.headerBytes;
    const head = await body.firstBytes(headerEnd);
    checkSectionSizes(parseHeader(head.subarray(PREAMBLE_BYTES, headerEnd)), layout);
    return head;
  }

  function tooLarge(what: string): Refusal {
    return new Refusal(413, 'too-large', `checkpoint upload is ${what}; this server accepts at most ${maxBytes} bytes (checkpointHandler maxBytes)`);
  }

  /** Names sort by time; anything not newer than the newest on disk (clock skew) is moved past it. */
  function nextName(existing: string[], step: number | null): string {
    const newest = existing.at(-1);
    const newestMs = newest === undefined ? 0 : nameTime(newest);
    const ms = Math.max(Date.now(), lastNameMs + 1, newestMs + 1);
    lastNameMs = ms;
    const time = new Date(ms).toISOString().replace(/[-:.]/g, '');
    return step === null ? time : `${time}-step-${String(step).padStart(8, '0')}`;
  }

  /**
   * Deletes the oldest checkpoints beyond `keep`, and .tmp files of uploads that died, in one
   * folder (a session's or a part's): a part's folder is not a checkpoint file, so the session's
   * pruning never reaches into it.
   */
  async function prune(folder: string): Promise<void> {
    const names = await checkpointNames(folder);
    for (const old of names.slice(0, Math.max(0, names.length - keep))) {
      const path = join(folder, old + EXT);
      verifiedFiles.delete(path);
      await unlink(path).catch(() => {});
    }
    for (const file of await readdir(folder)) {
      const path = join(folder, file);
      if (!file.endsWith(TMP_EXT) || uploading.has(path)) continue;
      const info = await stat(path).catch(() => undefined);
      if (info && Date.now() - info.mtimeMs > STALE_TMP_MS) await unlink(path).catch(() => {});
    }
  }

  /** `where` names the folder for messages: `session "<session>"` or `part "<part>" of session "<session>"`. */
  async function sendLatest(res: ServerResponse, where: string, folder: string): Promise<void> {
    const { found, skipped } = await findLatest(folder, verifyRemembered);
    for (const s of skipped) log(`[checkpoints] ${where}: skipping ${s.name}: ${s.reason}`);
    if (found) return sendFile(res, found.fh, found.name, skipped);
    if (skipped.length === 0) return sendError(res, 404, 'no-checkpoint', `${where} has no checkpoint`);
    // Not "none": starting afresh would soon prune checkpoints someone may want to rescue.
    const list = skipped.map((s) => `${s.name} (${s.reason})`).join('; ');
    sendError(res, 409, 'all-corrupt', `${where} has ${skipped.length} checkpoint(s) and none verifies: ${list}`);
  }

  /** verifyOpen, unless this file was verified (or found corrupt) as it is now. */
  async function verifyRemembered(fh: FileHandle, path: string, info: Stats): Promise<void> {
    const known = verifiedFiles.get(path, info);
    if (known === null) return;
    if (known !== undefined) throw known;
    try {
      await verifyOpen(fh, info.size, path);
      verifiedFiles.set(path, info, null);
    } catch (err) {
      if (err instanceof CheckpointCorruptError) verifiedFiles.set(path, info, err);
      throw err;
    }
  }

  /** Verifies a container on disk: preamble against the size, SHA-256, header. Throws CheckpointCorruptError. */
  async function verifyOpen(fh: FileHandle, size: number, path: string): Promise<CheckpointHeader> {
    onVerify?.(path, size);
    return verifyContainer(fh, size);
  }
}

/** The newest checkpoint of a session (or of one of its parts) that verifies (magic, lengths, SHA-256, header), or null. */
export async function latestValidCheckpoint(dir: string, session: string, part?: string): Promise<ValidCheckpoint | null> {
  if (!validSession(session)) throw new TypeError(`session name ${JSON.stringify(session)} is not allowed`);
  if (part !== undefined && !CHECKPOINT_PART.test(part)) throw new RangeError(`part name ${JSON.stringify(part)} is not allowed: use ${CHECKPOINT_PART_RULE}`);
  const sessionDir = join(resolve(dir), session);
  const folder = part === undefined ? sessionDir : join(sessionDir, PARTS_DIR, part);
  const { found, skipped } = await findLatest(folder, (fh, _path, info) => verifyContainer(fh, info.size));
  if (!found) return null;
  await found.fh.close();
  return { name: found.name, path: join(folder, found.name + EXT), bytes: found.size, meta: found.verified.meta, skipped };
}

// ---------------------------------------------------------------------------------------------

function validSession(session: string): boolean {
  // The pattern admits "." and "..", which would name the folder itself or its parent.
  return SESSION_NAME.test(session) && session !== '.' && session !== '..';
}

/**
 * An upload's body, chunk by chunk, within a deadline for the whole body and a shorter one for
 * each wait (a client that stalls). Failures are Refusals: 408 on time, 400 when it broke off.
 */
class BodyReader {
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

/** Bytes per element of the dtypes TF.js stores (a quantized weight stores its quantization dtype). */
const DTYPE_BYTES = new Map<string, number>([
  ['float32', 4],
  ['int32', 4],
  ['bool', 1],
  ['complex64', 8],
  ['float16', 2],
  ['uint8', 1],
  ['uint16', 2],
]);

/**
 * Checks that the header's weight specs describe exactly the sections' lengths. A section with a
 * string tensor (variable length) or a dtype this server does not know is left to the client.
 */
function checkSectionSizes(header: CheckpointHeader, layout: ContainerLayout): void {
  const sections = [
    ['model', header.model.weightSpecs, layout.modelBytes],
    ['optimizer', header.optimizer.weightSpecs, layout.optimizerBytes],
  ] as const;
  for (const [where, specs, bytes] of sections) {
    let total = 0;
    for (const spec of specs) {
      const quantization: unknown = (spec as { quantization?: unknown }).quantization;
      const dtype = typeof quantization === 'object' && quantization !== null && 'dtype' in quantization && typeof quantization.dtype === 'string' ? quantization.dtype : spec.dtype;
      const size = DTYPE_BYTES.get(dtype);
      if (size === undefined) {
        total = NaN;
        break;
      }
      total += size * spec.shape.reduce((a, b) => a * b, 1);
    }
    if (!Number.isNaN(total) && total !== bytes) {
      throw new CheckpointCorruptError('header', `the header's ${where}.weightSpecs describe ${total} bytes of tensors but the ${where} section holds ${bytes} bytes`);
    }
  }
}

/**
 * Verification results of stored files, valid while a file stays as it was: same inode, size,
 * mtime and ctime (a write or a utimes that restores the mtime still changes the ctime). Bounded:
 * the least recently used entries go first.
 */
class VerifiedFiles {
  private readonly entries = new Map<string, { stamp: string; result: CheckpointCorruptError | null }>();

  constructor(private readonly limit: number) {}

  /** null: verified; an error: found corrupt; undefined: not known for the file as it is now. */
  get(path: string, info: Stats): CheckpointCorruptError | null | undefined {
    const entry = this.entries.get(path);
    if (entry === undefined || entry.stamp !== stampOf(info)) return undefined;
    this.entries.delete(path);
    this.entries.set(path, entry);
    return entry.result;
  }

  set(path: string, info: Stats, result: CheckpointCorruptError | null): void {
    this.entries.delete(path);
    this.entries.set(path, { stamp: stampOf(info), result });
    if (this.entries.size > this.limit) this.entries.delete(this.entries.keys().next().value!);
  }

  delete(path: string): void {
    this.entries.delete(path);
  }
}

function stampOf(info: Stats): string {
  return `${info.dev}:${info.ino}:${info.size}:${info.mtimeMs}:${info.ctimeMs}`;
}

/**
 * Bytes of checkpoint and .tmp files of all sessions under `dir`, their parts' included, leaving
 * out the files in `skip`.
 */
async function storedBytes(dir: string, skip: ReadonlySet<string>): Promise<number> {
  const perSession = await Promise.all(
    (await subfolders(dir)).map(async (sessionDir) => {
      const folders = [sessionDir, ...(await subfolders(join(sessionDir, PARTS_DIR)))];
      let sum = 0;
      for (const folder of folders) {
        for (const file of await readdir(folder).catch(() => [])) {
          const path = join(folder, file);
          if ((!file.endsWith(EXT) && !file.endsWith(TMP_EXT)) || skip.has(path)) continue;
          const info = await stat(path).catch(() => undefined);
          if (info?.isFile()) sum += info.size;
        }
      }
      return sum;
    }),
  );
  return perSession.reduce((a, b) => a + b, 0);
}

/** The folders directly inside `folder`; none when it does not exist. */
async function subfolders(folder: string): Promise<string[]> {
  try {
    return (await readdir(folder, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => join(folder, e.name));
  } catch (err) {
    if (isCode(err, 'ENOENT') || isCode(err, 'ENOTDIR')) return [];
    throw err;
  }
}

/** Checkpoint names in a session's or a part's folder, oldest first; none when the folder does not exist. */
async function checkpointNames(folder: string): Promise<string[]> {
  let files: string[];
  try {
    files = await readdir(folder);
  } catch (err) {
    if (isCode(err, 'ENOENT')) return [];
    throw err;
  }
  return files
    .filter((f) => f.endsWith(EXT))
    .map((f) => f.slice(0, -EXT.length))
    .filter((n) => CHECKPOINT_NAME.test(n))
    .sort();
}

async function listCheckpointFiles(folder: string): Promise<Array<{ name: string; bytes: number; step: number | null; mtime: string }>> {
  const out = [];
  for (const name of await checkpointNames(folder)) {
    const info = await stat(join(folder, name + EXT)).catch(() => undefined);
    if (!info) continue; // pruned meanwhile
    const step = CHECKPOINT_NAME.exec(name)?.[6];
    out.push({ name, bytes: info.size, step: step === undefined ? null : Number(step), mtime: info.mtime.toISOString() });
  }
  return out;
}

function nameTime(name: string): number {
  const m = CHECKPOINT_NAME.exec(name);
  if (!m) return 0;
  const [, ymd, hh, mi, ss, ms] = m;
  return Date.UTC(Number(ymd.slice(0, 4)), Number(ymd.slice(4, 6)) - 1, Number(ymd.slice(6, 8)), Number(hh), Number(mi), Number(ss), Number(ms));
}

function stepOf(meta: Record<string, unknown>): number | null {
  const step = meta.step;
  return typeof step === 'number' && Number.isSafeInteger(step) && step >= 0 ? step : null;
}

/** Walks from the newest checkpoint back to the first that `verify` accepts, noting the ones it does not. */
async function findLatest<T>(
  folder: string,
  verify: (fh: FileHandle, path: string, info: Stats) => Promise<T>,
): Promise<{ found: OpenCheckpoint<T> | null; skipped: Skipped[] }> {
  const skipped: Skipped[] = [];
  for (const name of (await checkpointNames(folder)).reverse()) {
    const path = join(folder, name + EXT);
    let fh: FileHandle;
    try {
      fh = await open(path, 'r');
    } catch (err) {
      if (isCode(err, 'ENOENT')) continue;
      throw err;
    }
    try {
      const info = await fh.stat();
      const verified = await verify(fh, path, info);
      return { found: { name, fh, size: info.size, verified }, skipped };
    } catch (err) {
      await fh.close();
      if (!(err instanceof CheckpointCorruptError)) throw err;
      skipped.push({ name, reason: err.reason });
    }
  }
  return { found: null, skipped };
}

/** Verifies a container on disk: preamble against the size, SHA-256, header. Throws CheckpointCorruptError. */
async function verifyContainer(fh: FileHandle, size: number): Promise<CheckpointHeader> {
  const head = await readAt(fh, 0, Math.min(size, PREAMBLE_BYTES));
  const layout = readPreamble(head, size);
  const bodyEnd = layout.total - CHECKSUM_BYTES;
  const hash = createHash('sha256');
  for (let at = 0; at < bodyEnd; at += READ_CHUNK) hash.update(await readAt(fh, at, Math.min(READ_CHUNK, bodyEnd - at)));
  if (!hash.digest().equals(await readAt(fh, bodyEnd, CHECKSUM_BYTES))) throw checksumMismatch();
  return parseHeader(await readAt(fh, PREAMBLE_BYTES, layout.headerBytes));
}

async function readAt(fh: FileHandle, position: number, length: number): Promise<Buffer> {
  const buf = Buffer.alloc(length);
  let got = 0;
  while (got < length) {
    const { bytesRead } = await fh.read(buf, got, length - got, position + got);
    if (bytesRead === 0) break; // the file shrank under us; verification then fails on content
    got += bytesRead;
  }
  return buf.subarray(0, got);
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

function isCode(err: unknown, code: string): boolean {
  return err instanceof Error && (err as NodeJS.ErrnoException).code === code;
}

/** fsync a folder so a rename or a new entry in it survives a crash. Not every platform allows it. */
async function syncDir(path: string): Promise<void> {
  let fh: FileHandle | undefined;
  try {
    fh = await open(path, 'r');
    await fh.sync();
  } catch (err) {
    if (!isCode(err, 'EISDIR') && !isCode(err, 'EPERM') && !isCode(err, 'EINVAL')) throw err;
  } finally {
    await fh?.close();
  }
}
