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
import { randomBytes } from 'node:crypto';
import { open, readdir, rename, rmdir, stat, unlink, type FileHandle } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import {
  CheckpointCorruptError,
  PREAMBLE_BYTES,
  parseHeader,
  readPreamble,
  type CheckpointHeader,
} from '../src/checkpoint/checkpoint_format.ts';
import { PRIVATE_FILE_MODE, privateFolder } from './private_files.ts';
import {
  EXT,
  TMP_EXT,
  checkpointFolder,
  checkpointNames,
  isCode,
  listCheckpointFiles,
  nameTime,
  storedBytes,
  syncDir,
  type CheckpointFileInfo,
} from './checkpoint_files.ts';
import { VerifiedFiles, checkSectionSizes, findLatest, verifyContainer, type OpenCheckpoint, type Skipped } from './checkpoint_verify.ts';

// Layout and verification live beside the store; what the routes and offers read is named here too.
export { CHECKPOINT_NAME, validSession, type CheckpointFileInfo } from './checkpoint_files.ts';
export type { OpenCheckpoint, Skipped } from './checkpoint_verify.ts';

export interface CheckpointStoreOptions {
  /** Where checkpoints are kept: one folder per session. Created when needed. */
  dir: string;
  /** How many checkpoints each session keeps (and each part of it, apart); older ones are deleted after a save. Default 3. */
  keep?: number;
  /**
   * Disk budget for all sessions together: stored checkpoints plus saves in progress (counted at
   * their declared length). A save that would pass it is refused ('insufficient-storage'). Default 4 GiB.
   * The stored bytes come from a scan of `dir` at the start, refreshed behind a save every 10 s (this store's
   * own saves and deletions are counted in between); a save the figure has no room for scans
   * again before it is refused, so files another server writes are seen within about 10 s.
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

export interface ValidCheckpoint {
  name: string;
  path: string;
  bytes: number;
  meta: Record<string, unknown>;
  /** Newer checkpoints that failed verification, newest first. */
  skipped: Skipped[];
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

/** A .tmp file nobody has written to for this long belongs to a crashed or abandoned upload. */
const STALE_TMP_MS = 15 * 60_000;
/** The JSON header is held in memory while it is checked, before anything is written: cap it. */
const MAX_HEADER_BYTES = 16 * 1024 * 1024;
/** Files whose verification `latest` remembers. */
const VERIFIED_CACHE_ENTRIES = 1024;
/**
 * How old the figure of stored bytes may get before a save refreshes it, behind the save. Scanning
 * every session's files before each save cost 80 ms on a quiet machine and seconds on a loaded
 * one (each file a stat), enough to hold a parameter server's saves back for its whole run.
 */
const STORED_SCAN_FRESH_MS = 10_000;

export function checkpointStore(options: CheckpointStoreOptions): CheckpointStore {
  const store = new DiskCheckpointStore(options);
  return {
    dir: store.dir,
    folder: (session, part) => checkpointFolder(store.dir, session, part),
    list: listCheckpointFiles,
    openCheckpoint: (folder, name) => store.openCheckpoint(folder, name),
    latest: (folder) => findLatest(folder, (fh, path, info) => store.verifyRemembered(fh, path, info)),
    save: (folder, declared, openSource, beforeCommit) => store.save(folder, declared, openSource, beforeCommit),
  };
}

/** What one save has made so far on disk, for its cleanup to undo. */
interface Upload {
  /** Its declared length still counts in `reservedBytes`. */
  reserved: boolean;
  tmp?: string;
  fh?: FileHandle;
  /** The topmost folder this save made, until it stored a checkpoint in it. */
  madeFolder?: string;
}

/** The store's state across saves: the disk reserved by saves in progress, and what verified. */
class DiskCheckpointStore {
  readonly dir: string;
  private readonly keep: number;
  private readonly maxDiskBytes: number;
  private readonly log: (line: string) => void;
  private readonly onVerify: ((path: string, bytes: number) => void) | undefined;
  /** Saves in progress in this process: their .tmp files are not stale, and not counted twice. */
  private readonly uploading = new Set<string>();
  /** Declared lengths of the saves in progress: disk they are about to use. */
  private reservedBytes = 0;
  private readonly verifiedFiles = new VerifiedFiles(VERIFIED_CACHE_ENTRIES);
  /** The last name's time, so that two saves in one millisecond still get ordered, distinct names. */
  private lastNameMs = 0;
  /** The bytes stored at the last scan, plus this store's own saves and deletions since (null: no scan yet). */
  private stored: { bytes: number; scannedAt: number } | null = null;
  /** The scan in flight, and what this store wrote (or deleted) since it began. */
  private scanning: { since: number; done: Promise<number> } | null = null;

