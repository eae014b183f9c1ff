/**
 * DistributedDataParallel's logic in Node (TF.js cpu backend, in-memory links, real server for
 * the store): buckets, shape check, broadcast, averaging, noSync accumulation. The WebGPU +
 * WebRTC path is proven end to end in test/e2e/train.spec.ts.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { initProcessGroup, type ProcessGroup } from '../src/process_group.ts';
import { DistributedDataParallel, ShapeMismatchError, assignBuckets } from '../src/ddp.ts';
import { buildModel, classificationLoss } from '../src/models.ts';
import { syntheticDataset } from '../src/datasets.ts';
import { uniqueSession, withServer } from './helpers.ts';
import { MemoryNetwork } from './memory_link.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

async function groups(n: number): Promise<ProcessGroup[]> {
  const session = uniqueSession('ddp');
  const net = new MemoryNetwork();
  return Promise.all(
    Array.from({ length: n }, (_, rank) => initProcessGroup({ url: server.url, session, worldSize: n, rank, timeoutMs: 5_000, linkFactory: net.factoryFor(rank) })),
  );
}

const data = syntheticDataset({ length: 256, inputSize: 16, numClasses: 4, seed: 1 });

async function trainSteps(ddp: DistributedDataParallel, batches: number[][], opt: tf.Optimizer, accumulate = 1): Promise<void> {
  for (let s = 0; s < batches.length; s += accumulate) {
    for (let k = 0; k < accumulate; k++) {
      const { x, y } = data.batch(batches[s + k]);
      const xs = tf.tensor(x, [batches[s + k].length, 16]);
      const ys = tf.tensor1d(y, 'int32');
      const backward = () => ddp.backward(() => classificationLoss(ddp.model.apply(xs) as tf.Tensor, ys, 4));
      if (k < accumulate - 1) await ddp.noSync(backward);
      else await backward();
      xs.dispose();
      ys.dispose();
    }
    ddp.step(opt);
  }
}

const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);

describe('assignBuckets', () => {
  it('fills buckets in reverse parameter order, first cap small, whole parameters only', () => {
    const MiB = 1 << 20;
    // four parameters of 0.5, 0.75, 2 and 0.25 MiB
    const sizes = [0.5, 0.75, 2, 0.25].map((m) => (m * MiB) / 4);
    const buckets = assignBuckets(sizes, 1 * MiB, 2 * MiB);
    expect(buckets.map((b) => b.params)).toEqual([[3, 2], [1, 0]]);
    expect(buckets[0]).toMatchObject({ start: sizes[0] + sizes[1], end: sizes.reduce((a, b) => a + b) });
    expect(assignBuckets([10, 10], 1 << 20, 25 << 20).map((b) => b.params)).toEqual([[1, 0]]);
  });
});

describe('DistributedDataParallel', () => {
  it('broadcasts rank 0 weights, keeps replicas identical, and 2 ranks x B equals 1 rank x 2B', async () => {
    const pgs = await groups(2);
    // Different seeds on purpose: the broadcast must make rank 1 start from rank 0's weights.
    const ddps = await Promise.all(pgs.map((pg) => DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 5 + pg.rank }), pg)));
    const hashes0 = await Promise.all(ddps.map((d) => d.weightsHash()));
    expect(hashes0[0]).toBe(hashes0[1]);
    const steps = 5;
    await Promise.all(
      ddps.map((d, r) =>
        trainSteps(d, range(0, steps).map((s) => range(s * 32 + r * 16, s * 32 + r * 16 + 16)), tf.train.sgd(0.1)),
      ),
    );
    const [w0, w1] = await Promise.all(ddps.map((d) => d.flatWeights()));
    expect(Buffer.from(w0.buffer).equals(Buffer.from(w1.buffer))).toBe(true);

    const [solo] = await groups(1);
    const single = await DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 5 }), solo);
    await trainSteps(single, range(0, steps).map((s) => range(s * 32, s * 32 + 32)), tf.train.sgd(0.1));
    const ws = await single.flatWeights();
    let maxRel = 0;
    for (let i = 0; i < ws.length; i++) maxRel = Math.max(maxRel, Math.abs(ws[i] - w0[i]) / Math.max(Math.abs(ws[i]), 1e-3));
    expect(maxRel).toBeLessThan(1e-5);
    for (const p of [...pgs, solo]) p.destroy();
  });

  it('noSync accumulates: two micro-batches of B then a step equal one batch of 2B (sum of means)', async () => {
    const [a] = await groups(1);
    const [b] = await groups(1);
    const accum = await DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 9 }), a);
    const plain = await DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 9 }), b);
    // Accumulating two mean-losses sums their gradients: equal to one 2B batch at twice the lr.
    await trainSteps(accum, [range(0, 16), range(16, 32)], tf.train.sgd(0.05), 2);
    await trainSteps(plain, [range(0, 32)], tf.train.sgd(0.1));
    const [wa, wb] = await Promise.all([accum.flatWeights(), plain.flatWeights()]);
    for (let i = 0; i < wa.length; i++) expect(Math.abs(wa[i] - wb[i])).toBeLessThan(1e-6);
    a.destroy();
    b.destroy();
  });

  it('refuses models whose parameter shapes differ, naming the parameter and the ranks', async () => {
    const pgs = await groups(2);
    const results = await Promise.allSettled(
      pgs.map((pg) => DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 1, hidden: pg.rank === 0 ? 32 : 24 }), pg)),
    );
    for (const r of results) {
      expect(r.status).toBe('rejected');
      const err = (r as PromiseRejectedResult).reason as Error;
      expect(err).toBeInstanceOf(ShapeMismatchError);
      expect(err.message).toMatch(/parameter 0 \(.*kernel\) has shape \[16, 32\] on rank 0 but \[16, 24\] on rank 1/);
    }
    for (const p of pgs) p.destroy();
  });

  it('keeps the live tensor count flat across steps', async () => {
    const [pg] = await groups(1);
    const ddp = await DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 2 }), pg);
    const opt = tf.train.adam(0.01);
    await trainSteps(ddp, [range(0, 8)], opt);
    const before = tf.memory().numTensors;
    await trainSteps(ddp, range(0, 10).map((s) => range(s * 8, s * 8 + 8)), opt);
    expect(tf.memory().numTensors).toBe(before);
    pg.destroy();
  });

  it('a model built with the same seed has the same initial weights whatever the world size', async () => {
    const a = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 11 });
    const b = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 11 });
    const flat = async (m: tf.LayersModel) => (await tf.concat(m.getWeights().map((w) => w.reshape([-1]))).data()) as Float32Array;
    expect(Buffer.from((await flat(a)).buffer).equals(Buffer.from((await flat(b)).buffer))).toBe(true);
  });
});
