/**
 * Post-local SGD in Node (TF.js cpu backend, in-memory links, the real server): the hook averages
 * gradients up to its start step and then communicates nothing; the periodic averager makes
 * replicas bit-identical exactly at its period.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { PeriodicModelAverager, postLocalSGD } from '../src/parallel/comm_hooks/local_sgd.ts';
import type { GradBucket } from '../src/parallel/comm_hooks/types.ts';
import type { ProcessGroup, ReduceOpName } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { flatTrainableWeights } from '../src/parallel/replicas.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

async function groups(n: number): Promise<ProcessGroup[]> {
  const session = uniqueSession('lsgd');
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

const hex = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
const values = (rank: number, step: number, length: number) =>
  Float32Array.from({ length }, (_, i) => Math.sin(1 + i * 0.37 + rank * 1.3 + step * 0.11));

function bucket(buffer: Float32Array, step: number): GradBucket {
  return { index: 0, buffer, parameters: [{ index: 0, shape: [buffer.length], offset: 0, size: buffer.length }], step, isLast: true };
}

describe('post-local SGD', () => {
  it('the hook averages up to startStep, then returns each rank its own gradients without communicating', async () => {
    const pgs = await groups(3);
    try {
      const hook = postLocalSGD({ startStep: 2 });
      expect(hook.name).toBe('postLocalSGD');
      const calls: Array<{ rank: number; length: number; op: ReduceOpName }> = [];
      const spied = pgs.map(
        (pg) =>
          ({
            allReduce: (buf: Float32Array, op: ReduceOpName = 'sum') => {
              calls.push({ rank: pg.rank, length: buf.length, op });
              return pg.allReduce(buf, op);
            },
          }) as unknown as ProcessGroup,
      );
      for (let step = 1; step <= 4; step++) {
        const inputs = pgs.map((pg) => values(pg.rank, step, 37));
        const buffers = inputs.map((a) => a.slice());
        calls.length = 0;
        const outs = await Promise.all(pgs.map((pg) => hook.reduce(spied[pg.rank]!, bucket(buffers[pg.rank]!, step))));
        if (step <= 2) {
          // Exactly what a plain all-reduce gives (DDP's average).
          const plain = await Promise.all(pgs.map((pg) => pg.allReduce(inputs[pg.rank]!.slice(), 'avg')));
          for (const pg of pgs) expect(hex(outs[pg.rank]!)).toBe(hex(plain[pg.rank]!));
          expect(calls).toHaveLength(3);
          expect(calls.every((c) => c.op === 'avg' && c.length === 37)).toBe(true);
        } else {
          expect(calls).toHaveLength(0);
          for (const pg of pgs) {
            expect(outs[pg.rank]).toBe(buffers[pg.rank]);
            expect(hex(outs[pg.rank]!)).toBe(hex(inputs[pg.rank]!));
          }
        }
      }
      expect(() => postLocalSGD({ startStep: -1 })).toThrow(RangeError);
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it('the averager makes replicas bit-identical exactly every period after the warm-up', async () => {
    const n = 2;
    const pgs = await groups(n);
    const models = pgs.map(() => {
      const model = tf.sequential({
        layers: [
          tf.layers.dense({
            units: 5,
            inputShape: [4],
            activation: 'tanh',
            kernelInitializer: tf.initializers.glorotUniform({ seed: 11 }),
          }),
          tf.layers.dense({ units: 2, kernelInitializer: tf.initializers.glorotUniform({ seed: 12 }) }),
        ],
      });
      return model;
    });
    const optimizers = pgs.map(() => tf.train.sgd(0.1));
    try {
      const averager = new PeriodicModelAverager({ period: 3, warmupSteps: 2 });
      expect(hex(await flatTrainableWeights(models[1]!))).toBe(hex(await flatTrainableWeights(models[0]!)));
      const averagedAt: number[] = [];
      for (let step = 1; step <= 9; step++) {
        // Each rank trains on its own batch: local SGD, no gradient averaging.
        pgs.forEach((_, r) => {
          const x = tf.tensor2d(values(r, step, 8 * 4), [8, 4]);
          const y = tf.tensor2d(values(r + 10, step, 8 * 2), [8, 2]);
          optimizers[r]!.minimize(() => tf.losses.meanSquaredError(y, models[r]!.predict(x) as tf.Tensor) as tf.Scalar);
          tf.dispose([x, y]);
        });
        const before = await Promise.all(models.map((m) => flatTrainableWeights(m)));
        const averaged = await Promise.all(pgs.map((pg, r) => averager.average(pg, models[r]!, step)));
        expect(averaged.every((a) => a === averaged[0])).toBe(true);
        expect(averager.averagesAt(step)).toBe(averaged[0]);
        const after = await Promise.all(models.map((m) => flatTrainableWeights(m)));
        if (averaged[0]) {
          averagedAt.push(step);
          expect(hex(after[1]!)).toBe(hex(after[0]!));
          // The mean of the replicas.
          for (let i = 0; i < after[0]!.length; i++) expect(after[0]![i]).toBeCloseTo((before[0]![i]! + before[1]![i]!) / 2, 6);
        } else {
          expect(hex(after[1]!)).not.toBe(hex(after[0]!));
          for (let r = 0; r < n; r++) expect(hex(after[r]!)).toBe(hex(before[r]!));
        }
      }
      expect(averagedAt).toEqual([5, 8]);
      expect(new PeriodicModelAverager({ period: 1 }).averagesAt(1)).toBe(true);
      expect(() => new PeriodicModelAverager({ period: 0 })).toThrow(RangeError);
      expect(() => new PeriodicModelAverager({ period: 2, warmupSteps: -1 })).toThrow(RangeError);
    } finally {
      for (const pg of pgs) pg.destroy();
      for (const m of models) m.dispose();
      for (const o of optimizers) o.dispose();
    }
  });
});
