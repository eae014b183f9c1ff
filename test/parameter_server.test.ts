/**
 * The parameter server's transport-free core in Node (TF.js cpu backend): sharding, a shard's
 * asynchronous apply (staleness, dedupe, refusals, learning-rate scaling), CentralStorage's
 * synchronous average (equal to one model at the global batch and to DDP, whatever the arrival
 * order), state dicts and checkpoints, and no tensor leaks.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { DistributedDataParallel } from '../src/parallel/ddp/ddp.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { CentralStorageAccumulator, SyncPushError } from '../src/parallel/parameter_server/central_storage.ts';
import { psPart, restoreShard, saveShard } from '../src/parallel/parameter_server/checkpoint.ts';
import { MAX_STEP_JUMP, ParameterServerShard, ShardStateError, type ApplyResult } from '../src/parallel/parameter_server/shard.ts';
import { joinShards, shardParameters, splitByShard } from '../src/parallel/parameter_server/sharding.ts';
import { flatGradients } from '../src/parallel/parameter_server/worker.ts';
import { assignFlatWeights } from '../src/parallel/replicas.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { listCheckpoints } from '../src/checkpoint/checkpoint.ts';
import { connect, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { errorOf } from './fixtures/errors.ts';
import { CheckpointError } from '../src/checkpoint/checkpoint.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);
const same = (a: Float32Array, b: Float32Array) =>
  a.length === b.length && Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
/** A seeded stream of float32 "gradients" in [-1, 1). */
function randomGrads(n: number, seed: number): Float32Array {
  let s = seed >>> 0;
  return Float32Array.from({ length: n }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 31 - 1;
  });
}

describe('shardParameters', () => {
  it('places whole parameters largest first on the least-loaded server, deterministically', () => {
    // The MLP [16] -> 32 -> 4: kernel 512, bias 32, kernel 128, bias 4.
    expect(shardParameters([512, 32, 128, 4], 2)).toMatchObject({ shards: [[0], [1, 2, 3]], shardNumel: [512, 164], owner: [0, 1, 1, 1] });
    expect(shardParameters([512, 32, 128, 4], 3).shards).toEqual([[0], [2], [1, 3]]);
    // Equal sizes: lower index first, to the lower server on a tie.
    expect(shardParameters([10, 10, 10, 10], 2).shards).toEqual([
      [0, 2],
      [1, 3],
    ]);
    // Empty servers come first on a tie of loads: every server gets a parameter.
    expect(shardParameters([5, 0, 0], 3).shards).toEqual([[0], [1], [2]]);
    expect(shardParameters([7, 3], 1).shards).toEqual([[0, 1]]);
  });

  it('on many layouts: every parameter once, every server used, loads within one parameter of each other, same answer twice', () => {
    for (let trial = 0; trial < 50; trial++) {
      const grads = randomGrads(2 + (trial % 9), trial + 1);
      const sizes = Array.from(grads, (g) => Math.floor((g + 1) * 500) + 1);
      const k = 1 + (trial % sizes.length);
      const layout = shardParameters(sizes, k);
      expect(shardParameters(sizes, k)).toEqual(layout);
      expect(layout.shards.flat().sort((a, b) => a - b)).toEqual(range(0, sizes.length));
      for (const shard of layout.shards) {
        expect(shard.length).toBeGreaterThan(0);
        expect(shard).toEqual([...shard].sort((a, b) => a - b));
      }
      expect(Math.max(...layout.shardNumel) - Math.min(...layout.shardNumel)).toBeLessThanOrEqual(Math.max(...sizes));
      // The model's flat buffer and the shards' buffers convert both ways.
      const flat = randomGrads(
        sizes.reduce((a, b) => a + b),
        trial,
      );
      const parts = splitByShard(layout, flat);
      expect(parts.map((p) => p.length)).toEqual(layout.shardNumel);
      expect(same(joinShards(layout, parts), flat)).toBe(true);
    }
  });

  it('refuses a bad number of servers or bad sizes, saying what to do', () => {
    expect(() => shardParameters([1, 2], 0)).toThrow(RangeError);
    expect(() => shardParameters([1, 2], 1.5)).toThrow(errorOf(RangeError, /positive integer, got 1.5/));
    expect(() => shardParameters([1, 2, 3, 4], 5)).toThrow(
      errorOf(RangeError, /cannot shard 4 parameter tensor\(s\) over 5 parameter servers.*use at most 4 server/),
    );
    expect(() => shardParameters([1, -2], 1)).toThrow(errorOf(RangeError, /parameter 1 has size -2/));
    expect(() => shardParameters([], 1)).toThrow(RangeError);
  });
});

