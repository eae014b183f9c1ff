/**
 * Pipeline parallelism in Node (TF.js cpu backend, in-memory links, the real server): a pipeline
 * of stages trains to the weights of one rank at the same batch, 1F1B to GPipe's, DDP x pipeline
 * to one rank at the global batch; each rank holds only its stage; a lost rank stops every rank
 * naming its stage, and the run resumes from every stage's checkpoint part. The same on real
 * pages with WebGPU and WebRTC is test/e2e/pipeline.spec.ts.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { samplesSeen } from '../launcher/samples_seen.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { DistributedDataParallel } from '../src/parallel/ddp/ddp.ts';
import { DistTimeoutError } from '../src/wire/errors.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import { classificationLoss, sequentialOf, type LayerFactory } from '../src/nn/models.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { flatTrainableWeights } from '../src/parallel/replicas.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { pipelineMesh, runPipeline, type PipelineRunResult } from '../src/parallel/pipeline/runner.ts';
import type { ScheduleKind } from '../src/parallel/pipeline/schedule.ts';
import { PipelineStage } from '../src/parallel/pipeline/stage.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { relativeError } from './fixtures/tensors.ts';
import { waitFor } from './fixtures/wait.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer({ settleMs: 300, checkpointDir: await mkdtemp(join(tmpdir(), 'ddp-pipeline-')) });
});
afterAll(async () => {
  await server.close();
});

const data = syntheticDataset({ length: 640, inputSize: 16, numClasses: 4, seed: 1 });
/** A deeper MLP than the job's, so that 2 and 3 stages both split it: 16 -> 24 -> 20 -> 4, seeded per layer. */
const layers = (): LayerFactory[] =>
  [24, 20, 4].map(
    (units, i) => (inputShape?: number[]) =>
      tf.layers.dense({
        units,
        activation: i < 2 ? 'relu' : 'linear',
        kernelInitializer: tf.initializers.glorotUniform({ seed: 70 + i }),
        ...(inputShape ? { inputShape } : {}),
      }),
  );
const lossOf = (out: tf.Tensor, y: tf.Tensor) => classificationLoss(out, y, 4);

async function groups(n: number): Promise<ProcessGroup[]> {
  const session = uniqueSession('pp');
  const net = new MemoryNetwork();
  return Promise.all(
    Array.from({ length: n }, (_, rank) =>
      initProcessGroup({
        url: server.url,
        session,
        token: tokenFor(session),
        worldSize: n,
        rank,
        timeoutMs: 10_000,
        linkFactory: net.factoryFor(rank),
      }),
    ),
  );
}

/** The global batch of step k: samples 32k .. 32k+31. */
const globalBatch = (k: number) => Array.from({ length: 32 }, (_, j) => (32 * k + j) % data.length);

/** One rank, the whole model, batch 32, plain SGD: the reference. */
/** The first step's loss and correct predictions on one rank (the reference for the last stage's figures). */
let firstStep = { loss: NaN, correct: NaN };

async function singleRank(steps: number): Promise<Float32Array> {
  const [pg] = await groups(1);
  const model = sequentialOf(layers(), [16], 'whole');
  const ddp = await DistributedDataParallel.create(model, pg!);
  const opt = tf.train.sgd(0.1);
  for (let k = 0; k < steps; k++) {
    const { x, y } = data.batch(globalBatch(k));
    const xs = tf.tensor(x, [32, 16]);
    const ys = tf.tensor1d(y, 'int32');
    let correct: tf.Tensor | undefined;
    const { loss } = await ddp.backward(() => {
      const out = model.apply(xs) as tf.Tensor;
      correct = tf.keep(out.argMax(-1).equal(ys).sum());
      return lossOf(out, ys);
    });
    if (k === 0) firstStep = { loss, correct: (await correct!.data())[0]! };
    tf.dispose([xs, ys, correct!]);
    ddp.step(opt);
  }
  const w = await flatTrainableWeights(model);
  model.dispose();
  opt.dispose();
  pg!.destroy();
  return w;
}

/**
 * S stages x D replicas, each replica training on its share of the global batch (replica d takes
 * every D-th sample), M micro-batches. Returns the whole model's weights (replica 0's stages in
 * order), every stage's weights per replica, and each stage's parameter count.
 */
