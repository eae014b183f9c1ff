/**
 * runElastic's 'aggregation' events (src/parallel/ddp/contributions.ts), in Node (TF.js cpu backend,
 * in-memory links, the real server): after each robust DDP step, and after each of DiLoCo's
 * robust outer steps, every rank reports the same compact judgments of every rank's
 * contribution, once per aggregation; the hostile rank's norm stands out, and the tally the page
 * reports in its result says so too. A run under the mean reports none.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import { runElastic, type ElasticRunOptions } from '../src/parallel/ddp/runner.ts';
import { summarizeContributions, tallyContributions, type ContributionTally } from '../src/parallel/ddp/contributions.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { SGD } from '../src/nn/optim.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
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

const data = syntheticDataset({ length: 512, inputSize: 16, numClasses: 4, seed: 3 });
const mlp = () => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 7 });
type Aggregated = Extract<ElasticEvent, { type: 'aggregation' }>;

/** 3 ranks train `steps` steps with `extra` options; each rank's 'aggregation' events. */
async function run(extra: Pick<ElasticRunOptions, 'ddp' | 'diloco'>, steps: number): Promise<Aggregated[][]> {
  const session = uniqueSession('robust-events');
  const net = new MemoryNetwork();
  const events: Aggregated[][] = [[], [], []];
  const results = await Promise.all(
    [0, 1, 2].map((rank) =>
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
        steps,
        seed: 1,
        ...extra,
        onEvent: (e) => {
          if (e.type === 'aggregation') events[rank]!.push(e);
        },
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
  await Promise.all(results.map((r) => r.close()));
  return events;
}

/** The events as every rank would report them, without who reported. */
const judged = (es: Aggregated[]) => es.map(({ rank: _rank, ...rest }) => rest);

describe("runElastic's aggregation events", () => {
  it('a robust DDP run: one event per step on every rank, the same on each, the scaled rank far above the median norm', async () => {
    const events = await run({ ddp: { aggregation: { kind: 'trimmed-mean', trim: 1 }, attack: { kind: 'scale', attackers: 1 } } }, 4);
    for (const [rank, es] of events.entries()) {
      expect(es.map((e) => [e.rank, e.step, e.of, e.kind, e.used])).toEqual(
        [1, 2, 3, 4].map((step) => [rank, step, 'gradients', 'trimmed-mean', 3]),
      );
    }
    expect(judged(events[1]!)).toEqual(judged(events[0]!));
    expect(judged(events[2]!)).toEqual(judged(events[0]!));
    for (const e of events[0]!) {
      const [honest0, honest1, hostile] = e.ranks;
      expect(e.ranks.map((r) => r.status)).toEqual(['used', 'used', 'used']);
      // The attack scales by 1000 (attacks.ts's default): the median is an honest norm.
      expect(hostile!.normRatio).toBeGreaterThan(100);
      // Of 3 norms the median is the larger honest one.
      expect(Math.max(honest0!.normRatio!, honest1!.normRatio!)).toBe(1);
      expect(hostile!.trimmed).toBeGreaterThan(0.9);
      expect(e.ranks.every((r) => r.clipScale === 1)).toBe(true);
      // Rounded: 3 significant digits and 3 decimals, small in JSON.
      expect(JSON.stringify(e).length).toBeLessThan(600);
    }
    // What the page's result reports from them (client/train/contributions.ts).
    let tally: ContributionTally | null = null;
    for (const { type: _t, rank: _r, ...e } of events[0]!) tally = tallyContributions(tally, e);
    const summary = summarizeContributions(tally!);
    expect(summary).toMatchObject({ kind: 'trimmed-mean', of: 'gradients', aggregations: 4, fromStep: 1, toStep: 4 });
    expect(summary.ranks.map((r) => [r.rank, r.refusedSteps, r.absentSteps, r.cutMostSteps])).toEqual([
      [0, 0, 0, 0],
      [1, 0, 0, 0],
      [2, 0, 0, 4],
    ]);
    expect(summary.ranks[2]!.meanNormRatio).toBeGreaterThan(100);
  });

  it('DiLoCo with a robust outer step: an event per outer step, of the pseudo-gradients; a run under the mean reports none', async () => {
    const events = await run(
      { diloco: { syncEvery: 2, aggregation: { kind: 'centered-clip', tau: 'auto' }, attack: { kind: 'scale', attackers: 1 } } },
      4,
    );
    for (const es of events)
      expect(es.map((e) => [e.step, e.of, e.kind])).toEqual([2, 4].map((step) => [step, 'pseudo-gradients', 'centered-clip']));
    expect(judged(events[2]!)).toEqual(judged(events[0]!));
    const hostile = events[0]!.map((e) => e.ranks[2]!);
    expect(hostile.every((r) => r.normRatio! > 100 && r.clipScale < 0.1)).toBe(true);
    const plain = await run({}, 2);
    expect(plain.flat()).toEqual([]);
  });
});
