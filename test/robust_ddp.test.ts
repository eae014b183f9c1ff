/**
 * Robust aggregation in DistributedDataParallel, in Node (TF.js cpu backend, in-memory links, the
 * real server for the store): the direct all-gather (every rank's block straight from its rank,
 * the bytes it costs, the digests), 4 ranks training with one hostile rank of each kind (the mean
 * moves off the clean run; a trimmed mean and centered clipping stay close, every rank with the
 * same bits), a non-finite gradient refused and named, a rank without samples left out, what
 * does not combine with robust aggregation, and runElastic with it.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { DistributedDataParallel } from '../src/parallel/ddp/ddp.ts';
import { ContributionMismatchError, NonFiniteGradientError } from '../src/wire/errors.ts';
import { fp16CompressHook } from '../src/parallel/comm_hooks/default_hooks.ts';
import { DiLoCo } from '../src/parallel/diloco/diloco.ts';
import { meshAllGatherBytes } from '../src/c10d/collective_bytes.ts';
import { gatherContributions } from '../src/parallel/robust/exchange.ts';
import type { AggregationSpec } from '../src/parallel/robust/aggregators.ts';
import type { AttackKind } from '../src/parallel/robust/attacks.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { SGD } from '../src/nn/optim.ts';
import { hashFloat32 } from '../src/wire/hash.ts';
import { runElastic } from '../src/parallel/ddp/runner.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer({ settleMs: 300 });
});
afterAll(async () => {
  await server.close();
});

async function groups(n: number): Promise<ProcessGroup[]> {
  const session = uniqueSession('robust');
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

const data = syntheticDataset({ length: 512, inputSize: 16, numClasses: 4, seed: 3 });
const mlp = () => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 7 });
const STEPS = 12;
const BATCH = 16;
const WORLD = 4;

/** 4 ranks train STEPS steps (rank r on its own 16 samples each step) with `aggregation` and `attack` (the last rank): every rank's final weights. */
async function train(aggregation: AggregationSpec, attack?: AttackKind): Promise<Float32Array[]> {
  const pgs = await groups(WORLD);
  try {
    const ddps = await Promise.all(
      pgs.map((pg) =>
        DistributedDataParallel.create(mlp(), pg, { aggregation, ...(attack ? { attack: { kind: attack, attackers: 1 } } : {}) }),
      ),
    );
    await Promise.all(
      ddps.map(async (d, r) => {
        const opt = new SGD({ lr: 0.2 });
        for (let s = 0; s < STEPS; s++) {
          const start = (s * WORLD + r) * BATCH;
          const { x, y } = data.batch(Array.from({ length: BATCH }, (_, i) => (start + i) % data.length));
          const xs = tf.tensor(x, [BATCH, 16]);
          const ys = tf.tensor1d(y, 'int32');
          await d.backward(() => classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4));
          tf.dispose([xs, ys]);
          await d.step(opt);
        }
      }),
    );
    return await Promise.all(ddps.map((d) => d.flatWeights()));
  } finally {
    await Promise.all(pgs.map((pg) => pg.destroy()));
  }
}

function distance(a: Float32Array, b: Float32Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += (a[i]! - b[i]!) ** 2;
  return Math.sqrt(s);
}

describe('the direct all-gather', () => {
  it('gives every rank every block as its rank sent it, at (N-1) x the block per rank, with equal digests everywhere', async () => {
    const pgs = await groups(4);
    try {
      const block = (r: number) => Float32Array.from({ length: 5000 }, (_, i) => r * 10_000 + i);
      const before = pgs.map((pg) => pg.bytesSent());
      const got = await Promise.all(pgs.map((pg, r) => gatherContributions(pg, r === 2 ? null : block(r), 5000)));
      for (const g of got) {
        expect(g.blocks.map((b) => (b === null ? null : hashFloat32(b)))).toEqual(
          [0, 1, null, 3].map((r) => (r === null ? null : hashFloat32(block(r)))),
        );
        expect(g.digests).toEqual(got[0]!.digests);
      }
      // The block and its presence flag, to each of the 3 others: (N-1) x what the ring all-reduce's 2(N-1)/N would send.
      pgs.forEach((pg, r) => {
        expect(pg.bytesSent() - before[r]!).toBe(meshAllGatherBytes(5001, 4));
      });
      expect(new Set(got[0]!.digests.map((d) => d.join(','))).size).toBe(4);
    } finally {
      await Promise.all(pgs.map((pg) => pg.destroy()));
    }
  });
});

