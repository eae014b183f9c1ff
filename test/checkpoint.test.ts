/** Checkpoints: the container format, and save/load over real HTTP against the real handler on disk. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createServer, request as httpRequest, type Server } from 'node:http';
import { createHash } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm, truncate, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { checkpointHandler, latestValidCheckpoint, type CheckpointHandlerOptions } from '../signaling/checkpoints.ts';
import { CheckpointError, listCheckpoints, loadCheckpoint, saveCheckpoint } from '../src/checkpoint.ts';
import { CheckpointCorruptError, decodeCheckpoint, encodeCheckpoint, type Checkpoint, type WeightSpec } from '../src/checkpoint_format.ts';
import { DistTimeoutError } from '../src/errors.ts';

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

function makeCheckpoint(step: number, layers: Array<[number, number]> = [[16, 8], [8, 4]]): Checkpoint {
  const weightSpecs = specsFor(layers);
  const optimizerSpecs: WeightSpec[] = [
    { name: 'iter', shape: [], dtype: 'float32' },
    ...weightSpecs.flatMap((s) => [
      { ...s, name: `${s.name}/m` },
      { ...s, name: `${s.name}/v` },
    ]),
  ];
  return {
    meta: { step, epoch: Math.floor(step / 100), sampler: { epoch: 1, index: step * 32 }, config: { lr: 0.001, batchSize: 32 }, generation: 2 },
    model: {
      modelTopology: {
        class_name: 'Sequential',
        config: {
          name: 'sequential_1',
          layers: layers.map(([inputs, units], i) => ({
            class_name: 'Dense',
            config: { units, activation: i === layers.length - 1 ? 'softmax' : 'relu', use_bias: true, name: `dense_Dense${i + 1}`, ...(i === 0 ? { batch_input_shape: [null, inputs] } : {}) },
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
    const c = makeCheckpoint(1234, [[784, 128], [128, 10]]);
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
    await expect(encodeCheckpoint(split)).rejects.toThrow(/model.weightData must be one ArrayBuffer/);
  });
});

// ---------------------------------------------------------------------------------------------

interface Mounted {
  url: string;
  dir: string;
  close(): Promise<void>;
}

const servers: Mounted[] = [];

/** The handler on a real node:http server on port 0, over a fresh temp dir; other paths get a plain 404. */
async function mount(options: Partial<CheckpointHandlerOptions> = {}): Promise<Mounted> {
  const dir = await mkdtemp(join(tmpdir(), 'ckpt-test-'));
  const handle = checkpointHandler({ dir, ...options });
  const server = createServer((req, res) => {
    void handle(req, res).then((handled) => {
      if (!handled) res.writeHead(404, { 'content-type': 'text/plain' }).end(`not found: ${req.url}`);
    });
  });
  const mounted = await listen(server, dir);
  servers.push(mounted);
  return mounted;
}

async function listen(server: Server, dir = ''): Promise<Mounted> {
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

async function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: unknown) => e,
  );
}