  constructor(options: CheckpointStoreOptions) {
    this.dir = resolve(options.dir);
    this.keep = options.keep ?? 3;
    this.maxDiskBytes = options.maxDiskBytes ?? 4 * 1024 * 1024 * 1024;
    this.log = options.log ?? (() => {});
    this.onVerify = options.onVerify;
    const positiveInteger = (name: string, v: number) => {
      if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`${name} must be a positive integer, got ${v}`);
    };
    positiveInteger('keep', this.keep);
    positiveInteger('maxDiskBytes', this.maxDiskBytes);
    // The figure from the start, so that even the first save does not wait for a scan.
    this.scanStored().catch(() => {});
  }

  async openCheckpoint(folder: string, name: string): Promise<FileHandle | null> {
    try {
      return await open(join(folder, name + EXT), 'r');
    } catch (err) {
      if (isCode(err, 'ENOENT')) return null;
      throw err;
    }
  }

  async save(folder: string, declared: number, openSource: () => ByteSource, beforeCommit?: () => Promise<void>): Promise<SavedCheckpoint> {
    // Claimed before the first await, so that concurrent saves each see the others.
    this.reservedBytes += declared;
    const upload: Upload = { reserved: true };
    try {
      await this.checkDiskBudget(declared);
      const { header, size } = await this.receive(folder, declared, openSource(), upload);
      return await this.commit(folder, declared, upload, header, size, beforeCommit);
    } catch (err) {
      if (isCode(err, 'ENOSPC')) {
        throw new CheckpointRefused(
          'insufficient-storage',
          `the server's disk is full: the checkpoint was not stored; ask the server's operator to free space`,
        );
      }
      throw err;
    } finally {
      await this.cleanUp(folder, declared, upload);
    }
  }

  /**
   * Writes the body to a new .tmp file in `folder` (made if needed), synced and verified; a
   * corrupt container is refused ('corrupt').
   */
  private async receive(
    folder: string,
    declared: number,
    body: ByteSource,
    upload: Upload,
  ): Promise<{ header: CheckpointHeader; size: number }> {
    try {
      const head = await this.readContainerHead(body, declared);
      // New folders must themselves survive a crash, so the parent of each new one is synced too.
      // 0700 and files 0600: a session's weights are not for the machine's other users.
      const created = await privateFolder(this.dir, folder);
      upload.madeFolder = created;
      if (created !== undefined) {
        for (let made = folder; ; made = dirname(made)) {
          await syncDir(dirname(made));
          if (made === created || made === this.dir) break;
        }
      }
      const tmp = join(folder, `upload-${Date.now()}-${randomBytes(6).toString('hex')}${TMP_EXT}`);
      upload.tmp = tmp;
      this.uploading.add(tmp);
      const fh = await open(tmp, 'wx+', PRIVATE_FILE_MODE);
      upload.fh = fh;
      await fh.write(head);
      let size = head.length;
      for (let chunk = await body.next(); chunk !== null; chunk = await body.next()) {
        size += chunk.length;
        await fh.write(chunk);
      }
      await fh.sync();
      return { header: await this.verifyOpen(fh, size, tmp), size };
    } catch (err) {
      if (!(err instanceof CheckpointCorruptError)) throw err;
      throw new CheckpointRefused('corrupt', `checkpoint upload refused: ${err.reason} (nothing was stored: save the checkpoint again)`);
    }
  }