async function pipelineRun(
  stages: number,
  replicas: number,
  m: number,
  steps: number,
  schedule: ScheduleKind = 'gpipe',
  activationDtype: 'float32' | 'float16' = 'float32',
) {
  const pgs = await groups(stages * replicas);
  const out = await Promise.all(
    pgs.map(async (world) => {
      const mesh = await pipelineMesh(world, stages, replicas);
      const stage = new PipelineStage({ layers: layers(), inputShape: [16], group: mesh.pipe });
      const ddp = await DistributedDataParallel.create(stage.model, mesh.dp);
      const opt = tf.train.sgd(0.1);
      let first = { loss: NaN, correct: NaN };
      for (let k = 0; k < steps; k++) {
        const indices = globalBatch(k).filter((_, j) => j % replicas === mesh.replica);
        const { x, y } = data.batch(indices);
        const r = await stage.step({
          ddp,
          batchSize: indices.length,
          microBatches: m,
          schedule,
          activationDtype,
          ...(stage.isFirst ? { inputs: x } : {}),
          ...(stage.isLast
            ? {
                labels: Int32Array.from(y),
                loss: lossOf,
                metric: (out: tf.Tensor, labels: tf.Tensor) => out.argMax(-1).equal(labels).sum(),
              }
            : {}),
        });
        if (k === 0 && stage.isLast) first = { loss: r.loss, correct: r.metric };
        ddp.step(opt);
      }
      const weights = await flatTrainableWeights(stage.model);
      const result = {
        rank: world.rank,
        stage: mesh.stage,
        replica: mesh.replica,
        weights,
        parameters: stage.parameterCount,
        layers: stage.layers.map((l) => l.index),
        first,
      };
      stage.model.dispose();
      opt.dispose();
      return result;
    }),
  );
  await Promise.all(pgs.map((pg) => pg.barrier()));
  for (const pg of pgs) pg.destroy();
  const replica0 = out.filter((r) => r.replica === 0).sort((a, b) => a.stage - b.stage);
  const whole = new Float32Array(replica0.reduce((n, r) => n + r.weights.length, 0));
  let at = 0;
  for (const r of replica0) {
    whole.set(r.weights, at);
    at += r.weights.length;
  }
  return { whole, ranks: out };
}