describe('checkpoint server', () => {
  let srv: Mounted;
  beforeAll(async () => {
    srv = await mount({ keep: 3 });
  });

  it('save then load returns identical bytes', async () => {
    const s = session();
    const c = makeCheckpoint(123);
    const saved = await saveCheckpoint(srv.url, s, c);
    expect(saved.name).toMatch(/^\d{8}T\d{9}Z-step-00000123$/);
    const encoded = await encodeCheckpoint(c);
    expect(saved.bytes).toBe(encoded.length);
    // What is on disk is exactly what the client encoded.
    expect((await readFile(join(srv.dir, s, `${saved.name}.ckpt`))).equals(Buffer.from(encoded))).toBe(true);

    const loaded = await loadCheckpoint(srv.url, s);
    expect(loaded).not.toBeNull();
    expect(loaded!.name).toBe(saved.name);
    expect(loaded!.skipped).toEqual([]);
    expect(Buffer.from(await encodeCheckpoint(loaded!.checkpoint)).equals(Buffer.from(encoded))).toBe(true);
    expect(loaded!.checkpoint.meta).toEqual(c.meta);

    const listed = await listCheckpoints(srv.url, s);
    expect(listed).toHaveLength(1);
    expect(listed[0]).toMatchObject({ name: saved.name, bytes: encoded.length, step: 123 });
    expect(Number.isNaN(Date.parse(listed[0].mtime))).toBe(false);

    const named = await loadCheckpoint(srv.url, s, { name: saved.name });
    expect(named!.name).toBe(saved.name);
    expect(sameBytes(named!.checkpoint.model.weightData, c.model.weightData)).toBe(true);
  });

  it('keeps only the last `keep` checkpoints, newest last', async () => {
    const s = session();
    const names: string[] = [];
    for (let step = 1; step <= 5; step++) names.push((await saveCheckpoint(srv.url, s, makeCheckpoint(step))).name);
    expect([...names].sort()).toEqual(names);
    const listed = await listCheckpoints(srv.url, s);
    expect(listed.map((c) => c.name)).toEqual(names.slice(2));
    expect(listed.map((c) => c.step)).toEqual([3, 4, 5]);
    expect((await readdir(join(srv.dir, s))).sort()).toEqual(names.slice(2).map((n) => `${n}.ckpt`));
    expect((await loadCheckpoint(srv.url, s))!.checkpoint.meta.step).toBe(5);
  });

  it('a newer save at a lower step (a restarted run) is the latest and is not pruned', async () => {
    const s = session();
    for (const step of [500, 600, 700]) await saveCheckpoint(srv.url, s, makeCheckpoint(step));
    const restarted = await saveCheckpoint(srv.url, s, makeCheckpoint(450));
    expect((await listCheckpoints(srv.url, s)).map((c) => c.step)).toEqual([600, 700, 450]);
    expect((await loadCheckpoint(srv.url, s))!.name).toBe(restarted.name);
  });

  it('concurrent saves get distinct, ordered names', async () => {
    const s = session();
    const saved = await Promise.all([1, 2, 3].map((step) => saveCheckpoint(srv.url, s, makeCheckpoint(step))));
    expect(new Set(saved.map((x) => x.name)).size).toBe(3);
    expect((await listCheckpoints(srv.url, s))).toHaveLength(3);
  });

  it('skips a truncated newest checkpoint and says which and why', async () => {
    const s = session();
    const older = await saveCheckpoint(srv.url, s, makeCheckpoint(10));
    const newer = await saveCheckpoint(srv.url, s, makeCheckpoint(20));
    const path = join(srv.dir, s, `${newer.name}.ckpt`);
    await truncate(path, newer.bytes - 100);

    const loaded = await loadCheckpoint(srv.url, s);
    expect(loaded!.name).toBe(older.name);
    expect(loaded!.checkpoint.meta.step).toBe(10);
    expect(loaded!.skipped).toEqual([{ name: newer.name, reason: `truncated: expected ${newer.bytes} bytes, got ${newer.bytes - 100}` }]);

    const direct = await latestValidCheckpoint(srv.dir, s);
    expect(direct).toMatchObject({ name: older.name, bytes: older.bytes, skipped: loaded!.skipped });
    expect(direct!.meta.step).toBe(10);

    // Loading the corrupt one by name fails on the client, naming it.
    const err = await rejection(loadCheckpoint(srv.url, s, { name: newer.name }));
    expect(err).toBeInstanceOf(CheckpointCorruptError);
    expect((err as Error).message).toContain(newer.name);
  });

  it('skips a checkpoint with a flipped byte (checksum mismatch)', async () => {
    const s = session();
    const older = await saveCheckpoint(srv.url, s, makeCheckpoint(1));
    const newer = await saveCheckpoint(srv.url, s, makeCheckpoint(2));
    const flip = async (name: string) => {
      const path = join(srv.dir, s, `${name}.ckpt`);
      const bytes = await readFile(path);
      bytes[bytes.length >> 1] ^= 0xff;
      await writeFile(path, bytes);
    };
    await flip(newer.name);
    const loaded = await loadCheckpoint(srv.url, s);
    expect(loaded!.name).toBe(older.name);
    expect(loaded!.skipped).toEqual([{ name: newer.name, reason: expect.stringContaining('checksum mismatch') }]);

    // None verifies: an error listing them, not "no checkpoint" (which would start a job afresh).
    await flip(older.name);
    const err = await rejection(loadCheckpoint(srv.url, s));
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as CheckpointError).status).toBe(409);
    expect((err as Error).message).toContain(`${older.name} (checksum mismatch`);
    expect((err as Error).message).toContain(newer.name);
    expect(await latestValidCheckpoint(srv.dir, s)).toBeNull();
  });

  it('ignores leftover .tmp files and cleans stale ones on the next save', async () => {
    const s = session();
    const first = await saveCheckpoint(srv.url, s, makeCheckpoint(1));
    const sessionDir = join(srv.dir, s);
    // A crash mid-upload: a partial file, even one named like a newer checkpoint.
    const stale = join(sessionDir, '29990101T000000000Z-step-00000099.ckpt.tmp');
    const fresh = join(sessionDir, 'upload-in-progress-elsewhere.tmp');
    const partial = (await encodeCheckpoint(makeCheckpoint(99))).subarray(0, 500);
    await writeFile(stale, partial);
    await writeFile(fresh, partial);
    const hourAgo = new Date(Date.now() - 3_600_000);
    await utimes(stale, hourAgo, hourAgo);

    expect((await listCheckpoints(srv.url, s)).map((c) => c.name)).toEqual([first.name]);
    expect((await loadCheckpoint(srv.url, s))!.name).toBe(first.name);

    await saveCheckpoint(srv.url, s, makeCheckpoint(2));
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
    await expect(saveCheckpoint(srv.url, '..', makeCheckpoint(1))).rejects.toThrow(/not allowed/);
    await expect(loadCheckpoint(srv.url, 'bad name')).rejects.toThrow(TypeError);
    expect(await readdir(srv.dir)).not.toContain('bad name');
  });

  it('refuses a corrupt upload with 400 saying why', async () => {
    const s = session();
    const bytes = await encodeCheckpoint(makeCheckpoint(1));
    bytes[100] ^= 1;
    const res = await fetch(`${srv.url}api/checkpoints/${s}`, { method: 'POST', body: bytes });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { message: string }).message).toContain('checksum mismatch');
    const truncated = await fetch(`${srv.url}api/checkpoints/${s}`, { method: 'PUT', body: bytes.subarray(0, 1000) });
    expect(truncated.status).toBe(400);
    expect(((await truncated.json()) as { message: string }).message).toContain(`truncated: expected ${bytes.length} bytes, got 1000`);
    expect(await readdir(join(srv.dir, s))).toEqual([]);
  });

  it('returns null for a session with no checkpoints; lists nothing', async () => {
    expect(await loadCheckpoint(srv.url, session('unknown'))).toBeNull();
    expect(await listCheckpoints(srv.url, session('unknown'))).toEqual([]);
  });

  it('refuses bad checkpoint names and unknown ones', async () => {
    const s = session();
    expect((await fetch(`${srv.url}api/checkpoints/${s}/..%2F..%2Fetc`)).status).toBe(400);
    const err = await rejection(loadCheckpoint(srv.url, s, { name: '20200101T000000000Z-step-00000001' }));
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as CheckpointError).status).toBe(404);
  });
});

