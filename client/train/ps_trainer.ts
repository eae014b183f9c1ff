/**
 * The built-in training job with parameter servers: `--strategy ps --ps K` (asynchronous) or
 * `--strategy central` (CentralStorage). The library's `runParameterServer` carries the roles,
 * the pulls and pushes, the leases of the data, the rounds and the shard checkpoints; what is
 * left here is what the plain job does too (data, the model, metrics, evaluation, the
 * dashboard's events) and the figures of a parameter-server run: samples per second of the
 * workers together, the staleness of the pushes, where every sample went.
 */
import * as tf from '@tensorflow/tfjs';
import {
  classificationLoss,
  fetchBatch,
  runParameterServer,
  type Json,
  type ParameterServerRunOptions,
  type ProcessGroup,
  type PsRunEvent,
  type StepMetrics,
  type WorkerStepContext,
} from '../../src/index.ts';
import { correctPredictions } from '../../src/nn/losses.ts';
import { flatGradients } from '../../src/parallel/parameter_server/worker.ts';
import { labelsPerSample } from '../../src/datasets/dataset.ts';
import { slowFactor, Straggler } from '../../src/runtime/straggler.ts';
import type { TrainConfig } from '../../src/jobs/train_config.ts';
import { fleetReporter } from './fleet_local.ts';
import { labelsTensor } from './evaluation.ts';
import { jobSchedule, jobSession } from './job_options.ts';
import { psResult, type PsRunRecord, type WorkerFigures } from './ps_summary.ts';
import { startJob, watchLinks, type TrainerOptions, type TrainResult } from './harness.ts';
import type { TrainEvent } from './events.ts';

export async function trainParameterServer(opts: TrainerOptions): Promise<TrainResult> {
  const trainer = new PsTrainer(opts, await startJob(opts));
  // Every rank builds the whole model alike (one seed, or the host's model's own weights): servers take their shard from it.
  const model = await trainer.job.newModel();
  opts.onModel?.(model);
  const run = await runParameterServer(trainer.runOptions(model));
  return psResult(trainer, run);
}

/** One tab's part in a parameter-server run (a server or a worker): its figures, and the runner's hooks. */
export class PsTrainer implements PsRunRecord {
  readonly config: TrainConfig;
  readonly started = performance.now();
  readonly emit: TrainerOptions['emit'];
  private readonly shareFleet: ReturnType<typeof fleetReporter>;
  readonly strategy: 'central' | 'async';
  private readonly targetSamples: number;
  private straggler = new Straggler(1);
  private rank = -1;
  /** This worker's figures: its steps after the first (which compiles shaders) are timed. */
  readonly mine: WorkerFigures = {
    steps: 0,
    samples: 0,
    timedSamples: 0,
    firstStepEnd: 0,
    lastStepEnd: 0,
    slowed: 0,
    compute: 0,
    loss: NaN,
  };
  readonly tensorCounts: number[] = [];
  trainingStarted = 0;

  constructor(
    readonly opts: TrainerOptions,
    readonly job: Awaited<ReturnType<typeof startJob>>,
  ) {
    this.config = opts.config;
    this.emit = opts.emit;
    this.shareFleet = fleetReporter(opts.emit);
    this.strategy = this.config.strategy === 'central' ? 'central' : 'async';
    this.targetSamples = this.config.steps !== null ? this.config.steps * this.config.batchSize : this.config.epochs * job.trainSet.length;
  }

  /** runParameterServer's options: the session, the roles, the schedule, staleness, checkpoints, and this trainer's hooks. */
  runOptions(model: tf.LayersModel): ParameterServerRunOptions {
    const { config, opts } = this;
    return {
      ...jobSession(opts),
      // Read at each use (checkpoints): the host's removal of a tab changes it during the run.
      get token() {
        return opts.token;
      },
      spectate: opts.spectate ?? false,
      strategy: this.strategy,
      numServers: config.ps,
      min: config.min,
      max: config.max,
      model,
      optimizer: () => (config.optimizer === 'adam' ? tf.train.adam(config.lr) : tf.train.sgd(config.lr)),
      ...jobSchedule(config, this.job.trainSet.length),
      ...(config.maxStaleness === null ? {} : { maxStaleness: config.maxStaleness }),
      scaleLrByStaleness: config.stalenessLr,
      // A lost server resumes from its shard's checkpoint: without one set, it would start over.
      checkpointEvery: config.checkpointEvery > 0 ? config.checkpointEvery : 50,
      checkpointMeta: { config } as unknown as Json,
      step: (ctx) => this.step(ctx),
      onWorkerStep: (ctx) => this.onWorkerStep(ctx),
      onStatus: (s) => this.emit({ type: 'ps', ...s }),
      onRound: ({ pg }) => this.onRound(pg),
      onEvent: (e) => tellPage(e, this.emit),
    };
  }

