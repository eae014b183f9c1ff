/**
 * DistributedDataParallel's logic in Node (TF.js cpu backend, in-memory links, real server for
 * the store): buckets, shape check, broadcast, averaging, noSync accumulation. The WebGPU +
 * WebRTC path is proven end to end in test/e2e/train.spec.ts.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { DistributedDataParallel, ShapeMismatchError, assignBuckets, type DDPOptions } from '../src/parallel/ddp/ddp.ts';
import { NonFiniteGradientError, ReplicaDivergenceError } from '../src/wire/errors.ts';
import { verifyReplicas } from '../src/parallel/replicas.ts';
import { allReduceBytes } from '../src/c10d/collective_bytes.ts';
import { allreduceHook, fp16CompressHook } from '../src/parallel/comm_hooks/default_hooks.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { pendingWaiters, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { waitFor } from './fixtures/wait.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';

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
    Array.from({ length: n }, (_, rank) =>
      initProcessGroup({
        url: server.url,
        session,
        token: tokenFor(session),
        worldSize: n,
        rank,
        timeoutMs: 5_000,
        linkFactory: net.factoryFor(rank),
      }),
    ),
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
    expect(buckets.map((b) => b.params)).toEqual([
      [3, 2],
      [1, 0],
    ]);
    expect(buckets[0]).toMatchObject({ start: sizes[0] + sizes[1], end: sizes.reduce((a, b) => a + b) });
    expect(assignBuckets([10, 10], 1 << 20, 25 << 20).map((b) => b.params)).toEqual([[1, 0]]);
  });
});

describe('DistributedDataParallel', () => {
  it('broadcasts rank 0 weights, keeps replicas identical, and 2 ranks x B equals 1 rank x 2B', async () => {
    const pgs = await groups(2);
    // Different seeds on purpose: the broadcast must make rank 1 start from rank 0's weights.
    const ddps = await Promise.all(
      pgs.map((pg) => DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 5 + pg.rank }), pg)),
    );
    const hashes0 = await Promise.all(ddps.map((d) => d.weightsHash()));
    expect(hashes0[0]).toBe(hashes0[1]);
    const steps = 5;
    await Promise.all(
      ddps.map((d, r) =>
        trainSteps(
          d,
          range(0, steps).map((s) => range(s * 32 + r * 16, s * 32 + r * 16 + 16)),
          tf.train.sgd(0.1),
        ),
      ),
    );
    const [w0, w1] = await Promise.all(ddps.map((d) => d.flatWeights()));
    expect(Buffer.from(w0.buffer).equals(Buffer.from(w1.buffer))).toBe(true);

    const [solo] = await groups(1);
    const single = await DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 5 }), solo);
    await trainSteps(
      single,
      range(0, steps).map((s) => range(s * 32, s * 32 + 32)),
      tf.train.sgd(0.1),
    );
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
        return d
          .noSync(() => d.backward(() => classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4)))
          .finally(() => tf.dispose([xs, ys]));
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
      pgs.map((pg) =>
        DistributedDataParallel.create(
          buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 1, hidden: pg.rank === 0 ? 32 : 24 }),
          pg,
        ),
      ),
    );
    for (const r of results) {
      expect(r.status).toBe('rejected');
      const err = (r as PromiseRejectedResult).reason as Error;
      expect(err).toBeInstanceOf(ShapeMismatchError);
      expect(err.message).toMatch(/parameter 0 \(.*kernel\) has shape \[16, 32\] on rank 0 but \[16, 24\] on rank 1/);
    }
    for (const p of pgs) p.destroy();
  });

  it("initSync false (torch's init_sync): made without a word to the other ranks, each keeping its own weights", async () => {
    const net = new MemoryNetwork();
    const pgs = await groups(2, net);
    const before = traffic(net);
    // Rank 1 never makes its DDP: with the start-up sync rank 0's create would wait for it.
    const model = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 9 });
    const own = Buffer.from(
      new Float32Array((await Promise.all(model.trainableWeights.map((w) => w.read().data()))).flatMap((d) => Array.from(d))).buffer,
    );
    const ddp = await DistributedDataParallel.create(model, pgs[0]!, { initSync: false });
    expect(traffic(net)).toBe(before);
    expect(Buffer.from((await ddp.flatWeights()).buffer).equals(own)).toBe(true);
    for (const p of pgs) p.destroy();
  });

  it('keeps the live tensor count flat across steps on 2 ranks', async () => {
    const pgs = await groups(2);
    const ddps = await Promise.all(
      pgs.map((pg) => DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 2 }), pg)),
    );
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
    const refused = await Promise.allSettled(
      first.map((pg) =>
        DistributedDataParallel.create(
          buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 1, hidden: pg.rank === 0 ? 24 : 32 }),
          pg,
        ),
      ),
    );
    expect(refused.every((r) => r.status === 'rejected')).toBe(true);
    for (const p of first) p.destroy();
    // A second group in the same session where they agree; rank 1 checks before rank 0 has
    // published, so with shared keys it would read the first group's stale rank-0 shapes.
    const second = await groups(2, new MemoryNetwork(), session);
    const model = () => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 1, hidden: 32 });
    const checking = DistributedDataParallel.create(model(), second[1]);
    await waitFor("rank 1's shape check to wait for rank 0's shapes", () => pendingWaiters(server, session) === 1);
    const [d1, d0] = await Promise.all([checking, DistributedDataParallel.create(model(), second[0])]);
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

describe('carry', () => {
  /** Three steps on `n` ranks; with `carrying`, rank r carries [r + 1, step, -(r + 1) / 3] at each. */
  async function run(n: number, carrying: boolean, hook?: 'allreduce' | 'fp16') {
    const ddps = await Promise.all(
      (await groups(n)).map((pg) =>
        DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 3 }), pg),
      ),
    );
    if (hook) for (const d of ddps) d.registerCommHook(hook === 'fp16' ? fp16CompressHook() : allreduceHook());
    const sums: Array<Array<Float32Array | null>> = [];
    const sent: number[][] = [];
    const accepted: boolean[] = [];
    for (let step = 1; step <= 3; step++) {
      const before = ddps.map((d) => d.pg.bytesSent());
      sums.push(
        await Promise.all(
          ddps.map(async (d, r) => {
            if (carrying) accepted.push(d.carry(Float32Array.of(r + 1, step, -(r + 1) / 3)));
            const { x, y } = data.batch(range(step * 64 + r * 8, step * 64 + r * 8 + 8));
            const xs = tf.tensor(x, [8, 16]);
            const ys = tf.tensor1d(y, 'int32');
            await d.backward(() => classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4));
            tf.dispose([xs, ys]);
            await d.step(tf.train.sgd(0.1));
            return d.takeCarried();
          }),
        ),
      );
      sent.push(ddps.map((d, r) => d.pg.bytesSent() - before[r]!));
    }
    const weights = await Promise.all(ddps.map((d) => d.flatWeights()));
    for (const d of ddps) d.pg.destroy();
    return { sums, sent, accepted, weights, numel: ddps[0]!.parameterCount };
  }
  const same = (a: Float32Array, b: Float32Array) =>
    Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));

  it("values ride on the last bucket's all-reduce: their sums come back on every rank, in the same collective, and the weights are the plain average's bits", async () => {
    for (const n of [2, 3, 4]) {
      const plain = await run(n, false);
      const carried = await run(n, true);
      expect(carried.accepted.every(Boolean)).toBe(true);
      for (const [k, step] of carried.sums.entries()) {
        const want = Float32Array.of(
          (n * (n + 1)) / 2,
          (k + 1) * n,
          Array.from({ length: n }, (_, r) => Math.fround(-(r + 1) / 3)).reduce((a, b) => Math.fround(a + b), 0),
        );
        for (const got of step) {
          expect(got).not.toBeNull();
          expect(Array.from(got!.subarray(0, 2))).toEqual(Array.from(want.subarray(0, 2)));
          expect(got![2]!).toBeCloseTo(want[2]!, 5);
          // Every rank the same bits.
          expect(same(got!, step[0]!)).toBe(true);
        }
      }
      // One all-reduce of the gradients and the 3 values, not a second collective.
      for (const step of carried.sent)
        step.forEach((bytes, r) => {
          expect(bytes).toBe(allReduceBytes(carried.numel + 3, r, n));
        });
      // Summed then divided as 'avg' divides: the same weights as without the ride, to the bit.
      for (const w of carried.weights) expect(same(w, plain.weights[0]!)).toBe(true);
    }
  });

  it('carries nothing with a compressing hook, and nothing rides on a later backward than the one it was given for', async () => {
    const fp16 = await run(2, true, 'fp16');
    expect(fp16.accepted).toEqual([false, false, false, false, false, false]);
    expect(fp16.sums.flat().every((s) => s === null)).toBe(true);
    // A registered allreduceHook() is the plain all-reduce: it carries.
    const registered = await run(2, true, 'allreduce');
    expect(registered.accepted.every(Boolean)).toBe(true);

    // A noSync backward carries nothing; takeCarried() then answers null and drops what waited,
    // so the next synchronised backward is the gradients alone.
    const ddps = await Promise.all(
      (await groups(2)).map((pg) =>
        DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 3 }), pg),
      ),
    );
    const backward = (d: DistributedDataParallel, r: number) => {
      const { x, y } = data.batch(range(r * 8, r * 8 + 8));
      const xs = tf.tensor(x, [8, 16]);
      const ys = tf.tensor1d(y, 'int32');
      return d.backward(() => classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4)).finally(() => tf.dispose([xs, ys]));
    };
    const dropped = await Promise.all(
      ddps.map(async (d, r) => {
        d.carry(Float32Array.of(7));
        await d.noSync(() => backward(d, r));
        return d.takeCarried();
      }),
    );
    expect(dropped).toEqual([null, null]);
    const before = ddps.map((d) => d.pg.bytesSent());
    await Promise.all(ddps.map((d, r) => backward(d, r)));
    ddps.forEach((d, r) => {
      expect(d.pg.bytesSent() - before[r]!).toBe(allReduceBytes(d.parameterCount, r, 2));
    });
    expect(ddps.map((d) => d.takeCarried())).toEqual([null, null]);
    for (const d of ddps) d.pg.destroy();
  });
});