describe('checkpoint limits and failures', () => {
  it('refuses an upload over maxBytes with 413, naming the session, status and limit', async () => {
    const small = await mount({ maxBytes: 4096 });
    const s = session();
    const err = await rejection(saveCheckpoint(small.url, s, makeCheckpoint(1, [[64, 32]])));
    expect(err).toBeInstanceOf(CheckpointError);
    const e = err as CheckpointError;
    expect(e.status).toBe(413);
    expect(e.session).toBe(s);
    expect(e.message).toContain(`"${s}"`);
    expect(e.message).toContain('HTTP 413');
    expect(e.message).toContain('at most 4096 bytes');
  });

  it('refuses a streamed (chunked) upload once it passes maxBytes, leaving no files', async () => {
    const small = await mount({ maxBytes: 4096 });
    const s = session();
    const { port } = new URL(small.url);
    const status = await new Promise<number>((done, fail) => {
      const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: `/api/checkpoints/${s}` }, (res) => {
        res.resume();
        done(res.statusCode ?? 0);
      });
      req.on('error', fail);
      // No content-length: the server must count.
      for (let i = 0; i < 10; i++) req.write(Buffer.alloc(1024));
      req.end();
    });
    expect(status).toBe(413);
    await new Promise((r) => setTimeout(r, 50));
    expect(await readdir(join(small.dir, s))).toEqual([]);
  });

  it('times out a request that gets no answer, naming the URL and the time', async () => {
    const silent = await listen(createServer(() => {}));
    servers.push(silent);
    const err = await rejection(loadCheckpoint(silent.url, 'quiet', { timeoutMs: 200 }));
    expect(err).toBeInstanceOf(DistTimeoutError);
    expect((err as Error).message).toContain('200 ms');
    expect((err as Error).message).toContain(`${silent.url}api/checkpoints/quiet/latest`);
  });

  it('a server without the checkpoint handler is an error, not "no checkpoint"', async () => {
    const plain = await listen(createServer((_req, res) => res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: /api/...')));
    servers.push(plain);
    const err = await rejection(loadCheckpoint(plain.url, 'x'));
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as Error).message).toContain('HTTP 404: not found');
  });

  it('an unreachable server is a CheckpointError naming the session and URL', async () => {
    const gone = await listen(createServer());
    await gone.close();
    const err = await rejection(listCheckpoints(gone.url, 'x'));
    expect(err).toBeInstanceOf(CheckpointError);
    expect((err as Error).message).toContain('could not reach the server');
    expect((err as Error).message).toContain(`${gone.url}api/checkpoints/x`);
  });

  it("the caller's abort signal cancels a request", async () => {
    const silent = await listen(createServer(() => {}));
    servers.push(silent);
    const controller = new AbortController();
    const pending = rejection(listCheckpoints(silent.url, 'x', { signal: controller.signal }));
    controller.abort(new Error('user cancelled'));
    expect(((await pending) as Error).message).toBe('user cancelled');
  });
});
