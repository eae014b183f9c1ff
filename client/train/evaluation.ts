/**
 * The test-set evaluation of the built-in training job: every rank evaluates its share of the test
 * set and the totals are all-reduced, so each sample counts once; the evaluation after the run
 * reports its progress and stops between batches when the host skips it.
 */
import * as tf from '@tensorflow/tfjs';
import { fetchBatch, isRecoverable, type Dataset, type ProcessGroup } from '../../src/index.ts';
import { correctPredictions } from '../../src/nn/losses.ts';
import { labelsPerSample } from '../../src/datasets/dataset.ts';
import { yieldToEventLoop } from '../../src/runtime/ticker.ts';
import type { TrainEvent } from './events.ts';

/** The most labels (predictions) an evaluation batch holds: one batch runs between two yields to the page. */
const EVAL_LABELS_PER_BATCH = 1024;

/** A batch's labels as a tensor [n, ...targetShape] (one per sample, or one per position of a text window). */
export function labelsTensor(set: Dataset, y: Int32Array, n: number): tf.Tensor {
  return tf.tensor(y, [n, ...(set.targetShape ?? [])], 'int32');
}

/** The right predictions and the summed loss of a batch's logits against its labels, as a tensor [2]. */
export function labelTotals(logits: tf.Tensor, ys: tf.Tensor, numClasses: number): tf.Tensor1D {
  return tf.tidy(() => {
    const flat = logits.reshape([-1, numClasses]);
    const loss = tf.losses.softmaxCrossEntropy(
      tf.oneHot(ys.reshape([-1]).toInt() as tf.Tensor1D, numClasses),
      flat,
      undefined,
      undefined,
      tf.Reduction.SUM,
    );
    return tf.stack([correctPredictions(logits, ys), loss as tf.Scalar]) as tf.Tensor1D;
  });
}

/** Test accuracy and loss per label (a language model's per character), each rank evaluating its share of the test set; sums all-reduced. */
export async function evaluate(
  pg: ProcessGroup,
  model: tf.LayersModel,
  test: Dataset,
): Promise<{ testAccuracy: number; testLoss: number }> {
  const totals = await shareTotals(model, test, pg.rank, pg.worldSize);
  await pg.allReduce(totals, 'sum');
  return figuresOf(totals);
}

/** The evaluation after the run: its progress, and whether the host skipped it (polled between batches). */
export interface FinalEvalHooks {
  progress?(done: number, total: number): void;
  skipped?(): boolean;
}

/**
 * `evaluate` once training is over. A rank lost now (a tab closed as the run ended) takes nothing
 * from a run that completed, so instead of failing, this rank evaluates the whole test set alone
 * and says why; errors that are not a lost rank still fail. null when the host skipped it: a rank
 * that hears the skip stops its share and says so in the all-reduce (a fourth figure), so every
 * rank reaches the same answer at once, whichever heard it first.
 */
export async function evaluateAfterRun(
  pg: ProcessGroup,
  model: tf.LayersModel,
  test: Dataset,
  warn: (message: string) => void,
): Promise<{ testAccuracy: number; testLoss: number }> {
  const figures = await evaluateFinal(pg, model, test, warn, {});
  // Without a skipped() hook nothing skips it.
  if (figures === null) throw new Error('the final evaluation was skipped without a skip hook');
  return figures;
}

/** evaluateAfterRun with progress and the host's skip: null when skipped. */
export async function evaluateFinal(
  pg: ProcessGroup,
  model: tf.LayersModel,
  test: Dataset,
  warn: (message: string) => void,
  hooks: FinalEvalHooks,
): Promise<{ testAccuracy: number; testLoss: number } | null> {
  const skipped = () => hooks.skipped?.() === true;
  try {
    const totals = await shareTotals(model, test, pg.rank, pg.worldSize, hooks);
    const all = Float32Array.of(totals[0]!, totals[1]!, totals[2]!, skipped() ? 1 : 0);
    await pg.allReduce(all, 'sum');
    return all[3]! > 0 ? null : figuresOf(all);
  } catch (err) {
    if (!isRecoverable(err)) throw err;
    if (skipped()) return null;
    warn(
      `The group's final evaluation failed after training had ended (${(err as Error).message}): this rank evaluated the whole test set alone`,
    );
    const alone = await shareTotals(model, test, 0, 1, hooks);
    return skipped() ? null : figuresOf(alone);
  }
}

/**
 * evaluateFinal for a trainer, on weights that are final: 'evaluating' says so (the page offers
 * them at once) and how far this rank's share is, about every 5 %; null when it was skipped.
 */
export async function evaluateAndReport(
  pg: ProcessGroup,
  model: tf.LayersModel,
  test: Dataset,
  step: number,
  emit: (e: TrainEvent) => void,
  skipped: () => boolean,
): Promise<{ testAccuracy: number; testLoss: number } | null> {
  const warn = (message: string) => emit({ type: 'log', level: 'warn', message });
  let last = { done: -1, total: 0 };
  const progress = (done: number, total: number) => {
    if (last.done >= 0 && done > last.done && done < total && done - last.done < total / 20) return;
    last = { done, total };
    emit({ type: 'evaluating', step, done, total });
  };
  const figures = await evaluateFinal(pg, model, test, warn, { progress, skipped });
  if (figures !== null) return figures;
  emit({ type: 'evaluating', step, done: Math.max(0, last.done), total: last.total, skipped: true });
  emit({ type: 'log', level: 'info', message: `The evaluation after the run was skipped: no test accuracy for step ${step}` });
  return null;
}

/** Accuracy and mean loss from [correct, loss sum, count]. */
function figuresOf(totals: Float32Array): { testAccuracy: number; testLoss: number } {
  return { testAccuracy: totals[0]! / totals[2]!, testLoss: totals[1]! / totals[2]! };
}

/** The right predictions, the summed loss and the label count of share `rank` of `worldSize` of the test set. */
async function shareTotals(
  model: tf.LayersModel,
  test: Dataset,
  rank: number,
  worldSize: number,
  hooks: FinalEvalHooks = {},
): Promise<Float32Array> {
  const totals = new Float32Array(3); // correct, loss sum, count
  const mine: number[] = [];
  for (let i = rank; i < test.length; i += worldSize) mine.push(i);
  // At most EVAL_LABELS_PER_BATCH labels a batch: a language model's window is 64 of them, and 250
  // windows through its attention held the cpu backend's thread past the heartbeat timeout.
  const batch = Math.max(1, Math.min(250, Math.floor(EVAL_LABELS_PER_BATCH / labelsPerSample(test))));
  hooks.progress?.(0, mine.length);
  for (let s = 0; s < mine.length; s += batch) {
    if (hooks.skipped?.()) break;
    // On the cpu backend each batch holds the main thread: let heartbeats out between batches, or
    // a large test set looks like a frozen page and the server evicts it (a 842k-parameter CNN's
    // 5,000 test images took 13 s).
    if (s > 0) await yieldToEventLoop();
    const idx = mine.slice(s, s + batch);
    const { x, y } = await fetchBatch(test, idx);
    const out = tf.tidy(() => {
      const xs = tf.tensor(x, [idx.length, ...test.inputShape]);
      const logits = model.predict(xs) as tf.Tensor;
      return labelTotals(logits, labelsTensor(test, y, idx.length), test.numClasses);
    });
    const [c, l] = await out.data();
    out.dispose();
    totals[0] += c!;
    totals[1] += l!;
    totals[2] += idx.length * labelsPerSample(test);
    hooks.progress?.(Math.min(mine.length, s + batch), mine.length);
  }
  return totals;
}
