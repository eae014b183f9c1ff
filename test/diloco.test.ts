/**
 * DiLoCo in Node (TF.js cpu backend, in-memory links, the real server): the outer step against
 * torch's (bench/torch_diloco_reference.py wrote test/fixtures/torch_diloco.json), bit-identical
 * on every rank; its state through a state dict; the round-start outer step over the ranks that
 * trained; and runElastic with `diloco`: replicas identical after each outer step, a lost rank's
 * inner steps the only ones lost, a joiner starting from the outer weights, the outer state
 * saved in a checkpoint and resumed.
 */
import { readFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { DiLoCo, fragmentRanges, fragmentsSyncingAt } from '../src/parallel/diloco/diloco.ts';
import { assignFlatWeights, flatTrainableWeights } from '../src/parallel/replicas.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { runElastic, type ElasticRunResult, type StepContext } from '../src/parallel/ddp/runner.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
import { AdamW, SGD } from '../src/nn/optim.ts';
import { DistributedDataParallel } from '../src/parallel/ddp/ddp.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { relativeError } from './fixtures/tensors.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { samplesSeen } from '../launcher/samples_seen.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer({ settleMs: 300, checkpointDir: await mkdtemp(join(tmpdir(), 'ddp-diloco-')) });
});
afterAll(async () => {
  await server.close();
});

interface TorchDiLoCo {
  lr: number;
  momentum: number;
  start: number[];
  phases: Array<{ local: number[][]; outer: number[] }>;
  /** Phases whose pseudo-gradients torch weighs by each rank's samples. */
  weighted: Array<{ samples: number[]; local: number[][]; outer: number[] }>;
}
const torchRef = JSON.parse(readFileSync(new URL('./fixtures/torch_diloco.json', import.meta.url), 'utf8')) as TorchDiLoCo;

