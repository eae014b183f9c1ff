/**
 * DataParallel in Node: its devices are worker threads running the same DeviceReplica as the
 * browser's Workers (TF.js cpu), the main side is the real class. Scatter and gather alone, the
 * gradients against one thread's, training against one thread's, DDP over ranks that each use
 * devices, and every way a device fails. The browser's Workers (webgpu, wasm, cpu) are proven end
 * to end in test/e2e/data_parallel.spec.ts.
 */
import * as tf from '@tensorflow/tfjs';
import { Worker, type TransferListItem } from 'node:worker_threads';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DataParallel, type DeviceChannel } from '../src/parallel/data_parallel/data_parallel.ts';
import { chunkSizes, gatherMean, scatter } from '../src/parallel/data_parallel/scatter_gather.ts';
import { parseFromDevice, parseToDevice } from '../src/parallel/data_parallel/protocol.ts';
import { DataParallelDeviceError } from '../src/wire/errors.ts';
import { DistributedDataParallel } from '../src/parallel/ddp/ddp.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { flatTrainableWeights } from '../src/parallel/replicas.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { TextDataset } from '../src/datasets/text.ts';
import type { RunningServer } from '../signaling/server.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { relativeError } from './fixtures/tensors.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { errorOf } from './fixtures/errors.ts';

const DEVICE = new URL('./fixtures/data_parallel_node_device.ts', import.meta.url);

/** A device as a Node worker thread running data_parallel_node_device.ts (TypeScript, through tsx's loader). */
function nodeDevice(): DeviceChannel {
  const worker = new Worker(
    `import('tsx/esm/api').then(({ tsImport }) => tsImport(${JSON.stringify(DEVICE.href)}, ${JSON.stringify(import.meta.url)}))`,
    { eval: true },
  );
  return {
    post: (message, transfer = []) => worker.postMessage(message, transfer as unknown as TransferListItem[]),
    onMessage: (listener) => worker.on('message', listener),
    onError: (listener) => {
      worker.on('error', (err) => listener(`the worker threw: ${err.message}`));
    },
    terminate: () => void worker.terminate(),
  };
}

const data = syntheticDataset({ length: 512, inputSize: 16, numClasses: 4, seed: 3 });
const loss = { kind: 'softmaxCrossEntropy', numClasses: 4 } as const;
const newModel = () => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 7 });
const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);

/** The whole batch's mean-loss gradient on this thread, flat. */
async function oneThreadGradients(model: tf.LayersModel, indices: number[]): Promise<{ loss: number; grads: Float32Array }> {
  const { x, y } = data.batch(indices);
  const xs = tf.tensor(x, [indices.length, 16]);
  const ys = tf.tensor1d(y, 'int32');
  const vars = model.trainableWeights.map((w) => w.read() as tf.Variable);
  const { value, grads } = tf.variableGrads(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, 4), vars);
  const flat = tf.tidy(() => tf.concat(vars.map((v) => grads[v.name]!.reshape([-1]))));
  const out = { loss: (await value.data())[0]!, grads: (await flat.data()) as Float32Array };
  tf.dispose([xs, ys, value, flat, ...Object.values(grads)]);
  return out;
}

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

