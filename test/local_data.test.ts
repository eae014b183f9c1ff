/**
 * runElastic's localData (datasets/local.ts): every rank trains on its own samples and the
 * group on their union, exactly. In Node (TF.js cpu backend, in-memory links, the real server):
 * ranks with 5 and 27 samples per step equal one model trained on the union's batch (SGD and
 * Adam); a rank whose samples run out mid-epoch (and one with none) takes part with zero samples
 * and the run stays exact; a rank that leaves takes its samples (the group is told how many) and
 * one that joins brings its own, the replicas identical and every sample of the data still there
 * trained once. Bad input gets a clear error.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { samplesSeen } from '../launcher/samples_seen.ts';
import { DatasetError } from '../src/datasets/dataset.ts';
import { LocalDataset } from '../src/datasets/local.ts';
import { countsFromRows, splitByRemaining } from '../src/elastic/local_epoch.ts';
import { countCorrect } from '../src/elastic/local_eval.ts';
import { classificationLoss } from '../src/nn/models.ts';
import type { ElasticRunResult } from '../src/parallel/ddp/runner.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { withServer } from './fixtures/server.ts';
import { uniqueSession } from './fixtures/session.ts';
import {
  CLASSES,
  flatWeights,
  INPUT,
  lineage,
  localMember,
  localSamples,
  newModel,
  type LocalMember,
  type MemberOptions,
} from './fixtures/local_data.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer({ settleMs: 300, checkpointDir: await mkdtemp(join(tmpdir(), 'local-data-')) });
});
afterAll(async () => {
  await server.close();
});

const closeAll = (runs: ElasticRunResult[]) => Promise.all(runs.map((r) => r.close()));

/** Members with these datasets, all started at once; their results. */
async function train(datas: LocalDataset[], o: MemberOptions): Promise<{ members: LocalMember[]; runs: ElasticRunResult[] }> {
  const net = new MemoryNetwork();
  const session = uniqueSession('local');
  const members = datas.map((d, id) => localMember(server.url, net, id, session, d, o));
  const runs = await Promise.all(members.map((m) => m.result));
  return { members, runs };
}

/** One model trained on each step's union of the members' batches (their lineage), with the same optimizer. */
async function reference(members: LocalMember[], steps: number, optimizer: tf.Optimizer): Promise<Float32Array> {
  const model = newModel();
  const lines = members.map(lineage);
  for (let s = 1; s <= steps; s++) {
    const parts = members.map((m, i) => m.data.batch(lines[i]!.get(s)?.indices ?? []));
    const n = parts.reduce((a, p) => a + p.y.length, 0);
    const x = new Float32Array(n * INPUT);
    const y = new Int32Array(n);
    let at = 0;
    for (const p of parts) {
      x.set(p.x, at * INPUT);
      y.set(p.y, at);
      at += p.y.length;
    }
    const xs = tf.tensor(x, [n, INPUT]);
    const ys = tf.tensor1d(y, 'int32');
    const { value, grads } = tf.variableGrads(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, CLASSES));
    optimizer.applyGradients(grads);
    tf.dispose([xs, ys, value, ...Object.values(grads)]);
  }
  const w = await flatWeights(model);
  model.dispose();
  optimizer.dispose();
  return w;
}

function maxRelativeError(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i]! - b[i]!) / Math.max(1e-3, Math.abs(b[i]!)));
  return worst;
}

/** Each member's own samples of `epoch` in its lineage, sorted. */
function samplesOf(m: LocalMember, epoch: number): number[] {
  return [...lineage(m).values()]
    .filter((t) => t.epoch === epoch)
    .flatMap((t) => t.indices)
    .sort((a, b) => a - b);
}
const all = (n: number) => Array.from({ length: n }, (_, i) => i);

