/** The checkpoint store (signaling/checkpoint_store.ts) on its own: a temporary folder, no server, no HTTP. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdir, mkdtemp, readdir, rm, unlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  CheckpointRefused,
  checkpointStore,
  latestValidCheckpoint,
  type ByteSource,
  type CheckpointStoreOptions,
} from '../signaling/checkpoint_store.ts';
import {
  CHECKPOINT_MAGIC,
  CHECKPOINT_VERSION,
  PREAMBLE_BYTES,
  encodeCheckpoint,
  type Checkpoint,
  type WeightSpec,
} from '../src/checkpoint/checkpoint_format.ts';
import { errorOf } from './fixtures/errors.ts';

let root: string;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), 'ckpt-store-test-'));
});

afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

let stores = 0;

/** A store over a fresh, empty folder of its own, noting what it hashes and logs. */
async function freshStore(options: Partial<CheckpointStoreOptions> = {}) {
  const dir = join(root, `store-${++stores}`);
  await mkdir(dir);
  /** Paths the store read and hashed in full (onVerify), in order. */
  const verified: string[] = [];
  const logged: string[] = [];
  const store = checkpointStore({ dir, onVerify: (path) => verified.push(path), log: (line) => logged.push(line), ...options });
  return { dir, store, verified, logged };
}

function randomData(bytes: number): ArrayBuffer {
  const out = new Uint8Array(bytes);
  crypto.getRandomValues(out);
  return out.buffer;
}

/** A small checkpoint: one dense layer's kernel and bias, and an optimizer's iteration count. */
function makeCheckpoint(meta: Record<string, unknown>, units = 4): Checkpoint {
  const weightSpecs: WeightSpec[] = [
    { name: 'dense/kernel', shape: [8, units], dtype: 'float32' },
    { name: 'dense/bias', shape: [units], dtype: 'float32' },
  ];
  const optimizerSpecs: WeightSpec[] = [{ name: 'iter', shape: [], dtype: 'float32' }];
  return {
    meta,
    model: {
      modelTopology: { class_name: 'Sequential', config: { name: 'sequential_1', layers: [] } },
      weightSpecs,
      weightData: randomData(4 * (8 * units + units)),
    },
    optimizer: { weightSpecs: optimizerSpecs, weightData: randomData(4) },
  };
}

const container = (meta: Record<string, unknown>) => encodeCheckpoint(makeCheckpoint(meta));

/** `bytes` as an upload's body would give them: in chunks, the first ones kept by firstBytes. */
function sourceOf(bytes: Uint8Array, chunkBytes = 100): ByteSource {
  const all = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let received = 0;
  return {
    async firstBytes(n) {
      received = Math.max(received, Math.min(all.length, n));
      return all.subarray(0, received);
    },
    async next() {
      if (received >= all.length) return null;
      const chunk = all.subarray(received, received + chunkBytes);
      received += chunk.length;
      return chunk;
    },
  };
}

type Store = ReturnType<typeof checkpointStore>;

const saveBytes = (store: Store, folder: string, bytes: Uint8Array) => store.save(folder, bytes.length, () => sourceOf(bytes));

const names = async (store: Store, folder: string) => (await store.list(folder)).map((c) => c.name);

async function failure(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: unknown) => e,
  );
}

async function refusal(p: Promise<unknown>): Promise<CheckpointRefused> {
  const err = await failure(p);
  expect(err).toBeInstanceOf(CheckpointRefused);
  return err as CheckpointRefused;
}

// ---------------------------------------------------------------------------------------------