  /** Renames a verified upload into place (after `beforeCommit`), then prunes the folder. */
  private async commit(
    folder: string,
    declared: number,
    upload: Upload,
    header: CheckpointHeader,
    size: number,
    beforeCommit: (() => Promise<void>) | undefined,
  ): Promise<SavedCheckpoint> {
    const tmp = upload.tmp!;
    await upload.fh!.close();
    upload.fh = undefined;
    const step = stepOf(header.meta);
    await beforeCommit?.();
    const name = this.nextName(await checkpointNames(folder), step);
    const path = join(folder, name + EXT);
    await rename(tmp, path);
    upload.madeFolder = undefined;
    this.uploading.delete(tmp);
    this.reservedBytes -= declared;
    upload.reserved = false;
    // Verified above: `latest` need not hash it again while it stays as written.
    const info = await stat(path);
    this.verifiedFiles.set(path, info, null);
    this.countStored(info.size);
    await syncDir(folder);
    await this.prune(folder);
    return { name, bytes: size, step };
  }

  /** Undoes what a save left: cleaned up before the refusal is answered, so a client that sees it finds no leftovers. */
  private async cleanUp(folder: string, declared: number, upload: Upload): Promise<void> {
    await upload.fh?.close().catch(() => {});
    if (upload.tmp !== undefined && this.uploading.delete(upload.tmp)) await unlink(upload.tmp).catch(() => {});
    // A refused upload leaves no folder behind (a file beforeCommit wrote there, such as the
    // routes' token file, keeps it: then it stays).
    if (upload.madeFolder !== undefined) {
      for (let f = folder; ; f = dirname(f)) {
        if (
          !(await rmdir(f).then(
            () => true,
            () => false,
          ))
        )
          break;
        if (f === upload.madeFolder || f === this.dir) break;
      }
    }
    if (upload.reserved) this.reservedBytes -= declared;
  }

  /** Refuses a save that would take the stored checkpoints of all sessions past maxDiskBytes. */
  private async checkDiskBudget(declared: number): Promise<void> {
    // reservedBytes includes this upload. A figure with room lets the save go on at once (one
    // older than STORED_SCAN_FRESH_MS is refreshed behind it); a refusal is always decided on a
    // new scan, as another server sharing the folder, or a person, may have deleted files since.
    const known = this.stored;
    if (known && known.bytes + this.reservedBytes <= this.maxDiskBytes) {
      if (Date.now() - known.scannedAt >= STORED_SCAN_FRESH_MS) this.scanStored().catch(() => {});
      return;
    }
    const stored = await this.scanStored();
    const used = stored + this.reservedBytes - declared;
    if (stored + this.reservedBytes <= this.maxDiskBytes) return;
    this.log(
      `[checkpoints] disk budget: ${stored} bytes stored in ${this.dir}, ${this.reservedBytes - declared} being uploaded, limit ${this.maxDiskBytes}`,
    );
    throw new CheckpointRefused(
      'insufficient-storage',
      `the server's checkpoint storage is full: ${used} bytes are stored or being uploaded (all sessions) and this upload of ${declared} bytes would pass its limit of ${this.maxDiskBytes} bytes (maxDiskBytes); ask the server's operator to delete old checkpoints or raise the limit`,
    );
  }

  /**
   * Reads the preamble and the JSON header from the body and checks them against the declared
   * length, before anything is written. Returns the bytes read so far (to be written first).
   */
  private async readContainerHead(body: ByteSource, declared: number): Promise<Buffer> {
    const preamble = await body.firstBytes(Math.min(declared, PREAMBLE_BYTES));
    const layout = readPreamble(preamble.subarray(0, PREAMBLE_BYTES), declared);
    if (layout.headerBytes > MAX_HEADER_BYTES) {
      throw new CheckpointRefused(
        'too-large',
        `the checkpoint's JSON header is ${layout.headerBytes} bytes; this server reads headers of at most ${MAX_HEADER_BYTES} bytes (keep large data in the weight sections)`,
      );
    }
    const headerEnd = PREAMBLE_BYTES + layout.headerBytes;
    const head = await body.firstBytes(headerEnd);
    checkSectionSizes(parseHeader(head.subarray(PREAMBLE_BYTES, headerEnd)), layout);
    return head;
  }

