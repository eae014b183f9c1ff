/** Checkpoints: the container format, and save/load over real HTTP against the real handler on disk. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createServer, request as httpRequest, type Server } from 'node:http';
import { createHash } from 'node:crypto';
import { mkdtemp, open, readdir, readFile, rm, stat, truncate, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { checkpointHandler, type CheckpointHandlerOptions } from '../signaling/checkpoints.ts';
import { latestValidCheckpoint } from '../signaling/checkpoint_store.ts';
import { CheckpointError, listCheckpoints, loadCheckpoint, saveCheckpoint } from '../src/checkpoint/checkpoint.ts';
import {
  CheckpointCorruptError,
  decodeCheckpoint,
  encodeCheckpoint,
  type Checkpoint,
  type WeightSpec,
} from '../src/checkpoint/checkpoint_format.ts';
import { DistTimeoutError, UnauthorizedError } from '../src/wire/errors.ts';
import { SessionTokens, TOKEN_FILE } from '../signaling/session_tokens.ts';
import type { RunningServer } from '../signaling/server.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { connect, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { waitFor } from './fixtures/wait.ts';
import * as tf from '@tensorflow/tfjs';
import { buildModel } from '../src/nn/models.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
import { restoreStatePart, saveState } from '../src/elastic/checkpoints.ts';
import type { RunRecord } from '../src/elastic/run_record.ts';
import { errorOf } from './fixtures/errors.ts';

// ---------------------------------------------------------------------------------------------
// Fixtures: what a TF.js Sequential MLP and an Adam optimizer give.

function randomBuffer(bytes: number): ArrayBuffer {
  const out = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i += 65_536) crypto.getRandomValues(out.subarray(i, Math.min(bytes, i + 65_536)));
  return out.buffer;
}

function specsFor(layers: Array<[number, number]>): WeightSpec[] {
  return layers.flatMap(([inputs, units], i) => [
    { name: `dense_Dense${i + 1}/kernel`, shape: [inputs, units], dtype: 'float32' },
    { name: `dense_Dense${i + 1}/bias`, shape: [units], dtype: 'float32' },
  ]);
}

const bytesOf = (specs: WeightSpec[]) => specs.reduce((n, s) => n + 4 * s.shape.reduce((a, b) => a * b, 1), 0);

function makeCheckpoint(
  step: number,
  layers: Array<[number, number]> = [
    [16, 8],
    [8, 4],
  ],
): Checkpoint {
  const weightSpecs = specsFor(layers);
  const optimizerSpecs: WeightSpec[] = [
    { name: 'iter', shape: [], dtype: 'float32' },
    ...weightSpecs.flatMap((s) => [
      { ...s, name: `${s.name}/m` },
      { ...s, name: `${s.name}/v` },
    ]),
  ];
  return {
    meta: {
      step,
      epoch: Math.floor(step / 100),
      sampler: { epoch: 1, index: step * 32 },
      config: { lr: 0.001, batchSize: 32 },
      generation: 2,
    },
    model: {
      modelTopology: {
        class_name: 'Sequential',
        config: {
          name: 'sequential_1',
          layers: layers.map(([inputs, units], i) => ({
            class_name: 'Dense',
            config: {
              units,
              activation: i === layers.length - 1 ? 'softmax' : 'relu',
              use_bias: true,
              name: `dense_Dense${i + 1}`,
              ...(i === 0 ? { batch_input_shape: [null, inputs] } : {}),
            },
          })),
        },
        keras_version: 'tfjs-layers 4.22.0',
        backend: 'tensor_flow.js',
      },
      weightSpecs,
      weightData: randomBuffer(bytesOf(weightSpecs)),
    },
    optimizer: { weightSpecs: optimizerSpecs, weightData: randomBuffer(bytesOf(optimizerSpecs)) },
  };
}

async function corruptError(p: Promise<unknown>): Promise<CheckpointCorruptError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(CheckpointCorruptError);
  return err as CheckpointCorruptError;
}

const sameBytes = (a: ArrayBuffer, b: ArrayBuffer) => Buffer.from(a).equals(Buffer.from(b));

// ---------------------------------------------------------------------------------------------

describe('checkpoint container', () => {
  it('round-trips meta, topology, specs and weight data', async () => {
    const c = makeCheckpoint(1234, [
      [784, 128],
      [128, 10],
    ]);
    const bytes = await encodeCheckpoint(c);
    const d = await decodeCheckpoint(bytes);
    expect(d.meta).toEqual(c.meta);
    expect(d.model.modelTopology).toEqual(c.model.modelTopology);
    expect(d.model.weightSpecs).toEqual(c.model.weightSpecs);
    expect(d.optimizer.weightSpecs).toEqual(c.optimizer.weightSpecs);
    expect(d.model.weightData.byteLength).toBe(bytesOf(c.model.weightSpecs));
    expect(sameBytes(d.model.weightData, c.model.weightData)).toBe(true);
    expect(sameBytes(d.optimizer.weightData, c.optimizer.weightData)).toBe(true);
    // Deterministic: encoding the decoded checkpoint gives the same bytes.
    expect(Buffer.from(await encodeCheckpoint(d)).equals(Buffer.from(bytes))).toBe(true);
  });

  it('decodes from a view into a larger buffer and keeps extra artifact fields', async () => {
    const c = makeCheckpoint(7);
    const withExtras = { ...c, model: { ...c.model, format: 'layers-model', trainingConfig: { loss: 'categoricalCrossentropy' } } };
    const bytes = await encodeCheckpoint(withExtras);
    const padded = new Uint8Array(bytes.length + 100);
    padded.set(bytes, 50);
    const d = await decodeCheckpoint(padded.subarray(50, 50 + bytes.length));
    expect((d.model as unknown as Record<string, unknown>).trainingConfig).toEqual({ loss: 'categoricalCrossentropy' });
    expect(sameBytes(d.model.weightData, c.model.weightData)).toBe(true);
  });

  it('detects truncation, saying how many bytes were expected and found', async () => {
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    const err = await corruptError(decodeCheckpoint(bytes.subarray(0, bytes.length - 10), 'ckpt-a'));
    expect(err.kind).toBe('truncated');
    expect(err.message).toContain(`truncated: expected ${bytes.length} bytes, got ${bytes.length - 10}`);
    expect(err.message).toContain('ckpt-a');
    const tiny = await corruptError(decodeCheckpoint(bytes.subarray(0, 12)));
    expect(tiny.message).toContain('truncated: expected at least 64 bytes, got 12');
    expect((await corruptError(decodeCheckpoint(new Uint8Array(0)))).kind).toBe('truncated');
  });

  it('detects a flipped byte anywhere by the checksum', async () => {
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    for (const at of [40, Math.floor(bytes.length / 2), bytes.length - 40, bytes.length - 1]) {
      const bad = bytes.slice();
      bad[at] ^= 0x01;
      const err = await corruptError(decodeCheckpoint(bad));
      expect(err.kind).toBe('checksum');
      expect(err.message).toContain('checksum mismatch');
    }
  });

  it('detects bad magic, an unknown version and trailing bytes', async () => {
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    const notOurs = bytes.slice();
    notOurs.set(new TextEncoder().encode('PK\x03\x04'), 0);
    expect((await corruptError(decodeCheckpoint(notOurs))).message).toContain('bad magic');
    const future = bytes.slice();
    new DataView(future.buffer).setUint32(8, 99, true);
    expect((await corruptError(decodeCheckpoint(future))).message).toContain('unsupported format version 99');
    const longer = new Uint8Array(bytes.length + 3);
    longer.set(bytes);
    expect((await corruptError(decodeCheckpoint(longer))).message).toContain(`expected ${bytes.length} bytes, got ${bytes.length + 3}`);
  });

  it('reports an unreadable header even when the checksum matches', async () => {
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    const headerBytes = new DataView(bytes.buffer).getUint32(12, true);
    bytes.fill(0x7b, 32, 32 + headerBytes); // "{{{{..."
    const end = bytes.length - 32;
    bytes.set(createHash('sha256').update(bytes.subarray(0, end)).digest(), end);
    const err = await corruptError(decodeCheckpoint(bytes));
    expect(err.kind).toBe('header');
    expect(err.message).toContain('unreadable header');
  });

  it('refuses weight data that is not one ArrayBuffer (a TF.js ArrayBuffer[]) instead of writing zeros', async () => {
    const c = makeCheckpoint(1);
    const split = { ...c, model: { ...c.model, weightData: [c.model.weightData] as unknown as ArrayBuffer } };
    await expect(encodeCheckpoint(split)).rejects.toThrow(errorOf(TypeError, /model.weightData must be one ArrayBuffer/));
  });
});

// ---------------------------------------------------------------------------------------------

interface Listening {
  url: string;
  dir: string;
  close(): Promise<void>;
}

interface Mounted extends Listening {
  tokens: SessionTokens;
  /** Paths the handler read and hashed in full (onVerify), in order. */
  hashed: string[];
}

