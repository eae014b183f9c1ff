/**
 * The train job's --comm-hook outside the browser (client/train/comm.ts): the hook each spec
 * makes, and the float32 all-reduce's bytes that the compression ratio divides by, computed
 * from the ring's schedule and the frames' size, against what the process group really counts
 * (`pg.bytesSent()`, and DDP's `commBytes`) over in-memory links.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { DistributedDataParallel } from '../src/parallel/ddp/ddp.ts';
import { DEFAULT_FRAME_BYTES, HEADER_BYTES } from '../src/wire/framing.ts';
import { PeriodicModelAverager } from '../src/parallel/comm_hooks/local_sgd.ts';
import { PowerSGDHook } from '../src/parallel/comm_hooks/powersgd.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { commSetup, denseStepBytes, plainAllReduceBytes, TRAIN_FRAME_BYTES } from '../client/train/comm.ts';
import { allReduceBytes, messageBytes } from '../src/c10d/collective_bytes.ts';

const ringAllReduceBytes = (elements: number, rank: number, n: number, frameBytes?: number) =>
  allReduceBytes(elements, rank, n, { frameBytes, algorithm: 'ring' });
import { parseCommHook } from '../src/jobs/train_config.ts';
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

async function groups(n: number, extra: { maxFrameBytes?: number } = {}): Promise<ProcessGroup[]> {
  const session = uniqueSession('commbytes');
  const net = new MemoryNetwork();
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
        ...extra,
      }),
    ),
  );
}

describe('the float32 all-reduce’s bytes, computed', () => {
  it('a message is its payload plus a 36-byte header per frame of at most 32 KiB (an empty one is one header)', () => {
    expect(TRAIN_FRAME_BYTES).toBe(DEFAULT_FRAME_BYTES);
    const chunk = Math.floor((DEFAULT_FRAME_BYTES - HEADER_BYTES) / 4) * 4;
    expect(messageBytes(0)).toBe(HEADER_BYTES);
    expect(messageBytes(4)).toBe(4 + HEADER_BYTES);
    expect(messageBytes(chunk)).toBe(chunk + HEADER_BYTES);
    expect(messageBytes(chunk + 4)).toBe(chunk + 4 + 2 * HEADER_BYTES);
    expect(messageBytes(100, 64)).toBe(100 + 4 * HEADER_BYTES);
  });

  it('a world of one sends nothing; otherwise about 2(n-1)/n x 4 bytes per element, plus headers', () => {
    expect(ringAllReduceBytes(1000, 0, 1)).toBe(0);
    // n = 2, 1000 elements: one segment of 500 each way, one frame each.
    expect(ringAllReduceBytes(1000, 0, 2)).toBe(2 * (500 * 4 + HEADER_BYTES));
    // n = 3, 1000 elements: segments 334, 333, 333. Rank 0 sends segment 2 then 1 (reduce-scatter), 0 then 2 (all-gather).
    expect(ringAllReduceBytes(1000, 0, 3)).toBe((333 + 333 + 334 + 333) * 4 + 4 * HEADER_BYTES);
    const big = ringAllReduceBytes(1_000_000, 1, 4);
    expect(big / (1.5 * 4 * 1_000_000)).toBeGreaterThan(1);
    expect(big / (1.5 * 4 * 1_000_000)).toBeLessThan(1.0012);
    expect(
      denseStepBytes(
        [
          { start: 0, end: 10 },
          { start: 10, end: 1010 },
        ],
        0,
        2,
      ),
    ).toBe(ringAllReduceBytes(10, 0, 2) + ringAllReduceBytes(1000, 0, 2));
  });

  it('recursive doubling: the whole buffer once per step (log2 N steps), a folded rank once, its partner once more', () => {
    const whole = messageBytes(1000 * 4);
    // N = 8: three steps for everyone.
    for (let r = 0; r < 8; r++) expect(allReduceBytes(1000, r, 8, { algorithm: 'doubling' })).toBe(3 * whole);
    // N = 6: ranks 0 and 2 fold into 1 and 3, which send them the result; 4 and 5 only double.
    expect([0, 1, 2, 3, 4, 5].map((r) => allReduceBytes(1000, r, 6, { algorithm: 'doubling' }))).toEqual([
      whole,
      3 * whole,
      whole,
      3 * whole,
      2 * whole,
      2 * whole,
    ]);
    // The tuner: below the threshold, doubling; plainAllReduceBytes follows it.
    expect(plainAllReduceBytes(1000, 0, 8)).toBe(3 * whole);
    expect(plainAllReduceBytes(1_000_000, 0, 8)).toBe(ringAllReduceBytes(1_000_000, 0, 8));
  });

  for (const n of [2, 3, 6]) {
    it(`world ${n}: equals what pg.bytesSent() counts for every rank, from empty to many-frame buffers`, async () => {
      const pgs = await groups(n);
      for (const len of [0, 1, 7, 1000, 50_001, 123_457]) {
        const before = pgs.map((pg) => pg.bytesSent());
        await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(len).fill(pg.rank + 1), 'avg')));
        expect(pgs.map((pg, r) => pg.bytesSent() - before[r]!)).toEqual(pgs.map((pg) => plainAllReduceBytes(len, pg.rank, n)));
      }
      // Another frame size: the same rule with its own chunks.
      const small = await groups(n, { maxFrameBytes: 1024 });
      const before = small.map((pg) => pg.bytesSent());
      await Promise.all(small.map((pg) => pg.allReduce(new Float32Array(5000), 'sum')));
      expect(small.map((pg, r) => pg.bytesSent() - before[r]!)).toEqual(small.map((pg) => plainAllReduceBytes(5000, pg.rank, n, 1024)));
      for (const pg of [...pgs, ...small]) pg.destroy();
    });
  }
});

describe('DDP without a hook sends exactly the computed baseline; the hooks send less', () => {
  const data = syntheticDataset({ length: 256, inputSize: 16, numClasses: 4, seed: 5 });
  const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);

  /** `steps` synchronised backwards on 3 ranks (small buckets: several per step), with the hook of `spec`: each rank's commBytes per step. */
  async function sent(spec: string, steps: number): Promise<{ bytes: number[][]; dense: number[]; ddps: DistributedDataParallel[] }> {
    const pgs = await groups(3);
    const ddps = await Promise.all(
      pgs.map((pg) =>
        DistributedDataParallel.create(buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 2 }), pg, {
          firstBucketCapMB: 0.0004,
          bucketCapMB: 0.0001,
        }),
      ),
    );
    for (const d of ddps) {
      const hook = commSetup(parseCommHook(spec)).hook;
      if (hook) d.registerCommHook(hook);
    }
    const bytes: number[][] = ddps.map(() => []);
    for (let s = 0; s < steps; s++) {
      await Promise.all(
        ddps.map(async (d, r) => {
          const { x, y } = data.batch(range(s * 48 + r * 16, s * 48 + r * 16 + 16));
          const xs = tf.tensor(x, [16, 16]);
          const ys = tf.tensor1d(y, 'int32');
          const res = await d.backward(() => classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4));
          bytes[r]!.push(res.commBytes);
          tf.dispose([xs, ys]);
          d.step(tf.train.sgd(0.1));
        }),
      );
    }
    return { bytes, dense: ddps.map((d) => denseStepBytes(d.buckets, d.pg.rank, d.pg.worldSize)), ddps };
  }
  const done = (ddps: DistributedDataParallel[]) =>
    ddps.forEach((d) => {
      d.pg.destroy();
    });

  it('none: commBytes is the computed float32 all-reduce of the buckets, every step, on every rank (a ratio of exactly 1)', async () => {
    const { bytes, dense, ddps } = await sent('none', 2);
    expect(ddps[0]!.buckets.length).toBeGreaterThan(1);
    for (let r = 0; r < 3; r++) expect(bytes[r]).toEqual([dense[r], dense[r]]);
    done(ddps);
  });

  it('fp16 about half; powersgd the plain bytes for its first START steps, then fewer; localsgd none after START', async () => {
    const fp16 = await sent('fp16', 1);
    for (let r = 0; r < 3; r++) {
      expect(fp16.bytes[r]![0]! / fp16.dense[r]!).toBeGreaterThan(0.5);
      expect(fp16.bytes[r]![0]! / fp16.dense[r]!).toBeLessThan(0.56);
    }
    done(fp16.ddps);
    const psgd = await sent('powersgd:1:1', 2);
    for (let r = 0; r < 3; r++) {
      expect(psgd.bytes[r]![0]).toBe(psgd.dense[r]);
      expect(psgd.bytes[r]![1]!).toBeLessThan(psgd.dense[r]!);
    }
    expect(psgd.ddps[0]!.commHook).toBeInstanceOf(PowerSGDHook);
    done(psgd.ddps);
    const local = await sent('localsgd:2:1', 2);
    for (let r = 0; r < 3; r++) expect(local.bytes[r]).toEqual([local.dense[r], 0]);
    done(local.ddps);
  });

  it('localsgd’s averaging sends the computed all-reduce of every trainable weight', async () => {
    const pgs = await groups(3);
    const models = pgs.map(() => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 2 }));
    const averager = new PeriodicModelAverager({ period: 1 });
    const parameters = models[0]!.trainableWeights.reduce((sum, w) => sum + w.shape.reduce<number>((a, b) => a * (b ?? 1), 1), 0);
    const before = pgs.map((pg) => pg.bytesSent());
    await Promise.all(pgs.map((pg, r) => averager.average(pg, models[r]!, 1)));
    expect(pgs.map((pg, r) => pg.bytesSent() - before[r]!)).toEqual(pgs.map((pg) => plainAllReduceBytes(parameters, pg.rank, 3)));
    pgs.forEach((pg) => {
      pg.destroy();
    });
  });
});