/** A two-parameter shard ([3] and [2, 2]) with SGD at learning rate 0.1. */
function smallShard(options: Partial<ConstructorParameters<typeof ParameterServerShard>[0]> = {}): ParameterServerShard {
  const initial = [tf.tensor1d([1, 2, 3]), tf.tensor2d([4, 5, 6, 7], [2, 2])];
  const shard = new ParameterServerShard({ initial, optimizer: () => tf.train.sgd(0.1), numWorkers: 4, ...options });
  tf.dispose(initial);
  return shard;
}

/** TF.js's SGD step in float32: w + (-lr) * g, each product and sum rounded. */
function sgdByHand(w: Float32Array, g: Float32Array, lr: number): Float32Array {
  const c = Math.fround(-lr);
  return w.map((wi, i) => Math.fround(wi + Math.fround(c * g[i])));
}

describe('ParameterServerShard (asynchronous)', () => {
  it('applies pushes as they come, measures staleness, drops stale and duplicate pushes and counts them', async () => {
    const shard = smallShard({ maxStaleness: 1, histogramBuckets: 3 });
    const g = (seed: number) => randomGrads(7, seed);
    let w = (await shard.pull()).values;
    expect(Array.from(w)).toEqual([1, 2, 3, 4, 5, 6, 7]);

    expect(shard.apply({ worker: 0, stepId: 0, version: 0, grads: g(1) })).toEqual({
      status: 'applied',
      version: 1,
      staleness: 0,
      scale: 1,
      checkpointDue: false,
    });
    w = sgdByHand(w, g(1), 0.1);
    // Worker 1 computed on version 0 too: one update behind.
    expect(shard.apply({ worker: 1, stepId: 0, version: 0, grads: g(2) })).toMatchObject({ status: 'applied', version: 2, staleness: 1 });
    w = sgdByHand(w, g(2), 0.1);
    // Two behind: over maxStaleness 1.
    expect(shard.apply({ worker: 2, stepId: 0, version: 0, grads: g(3) })).toEqual({ status: 'stale', version: 2, staleness: 2 });
    // A retransmission of worker 0's step 0, and an older step arriving late: not applied again.
    expect(shard.apply({ worker: 0, stepId: 0, version: 0, grads: g(1) })).toEqual({ status: 'duplicate', version: 2, lastStep: 0 });
    expect(shard.apply({ worker: 1, stepId: 5, version: 2, grads: g(4) })).toMatchObject({ status: 'applied', version: 3, staleness: 0 });
    w = sgdByHand(w, g(4), 0.1);
    expect(shard.apply({ worker: 1, stepId: 4, version: 3, grads: g(5) })).toMatchObject({ status: 'duplicate', lastStep: 5 });
    // Staleness 3 lands in the last bucket (the tail), and is dropped.
    expect(shard.apply({ worker: 3, stepId: 0, version: 0, grads: g(6) })).toMatchObject({ status: 'stale', staleness: 3 });

    const pulled = await shard.pull();
    expect(pulled.version).toBe(3);
    expect(same(pulled.values, w)).toBe(true);
    expect(shard.stats()).toEqual({
      version: 3,
      applied: 3,
      stale: 2,
      duplicate: 2,
      refused: 0,
      refusedBy: { 'bad-worker': 0, 'bad-step': 0, 'bad-version': 0, 'bad-length': 0, nonfinite: 0 },
      stalenessHistogram: [2, 1, 2],
      workers: [
        { worker: 0, pushes: 2, applied: 1, lastStep: 0 },
        { worker: 1, pushes: 3, applied: 2, lastStep: 5 },
        { worker: 2, pushes: 1, applied: 0, lastStep: 0 },
        { worker: 3, pushes: 1, applied: 0, lastStep: 0 },
      ],
    });
    expect(shard.lastStep(1)).toBe(5);
    shard.dispose();
  });

  it('step ids: a stale push is handled once, a jump past MAX_STEP_JUMP is refused, a loaded record only drops its own push again', async () => {
    const shard = smallShard({ maxStaleness: 0 });
    const g = randomGrads(7, 9);
    expect(shard.apply({ worker: 0, stepId: 1, version: 0, grads: g })).toMatchObject({ status: 'applied', version: 1 });
    expect(shard.apply({ worker: 1, stepId: 1, version: 0, grads: g })).toMatchObject({ status: 'stale', staleness: 1 });
    // Delivered again after a round change: dropped as a duplicate, not counted stale twice.
    expect(shard.apply({ worker: 1, stepId: 1, version: 0, grads: g })).toMatchObject({ status: 'duplicate', lastStep: 1 });
    // A worker's pushes count up one by one: a step id far ahead (0xFFFFFFFF, say) is refused.
    expect(shard.apply({ worker: 0, stepId: 2 + MAX_STEP_JUMP, version: 1, grads: g })).toMatchObject({
      status: 'refused',
      reason: 'bad-step',
      detail: expect.stringMatching(/more than the 1024/),
    });
    expect(shard.apply({ worker: 0, stepId: 0xffffffff, version: 1, grads: g })).toMatchObject({ status: 'refused', reason: 'bad-step' });
    expect(shard.apply({ worker: 0, stepId: 1 + MAX_STEP_JUMP, version: 1, grads: g })).toMatchObject({ status: 'applied', version: 2 });
    // Records loaded from a state dict (a checkpoint part anyone with the session's link may have
    // uploaded) are not trusted to block a worker: only the push they name is dropped again.
    const sd = await shard.stateDict();
    const restored = smallShard({ maxStaleness: 0 });
    await restored.loadStateDict({
      ...sd,
      lastSteps: [
        [2, 0xffffffff],
        [3, 7],
      ],
    });
    expect(restored.apply({ worker: 3, stepId: 7, version: 2, grads: g })).toMatchObject({ status: 'duplicate', lastStep: 7 });
    expect(restored.apply({ worker: 2, stepId: 1, version: 2, grads: g })).toMatchObject({ status: 'applied', version: 3 });
    expect(restored.lastStep(2)).toBe(1);
    expect(restored.apply({ worker: 2, stepId: 1, version: 3, grads: g })).toMatchObject({ status: 'duplicate' });
    // Past a loaded record the jump bound holds again.
    expect(restored.apply({ worker: 3, stepId: 7 + MAX_STEP_JUMP, version: 3, grads: g })).toMatchObject({ status: 'applied' });
    expect(restored.apply({ worker: 3, stepId: 8 + 2 * MAX_STEP_JUMP, version: 4, grads: g })).toMatchObject({
      status: 'refused',
      reason: 'bad-step',
    });
    shard.dispose();
    restored.dispose();
  });

  it('keeps records of at most maxWorkerRecords workers, forgetting the lowest ids (ids of gone tabs are never reused)', () => {
    const shard = smallShard({ maxWorkerRecords: 2 });
    for (const worker of [0, 1, 2])
      expect(shard.apply({ worker, stepId: 1, version: shard.version, grads: randomGrads(7, worker) }).status).toBe('applied');
    expect(shard.stats().workers.map((w) => w.worker)).toEqual([1, 2]);
    expect(shard.lastStep(0)).toBe(-1);
    shard.dispose();
  });

  it('refuses malformed and non-finite pushes, counts them, and applies nothing', async () => {
    const shard = smallShard();
    const before = await shard.pull();
    const ok = randomGrads(7, 1);
    const nan = ok.slice();
    nan[3] = Number.NaN;
    const inf = ok.slice();
    inf[6] = -Infinity;
    const results: ApplyResult[] = [
      shard.apply({ worker: 0, stepId: 0, version: 0, grads: nan }),
      shard.apply({ worker: 0, stepId: 1, version: 0, grads: inf }),
      shard.apply({ worker: -1, stepId: 0, version: 0, grads: ok }),
      shard.apply({ worker: 4, stepId: 0, version: 0, grads: ok }),
      shard.apply({ worker: 0.5, stepId: 0, version: 0, grads: ok }),
      shard.apply({ worker: 0, stepId: 1.5, version: 0, grads: ok }),
      shard.apply({ worker: 0, stepId: 0, version: 1, grads: ok }),
      shard.apply({ worker: 0, stepId: 0, version: 0, grads: ok.subarray(1) }),
      shard.apply({ worker: 0, stepId: 0, version: 0, grads: Array.from(ok) as unknown as Float32Array }),
    ];
    expect(results.map((r) => (r.status === 'refused' ? r.reason : r.status))).toEqual([
      'nonfinite',
      'nonfinite',
      'bad-worker',
      'bad-worker',
      'bad-worker',
      'bad-step',
      'bad-version',
      'bad-length',
      'bad-length',
    ]);
    expect(results[0]).toMatchObject({ detail: 'worker 0 step 0: the gradients hold a NaN or an infinity' });
    expect(results[6]).toMatchObject({ detail: "worker 0 step 0: version 1 is not an integer in [0, 0] (this shard's version)" });
    const after = await shard.pull();
    expect(after.version).toBe(0);
    expect(same(after.values, before.values)).toBe(true);
    expect(shard.stats()).toMatchObject({
      applied: 0,
      refused: 9,
      refusedBy: { nonfinite: 2, 'bad-worker': 3, 'bad-step': 1, 'bad-version': 1, 'bad-length': 2 },
    });
    // A refused step is not recorded: the worker may send that step again, finite.
    expect(shard.apply({ worker: 0, stepId: 0, version: 0, grads: ok })).toMatchObject({ status: 'applied' });
    shard.dispose();
  });

  it('scales the gradients by 1/(1+s): for SGD exactly the learning rate over 1+s', async () => {
    const shard = smallShard({ scaleLrByStaleness: true });
    let w = (await shard.pull()).values;
    for (const [worker, seed] of [
      [0, 1],
      [1, 2],
      [2, 3],
    ]) {
      // All three computed on version 0: staleness 0, 1, 2.
      const g = randomGrads(7, seed);
      const r = shard.apply({ worker, stepId: 0, version: 0, grads: g });
      expect(r).toMatchObject({ status: 'applied', staleness: worker, scale: 1 / (1 + worker) });
      w = sgdByHand(
        w,
        g.map((x) => x / (1 + worker)),
        0.1,
      );
    }
    expect(same((await shard.pull()).values, w)).toBe(true);
    shard.dispose();
  });

  it('flags a checkpoint every checkpointEvery updates', () => {
    const shard = smallShard({ checkpointEvery: 3 });
    const due = range(0, 7).map(
      (s) =>
        (shard.apply({ worker: 0, stepId: s, version: shard.version, grads: randomGrads(7, s) }) as { checkpointDue: boolean })
          .checkpointDue,
    );
    expect(due).toEqual([false, false, true, false, false, true, false]);
    shard.dispose();
  });
});