describe('localData: the union of the ranks’ own samples', () => {
  it('splits each step by samples left (largest remainder), never more than a rank has', () => {
    expect(splitByRemaining(32, [15, 81])).toEqual([5, 27]);
    expect(splitByRemaining(8, [2, 30, 0])).toEqual([1, 7, 0]);
    expect(splitByRemaining(8, [1, 23, 0])).toEqual([0, 8, 0]);
    expect(splitByRemaining(5, [1, 1, 3])).toEqual([1, 1, 3]);
    expect(() => splitByRemaining(6, [1, 1, 3])).toThrow(/6 samples from ranks holding 5/);
    // Each row is its own rank's word (placed by the server); one that is not sane counts as a rank without samples.
    const rows = [
      [3, 5, 0],
      [9, 5, 0],
      [1, 2 ** 25, 0],
      [2, 4, 7],
      [1.5, 4, 0],
      [2, 4],
      [0, 0, 1],
    ];
    expect(countsFromRows(rows)).toEqual({
      remaining: [3, 0, 0, 0, 0, 0, 0],
      samples: [5, 0, 0, 0, 0, 0, 0],
      joined: [false, false, false, false, false, false, true],
    });
  });

  for (const [name, optimizer] of [
    ['SGD', () => tf.train.sgd(0.1)],
    ['Adam', () => tf.train.adam(0.01)],
  ] as const) {
    it(`2 ranks with 5 and 27 samples per step train the weights one model trains on the union's batch (${name})`, async () => {
      const datas = [localSamples(15, 1, 6), localSamples(81, 2, 10)];
      const { members, runs } = await train(datas, { min: 2, max: 2, batchSize: 16, optimizer });
      expect(runs.map((r) => r.steps)).toEqual([3, 3]);
      expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
      for (const m of members) {
        expect([...lineage(m).values()].map((t) => t.indices.length)).toEqual(m.data.length === 15 ? [5, 5, 5] : [27, 27, 27]);
        // Its own samples, each once, in its own order.
        expect(samplesOf(m, 0)).toEqual(all(m.data.length));
      }
      const counts = members[0]!.local.find((e) => e.type === 'local-counts')!;
      expect(counts.type === 'local-counts' && [...counts.remaining].sort((a, b) => a - b)).toEqual([15, 81]);
      // Each rank's accuracy on its own held-out samples, and the group's: the sample-weighted mean.
      for (const [i, m] of members.entries()) {
        const ev = runs[i]!.localEvaluation!;
        const own = await countCorrect(runs[i]!.ddp.model, m.data.heldOut!);
        expect(ev.own).toEqual({ correct: own, count: m.data.heldOut!.length, accuracy: own / m.data.heldOut!.length });
        expect(ev.ranks.map((r) => r.count).sort((a, b) => a - b)).toEqual([6, 10]);
        const correct = ev.ranks.reduce((a, r) => a + r.correct, 0);
        expect(ev.group).toEqual({ correct, count: 16, accuracy: correct / 16 });
        expect(m.local.filter((e) => e.type === 'local-evaluation').map((e) => e.step)).toEqual([3]);
      }
      const ref = await reference(members, 3, optimizer());
      expect(maxRelativeError(await flatWeights(runs[0]!.ddp.model), ref)).toBeLessThanOrEqual(1e-5);
      await closeAll(runs);
    });
  }

  it('a rank whose samples run out mid-epoch, and one with none at all, take part with zero samples: still exact', async () => {
    const empty = localSamples(0, 9);
    const datas = [localSamples(2, 1), localSamples(30, 2), empty];
    // 2 epochs of 32 samples at 12 per step (3 ranks x 4): 3 steps each.
    const { members, runs } = await train(datas, { min: 3, max: 3, batchSize: 4, epochs: 2, optimizer: () => tf.train.adam(0.01) });
    expect(runs.map((r) => r.steps)).toEqual([6, 6, 6]);
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    const small = members[0]!;
    const sizes = [...lineage(small).values()].map((t) => t.indices.length);
    // Its 2 samples go in the epoch's first steps; then it trains none (its steps still meet the group's).
    expect(sizes).toContain(0);
    expect(sizes.reduce((a, b) => a + b, 0)).toBe(4);
    expect([...lineage(members[2]!).values()].every((t) => t.indices.length === 0)).toBe(true);
    for (const epoch of [0, 1]) for (const m of members) expect(samplesOf(m, epoch)).toEqual(all(m.data.length));
    // The launcher's check of a global order has none to check here: it says nothing rather than something wrong.
    expect(samplesSeen(members.flatMap((m) => m.events))).toEqual([]);
    const ref = await reference(members, 6, tf.train.adam(0.01));
    expect(maxRelativeError(await flatWeights(runs[0]!.ddp.model), ref)).toBeLessThanOrEqual(1e-5);
    await closeAll(runs);
  });
});

/** A member that leaves for good at `step` (a closing tab): its run fails, the others go on. */
class TabClosed extends Error {}