describe('scatter and gather', () => {
  it('cuts a batch into chunks that differ by at most one, the larger first, and leaves extra devices idle', () => {
    expect(chunkSizes(32, 2)).toEqual([16, 16]);
    expect(chunkSizes(33, 2)).toEqual([17, 16]);
    expect(chunkSizes(10, 4)).toEqual([3, 3, 2, 2]);
    expect(chunkSizes(1, 3)).toEqual([1, 0, 0]);
    for (let n = 0; n <= 40; n++) {
      for (let k = 1; k <= 6; k++) {
        const s = chunkSizes(n, k);
        expect(s.reduce((a, b) => a + b, 0)).toBe(n);
        expect(Math.max(...s) - Math.min(...s)).toBeLessThanOrEqual(1);
        expect([...s].sort((a, b) => b - a)).toEqual(s);
      }
    }
    expect(() => chunkSizes(4, 0)).toThrow(RangeError);
    expect(() => chunkSizes(-1, 2)).toThrow(RangeError);
  });

  it('scatters copies of consecutive samples and refuses a batch of the wrong length', () => {
    const values = Float32Array.from(range(0, 10));
    const chunks = scatter(values, 2, [3, 2, 0]);
    expect(chunks.map((c) => [c.device, c.start, c.samples, Array.from(c.values)])).toEqual([
      [0, 0, 3, [0, 1, 2, 3, 4, 5]],
      [1, 3, 2, [6, 7, 8, 9]],
    ]);
    chunks[0]!.values[0] = 99;
    expect(values[0]).toBe(0);
    expect(() => scatter(values, 2, [3, 3])).toThrow(errorOf(RangeError, /10 values, but 6 samples of 2 need 12/));
  });

  it("gathers the chunks' mean gradients weighted by their samples, in float64", () => {
    const { loss, grads } = gatherMean([
      { samples: 3, loss: 1, grads: Float32Array.of(1, 2) },
      { samples: 1, loss: 5, grads: Float32Array.of(5, -2) },
    ]);
    expect(loss).toBe(2);
    expect(Array.from(grads)).toEqual([2, 1]);
    expect(() => gatherMean([])).toThrow(errorOf(RangeError, /no device/));
    expect(() =>
      gatherMean([
        { samples: 1, loss: 0, grads: new Float32Array(2) },
        { samples: 1, loss: 0, grads: new Float32Array(3) },
      ]),
    ).toThrow(errorOf(RangeError, /3 gradient values/));
  });

  it('checks every message type at both ends', () => {
    expect(
      parseFromDevice({ type: 'grads', id: 1, loss: 0.5, grads: new Float32Array(2), correct: 1, computeMs: 3, liveTensors: 4 }),
    ).not.toBeTypeOf('string');
    expect(parseFromDevice({ type: 'grads', id: 1, loss: 0.5, grads: [1, 2], correct: 1, computeMs: 3, liveTensors: 4 })).toMatch(
      /Float32Array/,
    );
    expect(parseFromDevice({ type: 'ready', backend: 'tpu', liveTensors: 0 })).toMatch(/unknown backend/);
    expect(parseFromDevice({ type: 'nope' })).toMatch(/unknown message type "nope"/);
    expect(parseFromDevice(null)).toMatch(/null/);
    expect(
      parseToDevice({ type: 'step', id: 1, weights: new Float32Array(1), x: new Float32Array(1), y: new Int32Array(1), samples: 0 }),
    ).toMatch(/samples/);
    expect(parseToDevice({ type: 'init', device: 0, backend: 'cpu', topology: {}, shapes: [[2, 2]], loss: { kind: 'hinge' } })).toMatch(
      /unknown loss/,
    );
    expect(parseToDevice({ type: 'fault', kind: 'explode' })).toMatch(/unknown kind/);
  });
});

