/**
 * DDP with host optimizers (src/nn/optim.ts) and uneven batches, in Node (TF.js cpu backend,
 * in-memory links, the real server for the store): N ranks at batch B equal one rank at N*B;
 * ranks with uneven batches weighed by `setBatchShare` equal one rank at the global batch; the
 * master copy survives weights written by someone else; TrainState carries the optimizer's state
 * exactly. That different backends end with the same bits is proven end to end
 * (test/e2e/mixed_fleet.spec.ts: a WebGPU tab beside a WebGL tab).
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { DistributedDataParallel } from '../src/parallel/ddp/ddp.ts';
import { Adam, AdamW, SGD, type HostOptimizer } from '../src/nn/optim.ts';
import { hostWeights } from '../src/parallel/replicas.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

async function groups(n: number): Promise<ProcessGroup[]> {
  const net = new MemoryNetwork();
  const session = uniqueSession('hostopt');
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

const data = syntheticDataset({ length: 1024, inputSize: 16, numClasses: 4, seed: 3 });
const mlp = () => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 11 });
const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);

async function step(ddp: DistributedDataParallel, indices: number[], opt: tf.Optimizer): Promise<void> {
  const { x, y } = data.batch(indices);
  const xs = tf.tensor(x, [indices.length, 16]);
  const ys = tf.tensor1d(y, 'int32');
  try {
    await ddp.backward(() => classificationLoss(ddp.model.apply(xs) as tf.Tensor, ys, 4));
  } finally {
    xs.dispose();
    ys.dispose();
  }
  await ddp.step(opt);
}

/** ||a - b|| / ||b|| over all weights (the relative error of the weight vector). */
function maxRelErr(a: Float32Array, b: Float32Array): number {
  let d = 0;
  let n = 0;
  for (let i = 0; i < a.length; i++) {
    d += (a[i]! - b[i]!) ** 2;
    n += b[i]! ** 2;
  }
  return Math.sqrt(d) / Math.sqrt(n);
}

/** One rank at the global batch, `steps` steps of `global` samples. */
async function single(makeOpt: () => HostOptimizer, steps: number, global: number): Promise<Float32Array> {
  const [pg] = await groups(1);
  const ddp = await DistributedDataParallel.create(mlp(), pg!);
  const opt = makeOpt();
  for (let s = 0; s < steps; s++) await step(ddp, range(s * global, (s + 1) * global), opt);
  const w = await ddp.flatWeights();
  pg!.destroy();
  return w;
}

/**
 * Two ranks splitting each global batch at `cut` (rank 0 takes the first `cut` samples), each
 * weighing its gradients by its share when the split is uneven. Returns both ranks' weights.
 */
async function pair(makeOpt: () => HostOptimizer, steps: number, global: number, cut: (s: number) => number): Promise<Float32Array[]> {
  const pgs = await groups(2);
  const ddps = await Promise.all(pgs.map((pg) => DistributedDataParallel.create(mlp(), pg)));
  const opts = ddps.map(() => makeOpt());
  for (let s = 0; s < steps; s++) {
    const c = cut(s);
    await Promise.all(
      ddps.map((d, r) => {
        const from = s * global + (r === 0 ? 0 : c);
        const to = r === 0 ? s * global + c : (s + 1) * global;
        d.setBatchShare(to - from, global);
        return step(d, range(from, to), opts[r]!);
      }),
    );
  }
  const ws = await Promise.all(ddps.map((d) => d.flatWeights()));
  for (const pg of pgs) pg.destroy();
  return ws;
}

const optimizers: Array<[string, () => HostOptimizer]> = [
  ['SGD', () => new SGD({ lr: 0.1 })],
  ['SGD with Nesterov momentum and weight decay', () => new SGD({ lr: 0.05, momentum: 0.9, nesterov: true, weightDecay: 1e-3 })],
  ['Adam', () => new Adam({ lr: 0.01 })],
  ['AdamW', () => new AdamW({ lr: 0.01 })],
];