describe('localData, elastic', () => {
  it('a rank that leaves takes its samples (the group is told how many), one that joins brings its own: replicas identical, every sample there trained once', async () => {
    const net = new MemoryNetwork();
    const session = uniqueSession('local-elastic');
    const o = { min: 2, max: 3, batchSize: 4 };
    const datas = [localSamples(40, 1), localSamples(24, 2), localSamples(56, 3)];
    let joiner: LocalMember | undefined;
    const first = datas.map((d, id) =>
      localMember(server.url, net, id, session, d, {
        ...o,
        extra: (ctx) => {
          if (id === 1 && ctx.step === 3) throw new TabClosed(`member 1 closed at step ${ctx.step}`);
          if (id === 0 && ctx.step === 5 && ctx.pg.worldSize === 2 && !joiner)
            joiner = localMember(server.url, net, 3, session, localSamples(16, 4), o);
        },
      }),
    );
    const outcomes = await Promise.allSettled(first.map((m) => m.result));
    expect(outcomes.map((x) => x.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    const late = await joiner!.result;
    const runs = [outcomes[0], outcomes[2]].map((x) => (x as PromiseFulfilledResult<ElasticRunResult>).value).concat(late);
    expect(runs.map((r) => r.worldSize)).toEqual([3, 3, 3]);
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    // The leaver took its samples not yet trained; the group was told how many.
    const gone = first[1]!;
    const leftWith = gone.data.length - samplesOf(gone, 0).length;
    expect(leftWith).toBeGreaterThan(0);
    const told = first[0]!.local.filter((e) => e.type === 'local-counts').map((e) => (e.type === 'local-counts' ? e.left : null));
    // Round 1 (new epoch), round 2 (after the leave), round 3 (the joiner: nobody left).
    expect(told).toEqual([null, leftWith, 0]);
    const joinerCounts = joiner!.local.find((e) => e.type === 'local-counts');
    expect(joinerCounts?.type === 'local-counts' && joinerCounts.joined.filter(Boolean).length).toBe(1);
    // Every sample of the ranks still there, the joiner's included, trained exactly once.
    for (const m of [first[0]!, first[2]!, joiner!]) expect(samplesOf(m, 0)).toEqual(all(m.data.length));
    await closeAll(runs);
  });
});

describe('localData, bad input', () => {
  const shape = { name: 'mine', inputShape: [2], numClasses: 3 };
  it('a label out of range, an input of the wrong length: clear errors, the dataset unchanged', () => {
    expect(() => new LocalDataset({ ...shape, inputs: new Float32Array(2), labels: Int32Array.of(3) })).toThrow(
      /label 3 of sample 0 is outside \[0, 3\)/,
    );
    expect(() => new LocalDataset({ ...shape, inputs: new Float32Array(3), labels: Int32Array.of(0) })).toThrow(
      /3 input floats for 1 labels/,
    );
    const d = new LocalDataset({ ...shape, classNames: ['cat', 'dog', 'bird'], inputs: new Float32Array(0), labels: new Int32Array(0) });
    expect(() => d.add(Float32Array.of(1, 2), 5)).toThrow(/label 5 is not a class of this dataset \(0..2: cat, dog, bird\)/);
    expect(() => d.add(Float32Array.of(1, 2, 3), 0)).toThrow(/a sample of 3 floats, expected 2 .*resize it/);
    expect(d.length).toBe(0);
    for (let i = 0; i < 20; i++) d.add(Float32Array.of(i, -i), i % 3);
    d.remove(0);
    expect(d.length).toBe(19);
    expect(d.countsPerClass()).toEqual([6, 7, 6]);
    expect(d.batch([0]).x).toEqual(Float32Array.of(1, -1));
    expect(() => d.remove(19)).toThrow(DatasetError);
    // A fifth of each class held out, at least one of each class on each side.
    const split = d.withHeldOut(0.2, 3);
    expect([split.countsPerClass(), split.heldOut!.length]).toEqual([[5, 6, 5], 3]);
    expect(() => d.withHeldOut(1)).toThrow(/held-out fraction must be in \[0, 1\), got 1/);
  });

  it('zero samples on every rank: the run ends on every rank saying so; a rank with none beside one with some trains', async () => {
    const outcomes = await Promise.allSettled(
      (await trainSettled([localSamples(0, 1), localSamples(0, 2)], { min: 2, max: 2 })).map((m) => m.result),
    );
    for (const x of outcomes) {
      expect(x.status).toBe('rejected');
      expect((x as PromiseRejectedResult).reason).toBeInstanceOf(DatasetError);
      expect(String((x as PromiseRejectedResult).reason)).toMatch(/no rank of the group holds a sample .*\[0, 0\].*add samples/);
    }
  });

  it('localData with balance, or not a LocalDataset, is refused before joining; samples cannot change while a run trains on them', async () => {
    const d = localSamples(8, 1);
    const net = new MemoryNetwork();
    const m = localMember(server.url, net, 0, uniqueSession('local-bad'), d, { min: 1, max: 1, balance: true });
    await expect(m.result).rejects.toThrow(/balance does not combine with localData/);
    const wrong = localMember(server.url, net, 0, uniqueSession('local-bad'), d, {
      min: 1,
      max: 1,
      localData: { length: 8 } as unknown as LocalDataset,
    });
    await expect(wrong.result).rejects.toThrow(/localData must be a LocalDataset/);
    let refused = '';
    const run = localMember(server.url, net, 1, uniqueSession('local-busy'), d, {
      min: 1,
      max: 1,
      extra: () => {
        try {
          d.add(new Float32Array(INPUT), 0);
        } catch (err) {
          refused = String(err);
        }
      },
    });
    await (await run.result).close();
    expect(refused).toMatch(/cannot add a sample while runElastic trains on it/);
    expect(d.add(new Float32Array(INPUT), 0)).toBe(8);
  });
});

/** Members started at once, not awaited. */
async function trainSettled(datas: LocalDataset[], o: MemberOptions): Promise<LocalMember[]> {
  const net = new MemoryNetwork();
  const session = uniqueSession('local');
  return datas.map((d, id) => localMember(server.url, net, id, session, d, o));
}