describe('checkpoint store', () => {
  it('saves, lists, opens and finds the latest checkpoint', async () => {
    const { dir, store, verified } = await freshStore();
    const folder = store.folder('alpha');
    expect(folder).toBe(join(dir, 'alpha'));
    expect(await store.list(folder)).toEqual([]);
    expect(await store.latest(folder)).toEqual({ found: null, skipped: [] });

    const bytes = await container({ step: 42 });
    const saved = await saveBytes(store, folder, bytes);
    expect(saved).toEqual({ name: expect.stringMatching(/^\d{8}T\d{9}Z-step-00000042$/), bytes: bytes.length, step: 42 });
    // Hashed once, as its .tmp file, before it was renamed into place; nothing else is left.
    expect(verified).toHaveLength(1);
    expect(verified[0]!.startsWith(join(folder, 'upload-'))).toBe(true);
    expect(verified[0]!.endsWith('.tmp')).toBe(true);
    expect(await readdir(folder)).toEqual([`${saved.name}.ckpt`]);

    const listed = await store.list(folder);
    expect(listed).toEqual([{ name: saved.name, bytes: bytes.length, step: 42, mtime: expect.any(String) }]);
    expect(Number.isNaN(Date.parse(listed[0]!.mtime))).toBe(false);

    // By name: the bytes as saved. An unknown name is null.
    const fh = await store.openCheckpoint(folder, saved.name);
    expect(fh).not.toBeNull();
    try {
      expect((await fh!.readFile()).equals(Buffer.from(bytes))).toBe(true);
    } finally {
      await fh!.close();
    }
    expect(await store.openCheckpoint(folder, '20200101T000000000Z-step-00000001')).toBeNull();

    // The latest, still open; verified by the save already, so not hashed again.
    const latest = await store.latest(folder);
    expect(latest.skipped).toEqual([]);
    expect(latest.found).toMatchObject({ name: saved.name, size: bytes.length });
    await latest.found!.fh.close();
    expect(verified).toHaveLength(1);

    // The standalone reader verifies it itself and gives its meta.
    expect(await latestValidCheckpoint(dir, 'alpha')).toEqual({
      name: saved.name,
      path: join(folder, `${saved.name}.ckpt`),
      bytes: bytes.length,
      meta: { step: 42 },
      skipped: [],
    });
  });

  it('names a checkpoint without a usable meta.step by its time alone', async () => {
    const { store } = await freshStore();
    const folder = store.folder('nostep');
    const none = await saveBytes(store, folder, await container({}));
    const negative = await saveBytes(store, folder, await container({ step: -1 }));
    for (const saved of [none, negative]) {
      expect(saved.step).toBeNull();
      expect(saved.name).toMatch(/^\d{8}T\d{9}Z$/);
    }
    expect((await store.list(folder)).map((c) => c.step)).toEqual([null, null]);
  });

  it('orders checkpoints by write time, not step, and keeps the last `keep`', async () => {
    const { store } = await freshStore({ keep: 3 });
    const folder = store.folder('beta');
    const saved = [];
    // A restarted run may save a lower step: it is still the newest.
    for (const step of [30, 10, 20, 5]) saved.push(await saveBytes(store, folder, await container({ step })));
    const all = saved.map((s) => s.name);
    expect(new Set(all).size).toBe(4);
    expect([...all].sort()).toEqual(all);
    expect(await names(store, folder)).toEqual(all.slice(1));
    expect((await store.list(folder)).map((c) => c.step)).toEqual([10, 20, 5]);
    expect((await readdir(folder)).sort()).toEqual(all.slice(1).map((n) => `${n}.ckpt`));
    const latest = await store.latest(folder);
    expect(latest.found?.name).toBe(all[3]);
    await latest.found?.fh.close();
  });

  it('gives concurrent saves distinct names', async () => {
    const { store } = await freshStore();
    const folder = store.folder('together');
    const saved = await Promise.all([1, 2, 3].map(async (step) => saveBytes(store, folder, await container({ step }))));
    const all = saved.map((s) => s.name);
    expect(new Set(all).size).toBe(3);
    expect(await names(store, folder)).toEqual([...all].sort());
    expect((await readdir(folder)).filter((f) => f.endsWith('.tmp'))).toEqual([]);
  });

  it("keeps a part's checkpoints apart from the session's and from other parts", async () => {
    const { dir, store } = await freshStore({ keep: 1 });
    const own = store.folder('gamma');
    const stage0 = store.folder('gamma', 'stage-0');
    expect(stage0).toBe(join(dir, 'gamma', 'parts', 'stage-0'));
    const part = await saveBytes(store, stage0, await container({ step: 1 }));
    await saveBytes(store, own, await container({ step: 2 }));
    const newest = await saveBytes(store, own, await container({ step: 3 }));
    // The session's pruning (keep 1) does not reach into its parts.
    expect(await names(store, own)).toEqual([newest.name]);
    expect(await names(store, stage0)).toEqual([part.name]);
    expect(await store.list(store.folder('gamma', 'stage-1'))).toEqual([]);
    expect((await latestValidCheckpoint(dir, 'gamma', 'stage-0'))?.name).toBe(part.name);
    expect((await latestValidCheckpoint(dir, 'gamma'))?.name).toBe(newest.name);
    expect(await latestValidCheckpoint(dir, 'gamma', 'stage-1')).toBeNull();
  });

  it('refuses session and part names that are not allowed', async () => {
    const { dir, store } = await freshStore();
    for (const bad of ['..', '.', 'a/b', 'bad name', 'x'.repeat(65), '']) expect(() => store.folder(bad), bad).toThrow(TypeError);
    for (const bad of ['..', 'Stage-0', '-stage', 'a'.repeat(33), '']) expect(() => store.folder('ok', bad), bad).toThrow(RangeError);
    await expect(latestValidCheckpoint(dir, '..')).rejects.toThrow(TypeError);
    await expect(latestValidCheckpoint(dir, 'ok', '..')).rejects.toThrow(RangeError);
    expect(await readdir(dir)).toEqual([]);
  });

  it('refuses options that are not positive integers', async () => {
    const dir = join(root, 'never-used');
    expect(() => checkpointStore({ dir, keep: 0 })).toThrow(errorOf(RangeError, 'keep must be a positive integer, got 0'));
    expect(() => checkpointStore({ dir, maxDiskBytes: 1.5 })).toThrow(
      errorOf(RangeError, 'maxDiskBytes must be a positive integer, got 1.5'),
    );
  });
});

