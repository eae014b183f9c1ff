/**
 * The built-in training job with parameter servers: `--strategy ps --ps K` (asynchronous) or
 * `--strategy central` (CentralStorage). The library's `runParameterServer` carries the roles,
 * the pulls and pushes, the leases of the data, the rounds and the shard checkpoints; what is
 * left here is what the plain job does too (data, the model, metrics, evaluation, the
 * dashboard's events) and the figures of a parameter-server run: samples per second of the
 * workers together, the staleness of the pushes, where every sample went.
 */
import * as tf from '@tensorflow/tfjs';
import { classificationLoss, correctPredictions, fetchBatch, flatGradients, labelsPerSample, hashFloat32, isRecoverable, runParameterServer, slowFactor, Straggler, type Json, type PsRunEvent } from '../../src/index.ts';
import { flatTrainableWeights } from '../../src/parallel/replicas.ts';
import { encodeValue } from '../../src/wire/protocol.ts';
import { linkReport } from '../report.ts';
import { fleetReporter } from './fleet_local.ts';
import { evaluateAfterRun, labelsTensor } from './evaluation.ts';
import { startJob, watchLinks, type TrainerOptions, type TrainResult } from './harness.ts';
import type { TrainEvent } from './events.ts';

export async function trainParameterServer(opts: TrainerOptions): Promise<TrainResult> {
  const { config, emit, flags } = opts;
  const started = performance.now();
  const { backend, gpu, trainSet, testSet, newModel } = await startJob(opts);
  const shareFleet = fleetReporter(opts.emit);
  // Every rank builds the whole model alike (one seed, or the host's model's own weights): servers take their shard from it.
  const model = await newModel();
  opts.onModel?.(model);
  const strategy = config.strategy === 'central' ? 'central' : 'async';
  const targetSamples = config.steps !== null ? config.steps * config.batchSize : config.epochs * trainSet.length;

  let straggler = new Straggler(1);
  let rank = -1;
  // This worker's figures: its steps after the first (which compiles shaders) are timed.
  const mine = { steps: 0, samples: 0, timedSamples: 0, firstStepEnd: 0, lastStepEnd: 0, slowed: 0, compute: 0, loss: NaN };
  const tensorCounts: number[] = [];
  let trainingStarted = 0;

  const run = await runParameterServer({
    url: opts.serverUrl,
    session: opts.session,
    // Read at each use (checkpoints): the host's removal of a tab changes it during the run.
    get token() {
      return opts.token;
    },
    onToken: opts.onToken,
    timeoutMs: opts.timeoutMs,
    store: opts.store,
    ...(opts.host === undefined ? {} : { host: opts.host }),
    spectate: opts.spectate ?? false,
    strategy,
    numServers: config.ps,
    min: config.min,
    max: config.max,
    model,
    optimizer: () => (config.optimizer === 'adam' ? tf.train.adam(config.lr) : tf.train.sgd(config.lr)),
    datasetLength: trainSet.length,
    batchSize: config.batchSize,
    epochs: config.epochs,
    steps: config.steps,
    shuffle: config.shuffle,
    seed: config.seed,
    ...(config.maxStaleness === null ? {} : { maxStaleness: config.maxStaleness }),
    scaleLrByStaleness: config.stalenessLr,
    // A lost server resumes from its shard's checkpoint: without one set, it would start over.
    checkpointEvery: config.checkpointEvery > 0 ? config.checkpointEvery : 50,
    checkpointMeta: { config } as unknown as Json,
    shouldStop: opts.stopRequested,
    onRendezvous: opts.onRendezvous,

    async step({ indices, model: m, pg }) {
      const t0 = performance.now();
      trainingStarted ||= t0;
      const factor = slowFactor(config.slow, pg.rank);
      if (straggler.factor !== factor) straggler = new Straggler(factor);
      const { x, y } = await fetchBatch(trainSet, indices);
      const xs = tf.tensor(x, [indices.length, ...trainSet.inputShape]);
      const ys = labelsTensor(trainSet, y, indices.length);
      let correctT: tf.Tensor | undefined;
      let correct = 0;
      let result: { loss: number; grads: Float32Array };
      try {
        result = await flatGradients(m, () => {
          const logits = m.apply(xs, { training: true }) as tf.Tensor;
          correctT = tf.keep(correctPredictions(logits, ys));
          return classificationLoss(logits, ys, trainSet.numClasses);
        });
        correct = (await correctT!.data())[0]!;
      } finally {
        correctT?.dispose();
        xs.dispose();
        ys.dispose();
      }
      const compute = performance.now() - t0;
      // A straggler waits in proportion to its own compute before it pushes.
      const slowed = await straggler.after(compute);
      mine.compute += compute;
      mine.slowed += slowed;
      mine.loss = result.loss;
      return { grads: result.grads, metrics: { loss: result.loss, accuracy: correct / (indices.length * labelsPerSample(trainSet)), compute, slowed } };
    },

    onWorkerStep({ stepId, indices, metrics }) {
      const now = performance.now();
      mine.steps++;
      mine.samples += indices.length;
      if (mine.steps === 1) mine.firstStepEnd = now;
      else mine.timedSamples += indices.length;
      mine.lastStepEnd = now;
      tensorCounts.push(tf.memory().numTensors);
      if (!metrics) return;
      const elapsed = mine.lastStepEnd - mine.firstStepEnd;
      emit({
        type: 'step',
        epoch: 0,
        step: stepId,
        // This worker's share of the run, if the workers keep pace with each other.
        totalSteps: Math.ceil(targetSamples / config.batchSize / Math.max(1, config.max - config.ps)),
        ranks: [
          {
            rank,
            loss: metrics.loss ?? NaN,
            accuracy: metrics.accuracy ?? NaN,
            samplesPerSec: elapsed > 0 ? (mine.timedSamples / elapsed) * 1000 : 0,
            breakdownMs: { compute: metrics.compute ?? 0, readback: 0, allreduce: 0, apply: 0, ...(metrics.slowed ? { slowed: metrics.slowed } : {}) },
          },
        ],
        elapsedSec: (now - started) / 1000,
      });
    },

    onStatus: (s) => emit({ type: 'ps', ...s }),
    onRound: ({ pg }) => {
      rank = pg.rank;
      emit({ type: 'joined', rank: pg.rank, worldSize: pg.worldSize, round: pg.round, backend: backend.backend, fallbackReason: backend.fallbackReason, adapter: gpu.adapter, ...(backend.probe ? { probe: backend.probe } : {}) });
      shareFleet(pg, backend, gpu.adapter);
      watchLinks(pg, emit);
    },
    onEvent: (e) => tellPage(e, emit),
  });

  const { pg } = run;
  if (run.stoppedBy === 'request') emit({ type: 'stopped', by: pg.rank, atStep: run.versions[0] ?? 0 });
  // The collectives after the run: a tab closed as it ended costs figures, not the run.
  const warn = (message: string) => emit({ type: 'log', level: 'warn', message });
  const final = await evaluateAfterRun(pg, run.model, testSet, warn);
  // The epoch just completed (virtual epochs: samples handed out over the dataset's size).
  emit({ type: 'eval', epoch: Math.max(0, run.samples.epoch - 1), step: run.versions[0] ?? 0, ...final });
  // The workers' throughput together: each worker's samples after its first step over the time they took.
  const elapsed = mine.lastStepEnd - mine.firstStepEnd;
  const own = Float32Array.of(run.role === 'worker' && elapsed > 0 ? (mine.timedSamples / elapsed) * 1000 : 0, trainingStarted > 0 ? (performance.now() - trainingStarted) / 1000 : 0);
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
  const weights = await flatTrainableWeights(run.model);
  const probeCount = Math.min(8, testSet.length);
  const probeBatch = await fetchBatch(testSet, Array.from({ length: probeCount }, (_, i) => i));
  const logitsT = tf.tidy(() => run.model.predict(tf.tensor(probeBatch.x, [probeCount, ...testSet.inputShape])) as tf.Tensor);
  const logits = (await logitsT.data()) as Float32Array;
  logitsT.dispose();
  const links = await linkReport(pg);
  const histogram = run.shard?.stalenessHistogram ?? run.worker?.stalenessHistogram ?? [];
  const pushes = run.shard
    ? { applied: run.shard.applied, stale: run.shard.stale, duplicate: run.shard.duplicate, refused: run.shard.refused }
    : { applied: run.worker?.applied ?? 0, stale: run.worker?.stale ?? 0, duplicate: 0, refused: run.worker?.refused ?? 0 };
  const processed = run.samples.applied + run.samples.stale;
  const summary: Record<string, unknown> = {
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
    ...(run.role === 'worker' ? { breakdownMs: { compute: mine.steps > 0 ? mine.compute / mine.steps : null, ...(config.slow !== null ? { slowed: mine.steps > 0 ? mine.slowed / mine.steps : null } : {}) } } : {}),
    ...(config.slow !== null ? { slowFactor: slowFactor(config.slow, pg.rank), slowedMs: mine.steps > 0 ? mine.slowed / mine.steps : null } : {}),
    seconds: (performance.now() - started) / 1000,
    generations: run.generations,
    liveTensors: { steps: tensorCounts.length, min: tensorCounts.length ? Math.min(...tensorCounts) : tf.memory().numTensors, max: tensorCounts.length ? Math.max(...tensorCounts) : tf.memory().numTensors },
    parameterServer: {
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
      ...(run.worker ? { worker: { workerId: run.worker.workerId, pulls: run.worker.pulls, pushes: run.worker.pushes, samples: run.worker.samples, samplesPerSec: elapsed > 0 ? (mine.timedSamples / elapsed) * 1000 : null } } : {}),
    },
    links,
    ...(run.stoppedBy === 'request' ? { stoppedBy: pg.rank } : {}),
    ...(flags.returnWeights && pg.rank === 0 ? { weights: encodeValue(new Uint8Array(weights.buffer, weights.byteOffset, weights.byteLength)) } : {}),
  };
  emit({ type: 'done', summary });
  return { summary, model: run.model, pg, close: run.close, probe: { inputs: probeBatch.x, inputShape: testSet.inputShape, logits } };
}

