/**
 * How long a run should take, said before it starts (the create form), with what it assumes: the
 * real time depends on each machine, so the form says "about" and gives its step and evaluation
 * times; once training runs, the dashboard's time left comes from the measured steps instead
 * (time_left.ts).
 *
 * Every constant here was measured on 2026-11-28 on this project's test machine kind: 2 cores,
 * no GPU, Debian Chromium's WebGPU on SwiftShader (a CPU implementation: the slow end of a class's
 * computers), with the world the form starts with, 3 tabs on that one computer:
 * `npm run launch -- --nproc 3 --job train --model M --dataset D --steps N --evalEvery K --logEvery 1`,
 * its console lines timed as they arrived. Other work shared the machine, and its load average
 * (1 to 20 during these runs) changes a step's time several times over: these are figures of a
 * busy machine, and an idle one is faster.
 * - Quick demo (mlp on synthetic data, batch 32, 60 steps; load 1): 0.5 s a step, 42 s for the
 *   job, 48 s with the launcher's start (issue 52 saw 58 s from the form).
 * - mlp on MNIST, batch 64 (load 10): 1.1 s a step; evaluating the 10,000 test samples (3,334 a
 *   tab): 31 s; 40 steps evaluated at 20 and 40 took 138 s.
 * - cnn on MNIST, batch 64 (load 20): 22 s a step (the first 114 s), 0.35 s per test sample a
 *   tab; half of that is assumed, the mlp's figures being from a machine half as busy.
 * - lm on the text, batch 16 windows of 64 characters (load 15 to 19): 46 s a step (the first
 *   116 s), and an evaluation of 105 windows a tab over 76 s; issue 52 saw about 30 min for the
 *   defaults' 60 steps and evaluation: 30 s a step is assumed.
 * One tab alone on such a computer takes about 0.4 of the time of three, two tabs 0.7; more
 * than three tabs are assumed to be on several computers, so each step costs what three cost.
 */
import type { DatasetKind, ModelKind, TrainConfig } from '../../src/jobs/train_config.ts';
import { fmtDuration, fmtInt } from './format.ts';

/** A model on a dataset, with 3 tabs on one 2-core computer. */
interface Cost {
  /** Seconds per step at `batch` samples per tab. */
  step: number;
  batch: number;
  /** Seconds per test sample a tab evaluates. */
  evalPerSample: number;
}

const COSTS: Readonly<Record<'mlp/synthetic' | 'mlp/mnist' | 'cnn/mnist' | 'lm/text', Cost>> = {
  'mlp/synthetic': { step: 0.5, batch: 32, evalPerSample: 0.003 },
  'mlp/mnist': { step: 1.1, batch: 64, evalPerSample: 31 / 3334 },
  'cnn/mnist': { step: 10, batch: 64, evalPerSample: 0.15 },
  'lm/text': { step: 30, batch: 16, evalPerSample: 0.75 },
};

/** The cost of a job's model on its data: the host's own model or data count as the nearest built-in one. */
function costOf(model: ModelKind, dataset: DatasetKind): Cost {
  if (model === 'lm') return COSTS['lm/text'];
  if (model === 'cnn') return COSTS['cnn/mnist'];
  return dataset === 'synthetic' ? COSTS['mlp/synthetic'] : COSTS['mlp/mnist'];
}

/** Share of a step that does not grow with the batch (dispatches, the all-reduce, the optimizer). */
const FIXED_SHARE = 0.3;

/** A step's time with fewer tabs on the computer, against three's. */
const TAB_SHARE = [0.4, 0.7, 1] as const;

/** A step's seconds at `batch` samples per tab, with 3 tabs on one 2-core computer. */
function stepAt(cost: Cost, batch: number): number {
  return cost.step * (FIXED_SHARE + ((1 - FIXED_SHARE) * batch) / cost.batch);
}

/**
 * Seconds to evaluate one test sample per second of a training step, for the dashboard's time
 * left before an evaluation was timed: both scale alike with the computer and its load.
 */
export function evalPerStepSecond(model: ModelKind, dataset: DatasetKind, batch: number): number {
  const cost = costOf(model, dataset);
  return cost.evalPerSample / stepAt(cost, batch);
}