const data = syntheticDataset({ length: 512, inputSize: 16, numClasses: 4, seed: 1 });
const mlp = (seed: number) => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed });

/** The loss of `model` on the samples `indices`. */
function lossOn(model: tf.LayersModel, indices: number[]): () => tf.Scalar {
  const { x, y } = data.batch(indices);
  return () => tf.tidy(() => classificationLoss(model.apply(tf.tensor(x, [indices.length, 16])) as tf.Tensor, tf.tensor1d(y, 'int32'), 4));
}

/**
 * CentralStorage with 2 workers, each on its half of a 32-sample batch, `steps` SGD steps;
 * `order(step)` gives the order the workers' pushes arrive in. Returns the server's weights.
 */
async function centralStorageRun(steps: number, order: (step: number) => number[]): Promise<Float32Array> {
  const init = mlp(5);
  const layout = shardParameters(
    init.trainableWeights.map((w) => w.shape.reduce<number>((a, b) => a * (b ?? 1), 1)),
    1,
  );
  const shard = ParameterServerShard.fromModel(init, layout, 0, { optimizer: () => tf.train.sgd(0.1) });
  init.dispose();
  const acc = new CentralStorageAccumulator(shard, { numWorkers: 2 });
  // Other seeds on purpose: every step the workers take the server's weights.
  const workers = [mlp(20), mlp(21)];
  for (let step = 0; step < steps; step++) {
    const { version, values } = await shard.pull();
    expect(version).toBe(step);
    const grads = await Promise.all(
      workers.map(async (model, w) => {
        assignFlatWeights(model, joinShards(layout, [values]));
        return (await flatGradients(model, lossOn(model, range(step * 32 + w * 16, step * 32 + w * 16 + 16)))).grads;
      }),
    );
    const [first, second] = order(step);
    expect(acc.add(first, step, splitByShard(layout, grads[first])[0])).toEqual({ status: 'waiting', step, arrived: 1, missing: [second] });
    expect(acc.add(second, step, splitByShard(layout, grads[second])[0])).toMatchObject({ status: 'applied', step, version: step + 1 });
  }
  const { values } = await shard.pull();
  shard.dispose();
  for (const m of workers) m.dispose();
  return values;
}

