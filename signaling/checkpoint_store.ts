/**
 * The checkpoint store: checkpoint files on the server's disk, with no HTTP in it (the routes
 * that serve it are signaling/checkpoints.ts). It lists, opens, verifies, writes and prunes
 * containers (src/checkpoint/checkpoint_format.ts), and keeps all sessions together within a disk budget.
 *
 * Files live in `<dir>/<session>/<name>.ckpt`, a part's in `<dir>/<session>/parts/<part>/<name>.ckpt`
 * (a folder name no checkpoint name can take); a save is written to a .tmp file, verified,
 * fsynced and renamed, so a crash at any point leaves the earlier checkpoints intact, and a
 * refused save leaves neither its .tmp nor a folder it made. Names are `<UTC time>-step-<step>`:
 * sorting them sorts by write time, so the newest is last even when a restarted run saves a
 * lower step. Each folder (a session's, or one part's) keeps its own last `keep`; pruning a
 * session's folder never touches its parts.
 */
import type { Stats } from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { open, readdir, rename, rmdir, stat, unlink, type FileHandle } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { SESSION_NAME } from '../src/wire/protocol.ts';
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
} from '../src/checkpoint/checkpoint_format.ts';
import { PRIVATE_FILE_MODE, privateFolder } from './private_files.ts';

export interface CheckpointStoreOptions {
  /** Where checkpoints are kept: one folder per session. Created when needed. */
  dir: string;
  /** How many checkpoints each session keeps (and each part of it, apart); older ones are deleted after a save. Default 3. */
  keep?: number;
  /**
   * Disk budget for all sessions together: stored checkpoints plus saves in progress (counted at
   * their declared length). A save that would pass it is refused ('insufficient-storage'). Default 4 GiB.
   */
  maxDiskBytes?: number;
  /** Where notes about refused saves go. Default: nowhere. */
  log?: (line: string) => void;
  /**
   * Called each time a stored checkpoint is read and hashed in full (a save, or a `latest`
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
export interface OpenCheckpoint<T> {
  name: string;
  fh: FileHandle;
  size: number;
  /** What the verification gave. */
  verified: T;
}

/** A checkpoint file as listed: `step` is the one in its name, null when it has none. */
export interface CheckpointFileInfo {
  name: string;
  bytes: number;
  step: number | null;
  /** When the file was written, ISO 8601. */
  mtime: string;
}

/** What a save stored: its name, its size, and meta.step (null when it had none). */
export interface SavedCheckpoint {
  name: string;
  bytes: number;
  step: number | null;
}

/**
 * Where a save's bytes come from (an upload's body): exactly the declared number of bytes, chunk
 * by chunk. Its own failures (a timeout, a broken connection) pass through `save` unchanged.
 */
export interface ByteSource {
  /** All bytes received so far, after reading until there are at least `n` (first call first). */
  firstBytes(n: number): Promise<Buffer>;
  /** The next chunk after those received so far, or null at the end. */
  next(): Promise<Buffer | null>;
}

/** Why the store refused a save: `code` is stable ('corrupt', 'too-large', 'insufficient-storage'), the message for a person. */
export class CheckpointRefused extends Error {
  override name = 'CheckpointRefused';
  constructor(
    readonly code: 'corrupt' | 'too-large' | 'insufficient-storage',
    message: string,
  ) {
    super(message);
  }
}

export interface CheckpointStore {
  /** The folder of all sessions, resolved. */
  readonly dir: string;
  /**
   * The folder of a session's own checkpoints, or of one of its parts'. Throws TypeError for a
   * session name, RangeError for a part name, that is not allowed. Touches nothing on disk.
   */
  folder(session: string, part?: string): string;
  /** The checkpoints in `folder`, oldest first; none when the folder does not exist. */
  list(folder: string): Promise<CheckpointFileInfo[]>;
  /** Checkpoint `name` of `folder`, opened for reading as stored (not verified); null when there is none. */
  openCheckpoint(folder: string, name: string): Promise<FileHandle | null>;
  /**
   * The newest checkpoint in `folder` that verifies, still open (the caller closes `found.fh`),
   * and the newer ones that did not, newest first. A file verified (or found corrupt) as it is
   * now is not read in full again.
   */
  latest(folder: string): Promise<{ found: OpenCheckpoint<void> | null; skipped: Skipped[] }>;
  /**
   * Stores a container of `declared` bytes in `folder`, read from the source `openSource` gives
   * (called once the disk budget allows the save). The preamble and header are checked before a
   * file is created; the whole container is verified before it is renamed into place. Then
   * `beforeCommit` runs (it may throw: then nothing is stored), the checkpoint gets its name, and
   * the folder is pruned to its last `keep`. Refusals are CheckpointRefused; whatever is refused
   * or fails leaves no .tmp file and no folder that this save made.
   */
  save(folder: string, declared: number, openSource: () => ByteSource, beforeCommit?: () => Promise<void>): Promise<SavedCheckpoint>;
}

