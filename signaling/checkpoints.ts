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
 * Errors are JSON {error, message}. Files live in `<dir>/<session>/<name>.ckpt`; an upload is
 * written to a .tmp file, verified, fsynced and renamed, so a crash at any point leaves the
 * earlier checkpoints intact. Names are `<UTC time>-step-<step>`: sorting them sorts by write
 * time, so the newest is last even when a restarted run saves a lower step.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, open, readdir, rename, stat, unlink, type FileHandle } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import { dirname, join, resolve } from 'node:path';
import { SESSION_NAME } from '../src/protocol.ts';
import type { SessionTokens } from './session_tokens.ts';
import {
  CHECKSUM_BYTES,
  PREAMBLE_BYTES,
  CheckpointCorruptError,
  checksumMismatch,
  parseHeader,
  readPreamble,
  type CheckpointHeader,
} from '../src/checkpoint_format.ts';

export interface CheckpointHandlerOptions {
  /** Where checkpoints are kept: one folder per session. Created when needed. */
  dir: string;
  /** The sessions' tokens: every route checks `Authorization: Bearer <token>` against them. */
  tokens: SessionTokens;
  /** How many checkpoints each session keeps; older ones are deleted after a save. Default 3. */
  keep?: number;
  /** Largest upload accepted, in bytes. Default 256 MiB. */
  maxBytes?: number;
  /** Where notes about corrupt or refused checkpoints go. Default: nowhere. */
  log?: (line: string) => void;
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
interface OpenCheckpoint {
  name: string;
  fh: FileHandle;
  size: number;
  header: CheckpointHeader;
}

const PREFIX = '/api/checkpoints';
const EXT = '.ckpt';
const TMP_EXT = '.tmp';
/** `<YYYYMMDD>T<HHMMSSmmm>Z` with an optional `-step-<n>`. */
const CHECKPOINT_NAME = /^(\d{8})T(\d{2})(\d{2})(\d{2})(\d{3})Z(?:-step-(\d{1,16}))?$/;
/** A .tmp file nobody has written to for this long belongs to a crashed or abandoned upload. */
const STALE_TMP_MS = 15 * 60_000;
const READ_CHUNK = 1 << 20;

export function checkpointHandler(options: CheckpointHandlerOptions): (req: IncomingMessage, res: ServerResponse) => Promise<boolean> {
  const dir = resolve(options.dir);
  const keep = options.keep ?? 3;
  const maxBytes = options.maxBytes ?? 256 * 1024 * 1024;
  const log = options.log ?? (() => {});
  if (!Number.isSafeInteger(keep) || keep < 1) throw new RangeError(`keep must be a positive integer, got ${keep}`);
  if (!Number.isSafeInteger(maxBytes) || maxBytes < PREAMBLE_BYTES + CHECKSUM_BYTES) {
    throw new RangeError(`maxBytes must be an integer of at least ${PREAMBLE_BYTES + CHECKSUM_BYTES}, got ${maxBytes}`);
  }
  /** Uploads in progress in this process: their .tmp files are not stale. */
  const uploading = new Set<string>();
  /** The last name's time, so that two saves in one millisecond still get ordered, distinct names. */
  let lastNameMs = 0;

  return async (req, res) => {
    let pathname: string;
    try {
      pathname = new URL(req.url ?? '/', 'http://x').pathname;
    } catch {
      return false; // not a path at all: not ours to answer
    }
    if (pathname !== PREFIX && !pathname.startsWith(`${PREFIX}/`)) return false;
    try {
      await route(req, res, pathname);
    } catch (err) {
      log(`[checkpoints] ${req.method} ${pathname} failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
      if (!res.headersSent) sendError(res, 500, 'internal', `the server could not handle this: ${String(err)}`);
      else res.destroy();
    }
    return true;
  };

  async function route(req: IncomingMessage, res: ServerResponse, pathname: string): Promise<void> {
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
    if (extra.length > 0) return sendError(res, 404, 'not-found', `no such resource: ${pathname}`);
    const sessionDir = join(dir, session);

    if (name === undefined) {
      if (req.method === 'POST' || req.method === 'PUT') return upload(req, res, session, sessionDir);
      if (req.method === 'GET') return sendJson(res, 200, { session, checkpoints: await listCheckpointFiles(sessionDir) });
      return methodNotAllowed(res, 'GET, POST, PUT');
    }
    if (req.method !== 'GET') return methodNotAllowed(res, 'GET');
    if (name === 'latest') return sendLatest(res, session, sessionDir);
    if (!CHECKPOINT_NAME.test(name)) {
      return sendError(res, 400, 'bad-name', `${JSON.stringify(name)} is not a checkpoint name (list them at ${PREFIX}/${session})`);
    }
    let fh: FileHandle;
    try {
      fh = await open(join(sessionDir, name + EXT), 'r');
    } catch (err) {
      if (isCode(err, 'ENOENT')) return sendError(res, 404, 'not-found', `session "${session}" has no checkpoint ${name}`);
      throw err;
    }
    await sendFile(res, fh, name, []);
  }

  async function upload(req: IncomingMessage, res: ServerResponse, session: string, sessionDir: string): Promise<void> {
    const declared = Number(req.headers['content-length']);
    if (declared > maxBytes) return tooLarge(res, `${declared} bytes`);
    // A new session folder must itself survive a crash, so its parent is synced too.
    if ((await mkdir(sessionDir, { recursive: true })) !== undefined) await syncDir(dirname(sessionDir));
    const tmp = join(sessionDir, `upload-${Date.now()}-${randomBytes(6).toString('hex')}${TMP_EXT}`);
    uploading.add(tmp);
    try {
      const fh = await open(tmp, 'wx+');
      let size = 0;
      let header: CheckpointHeader | CheckpointCorruptError;
      try {
        for await (const chunk of req as AsyncIterable<Buffer>) {
          size += chunk.length;
          if (size > maxBytes) {
            // Answer without reading the rest: leaving the loop destroys the request, and
            // `connection: close` tells the client the connection ends here.
            tooLarge(res, `more than ${maxBytes} bytes`);
            break;
          }
          await fh.write(chunk);
        }
        if (size > maxBytes) return;
        await fh.sync();
        header = await verifyOpen(fh, size).catch((err: unknown) => {
          if (err instanceof CheckpointCorruptError) return err;
          throw err;
        });
      } finally {
        await fh.close();
      }
      if (header instanceof CheckpointCorruptError) {
        log(`[checkpoints] session "${session}": refused an upload of ${size} bytes: ${header.reason}`);
        return sendError(res, 400, 'corrupt', `checkpoint upload refused: ${header.reason}`);
      }
      const step = stepOf(header.meta);
      const name = nextName(await checkpointNames(sessionDir), step);
      await rename(tmp, join(sessionDir, name + EXT));
      uploading.delete(tmp);
      await syncDir(sessionDir);
      await prune(sessionDir);
      sendJson(res, 201, { name, bytes: size, step });
    } finally {
      if (uploading.delete(tmp)) await unlink(tmp).catch(() => {});
    }
  }

  function tooLarge(res: ServerResponse, what: string): void {
    res.setHeader('connection', 'close');
    sendError(res, 413, 'too-large', `checkpoint upload is ${what}; this server accepts at most ${maxBytes} bytes (checkpointHandler maxBytes)`);
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

  /** Deletes the oldest checkpoints beyond `keep`, and .tmp files of uploads that died. */
  async function prune(sessionDir: string): Promise<void> {
    const names = await checkpointNames(sessionDir);
    for (const old of names.slice(0, Math.max(0, names.length - keep))) {
      await unlink(join(sessionDir, old + EXT)).catch(() => {});
    }
    for (const file of await readdir(sessionDir)) {
      const path = join(sessionDir, file);
      if (!file.endsWith(TMP_EXT) || uploading.has(path)) continue;
      const info = await stat(path).catch(() => undefined);
      if (info && Date.now() - info.mtimeMs > STALE_TMP_MS) await unlink(path).catch(() => {});
    }
  }

  async function sendLatest(res: ServerResponse, session: string, sessionDir: string): Promise<void> {
    const { found, skipped } = await findLatest(sessionDir);
    for (const s of skipped) log(`[checkpoints] session "${session}": skipping ${s.name}: ${s.reason}`);
    if (found) return sendFile(res, found.fh, found.name, skipped);
    if (skipped.length === 0) return sendError(res, 404, 'no-checkpoint', `session "${session}" has no checkpoint`);
    // Not "none": starting afresh would soon prune checkpoints someone may want to rescue.
    const list = skipped.map((s) => `${s.name} (${s.reason})`).join('; ');
    sendError(res, 409, 'all-corrupt', `session "${session}" has ${skipped.length} checkpoint(s) and none verifies: ${list}`);
  }
}

/** The newest checkpoint of a session that verifies (magic, lengths, SHA-256, header), or null. */
export async function latestValidCheckpoint(dir: string, session: string): Promise<ValidCheckpoint | null> {
  if (!validSession(session)) throw new TypeError(`session name ${JSON.stringify(session)} is not allowed`);
  const sessionDir = join(resolve(dir), session);
  const { found, skipped } = await findLatest(sessionDir);
  if (!found) return null;
  await found.fh.close();
  return { name: found.name, path: join(sessionDir, found.name + EXT), bytes: found.size, meta: found.header.meta, skipped };
}

// ---------------------------------------------------------------------------------------------

function validSession(session: string): boolean {
  // The pattern admits "." and "..", which would name the folder itself or its parent.
  return SESSION_NAME.test(session) && session !== '.' && session !== '..';
}

/** Checkpoint names in a session folder, oldest first; none when the folder does not exist. */
async function checkpointNames(sessionDir: string): Promise<string[]> {
  let files: string[];
  try {
    files = await readdir(sessionDir);
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

async function listCheckpointFiles(sessionDir: string): Promise<Array<{ name: string; bytes: number; step: number | null; mtime: string }>> {
  const out = [];
  for (const name of await checkpointNames(sessionDir)) {
    const info = await stat(join(sessionDir, name + EXT)).catch(() => undefined);
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

/** Walks from the newest checkpoint back to the first that verifies, noting the ones that do not. */
async function findLatest(sessionDir: string): Promise<{ found: OpenCheckpoint | null; skipped: Skipped[] }> {
  const skipped: Skipped[] = [];
  for (const name of (await checkpointNames(sessionDir)).reverse()) {
    let fh: FileHandle;
    try {
      fh = await open(join(sessionDir, name + EXT), 'r');
    } catch (err) {
      if (isCode(err, 'ENOENT')) continue;
      throw err;
    }
    try {
      const { size } = await fh.stat();
      const header = await verifyOpen(fh, size);
      return { found: { name, fh, size, header }, skipped };
    } catch (err) {
      await fh.close();
      if (!(err instanceof CheckpointCorruptError)) throw err;
      skipped.push({ name, reason: err.reason });
    }
  }
  return { found: null, skipped };
}

/** Verifies a container on disk: preamble against the size, SHA-256, header. Throws CheckpointCorruptError. */
async function verifyOpen(fh: FileHandle, size: number): Promise<CheckpointHeader> {
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