describe('DDP with host optimizers', () => {
  for (const [name, makeOpt] of optimizers) {
    it(`${name}: 2 ranks x 16 equal 1 rank x 32 after 20 steps (rel err <= 1e-5), replicas bit-identical`, async () => {
      const [w0, w1] = await pair(makeOpt, 20, 32, () => 16);
      expect(Buffer.from(w0!.buffer).equals(Buffer.from(w1!.buffer))).toBe(true);
      expect(maxRelErr(w0!, await single(makeOpt, 20, 32))).toBeLessThanOrEqual(1e-5);
    });
  }

  for (const [name, makeOpt] of optimizers.filter(([n]) => n === 'SGD' || n === 'Adam')) {
    it(`${name}: uneven batches (5 + 27, then shares changing every step, one rank at times with none) weighed by share equal 1 rank at the global batch after 20 steps`, async () => {
      const reference = await single(makeOpt, 20, 32);
      const fixed = await pair(makeOpt, 20, 32, () => 5);
      expect(Buffer.from(fixed[0]!.buffer).equals(Buffer.from(fixed[1]!.buffer))).toBe(true);
      expect(maxRelErr(fixed[0]!, reference)).toBeLessThanOrEqual(1e-5);
      // Re-balanced every step, a rank with a single sample, and a rank with none (at steps 1 and 15), included.
      const moving = await pair(makeOpt, 20, 32, (s) => (s * 7) % 33);
      expect(maxRelErr(moving[0]!, reference)).toBeLessThanOrEqual(1e-5);
    });
  }

  it('without the shares, uneven batches do not equal the global batch (the weighting is what makes them equal)', async () => {
    const makeOpt = () => new SGD({ lr: 0.1 });
    const pgs = await groups(2);
    const ddps = await Promise.all(pgs.map((pg) => DistributedDataParallel.create(mlp(), pg)));
    const opts = ddps.map(() => makeOpt());
    for (let s = 0; s < 5; s++)
      await Promise.all(ddps.map((d, r) => step(d, r === 0 ? range(s * 32, s * 32 + 5) : range(s * 32 + 5, s * 32 + 32), opts[r]!)));
    const w = await ddps[0]!.flatWeights();
    for (const pg of pgs) pg.destroy();
    expect(maxRelErr(w, await single(makeOpt, 5, 32))).toBeGreaterThan(1e-3);
  });

  it('setBatchShare refuses shares that are not a part of the global batch', async () => {
    const [pg] = await groups(1);
    const ddp = await DistributedDataParallel.create(mlp(), pg!);
    expect(() => ddp.setBatchShare(33, 32)).toThrow(errorOf(RangeError, /samples must be an integer in 0..globalSamples/));
    expect(() => ddp.setBatchShare(1.5, 32)).toThrow(RangeError);
    expect(() => ddp.setBatchShare(1, 0)).toThrow(RangeError);
    pg!.destroy();
  });

  it('weights written by someone else between steps (setWeights) are read back into the master copy', async () => {
    const [pg] = await groups(1);
    const ddp = await DistributedDataParallel.create(mlp(), pg!);
    const opt = new SGD({ lr: 0.1 });
    await step(ddp, range(0, 16), opt);
    expect(hostWeights(ddp.model)).not.toBeNull();
    const zeros = ddp.model.getWeights().map((w) => tf.zerosLike(w));
    ddp.model.setWeights(zeros);
    for (const z of zeros) z.dispose();
    expect(hostWeights(ddp.model)).toBeNull();
    // The step starts from the zeros, not from the stale master copy.
    const { x, y } = data.batch(range(16, 32));
    const xs = tf.tensor(x, [16, 16]);
    const ys = tf.tensor1d(y, 'int32');
    await ddp.backward(() => classificationLoss(ddp.model.apply(xs) as tf.Tensor, ys, 4));
    xs.dispose();
    ys.dispose();
    await ddp.step(opt);
    const after = await ddp.flatWeights();
    // From zeros, a single SGD step moves each weight by at most lr * |grad|: small.
    expect(Math.max(...Array.from(after, Math.abs))).toBeLessThan(0.5);
    expect(Array.from(after)).toEqual(Array.from(hostWeights(ddp.model)!));
    pg!.destroy();
  });

  it('TrainState carries the host optimizer exactly: a state loaded into a fresh replica continues bit for bit', async () => {
    const [pg] = await groups(1);
    const makeState = () => new TrainState({ model: mlp(), optimizer: () => new Adam({ lr: 0.01 }) });
    const a = makeState();
    const ddpA = await DistributedDataParallel.create(a.model, pg!, { name: 'a' });
    for (let s = 0; s < 5; s++) await step(ddpA, range(s * 16, s * 16 + 16), a.optimizer);
    const saved = await a.stateDict();
    const b = makeState();
    await b.loadStateDict(saved);
    const ddpB = await DistributedDataParallel.create(b.model, pg!, { name: 'b' });
    for (let s = 5; s < 10; s++) {
      await step(ddpA, range(s * 16, s * 16 + 16), a.optimizer);
      await step(ddpB, range(s * 16, s * 16 + 16), b.optimizer);
    }
    const [wa, wb] = await Promise.all([ddpA.flatWeights(), ddpB.flatWeights()]);
    expect(Buffer.from(wa.buffer).equals(Buffer.from(wb.buffer))).toBe(true);
    pg!.destroy();
  });

  it('keeps the live tensor count flat across host steps', async () => {
    const [pg] = await groups(1);
    const ddp = await DistributedDataParallel.create(mlp(), pg!);
    const opt = new Adam({ lr: 0.01 });
    await step(ddp, range(0, 16), opt);
    const before = tf.memory().numTensors;
    for (let s = 1; s < 6; s++) await step(ddp, range(s * 16, s * 16 + 16), opt);
    expect(tf.memory().numTensors).toBe(before);
    pg!.destroy();
  });
});