describe('CentralStorageAccumulator (synchronous)', () => {
  const steps = 15;

  it('2 workers at half batches train to the weights of one model at the whole batch, bit-identically whichever push comes first', async () => {
    const inOrder = await centralStorageRun(steps, () => [0, 1]);
    const reversed = await centralStorageRun(steps, () => [1, 0]);
    const mixed = await centralStorageRun(steps, (s) => (s % 3 === 0 ? [1, 0] : [0, 1]));
    expect(same(inOrder, reversed)).toBe(true);
    expect(same(inOrder, mixed)).toBe(true);

    const single = mlp(5);
    const opt = tf.train.sgd(0.1);
    for (let step = 0; step < steps; step++) {
      opt.minimize(
        lossOn(single, range(step * 32, step * 32 + 32)),
        false,
        single.trainableWeights.map((w) => w.read() as tf.Variable),
      );
    }
    const ws = (await tf.concat(single.trainableWeights.map((w) => w.read().reshape([-1]))).data()) as Float32Array;
    let maxRel = 0;
    for (let i = 0; i < ws.length; i++) maxRel = Math.max(maxRel, Math.abs(ws[i] - inOrder[i]) / Math.max(Math.abs(ws[i]), 1e-3));
    expect(maxRel).toBeLessThan(1e-5);
    // And training moved the weights: the comparison is not between untouched models.
    const start = mlp(5);
    const w0 = (await tf.concat(start.trainableWeights.map((w) => w.read().reshape([-1]))).data()) as Float32Array;
    expect(Math.max(...w0.map((v, i) => Math.abs(v - inOrder[i])))).toBeGreaterThan(1e-2);
    opt.dispose();
    single.dispose();
    start.dispose();
  });

  it('trains to the same weights as DDP on 2 ranks, bit for bit', async () => {
    const session = uniqueSession('ps-ddp');
    const net = new MemoryNetwork();
    const pgs = await Promise.all(
      range(0, 2).map((rank) =>
        initProcessGroup({
          url: server.url,
          session,
          token: tokenFor(session),
          worldSize: 2,
          rank,
          timeoutMs: 5_000,
          linkFactory: net.factoryFor(rank),
        }),
      ),
    );
    const ddps = await Promise.all(pgs.map((pg) => DistributedDataParallel.create(mlp(5), pg)));
    const opts = ddps.map(() => tf.train.sgd(0.1));
    for (let step = 0; step < steps; step++) {
      await Promise.all(ddps.map((d, r) => d.backward(lossOn(d.model, range(step * 32 + r * 16, step * 32 + r * 16 + 16)))));
      ddps.forEach((d, r) => {
        d.step(opts[r]);
      });
    }
    const ddpWeights = await ddps[0].flatWeights();
    expect(same(ddpWeights, await centralStorageRun(steps, (s) => (s % 2 ? [1, 0] : [0, 1])))).toBe(true);
    for (const p of pgs) p.destroy();
    for (const o of opts) o.dispose();
  });

  it('averages in worker order whatever the arrival order: 3 workers, all 6 orders, bit-identical', () => {
    const grads = range(0, 3).map((w) => randomGrads(1000, 100 + w));
    // ((g0 + g1) + g2) / 3 in float32.
    const expected = grads[0].map((g0, i) => Math.fround(Math.fround(Math.fround(g0 + grads[1][i]) + grads[2][i]) / 3));
    const orders = [
      [0, 1, 2],
      [0, 2, 1],
      [1, 0, 2],
      [1, 2, 0],
      [2, 0, 1],
      [2, 1, 0],
    ];
    for (const order of orders) {
      const shard = new ParameterServerShard({ initial: [tf.zeros([1000])], optimizer: () => tf.train.sgd(1) });
      const acc = new CentralStorageAccumulator(shard, { numWorkers: 3 });
      const results = order.map((w) => acc.add(w, 0, grads[w]));
      expect(results.slice(0, 2).map((r) => r.status)).toEqual(['waiting', 'waiting']);
      const last = results[2];
      expect(last.status).toBe('applied');
      expect(same((last as { average: Float32Array }).average, expected)).toBe(true);
      expect(acc.step).toBe(1);
      shard.dispose();
    }
  });

  it('refuses a push for another step, a second push of a worker, a bad worker id, length or a NaN, with clear errors', () => {
    const shard = new ParameterServerShard({ initial: [tf.zeros([4])], optimizer: () => tf.train.sgd(1) });
    const acc = new CentralStorageAccumulator(shard, { numWorkers: 2 });
    const g = Float32Array.of(1, 2, 3, 4);
    const refusal = (fn: () => unknown) => {
      try {
        fn();
      } catch (err) {
        expect(err).toBeInstanceOf(SyncPushError);
        return err as SyncPushError;
      }
      throw new Error('not refused');
    };
    expect(acc.add(0, 0, g)).toEqual({ status: 'waiting', step: 0, arrived: 1, missing: [1] });
    expect(refusal(() => acc.add(0, 0, g))).toMatchObject({
      reason: 'twice',
      worker: 0,
      step: 0,
      expectedStep: 0,
      message: 'step 0 refuses a push of worker 0 for step 0: this worker already pushed for this step',
    });
    expect(refusal(() => acc.add(1, 1, g))).toMatchObject({ reason: 'future-step' });
    expect(refusal(() => acc.add(2, 0, g))).toMatchObject({ reason: 'bad-worker' });
    expect(refusal(() => acc.add(1, 0, g.subarray(1)))).toMatchObject({ reason: 'bad-length' });
    expect(refusal(() => acc.add(1, 0, Float32Array.of(1, Number.NaN, 3, 4)))).toMatchObject({ reason: 'nonfinite' });
    // Nothing of the refused pushes was kept: the step completes with worker 1's good push.
    expect(acc.add(1, 0, Float32Array.of(3, 2, 1, 0))).toMatchObject({
      status: 'applied',
      step: 0,
      version: 1,
      average: Float32Array.of(2, 2, 2, 2),
    });
    expect(refusal(() => acc.add(0, 0, g))).toMatchObject({ reason: 'past-step', expectedStep: 1 });
    // Abandoning a step drops what arrived for it.
    acc.add(1, 1, g);
    acc.abandonStep();
    expect(acc.missing()).toEqual([0, 1]);
    expect(acc.stats()).toEqual({ step: 1, stepsApplied: 1, pushesByWorker: [1, 2] });
    shard.dispose();
  });
});