/** The folder, inside a session's, that holds one folder per part. */
const PARTS_DIR = 'parts';
const EXT = '.ckpt';
const TMP_EXT = '.tmp';
/** `<YYYYMMDD>T<HHMMSSmmm>Z` with an optional `-step-<n>`. */
export const CHECKPOINT_NAME = /^(\d{8})T(\d{2})(\d{2})(\d{2})(\d{3})Z(?:-step-(\d{1,16}))?$/;
/** A .tmp file nobody has written to for this long belongs to a crashed or abandoned upload. */
const STALE_TMP_MS = 15 * 60_000;
const READ_CHUNK = 1 << 20;
/** The JSON header is held in memory while it is checked, before anything is written: cap it. */
const MAX_HEADER_BYTES = 16 * 1024 * 1024;
/** Files whose verification `latest` remembers. */
const VERIFIED_CACHE_ENTRIES = 1024;

export function checkpointStore(options: CheckpointStoreOptions): CheckpointStore {
  const dir = resolve(options.dir);
  const keep = options.keep ?? 3;
  const maxDiskBytes = options.maxDiskBytes ?? 4 * 1024 * 1024 * 1024;
  const log = options.log ?? (() => {});
  const onVerify = options.onVerify;
  const positiveInteger = (name: string, v: number) => {
    if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`${name} must be a positive integer, got ${v}`);
  };
  positiveInteger('keep', keep);
  positiveInteger('maxDiskBytes', maxDiskBytes);

  /** Saves in progress in this process: their .tmp files are not stale, and not counted twice. */
  const uploading = new Set<string>();
  /** Declared lengths of the saves in progress: disk they are about to use. */
  let reservedBytes = 0;
  const verifiedFiles = new VerifiedFiles(VERIFIED_CACHE_ENTRIES);
  /** The last name's time, so that two saves in one millisecond still get ordered, distinct names. */
  let lastNameMs = 0;

  return {
    dir,
    folder: (session, part) => checkpointFolder(dir, session, part),
    list: listCheckpointFiles,
    openCheckpoint,
    latest: (folder) => findLatest(folder, verifyRemembered),
    save,
  };

  async function openCheckpoint(folder: string, name: string): Promise<FileHandle | null> {
    try {
      return await open(join(folder, name + EXT), 'r');
    } catch (err) {
      if (isCode(err, 'ENOENT')) return null;
      throw err;
    }
  }

  async function save(folder: string, declared: number, openSource: () => ByteSource, beforeCommit?: () => Promise<void>): Promise<SavedCheckpoint> {
    // Claimed before the first await, so that concurrent saves each see the others.
    reservedBytes += declared;
    let reserved = true;
    let tmp: string | undefined;
    let fh: FileHandle | undefined;
    /** The topmost folder this save made, until it stored a checkpoint in it. */
    let madeFolder: string | undefined;
    try {
      await checkDiskBudget(declared);
      const body = openSource();
      let header: CheckpointHeader;
      let size: number;
      try {
        const head = await readContainerHead(body, declared);
        // New folders must themselves survive a crash, so the parent of each new one is synced too.
        // 0700 and files 0600: a session's weights are not for the machine's other users.
        const created = await privateFolder(dir, folder);
        madeFolder = created;
        if (created !== undefined) {
          for (let made = folder; ; made = dirname(made)) {
            await syncDir(dirname(made));
            if (made === created || made === dir) break;
          }
        }
        tmp = join(folder, `upload-${Date.now()}-${randomBytes(6).toString('hex')}${TMP_EXT}`);
        uploading.add(tmp);
        fh = await open(tmp, 'wx+', PRIVATE_FILE_MODE);
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
        throw new CheckpointRefused('corrupt', `checkpoint upload refused: ${err.reason} (nothing was stored: save the checkpoint again)`);
      }
      await fh.close();
      fh = undefined;
      const step = stepOf(header.meta);
      await beforeCommit?.();
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
      return { name, bytes: size, step };
    } catch (err) {
      if (isCode(err, 'ENOSPC')) {
        throw new CheckpointRefused('insufficient-storage', `the server's disk is full: the checkpoint was not stored; ask the server's operator to free space`);
      }
      throw err;
    } finally {
      // Cleaned up before the refusal is answered, so a client that sees it finds no leftovers.
      await fh?.close().catch(() => {});
      if (tmp !== undefined && uploading.delete(tmp)) await unlink(tmp).catch(() => {});
      // A refused upload leaves no folder behind (a file beforeCommit wrote there, such as the
      // routes' token file, keeps it: then it stays).
      if (madeFolder !== undefined) {
        for (let f = folder; ; f = dirname(f)) {
          if (!(await rmdir(f).then(() => true, () => false))) break;
          if (f === madeFolder || f === dir) break;
        }
      }
      if (reserved) reservedBytes -= declared;
    }
  }

  /** Refuses a save that would take the stored checkpoints of all sessions past maxDiskBytes. */
  async function checkDiskBudget(declared: number): Promise<void> {
    // reservedBytes includes this upload; the files of uploads in progress are left out of the scan.
    const stored = await storedBytes(dir, uploading);
    const used = stored + reservedBytes - declared;
    if (stored + reservedBytes <= maxDiskBytes) return;
    log(`[checkpoints] disk budget: ${stored} bytes stored in ${dir}, ${reservedBytes - declared} being uploaded, limit ${maxDiskBytes}`);
    throw new CheckpointRefused(
      'insufficient-storage',
      `the server's checkpoint storage is full: ${used} bytes are stored or being uploaded (all sessions) and this upload of ${declared} bytes would pass its limit of ${maxDiskBytes} bytes (maxDiskBytes); ask the server's operator to delete old checkpoints or raise the limit`,
    );
  }

  /**
   * Reads the preamble and the JSON header from the body and checks them against the declared
   * length, before anything is written. Returns the bytes read so far (to be written first).
   */
  async function readContainerHead(body: ByteSource, declared: number): Promise<Buffer> {
    const preamble = await body.firstBytes(Math.min(declared, PREAMBLE_BYTES));
    const layout = readPreamble(preamble.subarray(0, PREAMBLE_BYTES), declared);
    if (layout.headerBytes > MAX_HEADER_BYTES) {
      throw new CheckpointRefused('too-large', `the checkpoint's JSON header is ${layout.headerBytes} bytes; this server reads headers of at most ${MAX_HEADER_BYTES} bytes (keep large data in the weight sections)`);
    }
    const headerEnd = PREAMBLE_BYTES + layout.headerBytes;
    const head = await body.firstBytes(headerEnd);
    checkSectionSizes(parseHeader(head.subarray(PREAMBLE_BYTES, headerEnd)), layout);
    return head;
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
  const folder = checkpointFolder(dir, session, part);
  const { found, skipped } = await findLatest(folder, (fh, _path, info) => verifyContainer(fh, info.size));
  if (!found) return null;
  await found.fh.close();
  return { name: found.name, path: join(folder, found.name + EXT), bytes: found.size, meta: found.verified.meta, skipped };
}

/** A session's folder under `dir`, or one of its parts'; throws TypeError or RangeError for a name that is not allowed. */
function checkpointFolder(dir: string, session: string, part?: string): string {
  if (!validSession(session)) throw new TypeError(`session name ${JSON.stringify(session)} is not allowed`);
  if (part !== undefined && !CHECKPOINT_PART.test(part)) throw new RangeError(`part name ${JSON.stringify(part)} is not allowed: use ${CHECKPOINT_PART_RULE}`);
  const sessionDir = join(resolve(dir), session);
  return part === undefined ? sessionDir : join(sessionDir, PARTS_DIR, part);
}

export function validSession(session: string): boolean {
  // The pattern admits "." and "..", which would name the folder itself or its parent.
  return SESSION_NAME.test(session) && session !== '.' && session !== '..';
}

// ---------------------------------------------------------------------------------------------

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

async function listCheckpointFiles(folder: string): Promise<CheckpointFileInfo[]> {
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
