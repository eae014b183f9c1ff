/**
 * runElastic's localData (datasets/local.ts): every rank trains on its own samples and the
 * group on their union, exactly. In Node (TF.js cpu backend, in-memory links, the real server):
 * ranks with 5 and 27 samples per step equal one model trained on the union's batch (SGD and
 * Adam); a rank whose samples run out mid-epoch (and one with none) takes part with zero samples
 * and the run stays exact; a rank that leaves takes its samples (the group is told how many) and
 * one that joins brings its own, the replicas identical and every sample of the data still there
 * trained once. Bad input gets a clear error.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { DatasetError } from '../src/datasets/dataset.ts';
import { LocalDataset } from '../src/datasets/local.ts';
import { splitByRemaining } from '../src/elastic/local_epoch.ts';
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
  server = await withServer({ settleMs: 300 });
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
function reference(members: LocalMember[], steps: number, optimizer: tf.Optimizer): Float32Array {
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
  const w = flatWeights(model);
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
  });

  for (const [name, optimizer] of [
    ['SGD', () => tf.train.sgd(0.1)],
    ['Adam', () => tf.train.adam(0.01)],
  ] as const) {
    it(`2 ranks with 5 and 27 samples per step train the weights one model trains on the union's batch (${name})`, async () => {
      const datas = [localSamples(15, 1), localSamples(81, 2)];
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
      const ref = reference(members, 3, optimizer());
      expect(maxRelativeError(flatWeights(runs[0]!.ddp.model), ref)).toBeLessThanOrEqual(1e-5);
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
    const ref = reference(members, 6, tf.train.adam(0.01));
    expect(maxRelativeError(flatWeights(runs[0]!.ddp.model), ref)).toBeLessThanOrEqual(1e-5);
    await closeAll(runs);
  });
});
