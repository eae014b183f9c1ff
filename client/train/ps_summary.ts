/**
 * A parameter-server run's end on this tab: the evaluation after the run, the workers' rates
 * gathered, the probe, and the summary with the run's roles, versions, samples and staleness.
 */
import * as tf from '@tensorflow/tfjs';
import { isRecoverable, type ParameterServerRunResult } from '../../src/index.ts';
import { hashFloat32 } from '../../src/wire/hash.ts';
import { slowFactor } from '../../src/runtime/straggler.ts';
import { flatTrainableWeights } from '../../src/parallel/replicas.ts';
import { encodeValue } from '../../src/wire/protocol.ts';
import { linkReport } from '../report.ts';
import { evaluateAfterRun } from './evaluation.ts';
import type { StartedJob, TrainerOptions, TrainResult } from './harness.ts';
import { probeOf } from './job_options.ts';
import type { TrainConfig } from '../../src/jobs/train_config.ts';
import type { TrainJobResult } from '../../src/jobs/job_report.ts';

/** This worker's figures: its steps after the first (which compiles shaders) are timed. */
export type WorkerFigures = {
  steps: number;
  samples: number;
  timedSamples: number;
  firstStepEnd: number;
  lastStepEnd: number;
  slowed: number;
  compute: number;
  loss: number;
};

/** What the summary reads of a parameter-server run on this tab (PsTrainer keeps it): the job, the strategy and this rank's figures. */
export interface PsRunRecord {
  readonly config: TrainConfig;
  readonly opts: TrainerOptions;
  readonly job: StartedJob;
  readonly emit: TrainerOptions['emit'];
  /** performance.now() when the trainer was made, and when training started (0: not yet). */
  readonly started: number;
  readonly trainingStarted: number;
  readonly strategy: 'central' | 'async';
  readonly mine: Readonly<WorkerFigures>;
  readonly tensorCounts: readonly number[];
}

export async function psResult(t: PsRunRecord, run: ParameterServerRunResult): Promise<TrainResult> {
  const { config, emit, mine, tensorCounts, trainingStarted, started } = t;
  const { flags } = t.opts;
  const { testSet, backend } = t.job;
  const { pg } = run;
  if (run.stoppedBy === 'request') emit({ type: 'stopped', by: pg.rank, atStep: run.versions[0] ?? 0 });
  // The collectives after the run: a tab closed as it ended costs figures, not the run.
  const warn = (message: string) => emit({ type: 'log', level: 'warn', message });
  const final = await evaluateAfterRun(pg, run.model, testSet, warn);
  // The epoch just completed (virtual epochs: samples handed out over the dataset's size).
  emit({ type: 'eval', epoch: Math.max(0, run.samples.epoch - 1), step: run.versions[0] ?? 0, ...final });
  // The workers' throughput together: each worker's samples after its first step over the time they took.
  const elapsed = mine.lastStepEnd - mine.firstStepEnd;
  const own = Float32Array.of(
    run.role === 'worker' && elapsed > 0 ? (mine.timedSamples / elapsed) * 1000 : 0,
    trainingStarted > 0 ? (performance.now() - trainingStarted) / 1000 : 0,
  );
  const { workerRates, trainSeconds } = await gatherRates(pg, own, warn);
  const weights = await flatTrainableWeights(run.model);
  const probe = await probeOf(run.model, testSet);
  const links = await linkReport(pg);
  const processed = run.samples.applied + run.samples.stale;
  const summary: TrainJobResult = {
    rank: pg.rank,
    worldSize: pg.worldSize,
    backend: backend.backend,
    model: config.model,
    dataset: config.dataset,
    // Steps: updates of server 0 (a synchronous step each, with CentralStorage).
    steps: run.versions[0] ?? 0,
    epochs: run.samples.epoch,
    samplesPerSec: workerRates.length > 0 ? workerRates.reduce((a, b) => a + b, 0) : null,
    // Samples processed (applied or dropped as stale) over the whole training time, first steps included.
    samplesPerSecWall: trainSeconds > 0 ? processed / trainSeconds : null,
    // A worker's last batch loss; servers compute none.
    ...(run.role === 'worker' ? { finalLoss: mine.loss } : {}),
    testAccuracy: final.testAccuracy,
    testLoss: final.testLoss,
    ...(config.model === 'lm' ? { perplexity: Math.exp(final.testLoss) } : {}),
    weightHash: hashFloat32(weights),
    ...(run.role === 'worker'
      ? {
          breakdownMs: {
            compute: mine.steps > 0 ? mine.compute / mine.steps : null,
            ...(config.slow !== null ? { slowed: mine.steps > 0 ? mine.slowed / mine.steps : null } : {}),
          },
        }
      : {}),
    ...(config.slow !== null
      ? { slowFactor: slowFactor(config.slow, pg.rank), slowedMs: mine.steps > 0 ? mine.slowed / mine.steps : null }
      : {}),
    seconds: (performance.now() - started) / 1000,
    generations: run.generations,
    liveTensors: {
      steps: tensorCounts.length,
      min: tensorCounts.length ? Math.min(...tensorCounts) : tf.memory().numTensors,
      max: tensorCounts.length ? Math.max(...tensorCounts) : tf.memory().numTensors,
    },
    parameterServer: parameterServerFigures(t, run, elapsed),
    links,
    ...(run.stoppedBy === 'request' ? { stoppedBy: pg.rank } : {}),
    ...(flags.returnWeights && pg.rank === 0
      ? { weights: encodeValue(new Uint8Array(weights.buffer, weights.byteOffset, weights.byteLength)) }
      : {}),
  };
  emit({ type: 'done', summary });
  return { summary, model: run.model, pg, close: run.close, probe };
}