// Each device is a worker thread that loads TF.js: seconds apiece on a loaded 2-core machine.
describe('DataParallel', { timeout: 90_000 }, () => {
  it("3 devices give the whole batch's gradient for even, uneven and tiny batches, and report their backend; a batch of the wrong size is refused with its numbers", async () => {
    const model = newModel();
    const dp = await DataParallel.create(model, { devices: 3, loss, backend: 'cpu', spawn: nodeDevice });
    try {
      expect(dp.devices).toEqual([0, 1, 2].map((device) => ({ device, backend: 'cpu' })));
      const cases: Array<[number, number[]]> = [
        [33, [11, 11, 11]],
        [32, [11, 11, 10]],
        [1, [1, 0, 0]],
      ];
      for (const [n, sizes] of cases) {
        const indices = range(0, n);
        const want = await oneThreadGradients(model, indices);
        const { x, y } = data.batch(indices);
        const got = await dp.computeGradients({ x, y: Int32Array.from(y) });
        expect(relativeError(got.grads, want.grads)).toBeLessThan(1e-6);
        expect(got.loss).toBeCloseTo(want.loss, 6);
        expect(got.devices.map((d) => d.samples)).toEqual(sizes);
        expect(got.correct).toBeGreaterThanOrEqual(0);
        expect(got.correct).toBeLessThanOrEqual(n);
      }
      const { x } = data.batch([5]);
      await expect(dp.computeGradients({ x: new Float32Array(20), y: new Int32Array(1) })).rejects.toThrow(
        errorOf(RangeError, /20 values, not a positive multiple of the 16/),
      );
      await expect(dp.computeGradients({ x, y: new Int32Array(2) })).rejects.toThrow(errorOf(RangeError, /1 samples but 2 labels/));
    } finally {
      dp.close();
      model.dispose();
    }
  });

  it("a language model's windows: 2 devices give the whole batch's gradient over every position, and count every position's prediction", async () => {
    const ids = Int32Array.from({ length: 400 }, (_, i) => (i * 7 + (i >> 3)) % 10);
    const text = new TextDataset('text', ids, 8, 10);
    const model = buildModel({ kind: 'lm', inputShape: [8], numClasses: 10, seed: 2, hidden: 16 });
    const dp = await DataParallel.create(model, {
      devices: 2,
      loss: { kind: 'softmaxCrossEntropy', numClasses: 10 },
      backend: 'cpu',
      spawn: nodeDevice,
    });
    try {
      const indices = range(0, 7);
      const { x, y } = text.batch(indices);
      const xs = tf.tensor(x, [7, 8]);
      const ys = tf.tensor(y, [7, 8], 'int32');
      const vars = model.trainableWeights.map((w) => w.read() as tf.Variable);
      const { value, grads } = tf.variableGrads(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, 10), vars);
      const flat = tf.tidy(() => tf.concat(vars.map((v) => grads[v.name]!.reshape([-1]))));
      const want = (await flat.data()) as Float32Array;
      const wantLoss = (await value.data())[0]!;
      tf.dispose([xs, ys, value, flat, ...Object.values(grads)]);
      const got = await dp.computeGradients({ x, y });
      expect(relativeError(got.grads, want)).toBeLessThan(1e-5);
      expect(got.loss).toBeCloseTo(wantLoss, 5);
      expect(got.devices.map((d) => d.samples)).toEqual([4, 3]);
      // 7 windows of 8 positions: up to 56 right predictions, not 7.
      expect(got.correct).toBeLessThanOrEqual(56);
      await expect(dp.computeGradients({ x, y: y.subarray(0, 7) })).rejects.toThrow(
        errorOf(RangeError, /7 samples but 7 labels \(56 expected\)/),
      );
    } finally {
      dp.close();
      model.dispose();
    }
  });

  it("trains to one thread's weights after 15 SGD steps (batch 33 over 2 devices), with no tensor leak on the devices", async () => {
    const reference = newModel();
    const model = newModel();
    const refOpt = tf.train.sgd(0.1);
    const opt = tf.train.sgd(0.1);
    const dp = await DataParallel.create(model, { devices: 2, loss, backend: 'cpu', spawn: nodeDevice });
    try {
      for (let s = 0; s < 15; s++) {
        const indices = range(s * 33, s * 33 + 33).map((i) => i % data.length);
        const { x, y } = data.batch(indices);
        const xs = tf.tensor(x, [indices.length, 16]);
        const ys = tf.tensor1d(y, 'int32');
        refOpt.minimize(() => classificationLoss(reference.apply(xs) as tf.Tensor, ys, 4));
        tf.dispose([xs, ys]);
        await dp.backward({ x, y: Int32Array.from(y) });
        dp.step(opt);
      }
      expect(relativeError(await flatTrainableWeights(model), await flatTrainableWeights(reference))).toBeLessThan(1e-5);
      const stats = dp.deviceStats();
      expect(stats.map((d) => [d.steps, d.samples])).toEqual([
        [15, 15 * 17],
        [15, 15 * 16],
      ]);
      for (const d of stats) expect(d.liveTensors!.min).toBe(d.liveTensors!.max);
      expect(() => dp.step(opt)).toThrow(/before backward/);
    } finally {
      dp.close();
      tf.dispose([model, reference].flatMap((m) => m.weights.map((w) => w.read())));
    }
  });

  it('a device that cannot run the backend asked for falls back to cpu and says why', async () => {
    const dp = await DataParallel.create(newModel(), { devices: 1, loss, backend: 'webgpu', spawn: nodeDevice });
    try {
      expect(dp.devices[0]!.backend).toBe('cpu');
      expect(dp.devices[0]!.fallbackReason).toMatch(/no webgpu in a Node worker thread; .*using cpu instead/);
    } finally {
      dp.close();
    }
  });

  it('a device that crashes fails the step with its index and reason, and every step after it', async () => {
    const model = newModel();
    const dp = await DataParallel.create(model, { devices: 2, loss, backend: 'cpu', spawn: nodeDevice });
    try {
      const { x, y } = data.batch(range(0, 8));
      await dp.computeGradients({ x, y: Int32Array.from(y) });
      dp.injectFault(1, 'crash');
      const err = await dp.computeGradients({ x, y: Int32Array.from(y) }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(DataParallelDeviceError);
      expect((err as DataParallelDeviceError).device).toBe(1);
      expect((err as Error).message).toMatch(
        /^DataParallel device 1 \(a Worker on cpu\) failed during (step 2|its run): the worker threw: a crash injected by DataParallel.injectFault/,
      );
      await expect(dp.computeGradients({ x, y: Int32Array.from(y) })).rejects.toBe(err);
      expect(() => dp.injectFault(2, 'crash')).toThrow(errorOf(RangeError, /no device 2/));
    } finally {
      dp.close();
    }
  });

  it('a device that stops answering fails the step when its timeout ends, naming the device, the step and the wait', async () => {
    const dp = await DataParallel.create(newModel(), { devices: 2, loss, backend: 'cpu', spawn: nodeDevice, stepTimeoutMs: 1_500 });
    try {
      dp.injectFault(0, 'hang');
      const { x, y } = data.batch(range(0, 8));
      await expect(dp.computeGradients({ x, y: Int32Array.from(y) })).rejects.toThrow(
        errorOf(
          DataParallelDeviceError,
          'DataParallel device 0 (a Worker on cpu) failed during step 1: it did not answer step 1 (4 samples) within 1.5 s',
        ),
      );
    } finally {
      dp.close();
    }
  });

  it('refuses a bad device count or loss before starting anything', async () => {
    await expect(DataParallel.create(newModel(), { devices: 0, loss, spawn: nodeDevice })).rejects.toThrow(
      errorOf(RangeError, /devices must be an integer from 1 to 32, got 0/),
    );
    await expect(
      DataParallel.create(newModel(), { devices: 2, loss: { kind: 'softmaxCrossEntropy', numClasses: 0 }, spawn: nodeDevice }),
    ).rejects.toThrow(errorOf(RangeError, /numClasses/));
  });

  it("DDP over 2 ranks of 2 devices each at batch 16 trains to one rank's weights at batch 32 (SGD, 10 steps)", async () => {
    const session = uniqueSession('dp-ddp');
    const net = new MemoryNetwork();
    const pgs = await Promise.all(
      range(0, 2).map((rank) =>
        initProcessGroup({
          url: server.url,
          session,
          token: tokenFor(session),
          worldSize: 2,
          rank,
          timeoutMs: 10_000,
          linkFactory: net.factoryFor(rank),
        }),
      ),
    );
    const models = pgs.map(() => newModel());
    const ddps = await Promise.all(pgs.map((pg, r) => DistributedDataParallel.create(models[r]!, pg)));
    const dps = await Promise.all(models.map((m) => DataParallel.create(m, { devices: 2, loss, backend: 'cpu', spawn: nodeDevice })));
    const reference = newModel();
    const refOpt = tf.train.sgd(0.1);
    const opts = pgs.map(() => tf.train.sgd(0.1));
    try {
      for (let s = 0; s < 10; s++) {
        const global = range(s * 32, s * 32 + 32);
        const { x, y } = data.batch(global);
        const xs = tf.tensor(x, [32, 16]);
        const ys = tf.tensor1d(y, 'int32');
        refOpt.minimize(() => classificationLoss(reference.apply(xs) as tf.Tensor, ys, 4));
        tf.dispose([xs, ys]);
        await Promise.all(
          pgs.map(async (_, r) => {
            const mine = data.batch(global.slice(r * 16, r * 16 + 16));
            const local = await dps[r]!.computeGradients({ x: mine.x, y: Int32Array.from(mine.y) });
            const result = await ddps[r]!.backward(local);
            expect(result.timings.compute).toBe(local.computeMs);
            ddps[r]!.step(opts[r]!);
          }),
        );
      }
      const [w0, w1] = await Promise.all(models.map((m) => flatTrainableWeights(m)));
      expect(Buffer.from(w0!.buffer).equals(Buffer.from(w1!.buffer))).toBe(true);
      expect(relativeError(w0!, await flatTrainableWeights(reference))).toBeLessThan(1e-5);
    } finally {
      for (const dp of dps) dp.close();
      for (const pg of pgs) pg.destroy();
    }
  });
});
