/**
 * runParameterServer in Node (TF.js cpu backend, in-memory links, the real server): CentralStorage
 * trains to one rank's weights at the global batch; asynchronous training converges and accounts
 * for every sample; a worker that leaves costs its batch and the others go on; the staleness
 * bound drops and counts; a lost server stops the workers until a tab takes its place, which
 * resumes from the shard's checkpoint. The same on real pages is test/e2e/ps.spec.ts.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { batchOf, planEpoch } from '../src/elastic/epoch.ts';
import { classificationLoss } from '../src/nn/models.ts';
import { flatGradients } from '../src/parallel/parameter_server/worker.ts';
import {
  runParameterServer,
  type ParameterServerRunOptions,
  type ParameterServerRunResult,
  type PsRunEvent,
} from '../src/parallel/parameter_server/runner.ts';
import { flatTrainableWeights } from '../src/parallel/replicas.ts';
import { DistTimeoutError } from '../src/wire/errors.ts';
import { connect, groupSize, text, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { sleep, waitFor as waitForNamed } from './fixtures/wait.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer({ settleMs: 300, checkpointDir: await mkdtemp(join(tmpdir(), 'ddp-ps-')) });
});
afterAll(async () => {
  await server.close();
});

const data = syntheticDataset({ length: 512, inputSize: 16, numClasses: 4, seed: 1 });

function model(): tf.Sequential {
  const m = tf.sequential();
  m.add(
    tf.layers.dense({ units: 24, activation: 'relu', inputShape: [16], kernelInitializer: tf.initializers.glorotUniform({ seed: 5 }) }),
  );
  m.add(tf.layers.dense({ units: 4, kernelInitializer: tf.initializers.glorotUniform({ seed: 6 }) }));
  return m;
}

async function gradsOf(m: tf.LayersModel, indices: number[]): Promise<{ loss: number; grads: Float32Array }> {
  const { x, y } = data.batch(indices);
  const xs = tf.tensor(x, [indices.length, 16]);
  const ys = tf.tensor1d(Int32Array.from(y), 'int32');
  try {
    return await flatGradients(m, () => classificationLoss(m.apply(xs) as tf.Tensor, ys, 4));
  } finally {
    tf.dispose([xs, ys]);
  }
}

interface Member {
  events: PsRunEvent[];
  result: Promise<ParameterServerRunResult>;
  abort: AbortController;
  steps: number;
}

/** `holdAt`: the worker waits before that step until `until` resolves (the test closes a server meanwhile). */
type Extra = Partial<ParameterServerRunOptions> & {
  leaveAtStep?: number;
  slowMs?: number;
  holdAt?: { step: number; until: Promise<void> };
};

function member(net: MemoryNetwork, id: number, session: string, max: number, extra: Extra = {}): Member {
  const events: PsRunEvent[] = [];
  const abort = new AbortController();
  const m = model();
  const self: Member = { events, abort, steps: 0, result: Promise.resolve() as unknown as Promise<ParameterServerRunResult> };
  const { leaveAtStep, slowMs, holdAt, ...options } = extra;
  self.result = runParameterServer({
    url: server.url,
    session,
    token: tokenFor(session),
    timeoutMs: 20_000,
    heartbeatIntervalMs: 200,
    linkFactory: net.factoryFor(id),
    max,
    model: m,
    optimizer: () => tf.train.sgd(0.1),
    datasetLength: 256,
    batchSize: 16,
    seed: 3,
    signal: abort.signal,
    onEvent: (e) => events.push(e),
    async step({ indices, model: mm }) {
      self.steps++;
      if (self.steps === leaveAtStep) abort.abort(new Error(`member ${id} closed at its step ${self.steps}`));
      if (holdAt?.step === self.steps) await holdAt.until;
      if (slowMs) await sleep(slowMs); // a slow worker: the behaviour under test
      const { loss, grads } = await gradsOf(mm, indices);
      return { grads, metrics: { loss } };
    },
    ...options,
  });
  self.result.catch(() => {});
  return self;
}