describe('checkpoint store: refused saves leave nothing behind', () => {
  it('refuses a container that fails its checksum once written, removing its .tmp and the folder it made', async () => {
    const { dir, store, verified } = await freshStore();
    const bytes = await container({ step: 1 });
    bytes[bytes.length - 100] ^= 1; // in the weights: found by the checksum, after the whole file is written
    let committed = false;
    const folder = store.folder('delta');
    const err = await refusal(
      store.save(
        folder,
        bytes.length,
        () => sourceOf(bytes),
        async () => {
          committed = true;
        },
      ),
    );
    expect(err.code).toBe('corrupt');
    expect(err.message).toContain('checksum mismatch');
    expect(err.message).toContain('nothing was stored');
    expect(committed).toBe(false);
    expect(verified).toHaveLength(1); // it was written and hashed ...
    expect(await readdir(dir)).toEqual([]); // ... and neither its .tmp nor its folder stays

    // Into a part of a new session: every folder it made goes.
    expect((await refusal(saveBytes(store, store.folder('delta', 'stage-0'), bytes))).code).toBe('corrupt');
    expect(await readdir(dir)).toEqual([]);

    // Into a folder that holds a checkpoint: that one stays, and so does the folder.
    const good = await saveBytes(store, folder, await container({ step: 2 }));
    expect((await refusal(saveBytes(store, folder, bytes))).code).toBe('corrupt');
    expect(await readdir(folder)).toEqual([`${good.name}.ckpt`]);
    expect((await latestValidCheckpoint(dir, 'delta'))?.name).toBe(good.name);
  });

  it('refuses from the first bytes, before any file is made: bad magic, truncation, a header that does not describe its sections', async () => {
    const { dir, store, verified } = await freshStore();
    const folder = store.folder('epsilon');
    const bytes = await container({ step: 1 });

    const notOurs = bytes.slice();
    notOurs.set(new TextEncoder().encode('PK\x03\x04'), 0);
    const magic = await refusal(saveBytes(store, folder, notOurs));
    expect(magic.code).toBe('corrupt');
    expect(magic.message).toContain('bad magic');

    const truncated = await refusal(saveBytes(store, folder, bytes.subarray(0, 100)));
    expect(truncated.code).toBe('corrupt');
    expect(truncated.message).toContain(`truncated: expected ${bytes.length} bytes, got 100`);

    const c = makeCheckpoint({ step: 1 });
    const short = await encodeCheckpoint({ ...c, model: { ...c.model, weightData: c.model.weightData.slice(4) } });
    const sections = await refusal(saveBytes(store, folder, short));
    expect(sections.code).toBe('corrupt');
    expect(sections.message).toContain(
      `model.weightSpecs describe ${4 * (8 * 4 + 4)} bytes of tensors but the model section holds ${4 * (8 * 4 + 4) - 4} bytes`,
    );

    expect(verified).toEqual([]);
    expect(await readdir(dir)).toEqual([]);
  });

  it('refuses a JSON header too large to hold in memory, reading nothing past the preamble', async () => {
    const { dir, store } = await freshStore();
    const headerBytes = 16 * 1024 * 1024 + 1;
    const preamble = Buffer.alloc(PREAMBLE_BYTES);
    preamble.write(CHECKPOINT_MAGIC, 0, 'latin1');
    preamble.writeUInt32LE(CHECKPOINT_VERSION, 8);
    preamble.writeUInt32LE(headerBytes, 12); // and empty weight sections
    const declared = PREAMBLE_BYTES + headerBytes + 32;
    const asked: number[] = [];
    const source: ByteSource = {
      async firstBytes(n) {
        asked.push(n);
        return preamble;
      },
      async next() {
        throw new Error('read past the preamble');
      },
    };
    const err = await refusal(store.save(store.folder('zeta'), declared, () => source));
    expect(err.code).toBe('too-large');
    expect(err.message).toContain(`the checkpoint's JSON header is ${headerBytes} bytes`);
    expect(asked).toEqual([PREAMBLE_BYTES]);
    expect(await readdir(dir)).toEqual([]);
  });

  it('passes a failure of its source through, removing the .tmp', async () => {
    const { dir, store } = await freshStore();
    const bytes = await container({ step: 1 });
    const inner = sourceOf(bytes);
    const broken = new Error('connection reset');
    let tmpExisted = false;
    const source: ByteSource = {
      firstBytes: (n) => inner.firstBytes(n),
      async next() {
        // Past the header: the .tmp file exists now.
        tmpExisted = (await readdir(join(dir, 'eta'))).some((f) => f.endsWith('.tmp'));
        throw broken;
      },
    };
    expect(await failure(store.save(store.folder('eta'), bytes.length, () => source))).toBe(broken);
    expect(tmpExisted).toBe(true);
    expect(await readdir(dir)).toEqual([]);
  });

  it('stores nothing when beforeCommit throws, after the container has verified', async () => {
    const { dir, store, verified } = await freshStore();
    const bytes = await container({ step: 1 });
    const taken = new Error('the session has another token now');
    const err = await failure(
      store.save(
        store.folder('theta'),
        bytes.length,
        () => sourceOf(bytes),
        async () => {
          throw taken;
        },
      ),
    );
    expect(err).toBe(taken);
    expect(verified).toHaveLength(1);
    expect(await readdir(dir)).toEqual([]);
  });

  it('keeps all sessions and their parts within the disk budget', async () => {
    const first = await container({ step: 1 });
    const { dir, store, logged } = await freshStore({ maxDiskBytes: Math.floor(first.length * 1.5) });
    await saveBytes(store, store.folder('iota', 'stage-0'), first);
    const second = await container({ step: 2 });
    const err = await refusal(saveBytes(store, store.folder('kappa'), second));
    expect(err.code).toBe('insufficient-storage');
    expect(err.message).toContain(
      `${first.length} bytes are stored or being uploaded (all sessions) and this upload of ${second.length} bytes would pass its limit of ${Math.floor(first.length * 1.5)} bytes (maxDiskBytes)`,
    );
    expect(logged.some((line) => line.includes('disk budget'))).toBe(true);
    expect(await readdir(dir)).toEqual(['iota']); // the refused save made no folder
  });

  it('trusts a recent scan, kept true by its own saves and prunes, for a save that fits; refuses only on a fresh scan', async () => {
    const bytes = await container({ step: 1 });
    const { dir, store } = await freshStore({ maxDiskBytes: Math.floor(bytes.length * 2.5), keep: 1 });
    await saveBytes(store, store.folder('mu'), bytes); // the scan: nothing stored
    // Its own saves and prunes keep the figure: with keep 1, one file stays, and each save fits beside it.
    for (let i = 0; i < 4; i++) await saveBytes(store, store.folder('mu'), bytes);
    // Files the store did not write (another server sharing the folder) are not rescanned for a
    // save the figure has room for...
    await mkdir(join(dir, 'other'));
    await writeFile(join(dir, 'other', 'a.ckpt'), Buffer.alloc(bytes.length));
    await saveBytes(store, store.folder('nu'), bytes);
    // ...but a save the figure has no room for is decided on a fresh scan, which finds them.
    const err = await refusal(saveBytes(store, store.folder('xi'), bytes));
    expect(err.message).toContain(`${3 * bytes.length} bytes are stored or being uploaded`);
    expect(await readdir(dir)).toEqual(['mu', 'nu', 'other']);
  });

  it("counts leftover .tmp files in the budget, and frees a refused save's share of it", async () => {
    const bytes = await container({ step: 1 });
    // Left by a server that crashed mid-upload, before this one started.
    const dir = join(root, `store-${++stores}`);
    await mkdir(join(dir, 'old'), { recursive: true });
    const leftover = join(dir, 'old', 'upload-crashed.tmp');
    await writeFile(leftover, Buffer.alloc(100));
    const store = checkpointStore({ dir, maxDiskBytes: bytes.length + 10 });
    expect((await refusal(saveBytes(store, store.folder('lambda'), bytes))).code).toBe('insufficient-storage');
    await unlink(leftover);
    // Had the refused save kept its reservation, this one would not fit.
    const saved = await saveBytes(store, store.folder('lambda'), bytes);
    expect(await names(store, store.folder('lambda'))).toEqual([saved.name]);
  });

  it('counts a save in progress at its declared length', async () => {
    const bytes = await container({ step: 1 });
    const { dir, store } = await freshStore({ maxDiskBytes: Math.floor(bytes.length * 1.5) });
    let arrived!: () => void;
    const atGate = new Promise<void>((done) => (arrived = done));
    let release!: () => void;
    const gate = new Promise<void>((done) => (release = done));
    const inner = sourceOf(bytes);
    let held = false;
    const slow: ByteSource = {
      firstBytes: (n) => inner.firstBytes(n),
      async next() {
        if (!held) {
          held = true;
          arrived();
          await gate;
        }
        return inner.next();
      },
    };
    const first = store.save(store.folder('slow'), bytes.length, () => slow);
    try {
      await atGate; // past its header: its .tmp exists, and its length is reserved
      expect((await readdir(join(dir, 'slow'))).some((f) => f.endsWith('.tmp'))).toBe(true);
      expect((await refusal(saveBytes(store, store.folder('fast'), bytes))).code).toBe('insufficient-storage');
    } finally {
      release();
    }
    const saved = await first;
    expect(await names(store, store.folder('slow'))).toEqual([saved.name]);
    expect(await readdir(dir)).toEqual(['slow']);
  });
});

