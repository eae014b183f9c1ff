/**
 * How the checkpoint store (checkpoint_store.ts) lays checkpoints out on disk: folder and file
 * names, listing them, their total size, and the fsync of a folder. No verification here
 * (checkpoint_verify.ts) and no saving.
 */
import { open, readdir, stat, type FileHandle } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { SESSION_NAME } from '../src/wire/protocol.ts';
import { CHECKPOINT_PART, CHECKPOINT_PART_RULE } from '../src/checkpoint/checkpoint_format.ts';

/** A checkpoint file as listed: `step` is the one in its name, null when it has none. */
export interface CheckpointFileInfo {
  name: string;
  bytes: number;
  step: number | null;
  /** When the file was written, ISO 8601. */
  mtime: string;
}

/** The folder, inside a session's, that holds one folder per part. */
export const PARTS_DIR = 'parts';
export const EXT = '.ckpt';
export const TMP_EXT = '.tmp';
/** `<YYYYMMDD>T<HHMMSSmmm>Z` with an optional `-step-<n>`. */
export const CHECKPOINT_NAME = /^(\d{8})T(\d{2})(\d{2})(\d{2})(\d{3})Z(?:-step-(\d{1,16}))?$/;

/** A session's folder under `dir`, or one of its parts'; throws TypeError or RangeError for a name that is not allowed. */
export function checkpointFolder(dir: string, session: string, part?: string): string {
  if (!validSession(session)) throw new TypeError(`session name ${JSON.stringify(session)} is not allowed`);
  if (part !== undefined && !CHECKPOINT_PART.test(part))
    throw new RangeError(`part name ${JSON.stringify(part)} is not allowed: use ${CHECKPOINT_PART_RULE}`);
  const sessionDir = join(resolve(dir), session);
  return part === undefined ? sessionDir : join(sessionDir, PARTS_DIR, part);
}

export function validSession(session: string): boolean {
  // The pattern admits "." and "..", which would name the folder itself or its parent.
  return SESSION_NAME.test(session) && session !== '.' && session !== '..';
}

/**
 * Bytes of checkpoint and .tmp files of all sessions under `dir`, their parts' included, leaving
 * out the files in `skip`.
 */
export async function storedBytes(dir: string, skip: ReadonlySet<string>): Promise<number> {
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
export async function checkpointNames(folder: string): Promise<string[]> {
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

export async function listCheckpointFiles(folder: string): Promise<CheckpointFileInfo[]> {
  const out = [];
  for (const name of await checkpointNames(folder)) {
    const info = await stat(join(folder, name + EXT)).catch(() => undefined);
    if (!info) continue; // pruned meanwhile
    const step = CHECKPOINT_NAME.exec(name)?.[6];
    out.push({ name, bytes: info.size, step: step === undefined ? null : Number(step), mtime: info.mtime.toISOString() });
  }
  return out;
}

export function nameTime(name: string): number {
  const m = CHECKPOINT_NAME.exec(name);
  if (!m) return 0;
  const [, ymd, hh, mi, ss, ms] = m;
  return Date.UTC(
    Number(ymd.slice(0, 4)),
    Number(ymd.slice(4, 6)) - 1,
    Number(ymd.slice(6, 8)),
    Number(hh),
    Number(mi),
    Number(ss),
    Number(ms),
  );
}

export function isCode(err: unknown, code: string): boolean {
  return err instanceof Error && (err as NodeJS.ErrnoException).code === code;
}

/** fsync a folder so a rename or a new entry in it survives a crash. Not every platform allows it. */
export async function syncDir(path: string): Promise<void> {
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
