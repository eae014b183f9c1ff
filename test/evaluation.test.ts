/**
 * The job's evaluation (client/train/evaluation.ts `evaluate`) on real process groups over the real
 * server: the accuracy is the whole test set's, and the page's other tasks (heartbeats, the
 * ticker's messages) run between its batches. On the cpu backend a batch holds the main thread,
 * so a test set evaluated in one go kept a page silent past the heartbeat bound and got it evicted.
 * After the run (`evaluateAfterRun`), a rank lost during the evaluation does not fail the survivor,
 * and the host's skip (`evaluateFinal`), heard by one rank mid-share, ends it on every rank alike.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { buildModel } from '../src/nn/models.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import type { Dataset } from '../src/datasets/dataset.ts';
import { evaluate, evaluateAfterRun, evaluateFinal } from '../client/train/evaluation.ts';
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

/** Ranks 0 and 1 of a fresh session, over in-memory links. */
async function twoRanks(name: string): Promise<ProcessGroup[]> {
  const net = new MemoryNetwork();
  const session = uniqueSession(name);
  return Promise.all(
    [0, 1].map((rank) =>
      initProcessGroup({
        url: server.url,
        session,
        token: tokenFor(session),
        worldSize: 2,
        rank,
        timeoutMs: 5_000,
        linkFactory: net.factoryFor(rank),
      }),
    ),
  );
}

describe('evaluate', () => {
  it('counts every test sample once across the ranks, and lets queued tasks run between its batches', async () => {
    const pgs = await twoRanks('evaluate');
    // 1,000 samples: each rank evaluates 500, in more than one batch.
    const test = syntheticDataset({ length: 1000, inputSize: 16, numClasses: 4, seed: 2 });
    const model = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 1 });
    const before = tf.memory().numTensors;

    // Rank 0's dataset notes, at each batch, whether a message posted as evaluation began (as a
    // heartbeat's timer or the ticker's Worker would post one) has been delivered yet.
    let delivered = false;
    const deliveredAtBatch: boolean[] = [];
    const watched: Dataset = Object.assign(Object.create(test) as Dataset, {
      batch: (idx: number[]) => {
        deliveredAtBatch.push(delivered);
        return test.batch(idx);
      },
    });
    const channel = new MessageChannel();
    channel.port1.onmessage = () => (delivered = true);
    channel.port2.postMessage(0);
    const [r0, r1] = await Promise.all([evaluate(pgs[0]!, model, watched), evaluate(pgs[1]!, model, test)]);
    channel.port1.close();

    expect(deliveredAtBatch.length).toBeGreaterThan(1);
    expect(deliveredAtBatch[0]).toBe(false);
    expect(deliveredAtBatch[1]).toBe(true);
    // Both ranks agree on the whole set's figures, which are those of one pass over it.
    expect(r0).toEqual(r1);
    const correct = tf.tidy(() => {
      const { x, y } = test.batch(Array.from({ length: test.length }, (_, i) => i));
      const logits = model.predict(tf.tensor(x, [test.length, 16])) as tf.Tensor;
      return logits.argMax(-1).equal(tf.tensor1d(y, 'int32')).sum();
    });
    const [whole] = await correct.data();
    correct.dispose();
    expect(r0.testAccuracy).toBeCloseTo(whole! / test.length, 6);
    expect(tf.memory().numTensors).toBe(before);
    model.dispose();
    pgs.forEach((pg) => {
      pg.destroy();
    });
  });

  it('after the run, a rank lost during the evaluation: the survivor evaluates the whole set alone and says so', async () => {
    const pgs = await twoRanks('evaluate-lost');
    const test = syntheticDataset({ length: 600, inputSize: 16, numClasses: 4, seed: 3 });
    const model = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 1 });
    const alone = uniqueSession('evaluate-alone');
    const solo = await initProcessGroup({
      url: server.url,
      session: alone,
      token: tokenFor(alone),
      worldSize: 1,
      rank: 0,
      timeoutMs: 5_000,
    });
    const whole = await evaluate(solo, model, test);
    solo.destroy();
    // Rank 1's tab closes as the run ends: rank 0's all-reduce of its totals loses it.
    pgs[1]!.destroy();
    const warnings: string[] = [];
    const result = await evaluateAfterRun(pgs[0]!, model, test, (m) => warnings.push(m));
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(
      /final evaluation failed after training had ended \(lost rank 1: .*\): this rank evaluated the whole test set alone/,
    );
    // The whole set's figures, as one rank alone gets them.
    expect(result.testAccuracy).toBeCloseTo(whole.testAccuracy, 6);
    expect(result.testLoss).toBeCloseTo(whole.testLoss, 5);
    model.dispose();
    pgs[0]!.destroy();
  });

  it('after the run, a skip heard by one rank mid-share ends the evaluation on both: the same answer, no hang', async () => {
    const pgs = await twoRanks('evaluate-skip');
    // 2,000 samples: 1,000 a rank, in batches of 250, with progress after each.
    const test = syntheticDataset({ length: 2000, inputSize: 16, numClasses: 4, seed: 4 });
    const model = buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 1 });
    const before = tf.memory().numTensors;
    const progress: Array<[number, number]> = [];
    // Rank 0 hears the skip after its second batch; rank 1 never does, and evaluates its whole share.
    const hooks0 = { progress: (done: number, total: number) => progress.push([done, total]), skipped: () => progress.length > 2 };
    const warn = (m: string) => {
      throw new Error(`no warning expected: ${m}`);
    };
    const [r0, r1] = await Promise.all([evaluateFinal(pgs[0]!, model, test, warn, hooks0), evaluateFinal(pgs[1]!, model, test, warn, {})]);
    expect(r0).toBeNull();
    expect(r1).toBeNull();
    expect(progress).toEqual([
      [0, 1000],
      [250, 1000],
      [500, 1000],
    ]);
    // Without a skip, the same call gives the figures (and the group is still in step for it).
    const [f0, f1] = await Promise.all([evaluateFinal(pgs[0]!, model, test, warn, {}), evaluateFinal(pgs[1]!, model, test, warn, {})]);
    expect(f0).toEqual(f1);
    expect(f0!.testAccuracy).toBeGreaterThan(0);
    expect(tf.memory().numTensors).toBe(before);
    model.dispose();
    pgs.forEach((pg) => {
      pg.destroy();
    });
  });
});