  private async step({ indices, model: m, pg }: WorkerStepContext) {
    const { config, job, mine } = this;
    const { trainSet } = job;
    const t0 = performance.now();
    this.trainingStarted ||= t0;
    const factor = slowFactor(config.slow, pg.rank);
    if (this.straggler.factor !== factor) this.straggler = new Straggler(factor);
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
    const slowed = await this.straggler.after(compute);
    mine.compute += compute;
    mine.slowed += slowed;
    mine.loss = result.loss;
    return {
      grads: result.grads,
      metrics: { loss: result.loss, accuracy: correct / (indices.length * labelsPerSample(trainSet)), compute, slowed },
    };
  }

  private onWorkerStep({ stepId, indices, metrics }: { stepId: number; indices: number[]; metrics: StepMetrics | undefined }): void {
    const { mine, config } = this;
    const now = performance.now();
    mine.steps++;
    mine.samples += indices.length;
    if (mine.steps === 1) mine.firstStepEnd = now;
    else mine.timedSamples += indices.length;
    mine.lastStepEnd = now;
    this.tensorCounts.push(tf.memory().numTensors);
    if (!metrics) return;
    const elapsed = mine.lastStepEnd - mine.firstStepEnd;
    this.emit({
      type: 'step',
      epoch: 0,
      step: stepId,
      // This worker's share of the run, if the workers keep pace with each other.
      totalSteps: Math.ceil(this.targetSamples / config.batchSize / Math.max(1, config.max - config.ps)),
      ranks: [
        {
          rank: this.rank,
          loss: metrics.loss ?? NaN,
          accuracy: metrics.accuracy ?? NaN,
          samplesPerSec: elapsed > 0 ? (mine.timedSamples / elapsed) * 1000 : 0,
          breakdownMs: {
            compute: metrics.compute ?? 0,
            readback: 0,
            allreduce: 0,
            apply: 0,
            ...(metrics.slowed ? { slowed: metrics.slowed } : {}),
          },
        },
      ],
      elapsedSec: (now - this.started) / 1000,
    });
  }

  private onRound(pg: ProcessGroup): void {
    const { backend, gpu } = this.job;
    this.rank = pg.rank;
    this.emit({
      type: 'joined',
      rank: pg.rank,
      worldSize: pg.worldSize,
      round: pg.round,
      backend: backend.backend,
      fallbackReason: backend.fallbackReason,
      adapter: gpu.adapter,
      ...(backend.probe ? { probe: backend.probe } : {}),
    });
    this.shareFleet(pg, backend, gpu.adapter);
    watchLinks(pg, this.emit);
  }
}

/** The run's events, as the dashboard and the console hear them. */
function tellPage(e: PsRunEvent, emit: (e: TrainEvent) => void): void {
  const log = (level: 'info' | 'warn', message: string) => emit({ type: 'log', level, message });
  switch (e.type) {
    case 'round':
      return; // onRound says 'joined'; the Parameter server card shows the roles
    case 'server-lost':
      log('warn', `${e.message[0]!.toUpperCase()}${e.message.slice(1)}.`);
      return;
    case 'restored':
      log('info', `Parameter server ${e.index} resumed from checkpoint ${e.name} (version ${e.version}).`);
      return;
    case 'checkpoint':
      log('info', `Shard ${e.index} saved at version ${e.version} (${e.name}, ${e.bytes} bytes).`);
      return;
    case 'checkpoint-failed':
      log('warn', `Shard ${e.index}'s checkpoint at version ${e.version} failed: ${e.error}`);
      return;
    case 'samples-lost':
      return; // the Parameter server card warns when the lost samples grow
    case 'peer-lost':
      emit({ type: 'rank-lost', rank: e.peer, reason: e.reason });
      return;
    case 'failure':
      log('warn', e.recoverable ? `The group changed (${e.error.replace(/\.$/, '')}); going on in the next round…` : e.error);
      return;
    case 'regroup':
      log('info', `${e.waiting} tab(s) waiting to join: regrouping`);
      return;
    case 'stop':
      log('info', e.reason === 'request' ? 'Stopping: asked to stop.' : 'Every sample of the run is handed out: stopping.');
      return;
    default: {
      const unknown: never = e;
      void unknown;
    }
  }
}
