/**
 * DistributedDataParallel's logic in Node (TF.js cpu backend, in-memory links, real server for
 * the store): buckets, shape check, broadcast, averaging, noSync accumulation. The WebGPU +
 * WebRTC path is proven end to end in test/e2e/train.spec.ts.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/process_group.ts';
import { initProcessGroup } from '../src/rendezvous.ts';
import { DistributedDataParallel, ShapeMismatchError, assignBuckets } from '../src/ddp.ts';
import { buildModel, classificationLoss } from '../src/models.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { tokenFor, uniqueSession, withServer } from './helpers.ts';
import { MemoryNetwork } from './memory_link.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

async function groups(n: number, net = new MemoryNetwork(), session = uniqueSession('ddp')): Promise<ProcessGroup[]> {
  return Promise.all(
    Array.from({ length: n }, (_, rank) => initProcessGroup({ url: server.url, session, token: tokenFor(session), worldSize: n, rank, timeoutMs: 5_000, linkFactory: net.factoryFor(rank) })),
  );
}

/** Bytes this network's links have carried so far. */
const traffic = (net: MemoryNetwork) => net.links.reduce((sum, l) => sum + l.bytesSent, 0);

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

  it('noSync on 2 ranks: no traffic while accumulating, and two micro-batches of B equal one batch of 2B', async () => {
    const mlp = () => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 9 });
    const accumNet = new MemoryNetwork();
    const accum = await Promise.all((await groups(2, accumNet)).map((pg) => DistributedDataParallel.create(mlp(), pg)));
    const plain = await Promise.all((await groups(2)).map((pg) => DistributedDataParallel.create(mlp(), pg)));
    // Inside noSync a backward only accumulates: nothing crosses the links.
    const before = traffic(accumNet);
    await Promise.all(
      accum.map((d, r) => {
        const { x, y } = data.batch(range(r * 32, r * 32 + 16));
        const xs = tf.tensor(x, [16, 16]);
        const ys = tf.tensor1d(y, 'int32');
        return d.noSync(() => d.backward(() => classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4))).finally(() => tf.dispose([xs, ys]));
      }),
    );
    expect(traffic(accumNet)).toBe(before);
    // The next synchronised backward all-reduces the sum. Accumulating two mean-losses sums their
    // gradients: equal to one 2B batch at twice the learning rate, with rank r on samples r*32..r*32+31.
    await Promise.all(
      accum.map(async (d, r) => {
        const { x, y } = data.batch(range(r * 32 + 16, r * 32 + 32));
        const xs = tf.tensor(x, [16, 16]);
        const ys = tf.tensor1d(y, 'int32');
        await d.backward(() => classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4));
        tf.dispose([xs, ys]);
        d.step(tf.train.sgd(0.05));
      }),
    );
    expect(traffic(accumNet)).toBeGreaterThan(before);
    await Promise.all(plain.map((d, r) => trainSteps(d, [range(r * 32, r * 32 + 32)], tf.train.sgd(0.1))));
    const [wa0, wa1, wb0] = await Promise.all([accum[0].flatWeights(), accum[1].flatWeights(), plain[0].flatWeights()]);
    expect(Buffer.from(wa0.buffer).equals(Buffer.from(wa1.buffer))).toBe(true);
    let maxDiff = 0;
    for (let i = 0; i < wa0.length; i++) maxDiff = Math.max(maxDiff, Math.abs(wa0[i] - wb0[i]));
    expect(maxDiff).toBeLessThan(1e-6);
    // And the step moved the weights: the comparison is not between two untouched models.
    const untouched = await DistributedDataParallel.create(mlp(), (await groups(1))[0]);
    const w0 = await untouched.flatWeights();
    expect(Math.max(...w0.map((v, i) => Math.abs(v - wa0[i])))).toBeGreaterThan(1e-3);
    for (const d of [...accum, ...plain, untouched]) d.pg.destroy();
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

  it('keeps the live tensor count flat across steps on 2 ranks', async () => {
    const pgs = await groups(2);
    const ddps = await Promise.all(pgs.map((pg) => DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 2 }), pg)));
    const opts = ddps.map(() => tf.train.adam(0.01));
    const batches = (r: number, steps: number) => range(0, steps).map((s) => range(s * 16 + r * 8, s * 16 + r * 8 + 8));
    await Promise.all(ddps.map((d, r) => trainSteps(d, batches(r, 1), opts[r])));
    const before = tf.memory().numTensors;
    await Promise.all(ddps.map((d, r) => trainSteps(d, batches(r, 10), opts[r])));
    expect(tf.memory().numTensors).toBe(before);
    for (const p of pgs) p.destroy();
  });

  it("keeps its shape check in the group's own store keys: a later group never reads an earlier one's", async () => {
    const session = uniqueSession('scoped');
    // A first group whose ranks disagree on the shapes.
    const first = await groups(2, new MemoryNetwork(), session);
    const refused = await Promise.allSettled(first.map((pg) => DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 1, hidden: pg.rank === 0 ? 24 : 32 }), pg)));
    expect(refused.every((r) => r.status === 'rejected')).toBe(true);
    for (const p of first) p.destroy();
    // A second group in the same session where they agree; rank 1 checks before rank 0 has
    // published, so with shared keys it would read the first group's stale rank-0 shapes.
    const second = await groups(2, new MemoryNetwork(), session);
    const model = () => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 1, hidden: 32 });
    const late = new Promise((r) => setTimeout(r, 300)).then(() => DistributedDataParallel.create(model(), second[0]));
    const [d1, d0] = await Promise.all([DistributedDataParallel.create(model(), second[1]), late]);
    expect(await d0.weightsHash()).toBe(await d1.weightsHash());
    for (const p of second) p.destroy();
  });

  it('a model built with the same seed has the same initial weights whatever the world size', async () => {
    const a = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 11 });
    const b = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 11 });
    const flat = async (m: tf.LayersModel) => (await tf.concat(m.getWeights().map((w) => w.reshape([-1]))).data()) as Float32Array;
    expect(Buffer.from((await flat(a)).buffer).equals(Buffer.from((await flat(b)).buffer))).toBe(true);
  });
});