/** Training and test samples, as the trainer loads them (synthetic: 4096 + 1024 by default). */
export const DATASET_SIZE: Readonly<Record<DatasetKind, { train: number; test: number }>> = {
  mnist: { train: 60_000, test: 10_000 },
  synthetic: { train: 4096, test: 1024 },
  // The host's own data: its size is the server's (GET /api/offer); 9 in 10 samples train.
  user: { train: 900, test: 100 },
  // Windows of 64 characters: the first 90% of the text trains, the rest tests.
  text: { train: 2835, test: 315 },
  // Each tab's own pictures: a class's few dozen per tab, 1 in 5 held out.
  local: { train: 240, test: 60 },
};

/** From opening the page to the first step: loading the data (MNIST over the network), compiling shaders. */
const START_SECONDS: Readonly<Record<DatasetKind, number>> = { mnist: 20, synthetic: 8, text: 15, user: 20, local: 8 };

export interface RunEstimate {
  /** Steps of the whole run (every rank takes each of them). */
  steps: number;
  /** Test-set evaluations during and at the end of the run. */
  evals: number;
  seconds: number;
  /** What it assumes: a step's and an evaluation's seconds on this project's test machine. */
  stepSeconds: number;
  evalSeconds: number;
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
  // The trainer evaluates at each epoch end, every evalEvery steps, and once at the end: a step
  // that is several of these evaluates once.
  const every = c.evalEvery;
  const both = every > 0 ? Math.floor(steps / lcm(every, perEpoch)) : 0;
  const periodic = every > 0 ? Math.floor(steps / every) : 0;
  const last = steps % perEpoch === 0 || (every > 0 && steps % every === 0);
  const evals = Math.floor(steps / perEpoch) + periodic - both + (last ? 0 : 1);
  const cost = costOf(c.model, c.dataset);
  const share = TAB_SHARE[Math.min(c.max, TAB_SHARE.length) - 1]!;
  const stepSeconds = share * stepAt(cost, c.batchSize);
  const test = c.testSize > 0 ? Math.min(c.testSize, size.test) : size.test;
  const evalSeconds = cost.evalPerSample * share * Math.ceil(test / c.max);
  // The first step compiles the model's shaders: about one more step.
  const seconds = START_SECONDS[c.dataset] + (steps + 1) * stepSeconds + evals * evalSeconds;
  return { steps, evals, seconds, stepSeconds, evalSeconds, text: `about ${fmtApprox(seconds)}` };
}

/** A duration rounded as a person would guess it: "30 s", "4 min", "1 h 20 min". */
export function fmtApprox(seconds: number): string {
  if (seconds < 60) return `${Math.max(10, Math.round(seconds / 10) * 10)} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  const m = Math.round(seconds / 600) * 10;
  return m % 60 === 0 ? `${m / 60} h` : fmtDuration(m * 60);
}

/** The form's sentence under the estimate, with what it assumes. */
export function estimateSentence(c: TrainConfig): string {
  const e = estimateRun(c);
  const tabs = c.max === 1 ? 'one tab' : `${c.max} tabs`;
  const fewer = c.min < c.max ? ' (longer with fewer)' : '';
  const where =
    c.max === 1
      ? 'one tab on a 2-core computer'
      : c.max === 2
        ? 'two tabs on one 2-core computer'
        : 'up to three tabs on each 2-core computer';
  const evals = e.evals === 1 ? 'the test-set evaluation' : `each of ${e.evals} test-set evaluations`;
  return `Estimated duration: ${e.text} for ${fmtInt(e.steps)} steps with ${tabs}${fewer}. It assumes ${fmtStep(e.stepSeconds)} a step and ${fmtStep(e.evalSeconds)} for ${evals}, as measured with ${where} without a GPU; a GPU is faster, and the dashboard shows the time left from the run's own steps.`;
}

/** "0.5 s", "12 s", "1 min 05 s". */
function fmtStep(seconds: number): string {
  return seconds < 10 ? `${Math.max(0.1, Math.round(seconds * 10) / 10)} s` : fmtDuration(seconds);
}

function lcm(a: number, b: number): number {
  const gcd = (x: number, y: number): number => (y === 0 ? x : gcd(y, x % y));
  return (a / gcd(a, b)) * b;
}
