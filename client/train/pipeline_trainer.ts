/**
 * The built-in training job as a pipeline (x data-parallel) run: `--pp S --dp D`. The library's
 * `runPipeline` carries the layout, the subgroups, the schedule and the checkpoints; what is left
 * here is what the plain job does too (data, metrics, evaluation, the dashboard's events), and the
 * pipeline's own figures: each stage's layers and memory, the measured bubble beside the
 * formula, where a step's time went, and the schedule's timeline.
 */
import * as tf from '@tensorflow/tfjs';
import {
  classificationLoss,
  fetchBatch,
  runPipeline,
  type Dataset,
  type ElasticEvent,
  type PipelineRoundContext,
  type PipelineRunOptions,
  type PipelineStepContext,
} from '../../src/index.ts';
import { bubbleFraction } from '../../src/parallel/pipeline/schedule.ts';
import { correctPredictions } from '../../src/nn/losses.ts';
import { labelsPerSample } from '../../src/datasets/dataset.ts';
import { layerFactoriesOf, modelLayers } from '../../src/nn/models.ts';
import { slowFactor, Straggler } from '../../src/runtime/straggler.ts';
import type { TimelineEntry } from '../../src/parallel/pipeline/stage.ts';
import { fleetReporter } from './fleet_local.ts';
import { labelsTensor, labelTotals } from './evaluation.ts';
import {
  modelSpecOf,
  startJob,
  dashboardEvents,
  watchLinks,
  type Metrics,
  type PipelineMetrics,
  type TrainerOptions,
  type TrainResult,
} from './harness.ts';
import { hostOptimizer } from '../../src/jobs/host_optimizer.ts';
import type { TrainConfig } from '../../src/jobs/train_config.ts';
import { jobSchedule, jobSession } from './job_options.ts';
import { pipelineResult, placeOf, type PipelineRunRecord } from './pipeline_summary.ts';

/** Every this many steps the ranks gather replica 0's timeline for the dashboard. */
const TIMELINE_EVERY = 5;

/** What a pipeline step reports for the vote. */
export type StepFigures = Metrics & PipelineMetrics;

export async function trainPipeline(opts: TrainerOptions): Promise<TrainResult> {
  const job = await startJob(opts);
  // The host's model: loaded whole once, each stage built from its share of the layers, with their weights.
  const layers =
    opts.config.model === 'user' ? layerFactoriesOf(await job.newModel()) : modelLayers(modelSpecOf(opts.config, job.trainSet));
  const trainer = new PipelineTrainer(opts, job);
  const run = await runPipeline<StepFigures>(trainer.runOptions(layers));
  return pipelineResult(trainer, run);
}

/** One tab's stage of a pipeline run: its figures, and the runner's hooks. */
export class PipelineTrainer implements PipelineRunRecord {
  readonly config: TrainConfig;
  readonly started = performance.now();
  readonly emit: TrainerOptions['emit'];
  private readonly shareFleet: ReturnType<typeof fleetReporter>;
  readonly sums = { compute: 0, waitActivations: 0, waitGradients: 0, allreduce: 0, apply: 0, bubble: 0, slowed: 0 };
  /** --slow: this tab's factor is looked up by its world rank in the current round, every step. */
  private straggler = new Straggler(1);
  timedSteps = 0;
  samplesPerSecTotal = 0;
  peakTensors = 0;
  peakStashed = 0;
  readonly tensorCounts: number[] = [];
  readonly hashChecks: boolean[] = [];
  lastLoss = NaN;
  private lastTimeline: { entries: TimelineEntry[]; total: number } = { entries: [], total: 0 };
  readonly evals: Array<{ step: number; testAccuracy: number; testLoss: number }> = [];
  private readonly toDashboard: ReturnType<typeof dashboardEvents>;

  constructor(
    readonly opts: TrainerOptions,
    readonly job: Awaited<ReturnType<typeof startJob>>,
  ) {
    this.config = opts.config;
    this.emit = opts.emit;
    this.shareFleet = fleetReporter(opts.emit);
    this.toDashboard = dashboardEvents(opts.emit, true);
  }

  async evaluateAndEmit(ctx: PipelineRoundContext, step: number, epoch: number) {
    const result = { step, ...(await evaluate(ctx, this.job.testSet, this.config.batchSize, this.config.microBatches)) };
    this.evals.push(result);
    this.emit({ type: 'eval', epoch, ...result });
    return result;
  }