/** The workers' throughput together (each one's samples after its first step over the time they took), and the longest training time of any rank. */
async function gatherRates(
  pg: ParameterServerRunResult['pg'],
  own: Float32Array,
  warn: (message: string) => void,
): Promise<{ workerRates: number[]; trainSeconds: number }> {
  const rates = await pg.allGather(own).catch((err: unknown) => {
    if (!isRecoverable(err)) throw err;
    warn(`The workers' rates were not gathered after the run (${(err as Error).message}): this rank's own only`);
    return own;
  });
  const workerRates: number[] = [];
  let trainSeconds = 0;
  for (let r = 0; r < rates.length / 2; r++) {
    if (rates[2 * r]! > 0) workerRates.push(rates[2 * r]!);
    trainSeconds = Math.max(trainSeconds, rates[2 * r + 1]!);
  }
  return { workerRates, trainSeconds };
}

/** The summary's parameter-server part: roles, versions, pushes and staleness, and (a worker) its own figures. */
function parameterServerFigures(t: PsRunRecord, run: ParameterServerRunResult, elapsed: number): TrainJobResult['parameterServer'] {
  const { config, mine, strategy } = t;
  const histogram = run.shard?.stalenessHistogram ?? run.worker?.stalenessHistogram ?? [];
  const pushes = run.shard
    ? { applied: run.shard.applied, stale: run.shard.stale, duplicate: run.shard.duplicate, refused: run.shard.refused }
    : { applied: run.worker?.applied ?? 0, stale: run.worker?.stale ?? 0, duplicate: 0, refused: run.worker?.refused ?? 0 };
  return {
    strategy,
    role: run.role,
    index: run.index,
    servers: run.servers,
    workers: run.workers,
    versions: run.versions,
    updatesPerSec: run.shard?.updatesPerSec ?? null,
    samples: run.samples,
    pushes,
    staleness: stalenessSummary(histogram),
    maxStaleness: config.maxStaleness,
    stalenessLr: config.stalenessLr,
    checkpoints: run.checkpoints,
    restoredFrom: run.restoredFrom,
    ...(run.worker
      ? {
          worker: {
            workerId: run.worker.workerId,
            pulls: run.worker.pulls,
            pushes: run.worker.pushes,
            samples: run.worker.samples,
            samplesPerSec: elapsed > 0 ? (mine.timedSamples / elapsed) * 1000 : null,
          },
        }
      : {}),
  };
}

/** Mean, median, 90th percentile and largest staleness of a histogram (the last bucket counts as its own value). */
export function stalenessSummary(histogram: number[]): {
  histogram: number[];
  mean: number | null;
  p50: number | null;
  p90: number | null;
  max: number | null;
} {
  const total = histogram.reduce((a, b) => a + b, 0);
  if (total === 0) return { histogram, mean: null, p50: null, p90: null, max: null };
  const quantile = (q: number) => {
    let seen = 0;
    for (let s = 0; s < histogram.length; s++) {
      seen += histogram[s]!;
      if (seen >= q * total) return s;
    }
    return histogram.length - 1;
  };
  let max = 0;
  histogram.forEach((n, s) => {
    if (n > 0) max = s;
  });
  return { histogram, mean: histogram.reduce((a, n, s) => a + n * s, 0) / total, p50: quantile(0.5), p90: quantile(0.9), max };
}