  /** Names sort by time; anything not newer than the newest on disk (clock skew) is moved past it. */
  private nextName(existing: string[], step: number | null): string {
    const newest = existing.at(-1);
    const newestMs = newest === undefined ? 0 : nameTime(newest);
    const ms = Math.max(Date.now(), this.lastNameMs + 1, newestMs + 1);
    this.lastNameMs = ms;
    const time = new Date(ms).toISOString().replace(/[-:.]/g, '');
    return step === null ? time : `${time}-step-${String(step).padStart(8, '0')}`;
  }

  /**
   * Deletes the oldest checkpoints beyond `keep`, and .tmp files of uploads that died, in one
   * folder (a session's or a part's): a part's folder is not a checkpoint file, so the session's
   * pruning never reaches into it.
   */
  private async prune(folder: string): Promise<void> {
    const names = await checkpointNames(folder);
    const remove = async (path: string, size: number) => {
      try {
        await unlink(path);
        this.countStored(-size);
      } catch {
        // Gone already (another server pruned it, or a person): nothing of ours to count.
      }
    };
    for (const old of names.slice(0, Math.max(0, names.length - this.keep))) {
      const path = join(folder, old + EXT);
      this.verifiedFiles.delete(path);
      const info = await stat(path).catch(() => undefined);
      if (info) await remove(path, info.size);
    }
    for (const file of await readdir(folder)) {
      const path = join(folder, file);
      if (!file.endsWith(TMP_EXT) || this.uploading.has(path)) continue;
      const info = await stat(path).catch(() => undefined);
      if (info && Date.now() - info.mtimeMs > STALE_TMP_MS) await remove(path, info.size);
    }
  }

  /** This store wrote (or deleted) `bytes`: the last scan's figure follows, until the next scan. */
  private countStored(bytes: number): void {
    if (this.stored) this.stored.bytes = Math.max(0, this.stored.bytes + bytes);
    // A scan in flight may have missed it: its figure gets it too (counted twice at worst, which
    // errs toward a new scan, never toward passing the budget).
    if (this.scanning) this.scanning.since += bytes;
  }

  /** The bytes stored by all sessions, scanned now (a scan already in flight is shared). */
  private scanStored(): Promise<number> {
    if (this.scanning) return this.scanning.done;
    const scan = { since: 0, done: Promise.resolve(0) };
    const scannedAt = Date.now();
    // The files of uploads in progress are left out of the scan: reservedBytes counts them.
    scan.done = storedBytes(this.dir, this.uploading)
      .then((bytes) => {
        this.stored = { bytes: Math.max(0, bytes + scan.since), scannedAt };
        return this.stored.bytes;
      })
      .finally(() => {
        this.scanning = null;
      });
    this.scanning = scan;
    return scan.done;
  }

  /** verifyOpen, unless this file was verified (or found corrupt) as it is now. */
  async verifyRemembered(fh: FileHandle, path: string, info: Stats): Promise<void> {
    const known = this.verifiedFiles.get(path, info);
    if (known === null) return;
    if (known !== undefined) throw known;
    try {
      await this.verifyOpen(fh, info.size, path);
      this.verifiedFiles.set(path, info, null);
    } catch (err) {
      if (err instanceof CheckpointCorruptError) this.verifiedFiles.set(path, info, err);
      throw err;
    }
  }

  /** Verifies a container on disk: preamble against the size, SHA-256, header. Throws CheckpointCorruptError. */
  private async verifyOpen(fh: FileHandle, size: number, path: string): Promise<CheckpointHeader> {
    this.onVerify?.(path, size);
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

function stepOf(meta: Record<string, unknown>): number | null {
  const step = meta.step;
  return typeof step === 'number' && Number.isSafeInteger(step) && step >= 0 ? step : null;
}