describe('checkpoint store: latest and pruning', () => {
  it('passes over newer corrupt files, naming them, and remembers what it found', async () => {
    const { dir, store, verified } = await freshStore();
    const folder = store.folder('mu');
    const good = await saveBytes(store, folder, await container({ step: 1 }));
    // A newer file that is no container (a half-copied file, say), named as a later checkpoint.
    const bad = '29990101T000000000Z-step-00000002';
    const badPath = join(folder, `${bad}.ckpt`);
    await writeFile(badPath, 'not a checkpoint');
    verified.length = 0;

    const first = await store.latest(folder);
    expect(first.found?.name).toBe(good.name);
    expect(first.skipped).toEqual([{ name: bad, reason: expect.stringContaining('bad magic') }]);
    await first.found?.fh.close();
    expect(verified).toEqual([badPath]); // the saved one was verified when it was saved

    const second = await store.latest(folder);
    expect(second.found?.name).toBe(good.name);
    expect(second.skipped).toEqual(first.skipped);
    await second.found?.fh.close();
    expect(verified).toEqual([badPath]); // neither is hashed again while it stays as it is

    expect(await latestValidCheckpoint(dir, 'mu')).toMatchObject({ name: good.name, skipped: first.skipped });
    // By name, a file is opened as stored, unverified.
    const raw = await store.openCheckpoint(folder, bad);
    expect(raw).not.toBeNull();
    await raw?.close();

    // The next save is named after the newest on disk, whatever the clock says.
    const after = await saveBytes(store, folder, await container({ step: 3 }));
    expect(after.name).toBe('29990101T000000001Z-step-00000003');
    const latest = await store.latest(folder);
    expect(latest.found?.name).toBe(after.name);
    expect(latest.skipped).toEqual([]);
    await latest.found?.fh.close();
  });

  it('finds nothing valid when every checkpoint is corrupt', async () => {
    const { dir, store } = await freshStore();
    const folder = store.folder('nu');
    const saved = await saveBytes(store, folder, await container({ step: 1 }));
    await writeFile(join(folder, `${saved.name}.ckpt`), 'overwritten');
    const latest = await store.latest(folder);
    expect(latest.found).toBeNull();
    expect(latest.skipped).toEqual([{ name: saved.name, reason: expect.stringContaining('bad magic') }]);
    expect(await latestValidCheckpoint(dir, 'nu')).toBeNull();
  });

  it('ignores .tmp files, and deletes stale ones on the next save', async () => {
    const { store } = await freshStore();
    const folder = store.folder('xi');
    const first = await saveBytes(store, folder, await container({ step: 1 }));
    const stale = join(folder, '29990101T000000000Z-step-00000099.ckpt.tmp');
    const fresh = join(folder, 'upload-in-progress-elsewhere.tmp');
    await writeFile(stale, 'partial');
    await writeFile(fresh, 'partial');
    const hourAgo = new Date(Date.now() - 3_600_000);
    await utimes(stale, hourAgo, hourAgo);

    expect(await names(store, folder)).toEqual([first.name]);
    const latest = await store.latest(folder);
    expect(latest.found?.name).toBe(first.name);
    await latest.found?.fh.close();

    const second = await saveBytes(store, folder, await container({ step: 2 }));
    expect((await readdir(folder)).sort()).toEqual(
      [`${first.name}.ckpt`, `${second.name}.ckpt`, 'upload-in-progress-elsewhere.tmp'].sort(),
    );
  });
});