  /** runPipeline's options: the session, the layout, the schedule, the checkpoints, and this trainer's hooks. */
  runOptions(layers: ReturnType<typeof modelLayers>): PipelineRunOptions<StepFigures> {
    const { config, opts } = this;
    const { trainSet } = this.job;
    return {
      ...jobSession(opts),
      // Read at each use (checkpoints): the host's removal of a tab changes it during the run.
      get token() {
        return opts.token;
      },
      ...(opts.rank === undefined ? {} : { rank: opts.rank }),
      stages: config.pp,
      replicas: config.dp,
      layers,
      inputShape: trainSet.inputShape,
      ...(config.splitPoints ? { splitPoints: config.splitPoints } : {}),
      optimizer: () => hostOptimizer(config),
      ...jobSchedule(config, trainSet.length),
      // A lost rank sends every stage back to the last checkpoint: without one set, the run would start over.
      checkpointEvery: config.checkpointEvery > 0 ? config.checkpointEvery : 50,
      checkpointMeta: { config: { ...config } },
      resumeFrom: config.resumeFrom,
      stopVote: opts.stopVote ?? 'any',
      ddp: { errorIfNonfinite: true },
      checkReplicasEvery: config.dp > 1 ? 100 : 0,
      step: (ctx) => this.step(ctx),
      onRound: (ctx) => this.onRound(ctx),
      onStep: (ctx) => this.onStep(ctx),
      onEpochEnd: async (ctx) => {
        await this.evaluateAndEmit(ctx, ctx.step, ctx.epoch);
      },
      onEvent: (e: ElasticEvent) => this.toDashboard(fillLosses(e, config.pp)),
    };
  }

  private async step({ indices, stage, ddp, optimizer, mesh }: PipelineStepContext): Promise<StepFigures> {
    const { config, job } = this;
    const t0 = performance.now();
    const factor = slowFactor(config.slow, mesh.world.rank);
    if (this.straggler.factor !== factor) this.straggler = new Straggler(factor);
    const batch = await fetchBatch(job.trainSet, indices);
    const loss = (out: tf.Tensor, labels: tf.Tensor) => classificationLoss(out, labels, job.trainSet.numClasses);
    const r = await stage.step({
      ddp,
      batchSize: indices.length,
      microBatches: config.microBatches,
      schedule: config.schedule,
      activationDtype: config.activationDtype,
      // A straggler stage waits after each pass in proportion to its compute, before sending on.
      ...(this.straggler.slow ? { straggler: this.straggler } : {}),
      ...(stage.isFirst ? { inputs: batch.x } : {}),
      ...(stage.isLast
        ? { labels: Int32Array.from(batch.y), loss, metric: (out: tf.Tensor, labels: tf.Tensor) => correctPredictions(out, labels) }
        : {}),
    });
    const a0 = performance.now();
    await ddp.step(optimizer);
    const apply = performance.now() - a0;
    this.peakTensors = Math.max(this.peakTensors, r.peakTensors);
    this.peakStashed = Math.max(this.peakStashed, r.peakStashed);
    this.lastTimeline = { entries: r.timeline, total: r.timings.total };
    const hash = this.opts.flags.checkWeights ? parseInt(await ddp.weightsHash(), 16) : 0;
    return {
      loss: r.loss,
      accuracy: r.metric / (indices.length * labelsPerSample(job.trainSet)),
      samples: indices.length,
      samplesPerSec: (indices.length / (performance.now() - t0)) * 1000,
      compute: r.timings.compute,
      readback: 0,
      allreduce: r.timings.allreduce,
      // The stage's all-reduce runs after its last backward: no span is measured to overlap.
      comm: 0,
      apply,
      waitActivations: r.timings.waitActivations,
      waitGradients: r.timings.waitGradients,
      slowed: r.timings.slowed,
      bubble: r.bubble,
      stage: mesh.stage,
      replica: mesh.replica,
      hashHi: hash >>> 16,
      hashLo: hash & 0xffff,
    };
  }

  private onRound({ mesh, stage }: PipelineRoundContext): void {
    const { emit, config } = this;
    const { backend, gpu } = this.job;
    emit({
      type: 'joined',
      rank: mesh.world.rank,
      worldSize: mesh.world.worldSize,
      round: mesh.world.round,
      backend: backend.backend,
      fallbackReason: backend.fallbackReason,
      adapter: gpu.adapter,
      ...(backend.probe ? { probe: backend.probe } : {}),
    });
    this.shareFleet(mesh.world, backend, gpu.adapter);
    emit({
      type: 'pipeline',
      ...placeOf(mesh),
      schedule: config.schedule,
      microBatches: config.microBatches,
      layers: stage.allLayers.map((l) => ({ index: l.index, className: l.className, parameters: l.parameters, stage: l.stage })),
      bubbleFormula: bubbleFraction(mesh.stages, config.microBatches),
    });
    watchLinks(mesh.world, emit);
  }