describe('pipeline parallel', () => {
  it("2 stages x 4 micro-batches at batch 32 train to one rank's weights after 20 SGD steps; each rank holds only its stage", async () => {
    const reference = await singleRank(20);
    const before = tf.memory().numTensors;
    const { whole, ranks } = await pipelineRun(2, 1, 4, 20);
    // Nothing leaks: with the stages' models and optimizers disposed, the live tensors are as before.
    expect(tf.memory().numTensors).toBe(before);
    expect(relativeError(whole, reference)).toBeLessThanOrEqual(1e-5);
    // The last stage's figures are the whole batch's: its mean loss and its correct predictions.
    const last = ranks.find((r) => r.stage === 1)!.first;
    expect(last.loss).toBeCloseTo(firstStep.loss, 5);
    expect(last.correct).toBe(firstStep.correct);
    // 16*24+24 = 408 on stage 0; 24*20+20 + 20*4+4 = 584 on stage 1: the whole model split, nothing doubled.
    expect(ranks.map((r) => [r.stage, r.layers, r.parameters]).sort()).toEqual([
      [0, [0], 408],
      [1, [1, 2], 584],
    ]);
  });

  it("uneven micro-batches (batch 32 in 5: 7, 7, 6, 6, 6) weigh each by its samples: still one rank's weights", async () => {
    const reference = await singleRank(10);
    const { whole } = await pipelineRun(2, 1, 5, 10);
    expect(relativeError(whole, reference)).toBeLessThanOrEqual(1e-5);
  });

  it('1F1B trains to bit-identical weights as GPipe (3 stages, 4 micro-batches)', async () => {
    const threeLayers = (await pipelineRun(3, 1, 4, 5, 'gpipe')).whole;
    const oneFOneB = (await pipelineRun(3, 1, 4, 5, '1f1b')).whole;
    expect(Array.from(oneFOneB)).toEqual(Array.from(threeLayers));
  });

  it('float16 activations on the wire train close to float32 (rounded, so not exact)', async () => {
    const full = (await pipelineRun(2, 1, 4, 10)).whole;
    const half = (await pipelineRun(2, 1, 4, 10, 'gpipe', 'float16')).whole;
    const err = relativeError(half, full);
    expect(err).toBeGreaterThan(0); // rounded: no longer exact
    expect(err).toBeLessThan(1e-2);
  });

  // In memory the receiver keeps up; on real pages an evaluation's first stage ran 65 messages
  // ahead before forward() ended each call together (test/e2e/pipeline.spec.ts caught it).
  it("inference through the pipeline: many calls in a row (an evaluation) give the whole model's outputs", async () => {
    const pgs = await groups(2);
    const whole = sequentialOf(layers(), [16], 'whole');
    const outs = await Promise.all(
      pgs.map(async (world) => {
        const mesh = await pipelineMesh(world, 2, 1);
        const stage = new PipelineStage({ layers: layers(), inputShape: [16], group: mesh.pipe });
        let last: Float32Array | null = null;
        // 40 calls x 4 micro-batches: 160 messages, more than the 64 a receiver keeps waiting.
        for (let k = 0; k < 40; k++) {
          const { x } = data.batch(globalBatch(k % 20));
          const out = await stage.forward({ batchSize: 32, microBatches: 4, ...(stage.isFirst ? { inputs: x } : {}) });
          if (out) {
            last = (await out.data()) as Float32Array;
            out.dispose();
          }
        }
        stage.model.dispose();
        return last;
      }),
    );
    const { x } = data.batch(globalBatch(39 % 20));
    const expected = tf.tidy(() => whole.predict(tf.tensor(x, [32, 16])) as tf.Tensor);
    expect(relativeError(outs[1]!, (await expected.data()) as Float32Array)).toBeLessThan(1e-6);
    expect(outs[0]).toBeNull();
    tf.dispose([expected]);
    whole.dispose();
    await Promise.all(pgs.map((pg) => pg.barrier()));
    for (const pg of pgs) pg.destroy();
  });

  it('refuses more micro-batches than a receiver keeps waiting, saying why', async () => {
    const [pg] = await groups(1);
    const mesh = await pipelineMesh(pg!, 1, 1);
    const stage = new PipelineStage({ layers: layers(), inputShape: [16], group: mesh.pipe });
    const ddp = await DistributedDataParallel.create(stage.model, mesh.dp);
    const { x, y } = data.batch(Array.from({ length: 100 }, (_, i) => i));
    await expect(
      stage.step({ ddp, batchSize: 100, microBatches: 65, inputs: x, labels: Int32Array.from(y), loss: lossOf }),
    ).rejects.toThrow(errorOf(RangeError, /at most 64 micro-batches per call, got 65/));
    stage.model.dispose();
    pg!.destroy();
  });

  it('2 stages x 2 replicas at batch 16 equal one rank at batch 32; the replicas of each stage stay identical', async () => {
    const reference = await singleRank(10);
    const { whole, ranks } = await pipelineRun(2, 2, 2, 10);
    expect(relativeError(whole, reference)).toBeLessThanOrEqual(1e-5);
    for (const s of [0, 1]) {
      const [a, b] = ranks.filter((r) => r.stage === s);
      expect(Array.from(a!.weights)).toEqual(Array.from(b!.weights));
    }
  });
});