/** Mean, median, 90th percentile and largest staleness of a histogram (the last bucket counts as its own value). */
export function stalenessSummary(histogram: number[]): { histogram: number[]; mean: number | null; p50: number | null; p90: number | null; max: number | null } {
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
  histogram.forEach((n, s) => n > 0 && (max = s));
  return { histogram, mean: histogram.reduce((a, n, s) => a + n * s, 0) / total, p50: quantile(0.5), p90: quantile(0.9), max };
}

/** The run's events, as the dashboard and the console hear them. */
function tellPage(e: PsRunEvent, emit: (e: TrainEvent) => void): void {
  const log = (level: 'info' | 'warn', message: string) => emit({ type: 'log', level, message });
  switch (e.type) {
    case 'round':
      return; // onRound says 'joined'; the Parameter server card shows the roles
    case 'server-lost':
      return log('warn', `${e.message[0]!.toUpperCase()}${e.message.slice(1)}.`);
    case 'restored':
      return log('info', `Parameter server ${e.index} resumed from checkpoint ${e.name} (version ${e.version}).`);
    case 'checkpoint':
      return log('info', `Shard ${e.index} saved at version ${e.version} (${e.name}, ${e.bytes} bytes).`);
    case 'checkpoint-failed':
      return log('warn', `Shard ${e.index}'s checkpoint at version ${e.version} failed: ${e.error}`);
    case 'samples-lost':
      return; // the Parameter server card warns when the lost samples grow
    case 'peer-lost':
      return emit({ type: 'rank-lost', rank: e.peer, reason: e.reason });
    case 'failure':
      return log('warn', e.recoverable ? `The group changed (${e.error.replace(/\.$/, '')}); going on in the next round…` : e.error);
    case 'regroup':
      return log('info', `${e.waiting} tab(s) waiting to join: regrouping`);
    case 'stop':
      return log('info', e.reason === 'request' ? 'Stopping: asked to stop.' : 'Every sample of the run is handed out: stopping.');
    default: {
      const unknown: never = e;
      void unknown;
    }
  }
}
