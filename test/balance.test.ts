/**
 * Batches balanced by speed (runElastic's `balance`): the split of a step's samples, the
 * smoothing of the speeds the ranks report, and a run in Node (TF.js cpu backend, in-memory
 * links, the real server) where one rank is 4x slower: it gets fewer samples, every sample of the
 * epoch is trained exactly once, and the weights equal one rank at the global batch.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { samplesSeen } from '../launcher/samples_seen.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { runElastic, type ElasticRunResult } from '../src/parallel/ddp/runner.ts';
import { balancedBatchOf, planGlobalEpoch, splitBatch } from '../src/elastic/epoch.ts';
import { keepSplit, predictedStep, splitByCost, StepCosts, type RankCost } from '../src/elastic/balance.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { SGD } from '../src/nn/optim.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { sleep } from './fixtures/wait.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';

describe('splitBatch', () => {
  it('splits in proportion to the weights, every rank at least one sample, the counts adding up', () => {
    expect(splitBatch(64, [1, 1, 1, 1])).toEqual([16, 16, 16, 16]);
    expect(splitBatch(64, [4, 4, 4, 1])).toEqual([20, 19, 19, 6]);
    expect(splitBatch(10, [1000, 1])).toEqual([9, 1]);
    expect(splitBatch(3, [1, 1, 1, 1])).toEqual([1, 1, 1, 0]);
    for (const [count, weights] of [
      [37, [0.3, 2.2, 1.1]],
      [5, [9, 1, 1, 1, 1]],
      [100, [1e-9, 1, 1e9]],
    ] as const) {
      const counts = splitBatch(count, weights);
      expect(counts.reduce((a, b) => a + b, 0)).toBe(count);
      expect(Math.min(...counts)).toBeGreaterThanOrEqual(1);
    }
  });

  it("in units of a quantum, the rest to the fastest rank, so a rank's batch takes few sizes", () => {
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
  it("the ranks' batches are the step's samples, each once; an epoch covers the order exactly once", () => {
    const plan = planGlobalEpoch(51, { step: 0, epoch: 0, position: 0 }, { numReplicas: 3, batchSize: 4, shuffle: true, seed: 1 });
    expect(plan.stepsLeft).toBe(5); // 51 samples at 12 a step
    const seen: number[] = [];
    for (let k = 0; k < plan.stepsLeft; k++) {
      const shares = [1 + k, 2, 0.5];
      const parts = [0, 1, 2].map((r) => balancedBatchOf(plan, k, 12, (count) => splitBatch(count, shares), r, 3));
      for (const p of parts) expect(p.globalSamples).toBe(k < 4 ? 12 : 3);
      seen.push(...parts.flatMap((p) => p.indices));
    }
    expect(seen.length).toBe(51);
    expect(new Set(seen).size).toBe(51);
    expect(seen).toEqual(plan.order);
  });

  it('a last step with fewer samples than ranks is padded from the start of the order, the padding counted', () => {
    const plan = planGlobalEpoch(9, { step: 0, epoch: 0, position: 0 }, { numReplicas: 4, batchSize: 2, shuffle: false });
    const parts = [0, 1, 2, 3].map((r) => balancedBatchOf(plan, 1, 8, (count) => splitBatch(count, [1, 1, 1, 1]), r, 4));
    expect(parts.map((p) => p.indices)).toEqual([[8], [0], [1], [2]]);
    expect(parts.map((p) => p.padding)).toEqual([0, 1, 1, 1]);
  });
});

describe('StepCosts', () => {
  it('fits overhead + samples x perSample from two sizes or more, smoothing a size seen again', () => {
    const costs = new StepCosts(2);
    expect(costs.known).toBe(false);
    costs.observe([16, 16], [28, 112]);
    costs.observe([26, 6], [33, 92]);
    const [fast, slow] = costs.models();
    expect(fast!.overhead).toBeCloseTo(20, 9);
    expect(fast!.perSample).toBeCloseTo(0.5, 9);
    expect(slow!.overhead).toBeCloseTo(80, 9);
    expect(slow!.perSample).toBeCloseTo(2, 9);
    // The same size again: half the new figure, half the history.
    costs.observe([26, 0], [43, 0]);
    expect(costs.models()[0]!.overhead + 26 * costs.models()[0]!.perSample).toBeCloseTo(38, 9);
  });

  it("a rank seen at one size takes the group's overhead ratio; an unmeasured rank the median model", () => {
    const costs = new StepCosts(3);
    costs.observe([10, 10, 10], [30, 60, 0]);
    // No lines yet: time in proportion to the samples.
    expect(costs.models()[0]).toEqual({ overhead: 0, perSample: 3 });
    costs.observe([20, 10, 10], [40, 0, 0]);
    // Rank 0's line: overhead 20 = 20 samples' worth; rank 1 (60 ms at 10) gets the same ratio.
    expect(costs.models()[1]!.overhead).toBeCloseTo(40, 9);
    expect(costs.models()[1]!.perSample).toBeCloseTo(2, 9);
    expect(costs.models()[2]).toEqual(costs.models()[0]!.perSample < costs.models()[1]!.perSample ? costs.models()[1] : costs.models()[0]);
  });

  it("a peer's figure is untrusted: non-finite or non-positive times are ignored, and no rank is predicted 20x cheaper per sample than the median", () => {
    const costs = new StepCosts(3);
    costs.observe([10, 10, 10], [NaN, -5, Infinity]);
    expect(costs.known).toBe(false);
    costs.observe([10, 10, 10], [100, 100, 1e-6]);
    expect(costs.models()[2]!.perSample).toBeCloseTo(10 / 20, 9);
    expect(splitByCost(300, costs.models(), 1)[2]).toBeLessThanOrEqual(300 * (20 / 22) + 3);
  });
});

describe('splitByCost', () => {
  const line = (overhead: number, perSample: number): RankCost => ({ overhead, perSample });

  it('without fixed costs, about in proportion to the speeds (the shortest step, not the nearest ratio); the counts add up', () => {
    // [20, 20, 20, 4] takes 20 ms; the nearest ratio, [19, 19, 19, 7], 28 ms.
    expect(splitByCost(64, [line(0, 1), line(0, 1), line(0, 1), line(0, 4)], 1)).toEqual([20, 20, 20, 4]);
    for (const count of [1, 3, 37, 259]) {
      const counts = splitByCost(count, [line(5, 0.3), line(1, 2.2), line(0, 1.1)], 8);
      expect(counts.reduce((a, b) => a + b, 0)).toBe(count);
    }
  });

  it("a rank whose fixed cost alone is longer than the others' whole batches gets no samples; a probe gives it one unit", () => {
    // Four ranks of a small model: 20 ms a step plus 0.1 ms a sample; rank 3 four times slower.
    const models = [line(20, 0.1), line(20, 0.1), line(20, 0.1), line(80, 0.4)];
    const counts = splitByCost(128, models, 4);
    expect(counts).toEqual([44, 44, 40, 0]);
    expect(predictedStep(counts, models)).toBeCloseTo(24.4, 9);
    // In proportion to samples/s (the fixed cost ignored), the slow rank would set the pace.
    expect(predictedStep([40, 40, 40, 8], models)).toBeCloseTo(83.2, 9);
    expect(splitByCost(128, models, 4, true)).toEqual([44, 40, 40, 4]);
  });

  it("a rank that claims to cost nothing holds at most half a step's samples (two thirds of three ranks'): the others always share the rest", () => {
    // Rank 3's claim (no fixed cost, 20x the median's speed) gave it all 128 samples and every
    // honest rank none: their fixed cost alone was longer than its whole batch.
    const models = [line(20, 0.1), line(20, 0.1), line(20, 0.1), line(0, 0.005)];
    const counts = splitByCost(128, models, 4);
    expect(counts[3]).toBe(64);
    expect(counts.slice(0, 3).reduce((a, b) => a + b, 0)).toBe(64);
    expect(counts.slice(0, 3).every((c) => c > 0)).toBe(true);
    expect(splitByCost(96, models.slice(1), 4)[2]).toBe(64);
    // One or two ranks: no bound (one rank of two is half the group anyway).
    expect(splitByCost(64, [line(20, 0.1), line(0, 0.005)], 4)).toEqual([0, 64]);
  });

  it('the same split on every rank: pure arithmetic on the same figures', () => {
    const models = [line(3.3, 0.71), line(9.1, 0.2), line(0.5, 1.9), line(40, 0.05)];
    expect(splitByCost(200, models, 3)).toEqual(
      splitByCost(
        200,
        models.map((m) => ({ ...m })),
        3,
      ),
    );
  });
});

describe('runElastic with balance', () => {
  let server: RunningServer;
  beforeAll(async () => {
    await tf.setBackend('cpu');
    server = await withServer({ settleMs: 300, checkpointDir: await mkdtemp(join(tmpdir(), 'ddp-balance-')) });
  });
  afterAll(async () => {
    await server.close();
  });

  const data = syntheticDataset({ length: 480, inputSize: 16, numClasses: 4, seed: 2 });

  /** `option`: the option's name, or its deprecated one (balanceBatches), which must do the same. */
  function member(
    net: MemoryNetwork,
    id: number,
    session: string,
    world: number,
    batchSize: number,
    cost: { overheadMs?: number; msPerSample: number },
    events: ElasticEvent[],
    samples: number[][],
    option: 'balance' | 'balanceBatches' = 'balance',
  ): Promise<ElasticRunResult> {
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
      ...(option === 'balance' ? { balance: true } : { balanceBatches: true }),
      onEvent: (e) => events.push(e),
      async step(ctx) {
        samples[ctx.pg.rank] ??= [];
        samples[ctx.pg.rank]!.push(ctx.indices.length);
        const { x, y } = data.batch(ctx.indices);
        const xs = tf.tensor(x, [ctx.indices.length, 16]);
        const ys = tf.tensor1d(y, 'int32');
        // A device that takes `overheadMs` a step (with samples) plus `msPerSample` per sample: a wait (not this process's one thread, which
        // both ranks share) in the straggler's slot, which DDP counts as this rank's own time.
        const ms = ctx.indices.length > 0 ? (cost.overheadMs ?? 0) + ctx.indices.length * cost.msPerSample : 0;
        const device = {
          after: async () => {
            await sleep(ms);
            return ms;
          },
        };
        const { loss } = await ctx.ddp.backward(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, 4), { straggler: device });
        tf.dispose([xs, ys]);
        await ctx.ddp.step(ctx.optimizer);
        // No samples: no loss (not 0), as the training page reports it.
        return { loss: ctx.indices.length > 0 ? loss : null };
      },
    });
  }

  it("a 4x slower rank gets about a quarter of the fast rank's samples; exactly once; equal to one rank at the global batch", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('balance');
    const events: ElasticEvent[] = [];
    const samples: number[][] = [];
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => {});
    // Rank 1 says it with the old name: the same balanced run, and one warning for the page.
    const runs = await Promise.all([
      member(net, 0, session, 2, 16, { msPerSample: 2 }, events, samples),
      member(net, 1, session, 2, 16, { msPerSample: 8 }, events, samples, 'balanceBatches'),
    ]);
    expect(warn.mock.calls.filter(([m]) => String(m).includes('balanceBatches is deprecated, use balance'))).toHaveLength(1);
    warn.mockRestore();
    expect(runs.map((r) => r.steps)).toEqual([15, 15]);
    expect(runs[0]!.weightHash).toBe(runs[1]!.weightHash);
    expect(samplesSeen(events)).toEqual([{ samples: 480, exactlyOnce: true, complete: true }]);
    // The first step is split equally (no speeds yet); then the slow rank gets about a fifth of the 32 (6.4).
    expect(samples[0]![0]).toBe(16);
    expect(samples[1]![0]).toBe(16);
    // A loaded machine's timers stretch the measured costs: a band around 6.4, and its mean closer.
    const last = samples[1]!.slice(-5);
    for (const s of last) expect(s).toBeGreaterThanOrEqual(3);
    for (const s of last) expect(s).toBeLessThanOrEqual(11);
    const mean = last.reduce((a, b) => a + b, 0) / last.length;
    expect(mean).toBeGreaterThanOrEqual(4);
    expect(mean).toBeLessThanOrEqual(9);

    const soloEvents: ElasticEvent[] = [];
    const [solo] = await Promise.all([
      member(new MemoryNetwork(), 0, uniqueSession('balance-solo'), 1, 32, { msPerSample: 0 }, soloEvents, []),
    ]);
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

  it("a rank whose fixed cost makes it slower than the others' whole batches trains no samples, and its replica stays identical", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('balance-overhead');
    const events: ElasticEvent[] = [];
    const samples: number[][] = [];
    // A small model's step: mostly fixed cost. Rank 1 is 4x slower in both.
    const runs = await Promise.all([
      member(net, 0, session, 2, 16, { overheadMs: 20, msPerSample: 0.5 }, events, samples),
      member(net, 1, session, 2, 16, { overheadMs: 80, msPerSample: 2 }, events, samples),
    ]);
    expect(runs[0]!.weightHash).toBe(runs[1]!.weightHash);
    expect(samplesSeen(events)).toEqual([{ samples: 480, exactlyOnce: true, complete: true }]);
    // Once both ranks were measured at two sizes, the slow one gets nothing: the fast one alone is faster.
    expect(samples[1]!.slice(-5)).toEqual([0, 0, 0, 0, 0]);
    expect(samples[0]!.slice(-6, -1)).toEqual([32, 32, 32, 32, 32]);
    // Its steps without samples: no loss (null through the vote, not 0), and every step event says why: the split, each rank's measured cost, the next probe.
    const steps = events.filter((e): e is Extract<ElasticEvent, { type: 'step' }> => e.type === 'step' && e.rank === 0);
    const idle = steps.filter((e) => e.balance?.counts[1] === 0);
    expect(idle.length).toBeGreaterThanOrEqual(5);
    for (const e of idle) {
      expect(e.metrics[1]!.loss).toBeNull();
      expect(e.metrics[0]!.loss).toEqual(expect.any(Number));
      expect(e.balance!.perSampleMs[1]!).toBeGreaterThan(e.balance!.perSampleMs[0]!);
      expect(e.balance!.overheadMs[1]!).toBeGreaterThan(e.balance!.overheadMs[0]!);
      expect(e.balance!.probeAt).toBe(64);
    }
    for (const e of steps) if (e.balance) expect(e.balance.counts).toEqual([samples[0]![e.step - 1], samples[1]![e.step - 1]]);
    await Promise.all(runs.map((r) => r.close()));
  });
});

describe('keepSplit', () => {
  it('keeps the last split while it predicts a step within 20% of the new one, so batch shapes (and compiled kernels) stay the same on noise', () => {
    const models: RankCost[] = [1, 1, 1, 4].map((perSample) => ({ overhead: 0, perSample }));
    // The ideal split is [20, 20, 20, 4] (20 ms); [23, 20, 17, 4] predicts 23 ms, under 20% longer; [25, 20, 15, 4] 25 ms.
    expect(keepSplit([23, 20, 17, 4], [20, 20, 20, 4], models)).toBe(true);
    expect(keepSplit([25, 20, 15, 4], [20, 20, 20, 4], models)).toBe(false);
    expect(keepSplit([19, 19, 18, 8], [20, 20, 20, 4], models)).toBe(false);
    expect(keepSplit([16, 16, 16, 16], [20, 20, 20, 4], models)).toBe(false);
    // Another total (an epoch's last step) or another group: split afresh.
    expect(keepSplit([20, 20, 20, 4], [20, 20, 20, 3], models)).toBe(false);
    expect(keepSplit([16, 16], [11, 11, 10], models.slice(0, 3))).toBe(false);
  });
});