async function groups(n: number): Promise<ProcessGroup[]> {
  const session = uniqueSession('diloco');
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

/** A model of 24 trainable values (a dense 5 -> 4 layer), as in the torch reference. */
function smallModel(): tf.LayersModel {
  const m = tf.sequential();
  m.add(tf.layers.dense({ inputShape: [5], units: 4 }));
  return m;
}

const hex = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

describe('DiLoCo', () => {
  it("takes torch's outer step (SGD, Nesterov, on the averaged pseudo-gradient), bit-identical on every rank, every H steps", async () => {
    const pgs = await groups(3);
    try {
      const models = pgs.map(() => smallModel());
      const dilocos = pgs.map(() => new DiLoCo({ syncEvery: 4, outerLr: torchRef.lr, outerMomentum: torchRef.momentum }));
      const start = Float32Array.from(torchRef.start);
      models.forEach((m) => {
        assignFlatWeights(m, start);
      });
      await Promise.all(pgs.map((pg, r) => dilocos[r]!.rejoin(pg, models[r]!, null, 0)));
      const sentBefore = pgs.map((pg) => pg.bytesSent());
      for (const [p, phase] of torchRef.phases.entries()) {
        models.forEach((m, r) => {
          assignFlatWeights(m, Float32Array.from(phase.local[r]!));
        });
        // Not an outer step: the models stay each rank's own.
        expect(await Promise.all(pgs.map((pg, r) => dilocos[r]!.sync(pg, models[r]!, 4 * p + 3)))).toEqual([false, false, false]);
        expect(await Promise.all(pgs.map((pg, r) => dilocos[r]!.sync(pg, models[r]!, 4 * p + 4)))).toEqual([true, true, true]);
        const after = await Promise.all(models.map((m) => flatTrainableWeights(m)));
        expect(new Set(after.map(hex)).size).toBe(1);
        expect(relativeError(after[0]!, Float32Array.from(phase.outer))).toBeLessThan(1e-6);
      }
      expect(dilocos.map((d) => [d.outerSteps, d.syncedAtStep])).toEqual([
        [4, 16],
        [4, 16],
        [4, 16],
      ]);
      // A pseudo-gradient all-reduce of 24 float32 values per outer step, and nothing else.
      for (const pg of pgs) expect(pg.bytesSent() - sentBefore[pg.rank]!).toBeGreaterThanOrEqual(4 * 24 * 4);
      for (const pg of pgs) expect(pg.bytesSent() - sentBefore[pg.rank]!).toBeLessThan(4 * 24 * 4 * 3);
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it("with int8 pseudo-gradients: bit-identical on every rank, and close to torch's float32 outer steps", async () => {
    const pgs = await groups(3);
    try {
      const models = pgs.map(() => smallModel());
      const dilocos = pgs.map(() => new DiLoCo({ syncEvery: 4, outerLr: torchRef.lr, outerMomentum: torchRef.momentum, wire: 'int8' }));
      models.forEach((m) => {
        assignFlatWeights(m, Float32Array.from(torchRef.start));
      });
      await Promise.all(pgs.map((pg, r) => dilocos[r]!.rejoin(pg, models[r]!, null, 0)));
      const errors: number[] = [];
      for (const [p, phase] of torchRef.phases.entries()) {
        models.forEach((m, r) => {
          assignFlatWeights(m, Float32Array.from(phase.local[r]!));
        });
        await Promise.all(pgs.map((pg, r) => dilocos[r]!.sync(pg, models[r]!, 4 * p + 4)));
        const after = await Promise.all(models.map((m) => flatTrainableWeights(m)));
        expect(new Set(after.map(hex)).size).toBe(1);
        errors.push(relativeError(after[0]!, Float32Array.from(phase.outer)));
      }
      console.log(
        `DiLoCo with int8 pseudo-gradients vs torch's float32: relative error per outer step ${errors.map((e) => e.toExponential(1)).join(', ')}`,
      );
      // Rounded, not wrong: each outer step within 1% of torch's (0.1% here), and not exact.
      for (const e of errors) expect(e).toBeLessThan(0.01);
      expect(errors.some((e) => e > 1e-6)).toBe(true);
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it("weighs each rank's pseudo-gradient by the samples it trained (torch's weighted mean); equal samples weigh exactly 1", async () => {
    const pgs = await groups(3);
    try {
      const models = pgs.map(() => smallModel());
      const dilocos = pgs.map(() => new DiLoCo({ syncEvery: 4, outerLr: torchRef.lr, outerMomentum: torchRef.momentum }));
      models.forEach((m) => {
        assignFlatWeights(m, Float32Array.from(torchRef.start));
      });
      await Promise.all(pgs.map((pg, r) => dilocos[r]!.rejoin(pg, models[r]!, null, 0)));
      for (const [p, phase] of torchRef.weighted.entries()) {
        const all = phase.samples.reduce((a, b) => a + b, 0);
        models.forEach((m, r) => {
          assignFlatWeights(m, Float32Array.from(phase.local[r]!));
        });
        // The phase's inner steps trained these samples (a rank given none counts for nothing).
        dilocos.forEach((d, r) => {
          d.countStep(phase.samples[r]!, all);
        });
        await Promise.all(pgs.map((pg, r) => dilocos[r]!.sync(pg, models[r]!, 4 * p + 4)));
        const after = await Promise.all(models.map((m) => flatTrainableWeights(m)));
        expect(new Set(after.map(hex)).size).toBe(1);
        expect(relativeError(after[0]!, Float32Array.from(phase.outer)), `outer step ${p + 1}`).toBeLessThan(1e-6);
      }
      // Equal shares: the same bits as a DiLoCo told nothing.
      const run = async (count: boolean) => {
        const ds = pgs.map(() => new DiLoCo({ syncEvery: 4 }));
        models.forEach((m) => {
          assignFlatWeights(m, Float32Array.from(torchRef.start));
        });
        await Promise.all(pgs.map((pg, r) => ds[r]!.rejoin(pg, models[r]!, null, 0)));
        models.forEach((m, r) => {
          assignFlatWeights(m, Float32Array.from(torchRef.phases[0]!.local[r]!));
        });
        if (count) for (const d of ds) d.countStep(5, 15);
        await Promise.all(pgs.map((pg, r) => ds[r]!.sync(pg, models[r]!, 4)));
        return hex(await flatTrainableWeights(models[0]!));
      };
      expect(await run(true)).toBe(await run(false));
      expect(() => dilocos[0]!.countStep(5, 4)).toThrow(errorOf(RangeError, /countStep: samples must be an integer in 0..globalSamples/));
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it("DDP hands DiLoCo's inner steps the rank's own mean gradient, not weighed by an uneven batch share", async () => {
    const pgs = await groups(2);
    try {
      const start = Float32Array.from(torchRef.start.slice(0, 24));
      const x = tf.tensor2d([[0.5, -1, 2, 0.25, 1]]);
      const loss = (m: tf.LayersModel) => () => tf.sum(tf.square(m.apply(x) as tf.Tensor)) as tf.Scalar;
      const models = pgs.map(() => smallModel());
      models.forEach((m) => {
        assignFlatWeights(m, start);
      });
      const ddps = await Promise.all(pgs.map((pg, r) => DistributedDataParallel.create(models[r]!, pg)));
      ddps.forEach((d) => {
        d.registerCommHook(new DiLoCo({ syncEvery: 4 }));
      });
      // Rank 0 trains 1 of the step's 4 samples, rank 1 three: a plain DDP would weigh them 0.5 and 1.5.
      ddps.forEach((d, r) => {
        d.setBatchShare(r === 0 ? 1 : 3, 4);
      });
      await Promise.all(ddps.map((d, r) => d.backward(loss(models[r]!))));
      await Promise.all(ddps.map((d) => d.step(new SGD({ lr: 1 }))));
      const ref = smallModel();
      assignFlatWeights(ref, start);
      const { grads } = tf.variableGrads(loss(ref));
      const g = await Promise.all(ref.trainableWeights.map((w) => grads[w.originalName]!.data()));
      tf.dispose(Object.values(grads));
      const expected = start.map((w, i) => w - Float32Array.from(g.flatMap((a) => [...a]))[i]!);
      for (const m of models) expect(relativeError(await flatTrainableWeights(m), expected)).toBeLessThan(1e-6);
      x.dispose();
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it('its state dict carries the outer weights and momentum: a loaded copy takes the next outer step bit for bit', async () => {
    const pgs = await groups(2);
    try {
      const models = pgs.map(() => smallModel());
      const a = pgs.map(() => new DiLoCo({ syncEvery: 1 }));
      const start = Float32Array.from(torchRef.start);
      models.forEach((m) => {
        assignFlatWeights(m, start);
      });
      await Promise.all(pgs.map((pg, r) => a[r]!.rejoin(pg, models[r]!, null, 0)));
      const phase = torchRef.phases[0]!;
      models.forEach((m, r) => {
        assignFlatWeights(m, Float32Array.from(phase.local[r]!));
      });
      await Promise.all(pgs.map((pg, r) => a[r]!.sync(pg, models[r]!, 1)));
      const state = a[0]!.stateDict();
      expect(Object.keys(state.tensors).sort()).toEqual(['momentum_buffer', 'outer_weights']);
      const b = pgs.map(() => new DiLoCo({ syncEvery: 1 }));
      for (const d of b) d.loadStateDict(state);
      const next = torchRef.phases[1]!;
      const run = async (ds: DiLoCo[]) => {
        models.forEach((m, r) => {
          assignFlatWeights(m, Float32Array.from(next.local[r]!));
        });
        await Promise.all(pgs.map((pg, r) => ds[r]!.sync(pg, models[r]!, 2)));
        return hex(await flatTrainableWeights(models[0]!));
      };
      expect(await run(b)).toBe(await run(a));
      // What a peer or a file may send is checked before it is taken.
      expect(() =>
        new DiLoCo({ syncEvery: 1 }).loadStateDict({ ...state, tensors: { ...state.tensors, momentum_buffer: new Float32Array(3) } }),
      ).toThrow(errorOf(RangeError, /momentum buffer of 3 values for 24 weights/));
      expect(() => new DiLoCo({ syncEvery: 1 }).loadStateDict({ ...state, meta: { ...state.meta, fragmentSteps: '-1' } })).toThrow(
        errorOf(RangeError, /fragmentSteps "-1" is not 1 counts/),
      );
      expect(() => new DiLoCo({ syncEvery: 4, fragments: 2 }).loadStateDict(state)).toThrow(
        errorOf(RangeError, /it is for 1 fragments, this DiLoCo has 2/),
      );
      const nan = state.tensors.outer_weights!.slice();
      nan[3] = NaN;
      expect(() => new DiLoCo({ syncEvery: 1 }).loadStateDict({ ...state, tensors: { ...state.tensors, outer_weights: nan } })).toThrow(
        errorOf(RangeError, /non-finite/),
      );
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it('at a round start, one outer step over the ranks whose inner steps count; a rank without them adds nothing', async () => {
    const pgs = await groups(3);
    try {
      const models = pgs.map(() => smallModel());
      const ds = pgs.map(() => new DiLoCo({ syncEvery: 8 }));
      const start = Float32Array.from(torchRef.start);
      models.forEach((m) => {
        assignFlatWeights(m, start);
      });
      await Promise.all(pgs.map((pg, r) => ds[r]!.rejoin(pg, models[r]!, null, 0)));
      const phase = torchRef.phases[0]!;
      // Ranks 0 and 1 trained 3 inner steps; rank 2 is a joiner (nothing held); the state transfer gave everyone rank 0's weights.
      const held = await Promise.all(
        models.map(async (m, r) => {
          assignFlatWeights(m, Float32Array.from(phase.local[r]!));
          return r < 2 ? ds[r]!.hold(m, 3) : null;
        }),
      );
      models.forEach((m) => {
        assignFlatWeights(m, Float32Array.from(phase.local[0]!));
      });
      const res = await Promise.all(pgs.map((pg, r) => ds[r]!.rejoin(pg, models[r]!, held[r]!, 3)));
      expect(res).toEqual([0, 1, 2].map(() => ({ outerStep: true, contributors: 2 })));
      // The reference: SGD's first step (momentum buffer = gradient) on the average of two pseudo-gradients.
      const g = start.map((s, i) =>
        Math.fround(Math.fround(Math.fround(s - phase.local[0]![i]!) + Math.fround(s - phase.local[1]![i]!)) / 2),
      );
      const expected = start.map((s, i) => Math.fround(s + Math.fround(-0.7) * Math.fround(g[i]! + Math.fround(0.9) * g[i]!)));
      const after = await Promise.all(models.map((m) => flatTrainableWeights(m)));
      expect(new Set(after.map(hex)).size).toBe(1);
      expect(relativeError(after[0]!, expected)).toBeLessThan(1e-6);
      expect(ds.map((d) => [d.outerSteps, d.syncedAtStep])).toEqual([
        [1, 3],
        [1, 3],
        [1, 3],
      ]);
      // A rank whose held steps are not the group's (another outer phase) counts for nothing; with nobody, nothing changes.
      const stale = { ...(await ds[0]!.hold(models[0]!, 5)), outerSteps: 0 };
      expect(stale.samples).toBeNull(); // told no samples: each rank's pseudo-gradient weighs 1
      const none = await Promise.all(pgs.map((pg, r) => ds[r]!.rejoin(pg, models[r]!, r === 0 ? stale : null, 5)));
      expect(none.every((x) => !x.outerStep)).toBe(true);
      expect(ds[0]!.outerSteps).toBe(1);
      // The group's outer step count but another committed step, or more outer steps than the
      // group: each counts for nothing either (rank 1 holds it; rank 0 nothing).
      const otherStep = { ...(await ds[1]!.hold(models[1]!, 4)), outerSteps: 1 };
      const ahead = { ...(await ds[1]!.hold(models[1]!, 5)), outerSteps: 2 };
      for (const held1 of [otherStep, ahead]) {
        const res2 = await Promise.all(pgs.map((pg, r) => ds[r]!.rejoin(pg, models[r]!, r === 1 ? held1 : null, 5)));
        expect(res2).toEqual([0, 1, 2].map(() => ({ outerStep: false, contributors: 0 })));
      }
      expect(ds.map((d) => d.outerSteps)).toEqual([1, 1, 1]);
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it("at a round start, counted ranks' pseudo-gradients are weighed by the samples each trained since the last outer step", async () => {
    const pgs = await groups(3);
    try {
      const models = pgs.map(() => smallModel());
      const ds = pgs.map(() => new DiLoCo({ syncEvery: 8, fragments: 2 }));
      const start = Float32Array.from(torchRef.start);
      models.forEach((m) => {
        assignFlatWeights(m, start);
      });
      await Promise.all(pgs.map((pg, r) => ds[r]!.rejoin(pg, models[r]!, null, 0)));
      const phase = torchRef.phases[0]!;
      // Three inner steps: rank 0 trained 3 samples of 4 each, rank 1 one; rank 2 (a joiner) holds nothing.
      const held = await Promise.all(
        models.map(async (m, r) => {
          for (let k = 0; k < 3; k++) ds[r]!.countStep(r === 0 ? 3 : r === 1 ? 1 : 0, 4);
          assignFlatWeights(m, Float32Array.from(phase.local[r]!));
          return r < 2 ? ds[r]!.hold(m, 3) : null;
        }),
      );
      expect(held[0]!.samples).toEqual([9, 9]);
      models.forEach((m) => {
        assignFlatWeights(m, Float32Array.from(phase.local[0]!));
      });
      const res = await Promise.all(pgs.map((pg, r) => ds[r]!.rejoin(pg, models[r]!, held[r]!, 3)));
      expect(res.map((x) => x.contributors)).toEqual([2, 2, 2]);
      const g = start.map((s, i) => (9 * (s - phase.local[0]![i]!) + 3 * (s - phase.local[1]![i]!)) / 12);
      const expected = start.map((s, i) => s - 0.7 * (g[i]! + 0.9 * g[i]!));
      const after = await Promise.all(models.map((m) => flatTrainableWeights(m)));
      expect(new Set(after.map(hex)).size).toBe(1);
      expect(relativeError(after[0]!, Float32Array.from(expected))).toBeLessThan(1e-6);
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it('streaming: fragments take turns, staggered over the H steps; an overlapped all-reduce lands steps later and keeps the progress made meanwhile', async () => {
    expect(fragmentRanges(10, 3)).toEqual([
      { start: 0, end: 3 },
      { start: 3, end: 6 },
      { start: 6, end: 10 },
    ]);
    expect(Array.from({ length: 8 }, (_, k) => fragmentsSyncingAt(k + 1, 8, 4))).toEqual([[], [0], [], [1], [], [2], [], [3]]);
    expect(Array.from({ length: 4 }, (_, k) => fragmentsSyncingAt(k + 1, 4, 1))).toEqual([[], [], [], [0]]);
    const pgs = await groups(2);
    try {
      const models = pgs.map(() => smallModel());
      const ds = pgs.map(() => new DiLoCo({ syncEvery: 4, fragments: 2, overlap: 1 }));
      const start = Float32Array.from(torchRef.start);
      models.forEach((m) => {
        assignFlatWeights(m, start);
      });
      await Promise.all(pgs.map((pg, r) => ds[r]!.rejoin(pg, models[r]!, null, 0)));
      const local = (r: number, step: number) => Float32Array.from(start, (v, i) => v + 0.01 * Math.sin(r * 3 + step * 0.7 + i));
      const at = async (step: number) => {
        models.forEach((m, r) => {
          assignFlatWeights(m, local(r, step));
        });
        const landed = await Promise.all(ds.map((d, r) => d.land(models[r]!, step)));
        const inSync = await Promise.all(pgs.map((pg, r) => ds[r]!.sync(pg, models[r]!, step)));
        return { landed, inSync, weights: await Promise.all(models.map((m) => flatTrainableWeights(m))) };
      };
      expect((await at(1)).landed).toEqual([0, 0]);
      // Step 2: fragment 0 (values 0-11) goes on the wire; nothing changes yet.
      const two = await at(2);
      expect(two.inSync).toEqual([false, false]);
      for (const [r, w] of two.weights.entries()) expect(hex(w)).toBe(hex(local(r, 2)));
      // Step 3: it lands. Fragment 0 = new outer + what each rank trained since step 2; fragment 1 untouched.
      const three = await at(3);
      expect(three.landed).toEqual([1, 1]);
      const g = Float32Array.from({ length: 12 }, (_, i) =>
        Math.fround(Math.fround(Math.fround(start[i]! - local(0, 2)[i]!) + Math.fround(start[i]! - local(1, 2)[i]!)) / 2),
      );
      const outer0 = Float32Array.from(g, (gi, i) => Math.fround(start[i]! + Math.fround(-0.7) * Math.fround(gi + Math.fround(0.9) * gi)));
      for (const [r, w] of three.weights.entries()) {
        const want = Float32Array.from({ length: 12 }, (_, i) => Math.fround(outer0[i]! + Math.fround(local(r, 3)[i]! - local(r, 2)[i]!)));
        expect(relativeError(w.subarray(0, 12), want)).toBeLessThan(1e-6);
        expect(hex(w.subarray(12))).toBe(hex(local(r, 3).subarray(12)));
      }
      const outerOf = (d: DiLoCo) => hex(d.stateDict().tensors.outer_weights!);
      expect(outerOf(ds[0]!)).toBe(outerOf(ds[1]!));
      expect(ds.map((d) => d.outerSteps)).toEqual([1, 1]);
      // Step 4: fragment 1's turn; a full outer step at the end lands it and leaves the replicas identical.
      await at(4);
      await Promise.all(pgs.map((pg, r) => ds[r]!.syncNow(pg, models[r]!, 4)));
      const end = await Promise.all(models.map((m) => flatTrainableWeights(m)));
      expect(hex(end[0]!)).toBe(hex(end[1]!));
      expect(ds.map((d) => d.inSync(4))).toEqual([true, true]);
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it('runElastic refuses diloco beside another hook or averager, and a voteEvery that is not a count, before joining', async () => {
    const base = {
      url: server.url,
      session: 'x',
      token: tokenFor('x'),
      min: 1,
      max: 1,
      state: new TrainState({ model: smallModel(), optimizer: () => new AdamW({ lr: 0.01 }) }),
      datasetLength: 8,
      batchSize: 2,
      step: async () => {},
    };
    await expect(runElastic({ ...base, diloco: { syncEvery: 4 }, modelAverager: { period: 4 } })).rejects.toThrow(
      errorOf(TypeError, /diloco is a strategy of its own: leave commHook and modelAverager unset/),
    );
    await expect(runElastic({ ...base, voteEvery: 0 })).rejects.toThrow(errorOf(RangeError, /voteEvery must be an integer >= 1, got 0/));
  });

  it('refuses options that make no outer step', () => {
    expect(() => new DiLoCo({ syncEvery: 4, fragments: 5 })).toThrow(
      errorOf(RangeError, /fragments must be an integer from 1 to syncEvery \(4\), got 5/),
    );
    expect(() => new DiLoCo({ syncEvery: 8, fragments: 4, overlap: 2 })).toThrow(
      errorOf(RangeError, /overlap must be an integer from 0 to below syncEvery \/ fragments \(2\), got 2/),
    );
    expect(() => new DiLoCo({ syncEvery: 0 })).toThrow(errorOf(RangeError, /syncEvery must be an integer >= 1, got 0/));
    expect(() => new DiLoCo({ syncEvery: 4, outerLr: -1 })).toThrow(errorOf(RangeError, /outerLr must be a positive number/));
    expect(() => new DiLoCo({ syncEvery: 4, outerMomentum: 0 })).toThrow(errorOf(RangeError, /Nesterov needs an outer momentum/));
    expect(() => new DiLoCo({ syncEvery: 4, outerMomentum: 1 })).toThrow(errorOf(RangeError, /outerMomentum must be in \[0, 1\)/));
  });
});

const data = syntheticDataset({ length: 96, inputSize: 16, numClasses: 4, seed: 1 });

interface Member {
  events: ElasticEvent[];
  result: Promise<ElasticRunResult>;
  /** This member's weights hash after each step it committed (after that step's outer step, if any). */
  hashes: Map<number, string>;
  roundHashes: string[];
  /** DiLoCo's outer step count as each round starts. */
  roundOuterSteps: unknown[];
  /** DiLoCo's outer weights (hex) after each step voted on. */
  outerWeights: Map<number, string>;
}

/** One member: AdamW inner steps on its samples, DiLoCo every `syncEvery` steps. */
function member(
  net: MemoryNetwork,
  id: number,
  session: string,
  o: {
    min: number;
    max: number;
    syncEvery: number;
    fragments?: number;
    overlap?: number;
    voteEvery?: number;
    steps?: number;
    checkpointEvery?: number;
    resumeFrom?: string;
    extra?: (ctx: StepContext) => Promise<void>;
    balance?: boolean;
    slow?: number;
  },
): Member {
  const events: ElasticEvent[] = [];
  const hashes = new Map<number, string>();
  const roundHashes: string[] = [];
  const roundOuterSteps: unknown[] = [];
  const outerWeights = new Map<number, string>();
  const model = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 0 });
  const state = new TrainState({ model, optimizer: () => new AdamW({ lr: 0.01 }) });
  // A slow rank: `slow` ms more per step, whatever its batch (a straggler by factor times a Node step of ~1 ms is noise).
  const straggler =
    o.slow === undefined
      ? undefined
      : {
          after: async () => {
            const t0 = performance.now();
            await new Promise((r) => setTimeout(r, o.slow));
            return performance.now() - t0;
          },
        };
  const result = runElastic({
    url: server.url,
    session,
    token: tokenFor(session),
    min: o.min,
    max: o.max,
    timeoutMs: 10_000,
    heartbeatIntervalMs: 200,
    linkFactory: net.factoryFor(id),
    state,
    datasetLength: data.length,
    batchSize: 4,
    steps: o.steps,
    seed: 5,
    checkReplicasEvery: 1,
    checkpointEvery: o.checkpointEvery,
    resumeFrom: o.resumeFrom,
    resumeFromToken: o.resumeFrom === undefined ? undefined : tokenFor(o.resumeFrom),
    diloco: { syncEvery: o.syncEvery, fragments: o.fragments, overlap: o.overlap },
    voteEvery: o.voteEvery,
    balance: o.balance,
    onEvent: (e) => events.push(e),
    onRound: async (ctx) => {
      roundHashes.push(await ctx.ddp.weightsHash());
      roundOuterSteps.push(ctx.ddp.commHookState()?.meta.outerSteps);
    },
    onStep: async (ctx) => {
      hashes.set(ctx.step, await ctx.ddp.weightsHash());
      const outer = ctx.ddp.commHookState()?.tensors.outer_weights;
      if (outer) outerWeights.set(ctx.step, hex(outer));
    },
    async step(ctx) {
      await o.extra?.(ctx);
      const { x, y } = data.batch(ctx.indices);
      const xs = tf.tensor(x, [ctx.indices.length, 16]);
      const ys = tf.tensor1d(y, 'int32');
      const { loss } =
        ctx.indices.length === 0
          ? await ctx.ddp.backward(() => tf.scalar(0))
          : await ctx.ddp.backward(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, 4), { straggler });
      tf.dispose([xs, ys]);
      ctx.ddp.step(ctx.optimizer);
      return { loss };
    },
  });
  result.catch(() => {});
  return { events, result, hashes, roundHashes, roundOuterSteps, outerWeights };
}

const closeAll = (runs: ElasticRunResult[]) => Promise.all(runs.map((r) => r.close()));
const roundNotes = (m: Member) => m.events.flatMap((e) => (e.type === 'round' && e.note ? [e.note] : []));

describe('runElastic with diloco', () => {
  it('inner steps communicate nothing; replicas are identical after each outer step (checked there) and at the end', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('diloco-run');
    const members = [0, 1].map((id) => member(net, id, session, { min: 2, max: 2, syncEvery: 3, steps: 10 }));
    const runs = await Promise.all(members.map((m) => m.result));
    expect(runs.map((r) => r.steps)).toEqual([10, 10]);
    const same = Array.from({ length: 10 }, (_, k) => members[0]!.hashes.get(k + 1) === members[1]!.hashes.get(k + 1));
    // Outer steps after steps 3, 6 and 9; the run's end (step 10) takes one more.
    expect(same).toEqual([false, false, true, false, false, true, false, false, true, false]);
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    expect(runs[0]!.ddp.commHook.name).toBe('diloco');
    expect(runs[0]!.ddp.bytesPerStep).toBe(0);
    await closeAll(runs);
  });

  it('balanced batches: a slow rank trains fewer samples per inner step instead of holding the others; every sample once, identical at the end', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('diloco-balanced');
    const members = [0, 1].map((id) =>
      member(net, id, session, { min: 2, max: 2, syncEvery: 4, voteEvery: 2, steps: 24, balance: true, slow: id === 1 ? 25 : undefined }),
    );
    const runs = await Promise.all(members.map((m) => m.result));
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    const events = members.flatMap((m) => m.events);
    expect(samplesSeen(events)[0]).toEqual({ samples: 96, exactlyOnce: true, complete: true });
    // After the first costs are in, the slow rank gets fewer samples than the fast one.
    const trained = (rank: number) =>
      events
        .filter((e) => e.type === 'batch' && e.rank === rank && e.step > 8)
        .reduce((a, e) => a + (e.type === 'batch' ? e.indices.length : 0), 0);
    expect(trained(1)).toBeLessThan(trained(0));
    await closeAll(runs);
  });

  it('a rank lost between outer steps: the survivors take an outer step over their own inner steps, and finish identical', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('diloco-lost');
    class TabClosed extends Error {}
    const members = [0, 1, 2].map((id) =>
      member(net, id, session, {
        min: 2,
        max: 3,
        syncEvery: 4,
        extra:
          id === 2
            ? async (ctx) => {
                if (ctx.step === 7) throw new TabClosed('closed at step 7');
              }
            : undefined,
      }),
    );
    const outcomes = await Promise.allSettled(members.map((m) => m.result));
    expect(outcomes.map((o) => o.status)).toEqual(['fulfilled', 'fulfilled', 'rejected']);
    const done = outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : []));
    expect(new Set(done.map((r) => r.weightHash)).size).toBe(1);
    // Step 7 was committed by the survivors but never by the lost rank: they go back to step 6 and
    // train step 7 again; their steps 5 and 6 count in an outer step as the new round starts.
    for (const m of members.slice(0, 2)) {
      expect(roundNotes(m)).toContain(
        'resumed at step 6 from the replica of rank 0, sent to 1 rank; step 7 is trained again; an outer step over the inner steps since step 4 of 2 ranks',
      );
    }
    expect(samplesSeen(members.flatMap((m) => m.events))).toEqual([{ samples: 96, exactlyOnce: true, complete: true }]);
    for (const m of members.slice(0, 2)) expect(new Set(m.roundHashes).size).toBe(2);
    expect(members[0]!.roundHashes[1]).toBe(members[1]!.roundHashes[1]);
    await closeAll(done);
  });

  it("voteEvery: the ranks meet only every few steps; each step still gets every rank's metrics, in order; a failed round goes back to the last vote", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('diloco-vote');
    class TabClosed extends Error {}
    const members = [0, 1, 2].map((id) =>
      member(net, id, session, {
        min: 2,
        max: 3,
        syncEvery: 8,
        voteEvery: 4,
        steps: 16,
        extra:
          id === 2
            ? async (ctx) => {
                if (ctx.step === 11) throw new TabClosed('closed at step 11');
              }
            : undefined,
      }),
    );
    const outcomes = await Promise.allSettled(members.map((m) => m.result));
    expect(outcomes.map((o) => o.status)).toEqual(['fulfilled', 'fulfilled', 'rejected']);
    const done = outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : []));
    expect(new Set(done.map((r) => r.weightHash)).size).toBe(1);
    const steps = members[0]!.events.flatMap((e) => (e.type === 'step' ? [[e.step, e.metrics.length]] : []));
    // Steps 1-8 with 3 ranks' metrics; 9 and 10 were not voted on (the round failed before step 12's vote); then 2 ranks from step 9 on.
    expect(steps.slice(0, 9)).toEqual([
      [1, 3],
      [2, 3],
      [3, 3],
      [4, 3],
      [5, 3],
      [6, 3],
      [7, 3],
      [8, 3],
      [9, 2],
    ]);
    expect(steps.map(([s]) => s)).toEqual(Array.from({ length: steps.length }, (_, i) => i + 1));
    // Back to the last vote (step 8, an outer step): steps 9 and 10, which the survivors took, are trained again with step 11.
    expect(roundNotes(members[0]!)).toContain('resumed at step 8 from the replica of rank 0, sent to 1 rank; step 9 is trained again');
    // Epoch 0 in steps 1-8 (3 ranks); epoch 1 from step 9, with 2 ranks after the loss: steps 9-16 train 64 of its 96 samples.
    expect(samplesSeen(members.flatMap((m) => m.events))).toEqual([
      { samples: 96, exactlyOnce: true, complete: true },
      { samples: 64, exactlyOnce: true, complete: false },
    ]);
    await closeAll(done);
  });

  it('streaming with overlap: the outer weights stay the same on every rank, a lost rank costs no sample, the run ends identical', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('diloco-stream');
    class TabClosed extends Error {}
    const members = [0, 1, 2].map((id) => {
      const m = member(net, id, session, {
        min: 2,
        max: 3,
        syncEvery: 4,
        fragments: 2,
        overlap: 1,
        extra:
          id === 2
            ? async (ctx) => {
                if (ctx.step === 7) throw new TabClosed('closed at step 7');
              }
            : undefined,
      });
      return m;
    });
    const outcomes = await Promise.allSettled(members.map((m) => m.result));
    expect(outcomes.map((o) => o.status)).toEqual(['fulfilled', 'fulfilled', 'rejected']);
    const done = outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : []));
    expect(new Set(done.map((r) => r.weightHash)).size).toBe(1);
    // Over both survivors' inner steps, or one's: the rank's loss can cut the all-reduce on the wire
    // when one survivor has its result and the other not; the one without it counts for nothing then.
    for (const m of members.slice(0, 2))
      expect(
        roundNotes(m).some((n) => /an outer step over the inner steps since step \d+ of [12] ranks?/.test(n)),
        JSON.stringify(roundNotes(m)),
      ).toBe(true);
    // Replicas differ between outer steps (the progress made while a fragment was on the wire)...
    const differ = [...members[0]!.hashes.keys()].filter(
      (k) => members[1]!.hashes.has(k) && members[0]!.hashes.get(k) !== members[1]!.hashes.get(k),
    );
    expect(differ.length).toBeGreaterThan(0);
    expect(samplesSeen(members.flatMap((m) => m.events))).toEqual([{ samples: 96, exactlyOnce: true, complete: true }]);
    // ...the outer weights never do.
    const common = [...members[0]!.outerWeights.keys()].filter((k) => members[1]!.outerWeights.has(k));
    expect(common.length).toBeGreaterThan(5);
    for (const k of common) expect(members[0]!.outerWeights.get(k), `step ${k}`).toBe(members[1]!.outerWeights.get(k));
    await closeAll(done);
  });

  it('a joiner starts from the outer weights the round start makes; the run ends identical', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('diloco-join');
    let joiner: Member | undefined;
    const first = [0, 1].map((id) =>
      member(net, id, session, {
        min: 2,
        max: 3,
        syncEvery: 4,
        steps: 14,
        extra: async (ctx) => {
          if (ctx.step === 3 && ctx.pg.rank === 0 && !joiner) joiner = member(net, 2, session, { min: 2, max: 3, syncEvery: 4, steps: 14 });
        },
      }),
    );
    const done = await Promise.all(first.map((m) => m.result));
    const all = [...done, await joiner!.result];
    expect(all.map((r) => [r.worldSize, r.steps])).toEqual([
      [3, 14],
      [3, 14],
      [3, 14],
    ]);
    expect(new Set(all.map((r) => r.weightHash)).size).toBe(1);
    // Every rank holds the same weights as the joiner's first round starts (the outer step over the two first ranks' inner steps).
    const joinedAt = joiner!.roundHashes[0];
    for (const m of first) expect(m.roundHashes).toContain(joinedAt);
    expect(roundNotes(joiner!).some((n) => /an outer step over the inner steps since step \d+ of 2 ranks/.test(n))).toBe(true);
    await closeAll(all);
  });

  it("the outer state is saved in checkpoints and resumed: the resumed run's outer step matches the checkpoint's outer phase", async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('diloco-ckpt');
    const runs = await Promise.all(
      [0, 1].map((id) => member(net, id, session, { min: 2, max: 2, syncEvery: 3, steps: 6, checkpointEvery: 6 }).result),
    );
    const saved = runs[0]!.weightHash;
    await closeAll(runs);
    const net2 = new MemoryNetwork();
    const again = uniqueSession('diloco-resume');
    const resumed = [0, 1].map((id) => member(net2, id, again, { min: 2, max: 2, syncEvery: 3, steps: 9, resumeFrom: session }));
    const runs2 = await Promise.all(resumed.map((m) => m.result));
    for (const m of resumed) expect(m.roundHashes[0]).toBe(saved);
    expect(runs2.map((r) => r.steps)).toEqual([9, 9]);
    expect(new Set(runs2.map((r) => r.weightHash)).size).toBe(1);
    // The outer state came back: 2 outer steps before (steps 3 and 6).
    expect(resumed.map((m) => m.roundOuterSteps[0])).toEqual([2, 2]);
    await closeAll(runs2);
  });
});