describe('runPipeline', () => {
  interface Member {
    events: ElasticEvent[];
    result: Promise<PipelineRunResult>;
  }

  class TabClosed extends Error {}

  function member(net: MemoryNetwork, id: number, session: string, o: { rank: number; leaveAt?: number; failAt?: number }): Member {
    let failed = false;
    const events: ElasticEvent[] = [];
    const result = runPipeline({
      url: server.url,
      session,
      token: tokenFor(session),
      timeoutMs: 20_000,
      heartbeatIntervalMs: 200,
      linkFactory: net.factoryFor(id),
      rank: o.rank,
      stages: 2,
      replicas: 2,
      layers: layers(),
      inputShape: [16],
      optimizer: () => tf.train.sgd(0.1),
      datasetLength: 256,
      batchSize: 8,
      seed: 3,
      checkpointEvery: 4,
      failedRoundGraceMs: 300,
      onEvent: (e) => events.push(e),
      async step({ indices, stage, ddp, optimizer, step }) {
        if (step === o.leaveAt) throw new TabClosed(`member ${id} closed at step ${step}`);
        if (step === o.failAt && !failed) {
          failed = true;
          throw new DistTimeoutError(`an injected link failure of member ${id} at step ${step}`, 1);
        }
        const { x, y } = data.batch(indices);
        const r = await stage.step({
          ddp,
          batchSize: indices.length,
          microBatches: 2,
          ...(stage.isFirst ? { inputs: x } : {}),
          ...(stage.isLast ? { labels: Int32Array.from(y), loss: lossOf } : {}),
        });
        ddp.step(optimizer);
        return { loss: r.loss };
      },
    });
    result.catch(() => {});
    return { events, result };
  }

  it("refuses a schedule no run can use before it joins anything, naming the option (the agent's one check)", async () => {
    const base = {
      url: server.url,
      session: uniqueSession('pp-bad'),
      token: 'unused',
      stages: 2,
      layers: layers(),
      inputShape: [16],
      optimizer: () => tf.train.sgd(0.1),
      datasetLength: 256,
      batchSize: 8,
      step: async () => {},
    };
    await expect(runPipeline({ ...base, steps: 0 })).rejects.toThrow(errorOf(RangeError, /steps must be a positive integer, got 0/));
    await expect(runPipeline({ ...base, epochs: 1.5 })).rejects.toThrow(errorOf(RangeError, /epochs must be a positive integer, got 1.5/));
    await expect(runPipeline({ ...base, datasetLength: -1 })).rejects.toThrow(
      errorOf(RangeError, /datasetLength must be a non-negative integer, got -1/),
    );
    await expect(runPipeline({ ...base, stopVote: 'most' as 'any' })).rejects.toThrow(
      errorOf(RangeError, /stopVote must be 'any' or 'all', got most/),
    );
  });

  it('a round that fails with every member still here (a broken link) forms a new round of the same members, which resumes from the checkpoints and finishes', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('ppfail');
    const members = [0, 1, 2, 3].map((id) => member(net, id, session, { rank: id, ...(id === 2 ? { failAt: 6 } : {}) }));
    const runs = await Promise.all(members.map((m) => m.result));
    expect(members[2]!.events.find((e) => e.type === 'failure')).toMatchObject({
      recoverable: true,
      error: expect.stringMatching(/injected link failure/),
    });
    for (const r of runs) {
      expect(r.steps).toBe(256 / 16);
      expect(r.generations).toBe(2);
      expect(r.resumes).toEqual(['every stage resumed from its checkpoint at step 4']);
    }
    expect(samplesSeen(members.flatMap((m) => m.events))).toEqual([{ samples: 256, exactlyOnce: true, complete: true }]);
    await Promise.all(runs.map((r) => r.close()));
  }, 60_000);

  it("a lost rank stops every rank naming its stage; with a new tab the run resumes from every stage's checkpoint", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('pplost');
    // Member 1 holds stage 1 of replica 0 (rank 1) and closes at step 6: steps 5 and 6 are trained again from step 4's checkpoint.
    const members = [0, 1, 2, 3].map((id) => member(net, id, session, { rank: id, ...(id === 1 ? { leaveAt: 6 } : {}) }));
    await expect(members[1]!.result).rejects.toBeInstanceOf(TabClosed);
    const others = [0, 2, 3].map((i) => members[i]!);
    // Every other rank heard why: the rank, its stage and replica.
    await waitFor(
      "every other member to report rank 1's loss",
      () => others.every((m) => m.events.some((e) => e.type === 'failure' && /rank 1, stage 1 of 2 in replica 0, was lost/.test(e.error))),
      { timeoutMs: 20_000, intervalMs: 50 },
    );
    const joiner = member(net, 4, session, { rank: 1 });
    const runs = await Promise.all([...others, joiner].map((m) => m.result));
    for (const r of runs) {
      expect(r.steps).toBe(256 / 16);
      expect(r.resumes).toEqual(['every stage resumed from its checkpoint at step 4']);
      expect(r.stepsRedone).toBe(1);
    }
    // Replicas of each stage identical at the end.
    const hashes = await Promise.all(runs.map(async (r) => [r.mesh.stage, await r.ddp.weightsHash()] as const));
    for (const s of [0, 1]) expect(new Set(hashes.filter(([st]) => st === s).map(([, h]) => h)).size).toBe(1);
    // Every sample of the epoch once (the lineage from the checkpoint).
    expect(samplesSeen([...members, joiner].flatMap((m) => m.events))).toEqual([{ samples: 256, exactlyOnce: true, complete: true }]);
    await Promise.all(runs.map((r) => r.close()));
  }, 60_000);
});
