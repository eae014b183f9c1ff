/**
 * DiLoCo's outer step with robust aggregation (DiLoCoOptions.aggregation), and an outer step whose
 * result is not finite refused before anything changes (it used to update the outer weights and
 * momentum first, leaving NaN or infinite state behind the refusal). Node, TF.js cpu backend,
 * in-memory links, the real server for the store.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { DiLoCo, type DiLoCoOptions } from '../src/parallel/diloco/diloco.ts';
import { assignFlatWeights, flatTrainableWeights } from '../src/parallel/replicas.ts';
import { NonFiniteWeightsError } from '../src/wire/errors.ts';
import { allFinite } from '../src/wire/finite.ts';
import { hashFloat32 } from '../src/wire/hash.ts';
import { runElastic } from '../src/parallel/ddp/runner.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
import { SGD } from '../src/nn/optim.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer({ settleMs: 300 });
});
afterAll(async () => {
  await server.close();
});

async function groups(n: number): Promise<ProcessGroup[]> {
  const session = uniqueSession('robust-diloco');
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

/** A dense 5 -> 4 layer: 24 trainable values. */
function smallModel(): tf.LayersModel {
  const m = tf.sequential();
  m.add(tf.layers.dense({ inputShape: [5], units: 4 }));
  return m;
}

const hex = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

/** Rank r's inner progress in outer phase p: the same small step for every rank, plus its own noise. */
function innerDelta(r: number, p: number): Float32Array {
  return Float32Array.from({ length: 24 }, (_, i) => 0.05 * Math.cos(i + p) + 0.01 * Math.sin(7 * r + 3 * i + p));
}

/** 4 ranks take `phases` outer steps with `options` (each rank's inner steps: outer weights less innerDelta): each rank's outer weights after. */
async function outerSteps(
  options: Omit<DiLoCoOptions, 'syncEvery'>,
  phases: number,
): Promise<{ outer: Float32Array[]; dilocos: DiLoCo[] }> {
  const pgs = await groups(4);
  try {
    const models = pgs.map(() => smallModel());
    const start = Float32Array.from({ length: 24 }, (_, i) => Math.sin(i) / 4);
    models.forEach((m) => {
      assignFlatWeights(m, start);
    });
    const dilocos = pgs.map(() => new DiLoCo({ syncEvery: 1, ...options }));
    await Promise.all(pgs.map((pg, r) => dilocos[r]!.rejoin(pg, models[r]!, null, 0)));
    for (let p = 1; p <= phases; p++) {
      const outer = dilocos[0]!.stateDict().tensors.outer_weights!;
      models.forEach((m, r) => {
        const d = innerDelta(r, p);
        assignFlatWeights(
          m,
          outer.map((v, i) => v - d[i]!),
        );
      });
      await Promise.all(pgs.map((pg, r) => dilocos[r]!.sync(pg, models[r]!, p)));
    }
    return { outer: dilocos.map((d) => d.stateDict().tensors.outer_weights!), dilocos };
  } finally {
    await Promise.all(pgs.map((pg) => pg.destroy()));
  }
}

function distance(a: Float32Array, b: Float32Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += (a[i]! - b[i]!) ** 2;
  return Math.sqrt(s);
}