describe('commSetup: the hook and the runElastic options each spec asks for', () => {
  it('none registers nothing; fp16, bf16, powersgd and localsgd their hooks; localsgd a model averager warming up as long', () => {
    const none = commSetup(parseCommHook('none'));
    expect(none).toMatchObject({ hook: undefined, powerSGD: undefined, modelAverager: undefined, averager: undefined });
    expect(commSetup(parseCommHook('fp16')).hook!.name).toBe('fp16_compress');
    expect(commSetup(parseCommHook('bf16')).hook!.name).toBe('bf16_compress');
    const psgd = commSetup(parseCommHook('powersgd:3:7'));
    expect(psgd.hook).toBe(psgd.powerSGD);
    expect(psgd.powerSGD!.options).toMatchObject({ matrixApproximationRank: 3, startIter: 7 });
    expect(commSetup(parseCommHook('powersgd:2')).powerSGD!.options.startIter).toBe(10);
    const local = commSetup(parseCommHook('localsgd:4'));
    expect(local.hook!.name).toBe('postLocalSGD');
    expect(local.modelAverager).toEqual({ period: 4, warmupSteps: 10 });
    expect([10, 11, 14, 18].map((s) => local.averager!.averagesAt(s))).toEqual([false, false, true, true]);
  });
});