describe('a rank that sends different contributions to different ranks (equivocation)', () => {
  it('fails the step on every rank that received a block other than the one its sender published through the server, naming the sender', async () => {
    const pgs = await groups(3);
    try {
      // Rank 2 publishes a digest that is not the block it sends: to its peers the same as sending them a block other than the one it told the server.
      const hostile = pgs[2]!;
      const gatherRows = hostile.gatherRows.bind(hostile);
      hostile.gatherRows = (row: readonly number[]) => gatherRows(row.map((v) => (v + 1) % 2 ** 24));
      const block = (r: number) => Float32Array.from({ length: 100 }, (_, i) => r + i);
      const got = await Promise.allSettled(pgs.map((pg, r) => gatherContributions(pg, block(r), 100, 7)));
      for (const r of [0, 1]) {
        const err = (got[r] as PromiseRejectedResult).reason as ContributionMismatchError;
        expect(err).toBeInstanceOf(ContributionMismatchError);
        expect([err.rank, err.step]).toEqual([2, 7]);
        expect(err.message).toContain(
          `rank 2's contribution to step 7 as rank ${r} received it is not the one rank 2 published through the server`,
        );
      }
    } finally {
      await Promise.all(pgs.map((pg) => pg.destroy()));
    }
  });
});

describe('DistributedDataParallel with robust aggregation', () => {
  it('one hostile rank of 4 (x1000, flipped x-4, noise, a little is enough): the mean moves off the clean run, trimmed mean and centered clipping stay close, every rank bit-identical', async () => {
    const init = await (async () => {
      const [pg] = await groups(1);
      const d = await DistributedDataParallel.create(mlp(), pg!);
      const w = await d.flatWeights();
      await pg!.destroy();
      return w;
    })();
    const clean = (await train({ kind: 'mean' }))[0]!;
    const progress = distance(clean, init);
    const off = (w: Float32Array) => distance(w, clean) / progress;
    const robust: AggregationSpec[] = [
      { kind: 'trimmed-mean', trim: 1 },
      { kind: 'centered-clip', tau: 'auto', iterations: 3 },
    ];
    const figures: Record<string, number> = {};
    // Without an attacker the robust rules train about as the mean does.
    for (const spec of robust) figures[`none/${spec.kind}`] = off((await train(spec))[0]!);
    for (const attack of ['scale', 'flip', 'noise', 'alie'] as const) {
      const mean = await train({ kind: 'mean' }, attack);
      figures[`${attack}/mean`] = off(mean[0]!);
      for (const spec of robust) {
        const ranks = await train(spec, attack);
        // Every rank applied the same aggregate: the replicas are bit-identical, the attacker's too.
        expect(new Set(ranks.map(hashFloat32)).size, `${attack}/${spec.kind}`).toBe(1);
        figures[`${attack}/${spec.kind}`] = off(ranks[0]!);
      }
    }
    console.log("distance from the clean run / the clean run's progress", figures);
    for (const spec of robust) expect(figures[`none/${spec.kind}`]!).toBeLessThan(0.5);
    for (const attack of ['scale', 'flip', 'noise'] as const) {
      expect(figures[`${attack}/mean`]!, attack).toBeGreaterThan(1);
      expect(figures[`${attack}/trimmed-mean`]!, attack).toBeLessThan(0.5);
      expect(figures[`${attack}/centered-clip`]!, attack).toBeLessThan(0.5);
    }
    // A little is enough: a small consistent shift, made to pass for honest (measured: the mean 0.32 off, the
    // robust rules 0.19-0.23, against 0.01-0.06 without it): it moves the robust rules too, but less than the mean.
    for (const spec of robust) {
      expect(figures[`alie/${spec.kind}`]!).toBeLessThan(figures['alie/mean']!);
      expect(figures[`alie/${spec.kind}`]!).toBeLessThan(0.5);
    }
  }, 120_000);

  it('refuses a non-finite gradient and names its rank; the others are aggregated, identically everywhere', async () => {
    const pgs = await groups(4);
    try {
      const ddps = await Promise.all(pgs.map((pg) => DistributedDataParallel.create(mlp(), pg, { aggregation: { kind: 'median' } })));
      const n = ddps[0]!.parameterCount;
      const grads = (r: number) => {
        const g = Float32Array.from({ length: n }, (_, i) => Math.sin(i + r));
        if (r === 1) g[42] = NaN;
        return g;
      };
      await Promise.all(ddps.map((d, r) => d.backward({ grads: grads(r), loss: 1, computeMs: 0 })));
      for (const d of ddps) {
        const a = d.lastAggregation!;
        expect(a.kind).toBe('median');
        expect(a.used).toBe(3);
        expect(a.judgments.map((j) => j.status)).toEqual(['used', 'refused', 'used', 'used']);
        expect(a.judgments[1]!.reason).toBe('non-finite value NaN at index 42');
        expect(a.digests).toEqual(ddps[0]!.lastAggregation!.digests);
      }
      await Promise.all(ddps.map((d) => d.step(new SGD({ lr: 0.1 }))));
      expect(new Set(await Promise.all(ddps.map((d) => d.weightsHash()))).size).toBe(1);
      // When every rank's gradient is refused, the step fails on every rank, naming a parameter, and nothing is applied.
      const all = await Promise.allSettled(
        ddps.map((d) => d.backward({ grads: Float32Array.from({ length: n }, () => NaN), loss: 1, computeMs: 0 })),
      );
      for (const r of all) expect(r.status === 'rejected' && r.reason instanceof NonFiniteGradientError).toBe(true);
      expect(() => ddps[0]!.step(new SGD({ lr: 0.1 }))).toThrow(/step\(\) before backward\(\)/);
    } finally {
      await Promise.all(pgs.map((pg) => pg.destroy()));
    }
  });

  it('a rank without samples this step contributes no block and is marked absent', async () => {
    const pgs = await groups(3);
    try {
      const ddps = await Promise.all(
        pgs.map((pg) => DistributedDataParallel.create(mlp(), pg, { aggregation: { kind: 'trimmed-mean', trim: 1 } })),
      );
      const { x, y } = data.batch(Array.from({ length: 8 }, (_, i) => i));
      await Promise.all(
        ddps.map(async (d, r) => {
          d.setBatchShare(r === 2 ? 0 : 8, 16);
          const xs = tf.tensor(x, [8, 16]);
          const ys = tf.tensor1d(y, 'int32');
          await d.backward(() => classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4));
          tf.dispose([xs, ys]);
        }),
      );
      for (const d of ddps) {
        expect(d.lastAggregation!.judgments.map((j) => j.status)).toEqual(['used', 'used', 'absent']);
        // Two blocks left: nothing to trim.
        expect(d.lastAggregation!.trim).toBe(0);
      }
    } finally {
      await Promise.all(pgs.map((pg) => pg.destroy()));
    }
  });

  it('refuses communication hooks and values carried on the sum, with what to do instead', async () => {
    const [pg] = await groups(1);
    try {
      const d = await DistributedDataParallel.create(mlp(), pg!, { aggregation: { kind: 'trimmed-mean', trim: 1 } });
      expect(() => d.registerCommHook(fp16CompressHook())).toThrow(
        /the communication hook fp16_compress cannot combine with robust aggregation \(trimmed-mean \(trim 1\)\)/,
      );
      expect(() => d.registerCommHook(new DiLoCo({ syncEvery: 4 }))).toThrow(/DiLoCoOptions\.aggregation/);
      expect(() => d.carry(Float32Array.of(1))).toThrow(/carry: values cannot ride on the gradients under robust aggregation/);
      await expect(
        DistributedDataParallel.create(mlp(), pg!, { aggregation: { kind: 'centered-clip', tau: -1 }, initSync: false }),
      ).rejects.toThrow(errorOf(RangeError, /tau must be a positive/));
      // A world of one exchanges nothing: its own gradient is the trimmed mean of one.
      const g = Float32Array.from({ length: d.parameterCount }, (_, i) => i / 100);
      await d.backward({ grads: g, loss: 0, computeMs: 0 });
      expect(d.lastAggregation).toMatchObject({ used: 1, trim: 0 });
      expect(d.lastAggregation!.values).toEqual(g);
    } finally {
      await pg!.destroy();
    }
  });

  it('runElastic with a trimmed mean and one attacker: the vote meets on its own, and the run ends with identical replicas', async () => {
    const session = uniqueSession('robust-elastic');
    const net = new MemoryNetwork();
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
          state: new TrainState({ model: mlp(), optimizer: () => new SGD({ lr: 0.1 }) }),
          datasetLength: 96,
          batchSize: 8,
          steps: 4,
          seed: 1,
          ddp: { aggregation: { kind: 'trimmed-mean', trim: 1 }, attack: { kind: 'scale', attackers: 1 } },
          async step({ indices, ddp, optimizer }) {
            const { x, y } = data.batch(indices);
            const xs = tf.tensor(x, [indices.length, 16]);
            const ys = tf.tensor1d(y, 'int32');
            const { loss } = await ddp.backward(() => classificationLoss(ddp.model.apply(xs) as tf.Tensor, ys, 4));
            tf.dispose([xs, ys]);
            await ddp.step(optimizer);
            expect(ddp.lastAggregation!.judgments[2]!.trimmed).toBeGreaterThan(0.9);
            return { loss };
          },
        }),
      ),
    );
    expect(new Set(results.map((r) => r.weightHash)).size).toBe(1);
    expect(results.map((r) => r.steps)).toEqual([4, 4, 4]);
    await Promise.all(results.map((r) => r.close()));
  });
});