/**
 * Members started one after another, each once the server has admitted the one before: ranks
 * follow arrival order and rank 0 takes server 0's place, so member i has rank i (the tests give
 * members roles: a slow worker, a worker that leaves, the server that is lost).
 */
async function inOrder(session: string, ids: number[], start: (id: number) => Member): Promise<Member[]> {
  const started: Member[] = [];
  for (const id of ids) {
    started.push(start(id));
    const self = started[started.length - 1]!;
    // Admitted: counted in the group now, or already past its first round (a short run may end before the next look).
    await waitFor(
      `member ${id} to be admitted to ${session}`,
      () => groupSize(server, session) >= started.length || self.events.length > 0,
    );
  }
  return started;
}

/**
 * Holds the first upload of server 0's checkpoint in `session` until `release()`: a save as slow
 * as a loaded machine makes one, at will. The upload itself is the real one, to the real server.
 */
function holdFirstSave(session: string): { held: () => boolean; release: () => void; restore: () => void } {
  const real = globalThis.fetch;
  let held = false;
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  globalThis.fetch = async (input, init) => {
    const url = input instanceof Request ? input.url : String(input);
    if (!held && init?.method === 'POST' && url.includes(`/api/checkpoints/${session}?part=ps-0`)) {
      held = true;
      await released;
    }
    return real(input, init);
  };
  const restore = () => {
    globalThis.fetch = real;
  };
  return { held: () => held, release, restore };
}

function accounted(r: ParameterServerRunResult): number {
  const s = r.samples;
  return s.applied + s.stale + s.refused + s.lost;
}