describe("DiLoCo's outer step", () => {
  it('refuses a step whose result is not finite before changing anything: outer weights, momentum and counts stay as they were, and the next good step is the one a DiLoCo without the bad one takes', async () => {
    const pgs = await groups(2);
    try {
      const models = pgs.map(() => smallModel());
      const zeros = new Float32Array(24);
      models.forEach((m) => {
        assignFlatWeights(m, zeros);
      });
      const dilocos = pgs.map(() => new DiLoCo({ syncEvery: 1 }));
      const control = pgs.map(() => new DiLoCo({ syncEvery: 1 }));
      await Promise.all(pgs.map((pg, r) => dilocos[r]!.rejoin(pg, models[r]!, null, 0)));
      await Promise.all(pgs.map((pg, r) => control[r]!.rejoin(pg, models[r]!, null, 0)));
      const before = dilocos[0]!.stateDict();
      // Each rank's pseudo-gradient is 3e38 at index 0: finite, but their float32 average overflows.
      const huge = zeros.slice();
      huge[0] = -3e38;
      models.forEach((m) => {
        assignFlatWeights(m, huge);
      });
      const refused = await Promise.allSettled(pgs.map((pg, r) => dilocos[r]!.sync(pg, models[r]!, 1)));
      for (const r of refused) expect(r.status === 'rejected' && r.reason instanceof NonFiniteWeightsError).toBe(true);
      for (const d of dilocos) {
        const after = d.stateDict();
        expect(allFinite(after.tensors.outer_weights!)).toBe(true);
        expect(hex(after.tensors.outer_weights!)).toBe(hex(before.tensors.outer_weights!));
        expect(after.tensors.momentum_buffer).toBeUndefined();
        expect(after.meta).toEqual(before.meta);
        expect(d.outerSteps).toBe(0);
      }
      // The model kept what it had.
      expect(hex(await flatTrainableWeights(models[0]!))).toBe(hex(huge));
      // A good step next: the very state of a DiLoCo that never saw the bad one.
      const good = Float32Array.from({ length: 24 }, (_, i) => -0.01 * i);
      models.forEach((m) => {
        assignFlatWeights(m, good);
      });
      await Promise.all(pgs.map((pg, r) => dilocos[r]!.sync(pg, models[r]!, 2)));
      const controlModels = pgs.map(() => smallModel());
      controlModels.forEach((m) => {
        assignFlatWeights(m, good);
      });
      await Promise.all(pgs.map((pg, r) => control[r]!.sync(pg, controlModels[r]!, 2)));
      const ours = dilocos[0]!.stateDict();
      const theirs = control[0]!.stateDict();
      expect(hex(ours.tensors.outer_weights!)).toBe(hex(theirs.tensors.outer_weights!));
      expect(hex(ours.tensors.momentum_buffer!)).toBe(hex(theirs.tensors.momentum_buffer!));
    } finally {
      await Promise.all(pgs.map((pg) => pg.destroy()));
    }
  });

  it('with a trimmed mean or centered clipping, one rank scaling its pseudo-gradient x1000 barely moves the outer weights (the mean is thrown far), the same bits on every rank', async () => {
    const clean = (await outerSteps({}, 4)).outer[0]!;
    const start = Float32Array.from({ length: 24 }, (_, i) => Math.sin(i) / 4);
    const progress = distance(clean, start);
    const attack = { kind: 'scale', attackers: 1 } as const;
    const mean = (await outerSteps({ attack }, 4)).outer[0]!;
    expect(distance(mean, clean) / progress).toBeGreaterThan(10);
    for (const aggregation of [{ kind: 'trimmed-mean', trim: 1 }, { kind: 'centered-clip', tau: 'auto' }, { kind: 'median' }] as const) {
      const { outer, dilocos } = await outerSteps({ aggregation, attack }, 4);
      expect(new Set(outer.map(hashFloat32)).size, aggregation.kind).toBe(1);
      expect(distance(outer[0]!, clean) / progress, aggregation.kind).toBeLessThan(0.2);
      const judged = dilocos[0]!.lastAggregation!;
      expect(judged.kind).toBe(aggregation.kind);
      expect(judged.judgments[3]!.distance!).toBeGreaterThan(100 * judged.judgments[0]!.distance!);
    }
  });

  it('runElastic with diloco.aggregation: the outer steps aggregate robustly and the run ends with identical replicas', async () => {
    const session = uniqueSession('robust-diloco-elastic');
    const net = new MemoryNetwork();
    const data = syntheticDataset({ length: 96, inputSize: 16, numClasses: 4, seed: 2 });
    const results = await Promise.all(
      Array.from({ length: 3 }, (_, rank) =>
        runElastic({
          url: server.url,
          session,
          token: tokenFor(session),
          min: 3,
          max: 3,
          rank,
          timeoutMs: 10_000,
          linkFactory: net.factoryFor(rank),
          state: new TrainState({
            model: buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 3 }),
            optimizer: () => new SGD({ lr: 0.1 }),
          }),
          datasetLength: 96,
          batchSize: 8,
          steps: 4,
          seed: 1,
          diloco: { syncEvery: 2, aggregation: { kind: 'median' }, attack: { kind: 'flip', attackers: 1 } },
          async step({ indices, ddp, optimizer }) {
            const { x, y } = data.batch(indices);
            const xs = tf.tensor(x, [indices.length, 16]);
            const ys = tf.tensor1d(y, 'int32');
            const { loss } = await ddp.backward(() => classificationLoss(ddp.model.apply(xs) as tf.Tensor, ys, 4));
            tf.dispose([xs, ys]);
            await ddp.step(optimizer);
            return { loss };
          },
        }),
      ),
    );
    expect(new Set(results.map((r) => r.weightHash)).size).toBe(1);
    const hook = results[0]!.ddp.commHook as DiLoCo;
    expect(hook.outerSteps).toBe(2);
    expect(hook.lastAggregation!.judgments.map((j) => j.status)).toEqual(['used', 'used', 'used']);
    await Promise.all(results.map((r) => r.close()));
  });
});
