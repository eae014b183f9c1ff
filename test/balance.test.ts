/**
 * Batches balanced by speed (runElastic's `balanceBatches`): the split of a step's samples, the
 * smoothing of the speeds the ranks report, and a run in Node (TF.js cpu backend, in-memory
 * links, the real server) where one rank is 4x slower: it gets fewer samples, every sample of the
 * epoch is trained exactly once, and the weights equal one rank at the global batch.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { samplesSeen } from '../launcher/samples_seen.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { runElastic, smoothSpeeds, type ElasticRunResult } from '../src/elastic/runner.ts';
import { balancedBatchOf, keepSplit, planGlobalEpoch, splitBatch } from '../src/elastic/epoch.ts';
import type { ElasticEvent } from '../src/elastic/events.ts';
import { buildModel, classificationLoss } from '../src/models.ts';
import { SGD } from '../src/optim.ts';
import { TrainState } from '../src/state_dict.ts';
import { tokenFor, uniqueSession, withServer } from './helpers.ts';
import { MemoryNetwork } from './memory_link.ts';

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

describe('splitBatch', () => {
  it('splits in proportion to the weights, every rank at least one sample, the counts adding up', () => {
    expect(splitBatch(64, [1, 1, 1, 1])).toEqual([16, 16, 16, 16]);
    expect(splitBatch(64, [4, 4, 4, 1])).toEqual([20, 19, 19, 6]);
    expect(splitBatch(10, [1000, 1])).toEqual([9, 1]);
    expect(splitBatch(3, [1, 1, 1, 1])).toEqual([1, 1, 1, 0]);
    for (const [count, weights] of [[37, [0.3, 2.2, 1.1]], [5, [9, 1, 1, 1, 1]], [100, [1e-9, 1, 1e9]]] as const) {
      const counts = splitBatch(count, weights);
      expect(counts.reduce((a, b) => a + b, 0)).toBe(count);
      expect(Math.min(...counts)).toBeGreaterThanOrEqual(1);
    }
  });

  it('in units of a quantum, the rest to the fastest rank, so a rank\'s batch takes few sizes', () => {
    expect(splitBatch(256, [4, 4, 4, 1], 8)).toEqual([80, 80, 72, 24]);
    expect(splitBatch(259, [4, 4, 4, 1], 8).reduce((a, b) => a + b, 0)).toBe(259);
    expect(splitBatch(259, [1, 4, 1, 1], 8)[1]! % 8).toBe(3);
    // Fewer units than ranks: split sample by sample.
    expect(splitBatch(20, [1, 1, 1], 8)).toEqual([7, 7, 6]);
  });

  it('a weight that is not a positive finite number counts as the median (a peer cannot starve the others)', () => {
    expect(splitBatch(30, [1, NaN, 1])).toEqual([10, 10, 10]);
    expect(splitBatch(30, [1, -5, Infinity])).toEqual([10, 10, 10]);
  });
});

describe('balancedBatchOf', () => {
  it('the ranks\' batches are the step\'s samples, each once; an epoch covers the order exactly once', () => {
    const plan = planGlobalEpoch(51, { step: 0, epoch: 0, position: 0 }, { numReplicas: 3, batchSize: 4, shuffle: true, seed: 1 });
    expect(plan.stepsLeft).toBe(5); // 51 samples at 12 a step
    const seen: number[] = [];
    for (let k = 0; k < plan.stepsLeft; k++) {
      const shares = [1 + k, 2, 0.5];
      const parts = [0, 1, 2].map((r) => balancedBatchOf(plan, k, 12, shares, r));
      for (const p of parts) expect(p.globalSamples).toBe(k < 4 ? 12 : 3);
      seen.push(...parts.flatMap((p) => p.indices));
    }
    expect(seen.length).toBe(51);
    expect(new Set(seen).size).toBe(51);
    expect(seen).toEqual(plan.order);
  });

  it('a last step with fewer samples than ranks is padded from the start of the order, the padding counted', () => {
    const plan = planGlobalEpoch(9, { step: 0, epoch: 0, position: 0 }, { numReplicas: 4, batchSize: 2, shuffle: false });
    const parts = [0, 1, 2, 3].map((r) => balancedBatchOf(plan, 1, 8, [1, 1, 1, 1], r));
    expect(parts.map((p) => p.indices)).toEqual([[8], [0], [1], [2]]);
    expect(parts.map((p) => p.padding)).toEqual([0, 1, 1, 1]);
  });
});

describe('smoothSpeeds', () => {
  it('halves each new figure with the history, keeps a rank\'s last speed when it reports none, and bounds outliers by the median', () => {
    expect(smoothSpeeds(null, [100, 50])).toEqual([100, 50]);
    expect(smoothSpeeds([100, 50], [100, 0])).toEqual([100, 50]);
    expect(smoothSpeeds([100, 50], [80, 30])).toEqual([90, 40]);
    // A peer claiming to be a million times faster weighs at most 20 medians.
    expect(smoothSpeeds(null, [100, 100, 1e8])).toEqual([100, 100, 2000]);
    expect(smoothSpeeds(null, [0, 0])).toBeNull();
  });
});

describe('runElastic with balanceBatches', () => {
  let server: RunningServer;
  beforeAll(async () => {
    await tf.setBackend('cpu');
    server = await withServer({ settleMs: 300, checkpointDir: await mkdtemp(join(tmpdir(), 'ddp-balance-')) });
  });
  afterAll(async () => {
    await server.close();
  });

  const data = syntheticDataset({ length: 480, inputSize: 16, numClasses: 4, seed: 2 });

  function member(net: MemoryNetwork, id: number, session: string, world: number, batchSize: number, msPerSample: number, events: ElasticEvent[], samples: number[][]): Promise<ElasticRunResult> {
    const model = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 0 });
    const state = new TrainState({ model, optimizer: () => new SGD({ lr: 0.1 }) });
    return runElastic({
      url: server.url,
      session,
      token: tokenFor(session),
      min: world,
      max: world,
      rank: id,
      timeoutMs: 10_000,
      linkFactory: net.factoryFor(id),
      state,
      datasetLength: data.length,
      batchSize,
      seed: 5,
      balanceBatches: true,
      onEvent: (e) => events.push(e),
      async step(ctx) {
        (samples[ctx.pg.rank] ??= []).push(ctx.indices.length);
        const { x, y } = data.batch(ctx.indices);
        const xs = tf.tensor(x, [ctx.indices.length, 16]);
        const ys = tf.tensor1d(y, 'int32');
        // A device that takes `msPerSample` per sample: a wait (not this process's one thread, which
        // both ranks share) in the straggler's slot, which DDP counts as this rank's own time.
        const device = { after: async () => (await sleep(ctx.indices.length * msPerSample), ctx.indices.length * msPerSample) };
        const { loss } = await ctx.ddp.backward(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, 4), { straggler: device });
        tf.dispose([xs, ys]);
        await ctx.ddp.step(ctx.optimizer);
        return { loss };
      },
    });
  }

  it('a 4x slower rank gets about a quarter of the fast rank\'s samples; exactly once; equal to one rank at the global batch', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('balance');
    const events: ElasticEvent[] = [];
    const samples: number[][] = [];
    const runs = await Promise.all([member(net, 0, session, 2, 16, 2, events, samples), member(net, 1, session, 2, 16, 8, events, samples)]);
    expect(runs.map((r) => r.steps)).toEqual([15, 15]);
    expect(runs[0]!.weightHash).toBe(runs[1]!.weightHash);
    expect(samplesSeen(events)).toEqual([{ samples: 480, exactlyOnce: true, complete: true }]);
    // The first step is split equally (no speeds yet); then the slow rank gets about a fifth of the 32 (6.4).
    expect(samples[0]![0]).toBe(16);
    expect(samples[1]![0]).toBe(16);
    for (const s of samples[1]!.slice(-5)) expect(s).toBeGreaterThanOrEqual(4);
    for (const s of samples[1]!.slice(-5)) expect(s).toBeLessThanOrEqual(9);

    const soloEvents: ElasticEvent[] = [];
    const [solo] = await Promise.all([member(new MemoryNetwork(), 0, uniqueSession('balance-solo'), 1, 32, 0, soloEvents, [])]);
    const [a, b] = [await runs[0]!.ddp.flatWeights(), await solo!.ddp.flatWeights()];
    let d = 0;
    let n = 0;
    for (let i = 0; i < a.length; i++) {
      d += (a[i]! - b[i]!) ** 2;
      n += b[i]! ** 2;
    }
    expect(Math.sqrt(d / n)).toBeLessThanOrEqual(1e-5);
    await Promise.all(runs.map((r) => r.close()));
    await solo!.close();
  });
});

describe('keepSplit', () => {
  it('keeps the last split while it is nearly as fast as the new one, so batch shapes (and compiled kernels) stay the same', () => {
    const speeds = [4, 4, 4, 1];
    // The ideal split for these speeds is [20, 19, 19, 6]; one sample off either way predicts a step under 10% longer.
    expect(keepSplit([19, 20, 19, 6], [20, 19, 19, 6], speeds)).toBe(true);
    expect(keepSplit([20, 19, 18, 7], [20, 19, 19, 6], speeds)).toBe(false);
    expect(keepSplit([16, 16, 16, 16], [20, 19, 19, 6], speeds)).toBe(false);
    // Another total (an epoch's last step) or another group: split afresh.
    expect(keepSplit([20, 19, 19, 6], [20, 19, 19, 5], speeds)).toBe(false);
    expect(keepSplit([16, 16], [11, 11, 10], [1, 1, 1])).toBe(false);
    const plan = planGlobalEpoch(64, { step: 0, epoch: 0, position: 0 }, { numReplicas: 2, batchSize: 16, shuffle: false });
    expect(balancedBatchOf(plan, 0, 32, [1, 1.1], 0, [16, 16]).counts).toEqual([16, 16]);
    // In units of 2 samples (an eighth of the mean batch of 16).
    expect(balancedBatchOf(plan, 0, 32, [1, 3], 0, [16, 16]).counts).toEqual([10, 22]);
  });
});
