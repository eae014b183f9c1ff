/**
 * How long a run should take, said before it starts (the create form). A rough figure on
 * purpose: the real time depends on each machine, so the page says "about" and "estimate", and
 * once training runs the dashboard's time left comes from measured steps instead.
 *
 * Every constant of the estimate is here. They were measured with this project's launcher on a
 * 2-core machine without a GPU, Chromium's WebGPU running on SwiftShader (a CPU implementation,
 * the slow end of what a class's computers have), one tab, batch 64, MNIST
 * (`npm run launch -- --nproc 1 --job train --model mlp|cnn --steps 20 --eval-every 10 --logEvery 1`,
 * timing the console lines):
 * - MLP: 0.2 s per step alone; 0.35-0.55 s at batch 32-64 with a few tabs sharing a machine,
 *   which is what the estimate assumes. Evaluating the 10,000 test samples: 12 s.
 * - CNN: 3.2 s per step alone, about 15 times the MLP; evaluating the test set: 7 minutes.
 * - From opening the page to the first step (loading MNIST, compiling shaders): about 5 s alone.
 */
import type { DatasetKind, ModelKind, TrainConfig } from '../../src/jobs/train_config.ts';
import { fmtDuration, fmtInt } from './format.ts';

/** Seconds per step: a fixed cost plus a cost per sample of the per-rank batch. */
const STEP_SECONDS: Readonly<Record<ModelKind, { base: number; perSample: number }>> = {
  // 0.35 s at batch 32 and 0.55 s at batch 64.
  mlp: { base: 0.15, perSample: 0.2 / 32 },
  // 3.2 s at batch 64 for one tab alone; a little more when tabs share a machine.
  cnn: { base: 0.3, perSample: 3.2 / 64 },
  // The host's own model: unknown until it is loaded; estimated as the MLP.
  user: { base: 0.15, perSample: 0.2 / 32 },
  // The language model on windows of 64 characters (see LM_STEP in this file's measurements).
  lm: { base: 0.3, perSample: 0.05 },
};

/** Training and test samples, as the trainer loads them (synthetic: 4096 + 1024 by default). */
export const DATASET_SIZE: Readonly<Record<DatasetKind, { train: number; test: number }>> = {
  mnist: { train: 60_000, test: 10_000 },
  synthetic: { train: 4096, test: 1024 },
  // The host's own data: its size is the server's (GET /api/offer); 9 in 10 samples train.
  user: { train: 900, test: 100 },
  // Windows of 64 characters: the first 90% of the text trains, the rest tests.
  text: { train: 2835, test: 315 },
};

/** Seconds to evaluate 1,000 test samples, split among the ranks. */
const EVAL_SECONDS_PER_1000: Readonly<Record<ModelKind, number>> = { mlp: 1.2, cnn: 42, lm: 17, user: 1.2 };

/** Loading the data and compiling shaders before the first step (MNIST comes over the network). */
const START_SECONDS: Readonly<Record<DatasetKind, number>> = { mnist: 10, synthetic: 3, text: 5, user: 10 };

export interface RunEstimate {
  /** Steps of the whole run (every rank takes each of them). */
  steps: number;
  /** Test-set evaluations during and at the end of the run. */
  evals: number;
  seconds: number;
  /** "about 4 min" */
  text: string;
}

/** Steps in one epoch with `world` ranks: torch's DistributedSampler pads each rank's share. */
export function stepsPerEpoch(datasetSize: number, world: number, batchSize: number): number {
  return Math.ceil(Math.ceil(datasetSize / world) / batchSize);
}

/** The estimate for a job, run with its largest number of tabs. */
export function estimateRun(c: TrainConfig): RunEstimate {
  const size = DATASET_SIZE[c.dataset];
  const train = c.trainSize > 0 ? Math.min(c.trainSize, c.dataset === 'mnist' ? size.train : c.trainSize) : size.train;
  const perEpoch = stepsPerEpoch(train, c.max, c.batchSize);
  const steps = c.steps ?? perEpoch * c.epochs;
  const epochEnds = Math.floor(steps / perEpoch);
  const periodic = c.evalEvery > 0 ? Math.floor(steps / c.evalEvery) : 0;
  // The trainer evaluates at each epoch end, every evalEvery steps, and once at the end.
  const evals = Math.max(1, epochEnds + periodic + (steps % perEpoch === 0 ? 0 : 1));
  const step = STEP_SECONDS[c.model];
  const evalSeconds = (EVAL_SECONDS_PER_1000[c.model] * size.test) / 1000 / c.max;
  const seconds = START_SECONDS[c.dataset] + steps * (step.base + step.perSample * c.batchSize) + evals * evalSeconds;
  return { steps, evals, seconds, text: `about ${fmtApprox(seconds)}` };
}

/** A duration rounded as a person would guess it: "30 s", "4 min", "1 h 20 min". */
export function fmtApprox(seconds: number): string {
  if (seconds < 60) return `${Math.max(10, Math.round(seconds / 10) * 10)} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  const m = Math.round(seconds / 600) * 10;
  return m % 60 === 0 ? `${m / 60} h` : fmtDuration(m * 60);
}

/** The form's sentence under the estimate. */
export function estimateSentence(c: TrainConfig): string {
  const e = estimateRun(c);
  const tabs = c.max === 1 ? 'one tab' : `${c.max} tabs`;
  const fewer = c.min < c.max ? ' (longer with fewer)' : '';
  return `Estimated duration: ${e.text} for ${fmtInt(e.steps)} steps with ${tabs}${fewer}. A rough estimate for computers without a GPU; with one it is faster, and the dashboard shows the time left as it goes.`;
}