describe('errorIfNonfinite', () => {
  /**
   * Two ranks take one step; on rank 1 the loss adds NaN * sum(last bias), so only that
   * parameter's gradient is NaN there, and so its average on both ranks.
   */
  async function nanStep(
    options: DDPOptions,
  ): Promise<{ ddps: DistributedDataParallel[]; results: PromiseSettledResult<{ loss: number }>[]; before: string[] }> {
    const pgs = await groups(2);
    const ddps = await Promise.all(
      pgs.map((pg) => DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 3 }), pg, options)),
    );
    const before = await Promise.all(ddps.map((d) => d.weightsHash()));
    const results = await Promise.allSettled(
      ddps.map(async (d, r) => {
        const { x, y } = data.batch(range(r * 8, r * 8 + 8));
        const xs = tf.tensor(x, [8, 16]);
        const ys = tf.tensor1d(y, 'int32');
        const bias = d.model.trainableWeights.at(-1)!.read();
        try {
          return await d.backward(() =>
            tf.tidy(() => {
              const loss = classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4);
              return r === 1 ? loss.add(bias.sum().mul(Number.NaN)) : loss;
            }),
          );
        } finally {
          tf.dispose([xs, ys]);
        }
      }),
    );
    return { ddps, results, before };
  }

  it('a NaN gradient on one rank fails the step on every rank, naming the parameter, and applies nothing (the default)', async () => {
    const { ddps, results, before } = await nanStep({});
    const last = ddps[0]!.model.trainableWeights.length - 1;
    results.forEach((res, r) => {
      expect(res.status).toBe('rejected');
      const err = (res as PromiseRejectedResult).reason as NonFiniteGradientError;
      expect(err).toBeInstanceOf(NonFiniteGradientError);
      expect(err.rank).toBe(r);
      expect(err.index).toBe(last);
      expect(err.parameter).toMatch(/bias$/);
      expect(err.message).toMatch(new RegExp(`^rank ${r}: the averaged gradient of parameter ${last} \\(.*bias\\) is not finite`));
    });
    // The gradients were dropped: a step has nothing to apply, and the weights did not move.
    for (const d of ddps) expect(() => d.step(tf.train.sgd(0.1))).toThrow(/step\(\) before backward\(\)/);
    expect(await Promise.all(ddps.map((d) => d.weightsHash()))).toEqual(before);
    // Training goes on after the failed step, and the replicas still agree.
    await Promise.all(ddps.map((d, r) => trainSteps(d, [range(64 + r * 8, 72 + r * 8)], tf.train.sgd(0.1))));
    expect(await Promise.all(ddps.map((d) => verifyReplicas(d.pg, d.model)))).toHaveLength(2);
    for (const d of ddps) d.pg.destroy();
  });

  it("with the option off (torch's default) a NaN gradient is averaged and applied", async () => {
    const { ddps, results } = await nanStep({ errorIfNonfinite: false });
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'fulfilled']);
    expect(Number.isNaN((results[1] as PromiseFulfilledResult<{ loss: number }>).value.loss)).toBe(true);
    for (const d of ddps) d.step(tf.train.sgd(0.1));
    const bias = (await ddps[0]!.flatWeights()).at(-1)!;
    expect(Number.isNaN(bias)).toBe(true);
    for (const d of ddps) d.pg.destroy();
  });

  it('keeps the live tensor count flat when it checks, and when a step fails', async () => {
    const pgs = await groups(2);
    const ddps = await Promise.all(
      pgs.map((pg) =>
        DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 2 }), pg, {
          errorIfNonfinite: true,
        }),
      ),
    );
    const opts = ddps.map(() => tf.train.adam(0.01));
    const batches = (r: number, from: number) => [range(from * 16 + r * 8, from * 16 + r * 8 + 8)];
    await Promise.all(ddps.map((d, r) => trainSteps(d, batches(r, 0), opts[r]!)));
    const before = tf.memory().numTensors;
    for (let s = 1; s < 6; s++) await Promise.all(ddps.map((d, r) => trainSteps(d, batches(r, s), opts[r]!)));
    // An infinite gradient for the first kernel only (the rest come from the ordinary loss).
    const failed = await Promise.allSettled(
      ddps.map(async (d, r) => {
        const { x, y } = data.batch(range(r * 8, r * 8 + 8));
        const [xs, ys] = [tf.tensor(x, [8, 16]), tf.tensor1d(y, 'int32')];
        const kernel = d.model.trainableWeights[0]!.read();
        const lossFn = () =>
          tf.tidy(
            () => classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4).add(kernel.sum().mul(Number.POSITIVE_INFINITY)) as tf.Scalar,
          );
        return d.backward(lossFn).finally(() => tf.dispose([xs, ys]));
      }),
    );
    for (const f of failed) expect((f as PromiseRejectedResult).reason).toMatchObject({ name: 'NonFiniteGradientError', index: 0 });
    expect(tf.memory().numTensors).toBe(before);
    for (const p of pgs) p.destroy();
  });
});

