/**
 * Evaluation without sharing data (runElastic's `localData` with `heldOut`): each rank counts
 * what the model gets right on its own held-out samples, and the ranks gather [correct, count]
 * through the server (each row placed at its sender's rank: a member speaks only for itself; a
 * sum all-reduce would let any member write any rank's figures). The group's accuracy is the
 * sample-weighted mean: all correct over all counted.
 */
import * as tf from '@tensorflow/tfjs';
import type { ProcessGroup } from '../c10d/process_group.ts';
import type { Dataset } from '../datasets/dataset.ts';
import { MAX_LOCAL_SAMPLES } from '../datasets/local.ts';

export interface Accuracy {
  correct: number;
  count: number;
  /** correct / count; null without samples. */
  accuracy: number | null;
}

export interface LocalEvaluation {
  /** This rank's accuracy on its own held-out samples. */
  own: Accuracy;
  /** Every rank's, in rank order (each as the rank itself said). */
  ranks: Accuracy[];
  /** The group's: the sample-weighted mean over every rank's held-out samples. */
  group: Accuracy;
}

const accuracyOf = (correct: number, count: number): Accuracy => ({ correct, count, accuracy: count > 0 ? correct / count : null });

/** How many of `data`'s samples `model` classifies right (argmax of its outputs), in batches of `batchSize`. */
export async function countCorrect(model: tf.LayersModel, data: Dataset, batchSize = 256): Promise<number> {
  let correct = 0;
  for (let from = 0; from < data.length; from += batchSize) {
    const indices = Array.from({ length: Math.min(batchSize, data.length - from) }, (_, i) => from + i);
    const { x, y } = data.batch(indices);
    const predicted = tf.tidy(() => (model.predict(tf.tensor(x, [indices.length, ...data.inputShape])) as tf.Tensor).argMax(-1));
    const values = await predicted.data();
    predicted.dispose();
    for (let i = 0; i < indices.length; i++) if (values[i] === y[i]) correct++;
  }
  return correct;
}

/**
 * Every rank calls it at the same point (a collective): this rank's accuracy on `heldOut` (none:
 * 0 of 0) and every rank's and the group's. A row that is not two sane counts is a rank that
 * counted nothing.
 */
export async function evaluateLocal(pg: ProcessGroup, model: tf.LayersModel, heldOut: Dataset | null): Promise<LocalEvaluation> {
  const count = heldOut?.length ?? 0;
  const correct = heldOut && count > 0 ? await countCorrect(model, heldOut) : 0;
  const rows = await pg.gatherRows([correct, count]);
  const ranks = rows.map((row) => {
    const [c, n] = row;
    const sane = row.length === 2 && Number.isSafeInteger(c) && Number.isSafeInteger(n) && c! >= 0 && c! <= n! && n! <= MAX_LOCAL_SAMPLES;
    return sane ? accuracyOf(c!, n!) : accuracyOf(0, 0);
  });
  const sum = ranks.reduce((a, r) => ({ correct: a.correct + r.correct, count: a.count + r.count }), { correct: 0, count: 0 });
  return { own: accuracyOf(correct, count), ranks, group: accuracyOf(sum.correct, sum.count) };
}