const servers: Listening[] = [];

/**
 * The handler on a real node:http server on port 0, over a fresh temp dir, with its own session
 * tokens (sessions get theirs from `joined`); other paths get a plain 404.
 */
async function mount(options: Partial<CheckpointHandlerOptions> = {}): Promise<Mounted> {
  const dir = await mkdtemp(join(tmpdir(), 'ckpt-test-'));
  const tokens = new SessionTokens(dir);
  const hashed: string[] = [];
  const handle = checkpointHandler({ dir, tokens, onVerify: (path) => hashed.push(path), ...options });
  const server = createServer((req, res) => {
    void handle(req, res).then((handled) => {
      if (!handled) res.writeHead(404, { 'content-type': 'text/plain' }).end(`not found: ${req.url}`);
    });
  });
  const mounted = { ...(await listen(server, dir)), tokens, hashed };
  servers.push(mounted);
  return mounted;
}

async function listen(server: Server, dir = ''): Promise<Listening> {
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/`,
    dir,
    close: () =>
      new Promise<void>((done) => {
        server.close(() => done());
        server.closeAllConnections();
      }),
  };
}

afterAll(async () => {
  for (const s of servers) {
    await s.close();
    if (s.dir) await rm(s.dir, { recursive: true, force: true });
  }
});

let counter = 0;
const session = (prefix = 'ckpt') => `${prefix}-${process.pid}-${++counter}`;

/** A new session whose token is fixed on `srv`, as a hello would. */
async function joined(srv: Mounted, prefix = 'ckpt'): Promise<string> {
  const s = session(prefix);
  expect((await srv.tokens.claimSession(s, tokenFor(s), undefined, true)).ok).toBe(true);
  return s;
}

const auth = (s: string) => ({ token: tokenFor(s) });
const headersFor = (s: string) => ({ authorization: `Bearer ${tokenFor(s)}`, 'content-type': 'application/octet-stream' });

async function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: unknown) => e,
  );
}

const exists = (path: string) =>
  stat(path).then(
    () => true,
    () => false,
  );
/** An upload into that folder has got past its header (its .tmp file exists). */
const hasTmp = async (sessionDir: string) => (await readdir(sessionDir).catch(() => [])).some((f) => f.endsWith('.tmp'));

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: { error?: string; message?: string };
}

/**
 * A raw POST that declares `length` bytes, sends `head` and then nothing more (a stalled
 * client). `answer` settles with the server's response; a guard timer fails it instead of
 * letting a test hang. `abort()` drops the connection.
 */
function stalledUpload(
  url: string,
  s: string,
  head: Uint8Array,
  length: number,
  guardMs = 5_000,
): { answer: Promise<Answer>; abort(): void } {
  const { port } = new URL(url);
  const req = httpRequest({
    host: '127.0.0.1',
    port,
    method: 'POST',
    path: `/api/checkpoints/${s}`,
    headers: { ...headersFor(s), 'content-length': String(length) },
  });
  const answer = new Promise<Answer>((done, fail) => {
    const guard = setTimeout(() => {
      req.destroy();
      fail(new Error(`no answer to the stalled upload within ${guardMs} ms`));
    }, guardMs);
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        clearTimeout(guard);
        req.destroy();
        done({
          status: res.statusCode ?? 0,
          headers: res.headers,
          body: JSON.parse(Buffer.concat(chunks).toString() || '{}') as Answer['body'],
        });
      });
    });
    req.on('error', (err) => {
      clearTimeout(guard);
      fail(err);
    });
  });
  answer.catch(() => {}); // awaited by the test, or dropped by abort()
  req.write(head);
  return { answer, abort: () => req.destroy() };
}

describe('checkpoint server', () => {
  let srv: Mounted;
  beforeAll(async () => {
    srv = await mount({ keep: 3 });
  });

  it('save then load returns identical bytes', async () => {
    const s = await joined(srv);
    const c = makeCheckpoint(123);
    const saved = await saveCheckpoint(srv.url, s, c, auth(s));
    expect(saved.name).toMatch(/^\d{8}T\d{9}Z-step-00000123$/);
    const encoded = await encodeCheckpoint(c);
    expect(saved.bytes).toBe(encoded.length);
    // What is on disk is exactly what the client encoded.
    expect((await readFile(join(srv.dir, s, `${saved.name}.ckpt`))).equals(Buffer.from(encoded))).toBe(true);

    const loaded = await loadCheckpoint(srv.url, s, auth(s));
    expect(loaded).not.toBeNull();
    expect(loaded!.name).toBe(saved.name);
    expect(loaded!.skipped).toEqual([]);
    expect(Buffer.from(await encodeCheckpoint(loaded!.checkpoint)).equals(Buffer.from(encoded))).toBe(true);
    expect(loaded!.checkpoint.meta).toEqual(c.meta);

    const listed = await listCheckpoints(srv.url, s, auth(s));
    expect(listed).toHaveLength(1);
    expect(listed[0]).toMatchObject({ name: saved.name, bytes: encoded.length, step: 123 });
    expect(Number.isNaN(Date.parse(listed[0].mtime))).toBe(false);

    const named = await loadCheckpoint(srv.url, s, { ...auth(s), name: saved.name });
    expect(named!.name).toBe(saved.name);
    expect(sameBytes(named!.checkpoint.model.weightData, c.model.weightData)).toBe(true);
  });

  it('keeps only the last `keep` checkpoints, newest last, and persists the token beside them', async () => {
    const s = await joined(srv);
    const names: string[] = [];
    for (let step = 1; step <= 5; step++) names.push((await saveCheckpoint(srv.url, s, makeCheckpoint(step), auth(s))).name);
    expect([...names].sort()).toEqual(names);
    const listed = await listCheckpoints(srv.url, s, auth(s));
    expect(listed.map((c) => c.name)).toEqual(names.slice(2));
    expect(listed.map((c) => c.step)).toEqual([3, 4, 5]);
    expect((await readdir(join(srv.dir, s))).sort()).toEqual([...names.slice(2).map((n) => `${n}.ckpt`), TOKEN_FILE]);
    expect((await loadCheckpoint(srv.url, s, auth(s)))!.checkpoint.meta.step).toBe(5);
  });

  it('a newer save at a lower step (a restarted run) is the latest and is not pruned', async () => {
    const s = await joined(srv);
    for (const step of [500, 600, 700]) await saveCheckpoint(srv.url, s, makeCheckpoint(step), auth(s));
    const restarted = await saveCheckpoint(srv.url, s, makeCheckpoint(450), auth(s));
    expect((await listCheckpoints(srv.url, s, auth(s))).map((c) => c.step)).toEqual([600, 700, 450]);
    expect((await loadCheckpoint(srv.url, s, auth(s)))!.name).toBe(restarted.name);
  });

  it('concurrent saves get distinct, ordered names', async () => {
    const s = await joined(srv);
    const saved = await Promise.all([1, 2, 3].map((step) => saveCheckpoint(srv.url, s, makeCheckpoint(step), auth(s))));
    expect(new Set(saved.map((x) => x.name)).size).toBe(3);
    expect(await listCheckpoints(srv.url, s, auth(s))).toHaveLength(3);
  });

  it('skips a truncated newest checkpoint and says which and why', async () => {
    const s = await joined(srv);
    const older = await saveCheckpoint(srv.url, s, makeCheckpoint(10), auth(s));
    const newer = await saveCheckpoint(srv.url, s, makeCheckpoint(20), auth(s));
    const path = join(srv.dir, s, `${newer.name}.ckpt`);
    await truncate(path, newer.bytes - 100);

    const loaded = await loadCheckpoint(srv.url, s, auth(s));
    expect(loaded!.name).toBe(older.name);
    expect(loaded!.checkpoint.meta.step).toBe(10);
    expect(loaded!.skipped).toEqual([{ name: newer.name, reason: `truncated: expected ${newer.bytes} bytes, got ${newer.bytes - 100}` }]);

    const direct = await latestValidCheckpoint(srv.dir, s);
    expect(direct).toMatchObject({ name: older.name, bytes: older.bytes, skipped: loaded!.skipped });
    expect(direct!.meta.step).toBe(10);

    // Loading the corrupt one by name fails on the client, naming it.
    const err = await rejection(loadCheckpoint(srv.url, s, { ...auth(s), name: newer.name }));
    expect(err).toBeInstanceOf(CheckpointCorruptError);
    expect((err as Error).message).toContain(newer.name);
  });

  it('skips a checkpoint with a flipped byte (checksum mismatch)', async () => {
    const s = await joined(srv);
    const older = await saveCheckpoint(srv.url, s, makeCheckpoint(1), auth(s));
    const newer = await saveCheckpoint(srv.url, s, makeCheckpoint(2), auth(s));
    const flip = async (name: string) => {
      const path = join(srv.dir, s, `${name}.ckpt`);
      const bytes = await readFile(path);
      bytes[bytes.length >> 1] ^= 0xff;
      await writeFile(path, bytes);
    };
    await flip(newer.name);
    const loaded = await loadCheckpoint(srv.url, s, auth(s));
    expect(loaded!.name).toBe(older.name);
    expect(loaded!.skipped).toEqual([{ name: newer.name, reason: expect.stringContaining('checksum mismatch') }]);

    // None verifies: an error listing them, not "no checkpoint" (which would start a job afresh).
    await flip(older.name);
    const err = await rejection(loadCheckpoint(srv.url, s, auth(s)));
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as CheckpointError).status).toBe(409);
    expect((err as Error).message).toContain(`${older.name} (checksum mismatch`);
    expect((err as Error).message).toContain(newer.name);
    expect(await latestValidCheckpoint(srv.dir, s)).toBeNull();
  });

  it('ignores leftover .tmp files and cleans stale ones on the next save', async () => {
    const s = await joined(srv);
    const first = await saveCheckpoint(srv.url, s, makeCheckpoint(1), auth(s));
    const sessionDir = join(srv.dir, s);
    // A crash mid-upload: a partial file, even one named like a newer checkpoint.
    const stale = join(sessionDir, '29990101T000000000Z-step-00000099.ckpt.tmp');
    const fresh = join(sessionDir, 'upload-in-progress-elsewhere.tmp');
    const partial = (await encodeCheckpoint(makeCheckpoint(99))).subarray(0, 500);
    await writeFile(stale, partial);
    await writeFile(fresh, partial);
    const hourAgo = new Date(Date.now() - 3_600_000);
    await utimes(stale, hourAgo, hourAgo);

    expect((await listCheckpoints(srv.url, s, auth(s))).map((c) => c.name)).toEqual([first.name]);
    expect((await loadCheckpoint(srv.url, s, auth(s)))!.name).toBe(first.name);

    await saveCheckpoint(srv.url, s, makeCheckpoint(2), auth(s));
    const files = await readdir(sessionDir);
    expect(files).not.toContain('29990101T000000000Z-step-00000099.ckpt.tmp');
    expect(files).toContain('upload-in-progress-elsewhere.tmp'); // recently written: may be live
  });

  it('refuses bad session names with 400 and never touches the disk', async () => {
    for (const bad of ['bad name', 'x'.repeat(65), 'a/b', 'ü']) {
      const res = await fetch(`${srv.url}api/checkpoints/${encodeURIComponent(bad)}`, { method: 'POST', body: new Uint8Array(10) });
      expect(res.status, bad).toBe(400);
      const body = (await res.json()) as { error: string; message: string };
      expect(body.error).toBe('bad-session');
      expect(body.message).toContain('is not allowed');
    }
    // "." and ".." match the character set but would name the folder or its parent.
    await expect(latestValidCheckpoint(srv.dir, '..')).rejects.toThrow(TypeError);
    await expect(saveCheckpoint(srv.url, '..', makeCheckpoint(1), auth('..'))).rejects.toThrow(errorOf(TypeError, /not allowed/));
    await expect(loadCheckpoint(srv.url, 'bad name', auth('bad name'))).rejects.toThrow(TypeError);
    expect(await readdir(srv.dir)).not.toContain('bad name');
  });

  it('refuses a corrupt upload with 400 saying why, storing nothing', async () => {
    const s = await joined(srv);
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    bytes[bytes.length - 100] ^= 1; // in the weights: found by the checksum, after the upload
    const res = await fetch(`${srv.url}api/checkpoints/${s}`, { method: 'POST', headers: headersFor(s), body: bytes });
    expect(res.status).toBe(400);
    const body = (await res.json()) as { error: string; message: string };
    expect(body.error).toBe('corrupt');
    expect(body.message).toContain('checksum mismatch');
    const truncated = await fetch(`${srv.url}api/checkpoints/${s}`, {
      method: 'PUT',
      headers: headersFor(s),
      body: bytes.subarray(0, 1000),
    });
    expect(truncated.status).toBe(400);
    expect(((await truncated.json()) as { message: string }).message).toContain(`truncated: expected ${bytes.length} bytes, got 1000`);
    // No checkpoint, no .tmp, no token file, and no folder: a refused upload leaves nothing behind.
    expect(await exists(join(srv.dir, s))).toBe(false);
  });

  it('refuses, before creating anything, a container whose header does not describe its sections', async () => {
    const s = await joined(srv);
    const c = makeCheckpoint(1);
    // A valid container (checksum included) whose model section is 4 bytes short of its weightSpecs.
    const short = { ...c, model: { ...c.model, weightData: c.model.weightData.slice(4) } };
    const res = await fetch(`${srv.url}api/checkpoints/${s}`, {
      method: 'POST',
      headers: headersFor(s),
      body: await encodeCheckpoint(short),
    });
    expect(res.status).toBe(400);
    const body = (await res.json()) as { error: string; message: string };
    expect(body.error).toBe('corrupt');
    const expected = bytesOf(c.model.weightSpecs);
    expect(body.message).toContain(
      `model.weightSpecs describe ${expected} bytes of tensors but the model section holds ${expected - 4} bytes`,
    );
    expect(await exists(join(srv.dir, s))).toBe(false);
  });

  it('returns null for a session with no checkpoints (204, which no browser logs as an error); lists nothing', async () => {
    const s = await joined(srv, 'empty');
    const res = await fetch(`${srv.url}api/checkpoints/${s}/latest`, { headers: headersFor(s) });
    expect(res.status).toBe(204);
    expect((await res.arrayBuffer()).byteLength).toBe(0);
    expect(await loadCheckpoint(srv.url, s, auth(s))).toBeNull();
    expect(await listCheckpoints(srv.url, s, auth(s))).toEqual([]);
    expect(await exists(join(srv.dir, s))).toBe(false);
  });

  it('refuses bad checkpoint names and unknown ones', async () => {
    const s = await joined(srv);
    expect((await fetch(`${srv.url}api/checkpoints/${s}/..%2F..%2Fetc`, { headers: headersFor(s) })).status).toBe(400);
    const err = await rejection(loadCheckpoint(srv.url, s, { ...auth(s), name: '20200101T000000000Z-step-00000001' }));
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as CheckpointError).status).toBe(404);
  });

  it('latest does not hash a file again while it stays as the server wrote and verified it', async () => {
    const s = await joined(srv);
    const older = await saveCheckpoint(srv.url, s, makeCheckpoint(1, [[256, 256]]), auth(s));
    const newer = await saveCheckpoint(srv.url, s, makeCheckpoint(2, [[256, 256]]), auth(s));
    const olderPath = join(srv.dir, s, `${older.name}.ckpt`);
    const newerPath = join(srv.dir, s, `${newer.name}.ckpt`);
    srv.hashed.length = 0;
    for (let i = 0; i < 3; i++) expect((await loadCheckpoint(srv.url, s, auth(s)))!.name).toBe(newer.name);
    expect(srv.hashed).toEqual([]); // verified on upload: never read in full again

    // Touched on disk: verified again (and still good).
    const whole = new Date(Math.floor(Date.now() / 1000) * 1000 - 60_000); // exactly representable, unlike ns mtimes
    await utimes(newerPath, whole, whole);
    expect((await loadCheckpoint(srv.url, s, auth(s)))!.name).toBe(newer.name);
    expect(srv.hashed).toEqual([newerPath]);
    srv.hashed.length = 0;
    expect((await loadCheckpoint(srv.url, s, auth(s)))!.name).toBe(newer.name);
    expect(srv.hashed).toEqual([]);

    // Changed in place: same size, and the mtime put back. The ctime still moves, so it is verified again.
    const before = await stat(newerPath);
    const fh = await open(newerPath, 'r+');
    await fh.write(Buffer.from([0x55]), 0, 1, before.size >> 1);
    await fh.close();
    await utimes(newerPath, whole, whole);
    // The kernel stamps ctimes from a coarse clock (a few ms a tick): within one tick of the touch
    // above, the ctime would not move. Touch again until it has, as any later change would.
    for (let i = 0; i < 100 && (await stat(newerPath)).ctimeMs === before.ctimeMs; i++) {
      await new Promise((r) => setTimeout(r, 5));
      await utimes(newerPath, whole, whole);
    }
    const after = await stat(newerPath);
    expect(after.ctimeMs).not.toBe(before.ctimeMs);
    expect([after.size, after.mtimeMs]).toEqual([before.size, before.mtimeMs]);

    const loaded = await loadCheckpoint(srv.url, s, auth(s));
    expect(loaded!.name).toBe(older.name);
    expect(loaded!.skipped).toEqual([{ name: newer.name, reason: expect.stringContaining('checksum mismatch') }]);
    expect(srv.hashed).toEqual([newerPath]);
    // The verdict is remembered too: neither file is hashed again.
    expect((await loadCheckpoint(srv.url, s, auth(s)))!.name).toBe(older.name);
    expect(srv.hashed).toEqual([newerPath]);
    expect(srv.hashed).not.toContain(olderPath);
  });
});

// ---------------------------------------------------------------------------------------------
// Parts: each pipeline stage saves its own share of the state, kept apart from the others.

/** A request sent with the path exactly as given (fetch and URL would resolve `..` first). */
function rawPath(url: string, path: string, headers: Record<string, string> = {}, method = 'GET'): Promise<Answer> {
  const { port } = new URL(url);
  return new Promise((done, fail) => {
    const req = httpRequest({ host: '127.0.0.1', port, method, path, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        let body: Answer['body'] = {};
        try {
          body = JSON.parse(text) as Answer['body'];
        } catch {
          body = { message: text };
        }
        done({ status: res.statusCode ?? 0, headers: res.headers, body });
      });
    });
    req.on('error', fail);
    req.end();
  });
}

/** Every file and folder under `dir`, as paths relative to it, sorted. */
async function tree(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { recursive: true });
  return entries.map((e) => e.split('\\').join('/')).sort();
}

describe('checkpoint parts', () => {
  let srv: Mounted;
  beforeAll(async () => {
    srv = await mount({ keep: 3 });
  });

  const inPart = (s: string, part: string) => ({ ...auth(s), part });
  const partDir = (s: string, part: string) => join(srv.dir, s, 'parts', part);
  /** Stage 1 holds other layers than stage 0, so a load from the wrong part would show. */
  const stageCheckpoint = (part: string, step: number) => makeCheckpoint(step, part === 'stage-0' ? [[16, 8]] : [[8, 4]]);

  it("keeps each part apart: its own last `keep`, and the session's own checkpoints untouched", async () => {
    const s = await joined(srv);
    const saved: Record<string, string[]> = { 'stage-0': [], 'stage-1': [], plain: [] };
    saved.plain.push((await saveCheckpoint(srv.url, s, makeCheckpoint(100), auth(s))).name);
    // The stages save the same steps, interleaved, as a pipeline does.
    for (let step = 1; step <= 4; step++) {
      for (const part of ['stage-0', 'stage-1'])
        saved[part]!.push((await saveCheckpoint(srv.url, s, stageCheckpoint(part, step), inPart(s, part))).name);
    }
    saved.plain.push((await saveCheckpoint(srv.url, s, makeCheckpoint(200), auth(s))).name);

    for (const part of ['stage-0', 'stage-1']) {
      const listed = await listCheckpoints(srv.url, s, inPart(s, part));
      expect(listed.map((c) => c.name)).toEqual(saved[part]!.slice(1));
      expect(listed.map((c) => c.step)).toEqual([2, 3, 4]);
      expect((await readdir(partDir(s, part))).sort()).toEqual(saved[part]!.slice(1).map((n) => `${n}.ckpt`));
      const latest = await loadCheckpoint(srv.url, s, inPart(s, part));
      expect(latest!.name).toBe(saved[part]!.at(-1));
      expect(latest!.checkpoint.meta.step).toBe(4);
      expect(latest!.checkpoint.model.weightSpecs).toEqual(stageCheckpoint(part, 4).model.weightSpecs);
    }
    // The session's own: both kept, and its list and latest see no part's files.
    expect((await listCheckpoints(srv.url, s, auth(s))).map((c) => [c.name, c.step])).toEqual([
      [saved.plain[0], 100],
      [saved.plain[1], 200],
    ]);
    expect((await loadCheckpoint(srv.url, s, auth(s)))!.checkpoint.meta.step).toBe(200);
    expect((await readdir(join(srv.dir, s))).sort()).toEqual([...saved.plain.map((n) => `${n}.ckpt`), TOKEN_FILE, 'parts'].sort());
    expect((await readdir(join(srv.dir, s, 'parts'))).sort()).toEqual(['stage-0', 'stage-1']);

    // Pruning the session's own folder never reaches into the parts.
    for (const step of [300, 400, 500]) await saveCheckpoint(srv.url, s, makeCheckpoint(step), auth(s));
    expect((await listCheckpoints(srv.url, s, auth(s))).map((c) => c.step)).toEqual([300, 400, 500]);
    for (const part of ['stage-0', 'stage-1']) {
      expect((await listCheckpoints(srv.url, s, inPart(s, part))).map((c) => c.name)).toEqual(saved[part]!.slice(1));
    }
  });

  it('lists and loads per part: an empty part is empty, names do not cross parts, corrupt ones are skipped', async () => {
    const s = await joined(srv);
    const only = await saveCheckpoint(srv.url, s, stageCheckpoint('stage-0', 7), inPart(s, 'stage-0'));
    expect(await loadCheckpoint(srv.url, s, inPart(s, 'stage-1'))).toBeNull();
    expect(await listCheckpoints(srv.url, s, inPart(s, 'stage-1'))).toEqual([]);
    expect(await loadCheckpoint(srv.url, s, auth(s))).toBeNull();
    expect(await listCheckpoints(srv.url, s, auth(s))).toEqual([]);
    expect(await exists(partDir(s, 'stage-1'))).toBe(false);

    // The list names its part.
    const res = await fetch(`${srv.url}api/checkpoints/${s}?part=stage-0`, { headers: headersFor(s) });
    expect(await res.json()).toMatchObject({ session: s, part: 'stage-0', checkpoints: [{ name: only.name, step: 7 }] });

    // A name is looked up in its own part only.
    expect((await loadCheckpoint(srv.url, s, { ...inPart(s, 'stage-0'), name: only.name }))!.checkpoint.meta.step).toBe(7);
    for (const elsewhere of [inPart(s, 'stage-1'), auth(s)]) {
      const err = await rejection(loadCheckpoint(srv.url, s, { ...elsewhere, name: only.name }));
      expect(err).toBeInstanceOf(CheckpointError);
      expect((err as CheckpointError).status).toBe(404);
    }
    const direct = await latestValidCheckpoint(srv.dir, s, 'stage-0');
    expect(direct).toMatchObject({ name: only.name, path: join(partDir(s, 'stage-0'), `${only.name}.ckpt`) });
    expect(await latestValidCheckpoint(srv.dir, s)).toBeNull();
    await expect(latestValidCheckpoint(srv.dir, s, '..')).rejects.toThrow(RangeError);

    // A corrupt newest is passed over within the part; none verifying is a 409 naming the part.
    const newer = await saveCheckpoint(srv.url, s, stageCheckpoint('stage-0', 8), inPart(s, 'stage-0'));
    await truncate(join(partDir(s, 'stage-0'), `${newer.name}.ckpt`), newer.bytes - 10);
    const loaded = await loadCheckpoint(srv.url, s, inPart(s, 'stage-0'));
    expect(loaded!.name).toBe(only.name);
    expect(loaded!.skipped).toEqual([{ name: newer.name, reason: expect.stringContaining('truncated') }]);
    await truncate(join(partDir(s, 'stage-0'), `${only.name}.ckpt`), 100);
    const err = await rejection(loadCheckpoint(srv.url, s, inPart(s, 'stage-0')));
    expect((err as CheckpointError).status).toBe(409);
    expect((err as Error).message).toContain(`part "stage-0" of session "${s}" has 2 checkpoint(s) and none verifies`);
  });

  it('loads by step: the newest checkpoint of the part at that step, null when there is none', async () => {
    const s = await joined(srv);
    const save = async (step: number) => (await saveCheckpoint(srv.url, s, stageCheckpoint('stage-1', step), inPart(s, 'stage-1'))).name;
    await save(10);
    const first20 = await save(20);
    const restarted20 = await save(20); // a restarted stage saved step 20 again
    const at30 = await save(30); // step 10 is pruned (keep 3)
    await saveCheckpoint(srv.url, s, stageCheckpoint('stage-0', 30), inPart(s, 'stage-0'));

    const at = (step: number, part = 'stage-1') => loadCheckpoint(srv.url, s, { ...inPart(s, part), step });
    expect((await at(20))!.name).toBe(restarted20);
    expect((await at(20))!.skipped).toEqual([]);
    expect((await at(30))!.name).toBe(at30);
    expect((await at(30, 'stage-0'))!.checkpoint.model.weightSpecs).toEqual(stageCheckpoint('stage-0', 30).model.weightSpecs);
    expect(await at(10)).toBeNull(); // pruned
    expect(await at(99)).toBeNull();
    expect(await at(20, 'stage-0')).toBeNull();
    expect(await loadCheckpoint(srv.url, s, { ...auth(s), step: 30 })).toBeNull(); // the session's own folder has none

    // A corrupt newest at the step: the older one at that step, saying what was skipped.
    const flip = async (name: string) => {
      const path = join(partDir(s, 'stage-1'), `${name}.ckpt`);
      const bytes = await readFile(path);
      bytes[bytes.length >> 1] ^= 0xff;
      await writeFile(path, bytes);
    };
    await flip(restarted20);
    const older = await at(20);
    expect(older!.name).toBe(first20);
    expect(older!.checkpoint.meta.step).toBe(20);
    expect(older!.skipped).toEqual([{ name: restarted20, reason: expect.stringContaining('checksum mismatch') }]);
    await flip(first20);
    const err = await rejection(at(20));
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as CheckpointError).status).toBe(409);
    expect((err as Error).message).toContain('at step 20 of part "stage-1"');
    expect((err as Error).message).toContain(first20);
    expect((err as Error).message).toContain(restarted20);

    await expect(loadCheckpoint(srv.url, s, { ...auth(s), step: 20, name: first20 })).rejects.toThrow(TypeError);
    for (const bad of [-1, 1.5, Number.NaN])
      await expect(loadCheckpoint(srv.url, s, { ...auth(s), step: bad })).rejects.toThrow(RangeError);
  });

  it('refuses bad part names: the server with 400 on every route, the client with RangeError before any request', async () => {
    const s = await joined(srv);
    const good = await saveCheckpoint(srv.url, s, makeCheckpoint(1), inPart(s, 'a'.repeat(32)));
    expect((await saveCheckpoint(srv.url, s, makeCheckpoint(1), inPart(s, '0'))).name).toMatch(/step-00000001$/);
    const body = await encodeCheckpoint(makeCheckpoint(2));
    const before = await tree(srv.dir);
    const queries = [
      'part=Stage-0',
      'part=-x',
      'part=',
      `part=${'a'.repeat(33)}`,
      'part=a_b',
      'part=a.b',
      'part=.',
      'part=..',
      'part=%2e%2e',
      'part=%2E%2E',
      'part=a%2Fb',
      'part=a/b',
      'part=..%2F..%2Fetc',
      'part=%5C..',
      'part=a%00',
      'part=a+b',
      'part=%C3%BC',
      'part=stage-0&part=stage-1',
    ];
    for (const query of queries) {
      for (const [method, path] of [
        ['POST', `api/checkpoints/${s}`],
        ['GET', `api/checkpoints/${s}`],
        ['GET', `api/checkpoints/${s}/latest`],
        ['GET', `api/checkpoints/${s}/${good.name}`],
      ] as const) {
        for (const headers of [headersFor(s), {}]) {
          const res = await fetch(`${srv.url}${path}?${query}`, { method, headers, body: method === 'POST' ? body : undefined });
          const answer = (await res.json()) as { error: string; message: string };
          expect([query, method, path, res.status, answer.error]).toEqual([query, method, path, 400, 'bad-part']);
          expect(answer.message).toMatch(
            query.includes('&') ? /give one part/ : /is not allowed: use 1-32 characters of a-z 0-9 and "-", the first a letter or digit/,
          );
        }
      }
    }
    expect(await tree(srv.dir)).toEqual(before);

    let requests = 0;
    const counting = (() => {
      requests++;
      return Promise.reject(new Error('no request was expected'));
    }) as typeof fetch;
    for (const bad of [
      'Stage-0',
      '-x',
      '',
      'a'.repeat(33),
      'a_b',
      'a.b',
      '.',
      '..',
      '%2e%2e',
      'a/b',
      '../x',
      'ü',
      ' stage-0',
      'stage-0\n',
    ]) {
      const o = { ...inPart(s, bad), fetch: counting };
      for (const call of [
        saveCheckpoint(srv.url, s, makeCheckpoint(1), o),
        loadCheckpoint(srv.url, s, o),
        loadCheckpoint(srv.url, s, { ...o, step: 1 }),
        listCheckpoints(srv.url, s, o),
      ]) {
        const err = await rejection(call);
        expect(err, JSON.stringify(bad)).toBeInstanceOf(RangeError);
        expect((err as Error).message).toContain(`checkpoint part ${JSON.stringify(bad)} is not allowed`);
        expect((err as Error).message).toContain('/^[a-z0-9][a-z0-9-]{0,31}$/');
      }
    }
    expect(requests).toBe(0);
  });

  it('refuses traversal through the name, the session and the path form', async () => {
    const s = await joined(srv);
    await saveCheckpoint(srv.url, s, makeCheckpoint(1), inPart(s, 'stage-0'));
    const before = await tree(srv.dir);
    const h = headersFor(s);
    const other = await joined(srv);
    const cases: Array<[string, number, string | undefined]> = [
      [`/api/checkpoints/${s}/..%2F..%2Fetc?part=stage-0`, 400, 'bad-name'],
      [`/api/checkpoints/${s}/..%2Fparts%2Fstage-0?part=stage-0`, 400, 'bad-name'],
      [`/api/checkpoints/${s}/parts?part=stage-0`, 400, 'bad-name'],
      [`/api/checkpoints/${s}/parts`, 400, 'bad-name'],
      [`/api/checkpoints/${s}/parts/stage-0`, 404, 'not-found'],
      [`/api/checkpoints/${s}/parts/stage-0/latest`, 404, 'not-found'],
      [`/api/checkpoints/%252e%252e?part=stage-0`, 400, 'bad-session'],
      [`/api/checkpoints/${s}%2Fparts%2Fstage-0?part=stage-0`, 400, 'bad-session'],
      [`/api/checkpoints/${s}/latest?part=stage-0%2F..%2F..`, 400, 'bad-part'],
      [`/api/checkpoints/${s}/latest?part=../../${s}`, 400, 'bad-part'],
      // Dot segments, plain or percent-encoded, are resolved (WHATWG URL) before routing: they
      // name another route of the API, with its own token check, or leave it.
      [`/api/checkpoints/${s}/%2e%2e?part=stage-0`, 404, 'not-found'], // /api/checkpoints/: no session
      [`/api/checkpoints/${s}/../${s}/latest?part=stage-0`, 200, undefined],
      [`/api/checkpoints/${s}/.%2E/${other}/latest?part=stage-0`, 403, 'forbidden'], // s's token is not other's
      [`/api/checkpoints/%2e%2e?part=stage-0`, 0, undefined],
      [`/api/checkpoints/${s}/latest/../../../../etc/passwd?part=stage-0`, 0, undefined],
    ];
    for (const [path, status, error] of cases) {
      const answer = await rawPath(srv.url, path, h);
      if (status === 0) {
        // Outside /api/checkpoints: not the handler's (the test server's plain 404).
        expect([path, answer.status, answer.body.message]).toEqual([path, 404, expect.stringMatching(/^not found/)]);
        continue;
      }
      expect([path, answer.status, answer.body.error]).toEqual([path, status, error]);
    }
    expect(await exists(join(srv.dir, other))).toBe(false);
    // Uploads too.
    for (const path of [
      `/api/checkpoints/${s}/parts/x`,
      `/api/checkpoints/${s}?part=..`,
      `/api/checkpoints/${s}?part=%2e%2e`,
      `/api/checkpoints/${s}?part=x%2F..%2F..`,
    ]) {
      const res = await fetch(`${srv.url}${path.slice(1)}`, {
        method: 'POST',
        headers: h,
        body: await encodeCheckpoint(makeCheckpoint(1)),
      });
      expect([path, res.status]).toEqual([path, path.includes('/parts/') ? 404 : 400]);
    }
    expect(await tree(srv.dir)).toEqual(before);
  });

  it('needs the session token for parts too (401 without, 403 wrong or nobody joined), touching nothing', async () => {
    const s = await joined(srv);
    const saved = await saveCheckpoint(srv.url, s, makeCheckpoint(1), inPart(s, 'stage-0'));
    const nobody = session('nobody');
    const body = await encodeCheckpoint(makeCheckpoint(2));
    const routes = (x: string) => [
      ['POST', `api/checkpoints/${x}?part=stage-0`],
      ['POST', `api/checkpoints/${x}?part=stage-9`],
      ['GET', `api/checkpoints/${x}?part=stage-0`],
      ['GET', `api/checkpoints/${x}/latest?part=stage-0`],
      ['GET', `api/checkpoints/${x}/${saved.name}?part=stage-0`],
    ];
    const before = await tree(srv.dir);
    const call = async (method: string, path: string, authorization?: string) => {
      const headers: Record<string, string> = { 'content-type': 'application/octet-stream' };
      if (authorization !== undefined) headers.authorization = authorization;
      const res = await fetch(srv.url + path, { method, headers, body: method === 'POST' ? body : undefined });
      return [res.status, ((await res.json()) as { error: string }).error];
    };
    for (const [method, path] of routes(s)) {
      expect([method, path, ...(await call(method!, path!))]).toEqual([method, path, 401, 'unauthorized']);
      expect([method, path, ...(await call(method!, path!, 'Bearer short'))]).toEqual([method, path, 401, 'unauthorized']);
      expect([method, path, ...(await call(method!, path!, `Bearer ${tokenFor(nobody)}`))]).toEqual([method, path, 403, 'forbidden']);
    }
    for (const [method, path] of routes(nobody)) {
      expect([method, path, ...(await call(method!, path!, `Bearer ${tokenFor(nobody)}`))]).toEqual([method, path, 403, 'forbidden']);
    }
    expect(await tree(srv.dir)).toEqual(before);
    const err = await rejection(loadCheckpoint(srv.url, s, { token: tokenFor(nobody), part: 'stage-0' }));
    expect((err as CheckpointError).status).toBe(403);
  });

  it('counts parts in the disk budget of all sessions', async () => {
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    const small = await mount({ maxDiskBytes: Math.floor(bytes.length * 2.5) });
    const a = await joined(small);
    const b = await joined(small);
    await saveCheckpoint(small.url, a, makeCheckpoint(1), { ...auth(a), part: 'stage-0' });
    await saveCheckpoint(small.url, a, makeCheckpoint(1), { ...auth(a), part: 'stage-1' });
    for (const [who, part] of [
      [a, 'stage-2'],
      [a, undefined],
      [b, 'stage-0'],
      [b, undefined],
    ] as const) {
      const err = await rejection(saveCheckpoint(small.url, who, makeCheckpoint(1), { ...auth(who), part }));
      expect((err as CheckpointError).status, `${who} ${part}`).toBe(507);
      expect((err as Error).message).toContain(`${2 * bytes.length} bytes are stored or being uploaded`);
    }
  });
});

describe('saveState and restoreStatePart', () => {
  beforeAll(async () => {
    await tf.setBackend('cpu');
  });

  it('each stage saves its part and restores it at a given step, with its run record', async () => {
    const srv = await mount({ keep: 3 });
    const s = await joined(srv);
    const o = { url: srv.url, session: s, token: tokenFor(s) };
    // Two stages: different models, as a pipeline's are.
    const stage = (part: number, seed: number) =>
      new TrainState({
        model: buildModel({ kind: 'mlp', inputShape: [part === 0 ? 16 : 8], numClasses: 4, seed }),
        optimizer: () => tf.train.adam(0.01),
      });
    const run: RunRecord = { generations: 2, stepsRedone: 1, resumes: ['resumed at step 3'] };
    const stages = [stage(0, 1), stage(1, 2)];
    for (const [i, st] of stages.entries()) {
      st.progress = { step: 5, epoch: 0, position: 40 };
      await saveState(st, run, { ...o, part: `stage-${i}` });
    }
    // data(), not dataSync(): dataSync can return stale data on TF.js's WebGPU backend (PLATFORM.md).
    const weightsAt5 = await Promise.all(
      stages.map((st) => Promise.all(st.model.getWeights().map(async (w) => Array.from(await w.data())))),
    );
    // Stage 0 goes on alone to step 6 with other weights.
    stages[0]!.model.setWeights(stages[0]!.model.getWeights().map((w) => tf.tidy(() => w.add(1))));
    stages[0]!.progress = { step: 6, epoch: 0, position: 48 };
    await saveState(stages[0]!, { ...run, generations: 3 }, { ...o, part: 'stage-0' });
    expect(await listCheckpoints(srv.url, s, auth(s))).toEqual([]); // nothing in the session's own folder

    for (const i of [0, 1]) {
      const fresh = stage(i, 10 + i);
      const restored = await restoreStatePart(fresh, { ...o, part: `stage-${i}`, step: 5 });
      expect(restored.run).toEqual(run);
      expect(restored.skipped).toEqual([]);
      expect(restored.note).toMatch(new RegExp(`^resumed at step 5 from checkpoint \\S+ of part "stage-${i}" of session "${s}"$`));
      expect(fresh.progress).toEqual({ step: 5, epoch: 0, position: 40 });
      expect(await Promise.all(fresh.model.getWeights().map(async (w) => Array.from(await w.data())))).toEqual(weightsAt5[i]);
      fresh.dispose();
    }
    // Stage 1 has no step 6: an error naming what it has, not a fresh start.
    const missing = await rejection(restoreStatePart(stage(1, 3), { ...o, part: 'stage-1', step: 6 }));
    expect(missing).toBeInstanceOf(CheckpointError);
    expect((missing as Error).message).toBe(`part "stage-1" of session "${s}" has no checkpoint at step 6 (it has steps 5)`);
    const none = await rejection(restoreStatePart(stage(1, 3), { ...o, part: 'stage-7', step: 5 }));
    expect((none as Error).message).toContain('(it has none)');
    await expect(restoreStatePart(stage(1, 3), { ...o, part: 'Stage-1', step: 5 })).rejects.toThrow(RangeError);
    for (const st of stages) st.dispose();
  });
});

describe('checkpoint limits and failures', () => {
  it('refuses an upload over maxBytes with 413, naming the session, status and limit', async () => {
    const small = await mount({ maxBytes: 4096 });
    const s = await joined(small);
    const err = await rejection(saveCheckpoint(small.url, s, makeCheckpoint(1, [[64, 32]]), auth(s)));
    expect(err).toBeInstanceOf(CheckpointError);
    const e = err as CheckpointError;
    expect(e.status).toBe(413);
    expect(e.session).toBe(s);
    expect(e.message).toContain(`"${s}"`);
    expect(e.message).toContain('HTTP 413');
    expect(e.message).toContain('at most 4096 bytes');
    expect(await exists(join(small.dir, s))).toBe(false);
  });

  it('refuses a chunked upload (no Content-Length) with 411, leaving no files', async () => {
    const srv = await mount({ maxBytes: 4096 });
    const s = await joined(srv);
    const { port } = new URL(srv.url);
    const answer = await new Promise<{ status: number; body: string }>((done, fail) => {
      const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: `/api/checkpoints/${s}`, headers: headersFor(s) }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => done({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
      });
      req.on('error', fail);
      // No content-length: node sends it chunked.
      for (let i = 0; i < 10; i++) req.write(Buffer.alloc(1024));
      req.end();
    });
    expect(answer.status).toBe(411);
    expect(JSON.parse(answer.body)).toMatchObject({ error: 'length-required', message: expect.stringContaining('Content-Length') });
    expect(await exists(join(srv.dir, s))).toBe(false);
  });

  it('times out an upload that takes too long (408), removing its .tmp', async () => {
    const srv = await mount({ uploadTimeoutMs: 300 });
    const s = await joined(srv);
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    const started = Date.now();
    // Past the header, so the .tmp file exists when the time runs out.
    const { answer } = stalledUpload(srv.url, s, bytes.subarray(0, bytes.length >> 1), bytes.length);
    const { status, body } = await answer;
    expect(status).toBe(408);
    expect(body.error).toBe('timeout');
    expect(body.message).toContain(`${bytes.length >> 1} of ${bytes.length} bytes arrived in 300 ms`);
    expect(body.message).toContain('uploadTimeoutMs');
    expect(Date.now() - started).toBeLessThan(3_000);
    // Neither the .tmp nor the folder it made stays.
    expect(await exists(join(srv.dir, s))).toBe(false);
  });

  it('times out an upload that stalls (408), before the whole-upload limit', async () => {
    const srv = await mount({ uploadIdleTimeoutMs: 200, uploadTimeoutMs: 30_000 });
    const s = await joined(srv);
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    // Stalled inside the preamble: nothing was created yet, and nothing is.
    const { answer } = stalledUpload(srv.url, s, bytes.subarray(0, 20), bytes.length);
    const { status, body } = await answer;
    expect(status).toBe(408);
    expect(body.message).toContain(`nothing arrived for 200 ms after 20 of ${bytes.length} bytes`);
    expect(body.message).toContain('uploadIdleTimeoutMs');
    expect(await exists(join(srv.dir, s))).toBe(false);
  });

  it('refuses uploads beyond maxConcurrentUploads with 503 and retry-after', async () => {
    const srv = await mount({ maxConcurrentUploads: 1 });
    const s = await joined(srv);
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    const first = stalledUpload(srv.url, s, bytes.subarray(0, bytes.length >> 1), bytes.length);
    // The first upload holds the only slot once its .tmp exists.
    await waitFor("the first upload's .tmp file", () => hasTmp(join(srv.dir, s)));

    const res = await fetch(`${srv.url}api/checkpoints/${s}`, { method: 'POST', headers: headersFor(s), body: bytes });
    expect(res.status).toBe(503);
    expect(res.headers.get('retry-after')).toBe('5');
    const body = (await res.json()) as { error: string; message: string };
    expect(body.error).toBe('busy');
    expect(body.message).toContain('maxConcurrentUploads');

    // Once the first one is gone, its slot is free again.
    first.abort();
    await waitFor(
      'an upload to be taken (201) once the first one is gone',
      async () => (await fetch(`${srv.url}api/checkpoints/${s}`, { method: 'POST', headers: headersFor(s), body: bytes })).status === 201,
      { intervalMs: 20 },
    );
    expect((await listCheckpoints(srv.url, s, auth(s))).length).toBe(1);
  });

  it('refuses uploads past the disk budget of all sessions (507), counting uploads in progress', async () => {
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    const srv = await mount({ maxDiskBytes: Math.floor(bytes.length * 1.5) });
    const a = await joined(srv);
    const b = await joined(srv);
    await saveCheckpoint(srv.url, a, makeCheckpoint(1), auth(a));
    // Another session: the budget is the server's, not the session's.
    const err = await rejection(saveCheckpoint(srv.url, b, makeCheckpoint(1), auth(b)));
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as CheckpointError).status).toBe(507);
    expect((err as Error).message).toContain(`${bytes.length} bytes are stored or being uploaded`);
    expect((err as Error).message).toContain('maxDiskBytes');
    expect(await exists(join(srv.dir, b))).toBe(false);

    // Nothing stored, but an upload in progress holds its length.
    const empty = await mount({ maxDiskBytes: Math.floor(bytes.length * 1.5) });
    const c = await joined(empty);
    const holding = stalledUpload(empty.url, c, bytes.subarray(0, bytes.length >> 1), bytes.length);
    await waitFor("the holding upload's .tmp file", () => hasTmp(join(empty.dir, c)));
    const refused = await fetch(`${empty.url}api/checkpoints/${c}`, { method: 'POST', headers: headersFor(c), body: bytes });
    expect(refused.status).toBe(507);
    expect(((await refused.json()) as { message: string }).message).toContain(`${bytes.length} bytes are stored or being uploaded`);
    holding.abort();
    await waitFor(
      'an upload to be taken (201) once the holding one is gone',
      async () => (await fetch(`${empty.url}api/checkpoints/${c}`, { method: 'POST', headers: headersFor(c), body: bytes })).status === 201,
      { intervalMs: 20 },
    );
  });

  it('times out a request that gets no answer, naming the URL and the time', async () => {
    const silent = await listen(createServer(() => {}));
    servers.push(silent);
    const err = await rejection(loadCheckpoint(silent.url, 'quiet', { ...auth('quiet'), timeoutMs: 200 }));
    expect(err).toBeInstanceOf(DistTimeoutError);
    expect((err as Error).message).toContain('200 ms');
    expect((err as Error).message).toContain(`${silent.url}api/checkpoints/quiet/latest`);
  });

  it('a server without the checkpoint handler is an error, not "no checkpoint"', async () => {
    const plain = await listen(
      createServer((_req, res) => res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: /api/...')),
    );
    servers.push(plain);
    const err = await rejection(loadCheckpoint(plain.url, 'x', auth('x')));
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as Error).message).toContain('HTTP 404: not found');
  });

  it('an unreachable server is a CheckpointError naming the session and URL', async () => {
    const gone = await listen(createServer());
    await gone.close();
    const err = await rejection(listCheckpoints(gone.url, 'x', auth('x')));
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as Error).message).toContain('could not reach the server');
    expect((err as Error).message).toContain(`${gone.url}api/checkpoints/x`);
  });

  it("the caller's abort signal cancels a request", async () => {
    const silent = await listen(createServer(() => {}));
    servers.push(silent);
    const controller = new AbortController();
    const pending = rejection(listCheckpoints(silent.url, 'x', { ...auth('x'), signal: controller.signal }));
    controller.abort(new Error('user cancelled'));
    expect(((await pending) as Error).message).toBe('user cancelled');
  });
});

// ---------------------------------------------------------------------------------------------
// The real server: tokens fixed by a WebSocket hello, then HTTP.

describe('checkpoint routes on the real server need the session token', () => {
  let server: RunningServer;
  let dir: string;
  const clients: StoreClient[] = [];
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'ckpt-auth-'));
    server = await withServer({ checkpointDir: dir });
  });
  afterAll(async () => {
    for (const c of clients) c.close();
    await server.close();
    await rm(dir, { recursive: true, force: true });
  });

  async function connected(prefix: string): Promise<string> {
    const s = uniqueSession(prefix);
    clients.push(await connect(server, s));
    return s;
  }

  it('refuses every route without the token (401), with a wrong one (403) and for a session nobody joined (403)', async () => {
    const s = await connected('auth');
    const saved = await saveCheckpoint(server.url, s, makeCheckpoint(1), auth(s));
    const savedPart = await saveCheckpoint(server.url, s, makeCheckpoint(1), { ...auth(s), part: 'stage-0' });
    const body = await encodeCheckpoint(makeCheckpoint(2));
    const nobody = uniqueSession('nobody');
    const routes = (session: string) => [
      { what: 'GET list', method: 'GET', path: `api/checkpoints/${session}` },
      { what: 'GET latest', method: 'GET', path: `api/checkpoints/${session}/latest` },
      { what: 'GET named', method: 'GET', path: `api/checkpoints/${session}/${saved.name}` },
      { what: 'POST', method: 'POST', path: `api/checkpoints/${session}`, body },
      { what: 'GET part list', method: 'GET', path: `api/checkpoints/${session}?part=stage-0` },
      { what: 'GET part latest', method: 'GET', path: `api/checkpoints/${session}/latest?part=stage-0` },
      { what: 'GET part named', method: 'GET', path: `api/checkpoints/${session}/${savedPart.name}?part=stage-0` },
      { what: 'POST part', method: 'POST', path: `api/checkpoints/${session}?part=stage-1`, body },
    ];
    const call = async (route: ReturnType<typeof routes>[number], authorization?: string) => {
      const headers: Record<string, string> = { 'content-type': 'application/octet-stream' };
      if (authorization !== undefined) headers.authorization = authorization;
      const res = await fetch(server.url + route.path, { method: route.method, headers, body: route.body });
      return {
        status: res.status,
        challenge: res.headers.get('www-authenticate'),
        ...((await res.json()) as { error: string; message: string }),
      };
    };

    for (const route of routes(s)) {
      for (const authorization of [undefined, `Basic ${btoa('user:pass')}`, 'Bearer', 'Bearer not a token', 'Bearer short']) {
        const r = await call(route, authorization);
        expect([route.what, authorization, r.status, r.error], r.message).toEqual([route.what, authorization, 401, 'unauthorized']);
        expect(r.challenge).toMatch(/^Bearer realm="checkpoints"/);
        expect(r.message).toMatch(/token/);
      }
      const wrong = await call(route, `Bearer ${tokenFor(nobody)}`);
      expect([route.what, wrong.status, wrong.error]).toEqual([route.what, 403, 'forbidden']);
      expect(wrong.message).toContain(`wrong token for session "${s}"`);
    }
    for (const route of routes(nobody)) {
      const unknown = await call(route, `Bearer ${tokenFor(nobody)}`);
      expect([route.what, unknown.status, unknown.error]).toEqual([route.what, 403, 'forbidden']);
      expect(unknown.message).toContain('connect to the session first');
    }

    // Nothing was stored or created by the refused requests.
    expect((await listCheckpoints(server.url, s, auth(s))).map((c) => c.name)).toEqual([saved.name]);
    expect((await listCheckpoints(server.url, s, { ...auth(s), part: 'stage-0' })).map((c) => c.name)).toEqual([savedPart.name]);
    expect(await readdir(join(dir, s, 'parts'))).toEqual(['stage-0']);
    expect(await readdir(dir)).not.toContain(nobody);
    // The client says what happened.
    const err = await rejection(loadCheckpoint(server.url, s, { token: tokenFor(nobody) }));
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as CheckpointError).status).toBe(403);
    expect((err as Error).message).toContain('wrong token');
  });

  it('refuses an upload that is not application/octet-stream (415), creating nothing', async () => {
    const s = await connected('type');
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    const bearer = { authorization: `Bearer ${tokenFor(s)}` };
    const attempts: RequestInit[] = [
      { body: new TextDecoder('latin1').decode(bytes), headers: { ...bearer } }, // a string body: text/plain, a "simple" request
      { body: bytes, headers: { ...bearer, 'content-type': 'text/plain' } },
      { body: bytes, headers: { ...bearer, 'content-type': 'application/x-www-form-urlencoded' } },
      { body: bytes, headers: { ...bearer } }, // no Content-Type at all
    ];
    for (const init of attempts) {
      const res = await fetch(`${server.url}api/checkpoints/${s}`, { method: 'POST', ...init });
      expect(res.status).toBe(415);
      const body = (await res.json()) as { error: string; message: string };
      expect(body.error).toBe('unsupported-media-type');
      expect(body.message).toContain('application/octet-stream');
    }
    expect(await readdir(dir)).not.toContain(s);
  });

  it('keeps the token across a restart: another token is refused, the original loads the checkpoint', async () => {
    const own = await mkdtemp(join(tmpdir(), 'ckpt-restart-'));
    let first: RunningServer | undefined = await withServer({ checkpointDir: own });
    let second: RunningServer | undefined;
    try {
      const s = uniqueSession('restart');
      const client = await connect(first, s);
      const saved = await saveCheckpoint(first.url, s, makeCheckpoint(42), auth(s));
      expect(await readFile(join(own, s, TOKEN_FILE), 'utf8')).toMatch(/^[0-9a-f]{64}\n$/);
      client.close();
      await first.close();
      first = undefined;

      second = await withServer({ checkpointDir: own });
      const intruder = await rejection(StoreClient.connect(second.url, { session: s, token: newSessionToken(), timeoutMs: 5_000 }));
      expect(intruder).toBeInstanceOf(UnauthorizedError);
      expect((intruder as UnauthorizedError).code).toBe('UNAUTHORIZED');
      const stolen = await rejection(loadCheckpoint(second.url, s, { token: newSessionToken() }));
      expect((stolen as CheckpointError).status).toBe(403);

      // Before anyone connects to the new server: the persisted hash is enough.
      const loaded = await loadCheckpoint(second.url, s, auth(s));
      expect(loaded!.name).toBe(saved.name);
      expect(loaded!.checkpoint.meta.step).toBe(42);
      (await connect(second, s)).close();
    } finally {
      await first?.close();
      await second?.close();
      await rm(own, { recursive: true, force: true });
    }
  });

  it('a session dropped for idleness keeps its token through its checkpoints and can save again', async () => {
    const own = await mkdtemp(join(tmpdir(), 'ckpt-idle-'));
    const idle = await withServer({ checkpointDir: own, sessionIdleMs: 50 });
    try {
      const s = uniqueSession('idle');
      const client = await connect(idle, s);
      await saveCheckpoint(idle.url, s, makeCheckpoint(1), auth(s));
      client.close();
      await waitFor('the idle session to be dropped', () => !idle.sessions.has(s));
      // Known now only from the token file: saving again must not need the in-memory token.
      const again = await saveCheckpoint(idle.url, s, makeCheckpoint(2), auth(s));
      expect((await loadCheckpoint(idle.url, s, auth(s)))!.name).toBe(again.name);
      const intruder = await rejection(StoreClient.connect(idle.url, { session: s, token: newSessionToken(), timeoutMs: 5_000 }));
      expect(intruder).toBeInstanceOf(UnauthorizedError);
    } finally {
      await idle.close();
      await rm(own, { recursive: true, force: true });
    }
  });
});