describe('verifyReplicas', () => {
  /** Adds `delta` to one element of `d`'s first weight. */
  function perturb(d: DistributedDataParallel, delta: number): void {
    const v = d.model.trainableWeights[0]!.read() as tf.Variable;
    const nudged = tf.tidy(() => v.add(tf.oneHot([0], v.size).reshape(v.shape).mul(delta)));
    v.assign(nudged);
    nudged.dispose();
  }

  it('passes while replicas agree and names the rank that diverged from the majority', async () => {
    const pgs = await groups(3);
    const ddps = await Promise.all(
      pgs.map((pg) => DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 4 }), pg)),
    );
    const agreed = await Promise.all(ddps.map((d) => d.verifyReplicas()));
    expect(new Set(agreed).size).toBe(1);
    expect(agreed[0]).toBe(await ddps[0]!.weightsHash());
    perturb(ddps[2]!, 1e-3);
    const results = await Promise.allSettled(ddps.map((d) => d.verifyReplicas()));
    for (const res of results) {
      const err = (res as PromiseRejectedResult).reason as ReplicaDivergenceError;
      expect(err).toBeInstanceOf(ReplicaDivergenceError);
      expect(err.ranks).toEqual([2]);
      expect(err.byMajority).toBe(true);
      expect(err.reference).toBe(agreed[0]);
      expect(err.message).toMatch(new RegExp(`^replicas diverged: rank 2 has weights hash [0-9a-f]{8}, the majority has ${agreed[0]}$`));
    }
    for (const p of pgs) p.destroy();
  });

  it('with no majority (two ranks), names the ranks that differ from rank 0', async () => {
    const pgs = await groups(2);
    const ddps = await Promise.all(
      pgs.map((pg) => DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 4 }), pg)),
    );
    perturb(ddps[1]!, -1e-3);
    const results = await Promise.allSettled(ddps.map((d) => verifyReplicas(d.pg, d.model)));
    for (const res of results)
      expect((res as PromiseRejectedResult).reason).toMatchObject({ name: 'ReplicaDivergenceError', ranks: [1], byMajority: false });
    for (const p of pgs) p.destroy();
  });
});