describe('runParameterServer', () => {
  it('CentralStorage with 2 workers at batch 16 equals one rank at batch 32 (SGD, 12 steps)', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('central');
    const members = await inOrder(session, [0, 1, 2], (id) => member(net, id, session, 3, { strategy: 'central', steps: 12, min: 3 }));
    const runs = await Promise.all(members.map((m) => m.result));
    // The reference: one model, batch 32, the epoch's order as one rank's DistributedSampler gives it.
    const ref = model();
    const opt = tf.train.sgd(0.1);
    for (let k = 0; k < 12; k++) {
      const epoch = Math.floor((32 * k) / 256);
      const position = (32 * k) % 256;
      const idx = batchOf(planEpoch(256, { epoch, position, step: 0 }, { numReplicas: 1, rank: 0, batchSize: 32, seed: 3 }), 0, 32).indices;
      const { x, y } = data.batch(idx);
      const xs = tf.tensor(x, [idx.length, 16]);
      const ys = tf.tensor1d(Int32Array.from(y), 'int32');
      opt.minimize(() => classificationLoss(ref.apply(xs) as tf.Tensor, ys, 4));
      tf.dispose([xs, ys]);
    }
    const want = await flatTrainableWeights(ref);
    for (const r of runs) {
      const got = await flatTrainableWeights(r.model);
      let num = 0;
      let den = 0;
      for (let i = 0; i < want.length; i++) {
        num += (got[i]! - want[i]!) ** 2;
        den += want[i]! ** 2;
      }
      expect(Math.sqrt(num / den)).toBeLessThan(1e-5);
      expect(r.versions).toEqual([12]);
      expect(r.samples.applied).toBe(12 * 32);
    }
    expect(runs.filter((r) => r.role === 'server').map((r) => r.rank)).toEqual([0]);
    // The store holds the roles, the server's version and the leases (records, never a tensor).
    const store = await connect(server, session);
    const roles = JSON.parse(text(await store.get('ps/roles'))) as {
      servers: Array<{ index: number; rank: number }>;
      workers: Array<{ workerId: number }>;
    };
    expect(roles.servers).toEqual([{ index: 0, rank: 0 }]);
    expect(roles.workers).toHaveLength(2);
    await waitFor(
      'server 0 to publish version 12',
      async () => (JSON.parse(text(await store.get('ps/server-0'))) as { version: number }).version === 12,
    );
    await waitFor(
      'the leases to count 12 x 32 samples applied',
      async () => (JSON.parse(text(await store.get('ps/leases'))) as { applied: number }).applied === 12 * 32,
    );
    store.close();
    await Promise.all(runs.map((r) => r.close()));
  }, 60_000);

  it('asynchronous training over 2 servers converges and accounts for every sample of 2 virtual epochs', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('async');
    const members = await inOrder(session, [0, 1, 2, 3, 4], (id) =>
      member(net, id, session, 5, { numServers: 2, epochs: 2, min: 5, ...(id === 4 ? { slowMs: 30 } : {}) }),
    );
    const runs = await Promise.all(members.map((m) => m.result));
    const s0 = runs.find((r) => r.role === 'server' && r.index === 0)!;
    expect(s0.samples.target).toBe(512);
    expect(s0.samples.leased).toBe(512);
    expect(accounted(s0)).toBe(512);
    expect(s0.samples.lost).toBe(0);
    // Every push applied exactly once on both shards: versions count the pushes.
    const pushes = runs.filter((r) => r.role === 'worker').reduce((n, r) => n + r.worker!.pushes, 0);
    expect(s0.versions).toEqual([pushes, pushes]);
    // Every rank ends with the same parameters, and they learned something.
    const finals = await Promise.all(runs.map((r) => flatTrainableWeights(r.model)));
    for (const f of finals) expect(f).toEqual(finals[0]);
    const all = Array.from({ length: 256 }, (_, i) => i);
    const before = (await gradsOf(model(), all)).loss;
    const after = (await gradsOf(runs[0]!.model, all)).loss;
    expect(after).toBeLessThan(before * 0.8);
    // The slow worker's pushes are the stale ones.
    expect(s0.shard!.stalenessHistogram.slice(1).reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    await Promise.all(runs.map((r) => r.close()));
  }, 60_000);

  it('a worker that leaves costs its batch; the others go on and every sample is accounted for', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('pslost');
    const members = await inOrder(session, [0, 1, 2, 3], (id) =>
      member(net, id, session, 4, { epochs: 2, ...(id === 2 ? { leaveAtStep: 3 } : {}) }),
    );
    await expect(members[2]!.result).rejects.toThrow(/closed at its step 3/);
    const runs = await Promise.all([0, 1, 3].map((i) => members[i]!.result));
    const s0 = runs.find((r) => r.role === 'server')!;
    expect(s0.samples.lost).toBe(16);
    expect(accounted(s0)).toBe(512);
    // Pushes delivered again after the round change were not applied twice: one version per applied push.
    expect(s0.versions[0]).toBe(s0.shard!.applied);
    expect(members[0]!.events.some((e) => e.type === 'samples-lost' && e.samples === 16)).toBe(true);
    // No state moved: the server kept its shard (one round change, no restore).
    expect(s0.restoredFrom).toBeNull();
    expect(s0.generations).toBe(2);
    await Promise.all(runs.map((r) => r.close()));
  }, 60_000);

  it("roles are the server's: a member cannot take a server's place, and a worker is its member id", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('psroles');
    const members = await inOrder(session, [0, 1, 2], (id) => member(net, id, session, 3, { epochs: 2, min: 3, slowMs: 5 }));
    await waitFor('members 1 and 2 to take 2 steps', () => members[1]!.steps >= 2 && members[2]!.steps >= 2);
    // A fourth tab (a spectator of the full group) tries what c9d87d7 let it do: take server 0's place.
    const impostor = await connect(server, session);
    const round = new Promise<{ members: number[] }>((resolve) => impostor.on('round', (e) => resolve(e)));
    const { memberId } = await impostor.rendezvous({ min: 3, max: 3, spectate: true }, 200);
    const roster = (await round).members;
    const [holder] = await impostor.claim(['ps/place-0'], true);
    expect(holder).toBe(roster[0]);
    expect(holder).not.toBe(memberId);
    // A store write of the same name is a plain key: it holds no place.
    await impostor.set('ps/place-0', String(memberId));
    expect(await impostor.claim(['ps/place-0'])).toEqual([roster[0]]);
    const runs = await Promise.all(members.map((m) => m.result));
    impostor.close();
    expect(runs.filter((r) => r.role === 'server').map((r) => r.rank)).toEqual([0]);
    // Workers are their member ids, as the server told every rank.
    for (const r of runs.filter((x) => x.role === 'worker')) expect(r.index).toBe(roster[r.rank]);
    const s0 = runs.find((r) => r.role === 'server')!;
    expect(accounted(s0)).toBe(512);
    expect(s0.shard!.workers.map((w) => w.worker).sort((a, b) => a - b)).toEqual([roster[1], roster[2]].sort((a, b) => a! - b!));
    await Promise.all(runs.map((r) => r.close()));
  }, 60_000);

  it('a round that fails with every member still here (a broken link) forms a new round of the same members; the run finishes, every sample accounted for', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('psfail');
    let steps = 0;
    const failing: Extra = {
      async step({ indices, model: m }) {
        if (++steps === 3) throw new DistTimeoutError('an injected link failure of worker 2', 1);
        const { loss, grads } = await gradsOf(m, indices);
        return { grads, metrics: { loss } };
      },
    };
    const members = await inOrder(session, [0, 1, 2], (id) =>
      member(net, id, session, 3, { min: 3, failedRoundGraceMs: 300, ...(id === 2 ? failing : {}) }),
    );
    const runs = await Promise.all(members.map((m) => m.result));
    expect(members[2]!.events.find((e) => e.type === 'failure')).toMatchObject({
      recoverable: true,
      error: expect.stringMatching(/injected link failure/),
    });
    for (const r of runs) expect(r.generations).toBeGreaterThanOrEqual(2);
    const s0 = runs.find((r) => r.role === 'server')!;
    // The same members: nothing lost (the failed worker's lease was handed to it again).
    expect(s0.samples).toMatchObject({ lost: 0, leased: 256 });
    expect(accounted(s0)).toBe(256);
    const finals = await Promise.all(runs.map((r) => flatTrainableWeights(r.model)));
    for (const f of finals) expect(f).toEqual(finals[0]);
    await Promise.all(runs.map((r) => r.close()));
  }, 60_000);

  it('a tab that joins while training runs is admitted at once, pulls the parameters and works', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('psjoin');
    const members = await inOrder(session, [0, 1, 2], (id) => member(net, id, session, 4, { epochs: 4, min: 2, slowMs: 5 }));
    await waitFor('a worker to take 3 steps', () => members.some((m) => m.steps >= 3));
    const joiner = member(net, 3, session, 4, { epochs: 4, min: 2 });
    const runs = await Promise.all([...members, joiner].map((m) => m.result));
    const joined = runs[3]!;
    expect(joined.role).toBe('worker');
    expect(joined.worker!.pushes).toBeGreaterThan(0);
    expect(members[0]!.events.some((e) => e.type === 'regroup')).toBe(true);
    const s0 = runs.find((r) => r.role === 'server')!;
    expect(accounted(s0)).toBe(1024);
    expect(s0.samples.lost).toBe(0);
    const finals = await Promise.all(runs.map((r) => flatTrainableWeights(r.model)));
    for (const f of finals) expect(f).toEqual(finals[0]);
    await Promise.all(runs.map((r) => r.close()));
  }, 60_000);

  it('the staleness bound drops and counts stale pushes', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('psstale');
    const members = await inOrder(session, [0, 1, 2, 3], (id) =>
      member(net, id, session, 4, { epochs: 1, maxStaleness: 0, min: 4, slowMs: id === 3 ? 40 : 0 }),
    );
    const runs = await Promise.all(members.map((m) => m.result));
    const s0 = runs.find((r) => r.role === 'server')!;
    expect(s0.shard!.stale).toBeGreaterThan(0);
    expect(s0.samples.stale).toBeGreaterThan(0);
    expect(accounted(s0)).toBe(256);
    // Versions count only the applied pushes.
    expect(s0.versions[0]).toBe(s0.shard!.applied);
    const workerStale = runs.filter((r) => r.role === 'worker').reduce((n, r) => n + r.worker!.stale, 0);
    expect(workerStale).toBe(s0.shard!.stale);
    await Promise.all(runs.map((r) => r.close()));
  }, 60_000);

  it("a save due while one uploads follows it; a server's run ends once its last save is stored, and counts it", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('pssaves');
    const saves = holdFirstSave(session);
    try {
      const members = await inOrder(session, [0, 1, 2], (id) => member(net, id, session, 3, { epochs: 1, min: 3, checkpointEvery: 4 }));
      // The workers finish (16 updates) while server 0's first save (version 4) uploads: 8, 12 and 16 fall due meanwhile.
      const workers = await Promise.all([members[1]!.result, members[2]!.result]);
      expect(saves.held()).toBe(true);
      saves.release();
      const s0 = await members[0]!.result;
      // One more save, at the version then (the last), and the run's result waited for it.
      expect(members[0]!.events.flatMap((e) => (e.type === 'checkpoint' ? [e.version] : []))).toEqual([4, 16]);
      expect(s0.checkpoints).toBe(2);
      expect(s0.versions).toEqual([16]);
      await Promise.all([s0, ...workers].map((r) => r.close()));
    } finally {
      saves.restore();
    }
  }, 60_000);

  it('a lost server stops the workers until a tab takes its place; it resumes from the shard checkpoint', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('pslostps');
    // The workers wait before their 7th step until the server is closed: 12 updates are in, and the run
    // cannot end before the close (on a loaded machine it used to, while its first save still uploaded).
    let serverClosed!: () => void;
    const closed = new Promise<void>((r) => (serverClosed = r));
    const members = await inOrder(session, [0, 1, 2], (id) =>
      member(net, id, session, 3, {
        epochs: 3,
        checkpointEvery: 4,
        slowMs: 5,
        ...(id === 0 ? {} : { holdAt: { step: 7, until: closed } }),
      }),
    );
    // Close the server once it has saved a checkpoint and gone on a little.
    await waitForNamed(
      'a checkpoint of version 8 or later',
      () => members[0]!.events.some((e) => e.type === 'checkpoint' && e.version >= 8),
      {
        timeoutMs: 60_000,
        intervalMs: 50,
      },
    );
    members[0]!.abort.abort(new Error('the server tab closed'));
    serverClosed();
    // The workers learn it at once: the server's links close, and the server forms a round without it.
    await waitForNamed(
      'workers 1 and 2 to report server 0 lost',
      () =>
        [1, 2].every((i) =>
          members[i]!.events.some((e) => e.type === 'server-lost' && e.index === 0 && /parameter server 0 was lost/.test(e.message)),
        ),
      { timeoutMs: 60_000, intervalMs: 50 },
    );
    const joiner = member(net, 3, session, 3, { epochs: 3, checkpointEvery: 4 });
    const runs = await Promise.all([members[1]!, members[2]!, joiner].map((m) => m.result));
    const server0 = runs.find((r) => r.role === 'server')!;
    expect(server0.restoredFrom).toBeGreaterThanOrEqual(8);
    expect(server0.restoredFrom).toBeLessThanOrEqual(12); // the lost server had 12 updates
    expect(joiner.events.some((e) => e.type === 'restored' && e.index === 0)).toBe(true);
    expect(server0.samples.leased).toBe(768);
    const finals = await Promise.all(runs.map((r) => flatTrainableWeights(r.model)));
    for (const f of finals) expect(f).toEqual(finals[0]);
    await Promise.all(runs.map((r) => r.close()));
  }, 180_000);
});

/** These runs train for real: a longer bound than the fixture's default. */
const waitFor = (what: string, check: () => boolean | Promise<boolean>) => waitForNamed(what, check, { timeoutMs: 30_000, intervalMs: 50 });