  private async onStep(ctx: PipelineRoundContext & { metrics: StepFigures[] }): Promise<void> {
    const { mesh, step, epoch, metrics } = ctx;
    // The loss and accuracy are the last stage's; the other stages of its replica show the same.
    const lastStage = metrics.filter((m) => m.stage === mesh.stages - 1);
    this.lastLoss = lastStage.reduce((s, m) => s + (m.loss ?? NaN), 0) / lastStage.length;
    if (this.opts.flags.checkWeights) {
      // Replicas of one stage must agree; different stages hold different weights.
      this.hashChecks.push(
        metrics.every((m) => metrics.filter((o) => o.stage === m.stage).every((o) => o.hashHi === m.hashHi && o.hashLo === m.hashLo)),
      );
    }
    if (step > 1) {
      // The first step compiles shaders: leave it out of the averages.
      this.timedSteps++;
      const mine = metrics[mesh.world.rank]!;
      for (const key of Object.keys(this.sums) as Array<keyof typeof this.sums>) this.sums[key] += mine[key];
      this.samplesPerSecTotal += metrics.filter((m) => m.stage === 0).reduce((s, m) => s + m.samplesPerSec, 0);
    }
    this.tensorCounts.push(tf.memory().numTensors);
    if (step === 1 || step % TIMELINE_EVERY === 0) await emitTimeline(ctx, step, this.lastTimeline, this.config.microBatches, this.emit);
    if (this.config.evalEvery > 0 && step % this.config.evalEvery === 0) await this.evaluateAndEmit(ctx, step, epoch);
  }
}

/**
 * A pipeline's stages other than the last do not compute the loss: on the dashboard each rank of
 * a replica shows its replica's loss and accuracy (those of its last stage).
 */
function fillLosses(e: ElasticEvent, stages: number): ElasticEvent {
  if (e.type !== 'step') return e;
  const metrics = e.metrics.map((m, rank) => {
    const last = e.metrics[Math.floor(rank / stages) * stages + stages - 1];
    return last ? { ...m, loss: last.loss!, accuracy: last.accuracy! } : m;
  });
  return { ...e, metrics };
}

/**
 * The schedule as it ran on replica 0's stages in the last step, gathered over the world (every
 * rank calls this at the same step: it is a collective) and sent to the dashboard.
 */
async function emitTimeline(
  ctx: PipelineRoundContext,
  step: number,
  mine: { entries: TimelineEntry[]; total: number },
  microBatches: number,
  emit: TrainerOptions['emit'],
): Promise<void> {
  const slots = 2 * microBatches;
  const row = new Float32Array(1 + 4 * slots).fill(-1);
  row[0] = mine.total;
  mine.entries.slice(0, slots).forEach((t, i) => {
    row.set([t.phase === 'F' ? 0 : 1, t.microBatch, t.start, t.end], 1 + 4 * i);
  });
  const all = await ctx.mesh.world.allGather(row);
  const stages = Array.from({ length: ctx.mesh.stages }, (_, s) => {
    const r = all.subarray(s * row.length, (s + 1) * row.length);
    const entries: TimelineEntry[] = [];
    for (let i = 0; i < slots; i++) {
      const [phase, microBatch, start, end] = r.subarray(1 + 4 * i, 5 + 4 * i);
      if (phase! < 0) continue;
      entries.push({ phase: phase === 0 ? 'F' : 'B', microBatch: microBatch!, start: start!, end: end! });
    }
    return { stage: s, totalMs: r[0]!, entries };
  });
  emit({ type: 'timeline', step, stages });
}

/**
 * Test accuracy and loss through the pipelines: replica d evaluates every D-th test sample, its
 * first stage feeding the inputs and its last computing the sums, which are all-reduced over
 * the world (the other stages add zeros).
 */
export async function evaluate(
  ctx: PipelineRoundContext,
  test: Dataset,
  batch: number,
  microBatches: number,
): Promise<{ testAccuracy: number; testLoss: number }> {
  const { mesh, stage } = ctx;
  const totals = new Float32Array(3); // correct, loss sum, count
  const mine: number[] = [];
  for (let i = mesh.replica; i < test.length; i += mesh.replicas) mine.push(i);
  // Batches of the training batch's size: a stage waits for the one before it one micro-batch
  // at a time, never for a pass much longer than training's.
  for (let s = 0; s < mine.length; s += batch) {
    const idx = mine.slice(s, s + batch);
    const { x, y } = await fetchBatch(test, idx);
    const logits = await stage.forward({ batchSize: idx.length, microBatches, ...(stage.isFirst ? { inputs: x } : {}) });
    if (!logits) continue;
    const out = tf.tidy(() => labelTotals(logits, labelsTensor(test, y, idx.length), test.numClasses));
    logits.dispose();
    const [c, l] = await out.data();
    out.dispose();
    totals[0] += c!;
    totals[1] += l!;
    totals[2] += idx.length * labelsPerSample(test);
  }
  await mesh.world.allReduce(totals, 'sum');
  return { testAccuracy: totals[0]! / totals[2]!, testLoss: totals[1]! / totals[2]! };
}