describe('state dicts and checkpoints', () => {
  /** A shard of all the MLP's 4 parameters (Adam by default: moments to carry). */
  const mlpShard = (seed: number, optimizer: () => tf.Optimizer = () => tf.train.adam(0.01)) => {
    const model = mlp(seed);
    const layout = shardParameters(
      model.trainableWeights.map((w) => w.shape.reduce<number>((a, b) => a * (b ?? 1), 1)),
      1,
    );
    const shard = ParameterServerShard.fromModel(model, layout, 0, { optimizer, maxStaleness: 2 });
    model.dispose();
    return shard;
  };
  const adamShard = (seed: number) => mlpShard(seed);
  /** Push i of a stream from 3 workers, some one version behind. */
  const push = (shard: ParameterServerShard, i: number) =>
    shard.apply({
      worker: i % 3,
      stepId: Math.floor(i / 3),
      version: Math.max(0, shard.version - (i % 2)),
      grads: randomGrads(shard.numel, 1000 + i),
    });

  it('a shard restored from a state dict continues bit-identically to the original (Adam, momentum, SGD)', async () => {
    // Restored at versions where pow(beta, t) and Adam's running product of betas differ in the last bit, too.
    for (const optimizer of [() => tf.train.adam(0.01), () => tf.train.momentum(0.05, 0.9), () => tf.train.sgd(0.1)]) {
      for (const at of [2, 5, 8]) {
        const source = mlpShard(5, optimizer);
        for (let i = 0; i < at; i++) expect(push(source, i).status).toBe('applied');
        const sd = await source.stateDict();
        expect(sd.version).toBe(at);
        // Other initial weights and a fresh optimizer: everything must come from the state dict.
        const restored = mlpShard(6, optimizer);
        await restored.loadStateDict(sd);
        expect(restored.version).toBe(at);
        // The dedupe record came along: a retransmission is still a duplicate.
        expect(range(0, 3).map((w) => restored.lastStep(w))).toEqual(range(0, 3).map((w) => source.lastStep(w)));
        expect(
          restored.apply({ worker: (at - 1) % 3, stepId: Math.floor((at - 1) / 3), version: at, grads: randomGrads(restored.numel, 1) }),
        ).toMatchObject({ status: 'duplicate' });
        for (let i = at; i < at + 8; i++) expect(push(restored, i)).toEqual(push(source, i));
        const [a, b] = await Promise.all([source.pull(), restored.pull()]);
        expect(a.version).toBe(at + 8);
        expect(same(a.values, b.values)).toBe(true);
        source.dispose();
        restored.dispose();
      }
    }
  });

  it('a state dict is taken at one version even when a push lands while it is being copied', async () => {
    const shard = adamShard(5);
    for (let i = 0; i < 3; i++) push(shard, i);
    const pending = shard.stateDict();
    expect(push(shard, 3)).toMatchObject({ status: 'applied', version: 4 });
    const sd = await pending;
    expect(sd.version).toBe(4);
    const copy = adamShard(6);
    await copy.loadStateDict(sd);
    expect(same((await copy.pull()).values, (await shard.pull()).values)).toBe(true);
    for (let i = 4; i < 8; i++) {
      push(shard, i);
      push(copy, i);
    }
    expect(same((await copy.pull()).values, (await shard.pull()).values)).toBe(true);
    shard.dispose();
    copy.dispose();
  });

  it('refuses a state dict of another shape before loading anything', async () => {
    const shard = adamShard(5);
    push(shard, 0);
    const sd = await shard.stateDict();
    const other = smallShard();
    await expect(other.loadStateDict(sd)).rejects.toThrow(ShardStateError);
    await expect(other.loadStateDict(sd)).rejects.toThrow(errorOf(ShardStateError, /it has 4 parameters, this shard 2/));
    const wrongShape = {
      ...sd,
      params: { ...sd.params, weightSpecs: sd.params.weightSpecs.map((s, i) => (i === 1 ? { ...s, shape: [31] } : s)) },
    };
    await expect(shard.loadStateDict(wrongShape)).rejects.toThrow(
      errorOf(ShardStateError, /parameter 1 \(param-1\) is \[31\] float32, this shard's is \[32\] float32/),
    );
    await expect(shard.loadStateDict({ ...sd, lastSteps: [[5000, 1]] })).rejects.toThrow(errorOf(ShardStateError, /last step ids/));
    expect(shard.version).toBe(1);
    shard.dispose();
    other.dispose();
  });

  it("saves each server's shard as its own checkpoint part and restores it", async () => {
    const session = uniqueSession('ps-ckpt');
    // The session's first connection fixes its token, which the checkpoint routes require.
    (await connect(server, session)).close();
    const o = { url: server.url, session, token: tokenFor(session) };
    const model = mlp(5);
    const layout = shardParameters(
      model.trainableWeights.map((w) => w.shape.reduce<number>((a, b) => a * (b ?? 1), 1)),
      2,
    );
    const make = (k: number) =>
      ParameterServerShard.fromModel(model, layout, k, { optimizer: () => tf.train.adam(0.01), checkpointEvery: 2 });
    const shards = [make(0), make(1)];
    const snapshots: Array<{ version: number; values: Float32Array }> = [];
    for (const shard of shards) {
      for (let i = 0; i < 4; i++) {
        const r = shard.apply({ worker: 0, stepId: i, version: shard.version, grads: randomGrads(shard.numel, i + 10 * shard.index) });
        if (r.status === 'applied' && r.checkpointDue) await saveShard(shard, o);
        if (shard.version === 2) snapshots[shard.index] = await shard.pull();
      }
    }
    expect((await listCheckpoints(server.url, session, { token: o.token, part: psPart(1) })).map((c) => c.step)).toEqual([2, 4]);
    // Server 1 lost after version 4 comes back at its latest checkpoint; server 0 is restored at version 2.
    const back1 = make(1);
    expect(await restoreShard(back1, o)).toMatchObject({ version: 4 });
    expect(same((await back1.pull()).values, (await shards[1].pull()).values)).toBe(true);
    const back0 = make(0);
    expect(await restoreShard(back0, { ...o, version: 2 })).toMatchObject({ version: 2 });
    expect(same((await back0.pull()).values, snapshots[0].values)).toBe(true);
    await expect(restoreShard(back0, { ...o, version: 3 })).rejects.toThrow(
      errorOf(CheckpointError, /part "ps-0" of session .* has no checkpoint at version 3 \(it has versions 2, 4\)/),
    );
    // A part nobody saved: start fresh.
    const fresh = uniqueSession('ps-none');
    (await connect(server, fresh)).close();
    expect(await restoreShard(back0, { url: server.url, session: fresh, token: tokenFor(fresh) })).toBeNull();
    for (const s of [...shards, back0, back1]) s.dispose();
    model.dispose();
  });
});

describe('tensor hygiene', () => {
  it('keeps the live tensor count flat across applies, pulls, state dicts and synchronous steps', async () => {
    const shard = new ParameterServerShard({
      initial: [tf.zeros([16, 32]), tf.zeros([32])],
      optimizer: () => tf.train.adam(0.01),
      maxStaleness: 1,
    });
    const sync = new ParameterServerShard({ initial: [tf.zeros([64])], optimizer: () => tf.train.sgd(0.1) });
    const acc = new CentralStorageAccumulator(sync, { numWorkers: 2 });
    const round = async (i: number) => {
      shard.apply({ worker: i % 2, stepId: i, version: Math.max(0, shard.version - (i % 3)), grads: randomGrads(shard.numel, i) });
      acc.add(1, acc.step, randomGrads(64, i));
      acc.add(0, acc.step, randomGrads(64, i + 1));
      await shard.pull();
    };
    await round(0); // Adam makes its moments on the first apply.
    const sd = await shard.stateDict();
    await shard.loadStateDict(sd);
    const before = tf.memory().numTensors;
    for (let i = 1; i < 60; i++) await round(i);
    await shard.loadStateDict(await shard.stateDict());
    shard.apply({ worker: 0, stepId: 1000, version: shard.version, grads: new Float32Array(shard.numel).fill(Number.NaN) });
    expect(tf.memory().numTensors).toBe(before);
    shard.dispose();
    sync.dispose();
  });
});
