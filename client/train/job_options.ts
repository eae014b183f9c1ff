/**
 * What every strategy's trainer hands its runner alike: the session the tab joins and the job's
 * schedule from its config (one mapping for DDP, the pipeline and the parameter servers); and
 * the probe of a whole trained model.
 */
import * as tf from '@tensorflow/tfjs';
import { fetchBatch, type Dataset } from '../../src/index.ts';
import type { TrainConfig } from '../../src/jobs/train_config.ts';
import type { TrainerOptions } from './harness.ts';

/** The job's schedule (the runners' ScheduleOptions): the DistributedSampler's settings and the run's length. */
export function jobSchedule(config: Pick<TrainConfig, 'batchSize' | 'epochs' | 'steps' | 'shuffle' | 'seed'>, datasetLength: number) {
  return {
    datasetLength,
    batchSize: config.batchSize,
    epochs: config.epochs,
    steps: config.steps,
    shuffle: config.shuffle,
    seed: config.seed,
  };
}

/**
 * The session the tab joins and how it stops (the rendezvous options every runner takes), but
 * its token: a getter each trainer keeps in its own options (a spread would copy today's value).
 */
export function jobSession(opts: TrainerOptions) {
  return {
    url: opts.serverUrl,
    session: opts.session,
    onToken: opts.onToken,
    onRendezvous: opts.onRendezvous,
    timeoutMs: opts.timeoutMs,
    store: opts.store,
    ...(opts.host === undefined ? {} : { host: opts.host }),
    shouldStop: opts.stopRequested,
  };
}

/** What `model` predicts on the first test samples (at most 8): the page's check of the trained model. */
export async function probeOf(
  model: tf.LayersModel,
  testSet: Dataset,
): Promise<{ inputs: Float32Array; inputShape: number[]; logits: Float32Array }> {
  const probeCount = Math.min(8, testSet.length);
  // A tab with no test samples of its own (dataset local, no pictures held out) has nothing to probe.
  if (probeCount === 0) return { inputs: new Float32Array(0), inputShape: testSet.inputShape, logits: new Float32Array(0) };
  const probeBatch = await fetchBatch(
    testSet,
    Array.from({ length: probeCount }, (_, i) => i),
  );
  const logitsT = tf.tidy(() => model.predict(tf.tensor(probeBatch.x, [probeCount, ...testSet.inputShape])) as tf.Tensor);
  const logits = (await logitsT.data()) as Float32Array;
  logitsT.dispose();
  return { inputs: probeBatch.x, inputShape: testSet.inputShape, logits };
}
