/**
 * Verifying stored checkpoint containers (checkpoint_store.ts): the header's sizes against the
 * sections, the SHA-256 of a file on disk, the newest file that verifies, and the memory of
 * which files verified as they are now.
 */
import type { Stats } from 'node:fs';
import { createHash } from 'node:crypto';
import { open, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import {
  CHECKSUM_BYTES,
  PREAMBLE_BYTES,
  CheckpointCorruptError,
  checksumMismatch,
  parseHeader,
  readPreamble,
  type CheckpointHeader,
  type ContainerLayout,
} from '../src/checkpoint/checkpoint_format.ts';
import { EXT, checkpointNames, isCode } from './checkpoint_files.ts';

export interface Skipped {
  name: string;
  reason: string;
}

/** A verified checkpoint, still open so that a concurrent prune cannot delete it before it is sent. */
export interface OpenCheckpoint<T> {
  name: string;
  fh: FileHandle;
  size: number;
  /** What the verification gave. */
  verified: T;
}

const READ_CHUNK = 1 << 20;

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
export function checkSectionSizes(header: CheckpointHeader, layout: ContainerLayout): void {
  const sections = [
    ['model', header.model.weightSpecs, layout.modelBytes],
    ['optimizer', header.optimizer.weightSpecs, layout.optimizerBytes],
  ] as const;
  for (const [where, specs, bytes] of sections) {
    let total = 0;
    for (const spec of specs) {
      const quantization: unknown = (spec as { quantization?: unknown }).quantization;
      const dtype =
        typeof quantization === 'object' && quantization !== null && 'dtype' in quantization && typeof quantization.dtype === 'string'
          ? quantization.dtype
          : spec.dtype;
      const size = DTYPE_BYTES.get(dtype);
      if (size === undefined) {
        total = NaN;
        break;
      }
      total += size * spec.shape.reduce((a, b) => a * b, 1);
    }
    if (!Number.isNaN(total) && total !== bytes) {
      throw new CheckpointCorruptError(
        'header',
        `the header's ${where}.weightSpecs describe ${total} bytes of tensors but the ${where} section holds ${bytes} bytes`,
      );
    }
  }
}

/**
 * Verification results of stored files, valid while a file stays as it was: same inode, size,
 * mtime and ctime (a write or a utimes that restores the mtime still changes the ctime). Bounded:
 * the least recently used entries go first.
 */
export class VerifiedFiles {
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

/** Walks from the newest checkpoint back to the first that `verify` accepts, noting the ones it does not. */
export async function findLatest<T>(
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
export async function verifyContainer(fh: FileHandle, size: number): Promise<CheckpointHeader> {
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
