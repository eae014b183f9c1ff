/**
 * The data-parallel (DDP) strategy's trainer: every rank trains the whole model on its share of
 * each batch and DDP averages the gradients, with its comm hooks, devices, stragglers and summary
 * (ddp_summary.ts; its figures in ddp_figures.ts).
 */
import * as tf from '@tensorflow/tfjs';
import {
  DataParallel,
  TrainState,
  type BackwardOptions,
  type DistributedDataParallel,
  classificationLoss,
  fetchBatch,
  runElastic,
  type ElasticRunOptions,
  type ElasticRunResult,
  type Json,
  type ProcessGroup,
  type RebuildContext,
  type RoundContext,
  type StepContext,
} from '../../src/index.ts';
import { correctPredictions } from '../../src/nn/losses.ts';
import { labelsPerSample } from '../../src/datasets/dataset.ts';
import { slowFactor, Straggler } from '../../src/runtime/straggler.ts';
import type { BackendChoice } from './backend.ts';
import { hostOptimizer } from '../../src/jobs/host_optimizer.ts';
import { attackPlanOf, sampleDue, type BackendName, type TrainConfig } from '../../src/jobs/train_config.ts';
import type { StepBreakdownMs, TrainEvent } from './events.ts';
import { commSetup, type CommSetup } from './comm.ts';
import { setActiveDataParallel } from '../device_hook.ts';
import { fleetReporter } from './fleet_local.ts';
import { contributionTracker } from './contributions.ts';
import { evaluate, evaluateAndReport, labelsTensor } from './evaluation.ts';
import {
  dashboardEvents,
  sampleText,
  startJob,
  watchLinks,
  type CommMetrics,
  type DeviceMetrics,
  type Metrics,
  type TrainerOptions,
  type TrainResult,
} from './harness.ts';
import { DILOCO_VOTE_EVERY, stepBytes, syncsAt, weightedLoss } from './ddp_figures.ts';
import { jobSchedule, jobSession } from './job_options.ts';
import { ddpResult, type DdpRunRecord } from './ddp_summary.ts';
import { LocalRun } from './local_run.ts';
import { LocalDataset } from '../../src/datasets/local.ts';

/** Every how many steps the page hears its devices' figures. */
const DEVICE_REPORT_EVERY = 10;

export type DdpMetrics = Metrics & CommMetrics & DeviceMetrics & { stepMs: number };
type Job = Awaited<ReturnType<typeof startJob>>;

export async function trainDdp(opts: TrainerOptions): Promise<TrainResult> {
  const trainer = new DdpTrainer(opts, await startJob(opts));
  await trainer.start();
  let run: ElasticRunResult;
  try {
    run = await runElastic<DdpMetrics>(trainer.runOptions());
  } finally {
    // The Workers end with the run, also when it fails; their figures stay readable.
    trainer.dp?.close();
  }
  return ddpResult(trainer, run);
}

/** One tab's DDP run: its model (rebuilt when its GPU is lost), devices, figures, and the runner's hooks. */
export class DdpTrainer implements DdpRunRecord {
  readonly config: TrainConfig;
  readonly started = performance.now();
  readonly emit: (e: TrainEvent) => void;
  readonly shareFleet: ReturnType<typeof fleetReporter>;
  /** A lost WebGPU device is re-created (or falls back) during the run. */
  backend: BackendChoice;
  model!: tf.LayersModel;
  state!: TrainState;
  /** --devices K > 1: K Workers compute each batch's gradients (DataParallel), made for the model they serve. */
  dp: DataParallel | undefined;
  readonly sums: StepBreakdownMs & { slowed: number } = { compute: 0, readback: 0, allreduce: 0, apply: 0, slowed: 0 };
  /** --comm-hook: one hook for the whole run (runElastic registers it on each round's DDP and keeps its state). */
  readonly comm: CommSetup;
  readonly robust: { aggregation: TrainConfig['aggregation']; attack?: ReturnType<typeof attackPlanOf> };
  /** Robust aggregation: the judgments of each step, to the dashboard and, added up, to the result. */
  readonly judged: ReturnType<typeof contributionTracker>;
  /** This rank's bytes over the timed steps, sent and the float32 all-reduce's; and localsgd's averagings among them. */
  readonly bytes = { sent: 0, dense: 0, averagings: 0, afterStart: 0, stepsAfterStart: 0 };
  commSpan = 0;
  // This rank's step, split: the exposed all-reduce is waiting for the slowest rank plus the wire,
  // estimated per step as the least any rank waited (the last rank to arrive waits only for the wire).
  readonly own = { compute: 0, readback: 0, waitSlowest: 0, wire: 0, apply: 0, batch: 0 };
  /** The step after which the hook compresses (PowerSGD's startIter, post-local SGD's startStep; 0: from the first). */
  private readonly hookStart: number;
  /** --slow: this tab's factor is looked up by its rank in the current round, every step. */
  private straggler = new Straggler(1);
  slowedTotal = 0;
  timedSteps = 0;
  samplesPerSecTotal = 0;
  readonly tensorCounts: number[] = [];
  readonly hashChecks: boolean[] = [];
  lastLoss = NaN;
  readonly evals: Array<{ step: number; testAccuracy: number; testLoss: number }> = [];
  private announcedModel = false;
  lastSample: Extract<TrainEvent, { type: 'sample' }> | undefined;
  /** The steps after which the language model wrote (the job's report lists them). */
  readonly sampleSteps: number[] = [];
  /** Dataset local: this tab's own pictures' run (its evaluations are on every tab's own held-out pictures). */
  readonly local: LocalRun | null;

  constructor(
    readonly opts: TrainerOptions,
    readonly job: Job,
  ) {
    this.config = opts.config;
    this.emit = opts.emit;
    this.backend = job.backend;
    this.shareFleet = fleetReporter(opts.emit);
    this.comm = commSetup(this.config.commHook);
    this.robust = { aggregation: this.config.aggregation, ...(this.config.attack ? { attack: attackPlanOf(this.config.attack) } : {}) };
    this.judged = contributionTracker(dashboardEvents(this.emit, this.config.min === this.config.max));
    this.local = job.trainSet instanceof LocalDataset ? new LocalRun(job.trainSet, this.emit) : null;
    const spec = this.comm.spec;
    this.hookStart = spec.kind === 'powersgd' ? spec.startIter : spec.kind === 'localsgd' ? spec.startStep : 0;
  }

  /** The model and its state; the devices started before joining, so that the group does not wait for the Workers at its first step. */
  async start(): Promise<void> {
    await this.newModelAndState();
    await this.devicesFor(this.model);
  }

  /** The model and its state, new (at the start, and on the re-created backend after a lost GPU). */
  private async newModelAndState(): Promise<TrainState> {
    this.model = await this.job.newModel();
    this.state = new TrainState({ model: this.model, optimizer: () => hostOptimizer(this.config) });
    this.opts.onModel?.(this.model, this.job.text?.tokenizer.chars);
    return this.state;
  }

  /** The devices for model `m`: a model rebuilt after a lost GPU gets devices of its own at its first step. */
  private async devicesFor(m: tf.LayersModel): Promise<DataParallel | undefined> {
    const { config, emit } = this;
    if (config.devices <= 1) return undefined;
    if (this.dp?.model === m) return this.dp;
    this.dp?.close();
    this.dp = undefined;
    const made = await DataParallel.create(m, {
      devices: config.devices,
      backend: config.backend === 'auto' ? this.backend.backend : config.backend,
      loss: { kind: 'softmaxCrossEntropy', numClasses: this.job.trainSet.numClasses },
    });
    this.dp = made;
    setActiveDataParallel(made);
    emit({ type: 'devices', devices: made.devices });
    for (const d of made.devices.filter((x) => x.fallbackReason))
      emit({ type: 'log', level: 'warn', message: `Device ${d.device}: ${d.fallbackReason}` });
    emit({
      type: 'log',
      level: 'info',
      message: `This tab computes on ${made.devices.length} devices (Workers): ${made.devices.map((d) => `device ${d.device} on ${d.backend}`).join(', ')}`,
    });
    return made;
  }

  /** A language model also writes: every tab samples its own replica (the same text where replicas are identical). */
  private async writeSample(step: number): Promise<void> {
    if (!this.job.text) return;
    this.lastSample = await sampleText(this.model, this.job.text, step);
    this.sampleSteps.push(step);
    this.emit(this.lastSample);
  }

  async evaluateAndEmit(pg: ProcessGroup, step: number, epoch: number, figures?: { testAccuracy: number; testLoss: number }) {
    const figured =
      figures ?? (this.local ? await this.local.evaluate(pg, this.model, step, epoch) : await evaluate(pg, this.model, this.job.testSet));
    const result = { step, ...figured };
    this.evals.push(result);
    this.emit({ type: 'eval', epoch, ...result });
    await this.writeSample(step);
    return result;
  }

  /** The evaluation after the run (see evaluateAndReport); null when the host skipped it. */
  async finalEvaluation(pg: ProcessGroup, step: number, epoch: number) {
    // Each tab's own held-out pictures: the run evaluated the model it ended with (a few dozen pictures, nothing to skip).
    if (this.local) return this.evaluateAndEmit(pg, step, epoch, this.local.evaluatedAt(step));
    const figures = await evaluateAndReport(pg, this.model, this.job.testSet, step, this.emit, () => this.opts.skipEvaluation?.() === true);
    return figures === null ? null : this.evaluateAndEmit(pg, step, epoch, figures);
  }

  /** This rank's gradients computed on the page's own backend, averaged by DDP; and the right predictions. */
  private async backwardHere(ddp: DistributedDataParallel, x: Float32Array, y: Int32Array, stretch: BackwardOptions) {
    const { trainSet } = this.job;
    const n = y.length / labelsPerSample(trainSet);
    const xs = tf.tensor(x, [n, ...trainSet.inputShape]);
    const ys = labelsTensor(trainSet, y, n);
    let correctT: tf.Tensor | undefined;
    try {
      const result = await ddp.backward(() => {
        const logits = this.model.apply(xs, { training: true }) as tf.Tensor;
        // Train accuracy from the same forward pass; kept past the gradient computation's tidy.
        correctT = tf.keep(correctPredictions(logits, ys));
        return classificationLoss(logits, ys, trainSet.numClasses);
        // A straggler waits in proportion to its forward, backward and readback, before its all-reduces.
      }, stretch);
      // No samples this step (balanced batches): DDP did not run the forward.
      return { result, correct: correctT ? (await correctT.data())[0]! : 0 };
    } finally {
      // Also when the step fails (a lost GPU): nothing of it may stay behind.
      correctT?.dispose();
      xs.dispose();
      ys.dispose();
    }
  }

  /** The step's gradients: on the devices (--devices), which DDP then averages across ranks, or on the page's backend. */
  private async backward(ctx: StepContext, x: Float32Array, y: Int32Array, stretch: BackwardOptions) {
    const { indices, step, ddp } = ctx;
    const devices = await this.devicesFor(this.model);
    if (!devices || indices.length === 0)
      return { ...(await this.backwardHere(ddp, x, y, stretch)), deviceMetrics: { devices: 1, deviceMs: 0 } };
    // The devices compute; DDP averages their gathered gradients across ranks (a straggler stretches their time).
    const local = await devices.computeGradients({ x, y });
    const result = await ddp.backward(local, stretch);
    const working = local.devices.filter((d) => d.samples > 0);
    const deviceMetrics: DeviceMetrics = {
      devices: devices.devices.length,
      deviceMs: working.reduce((s, d) => s + d.computeMs, 0) / Math.max(1, working.length),
    };
    if (step % DEVICE_REPORT_EVERY === 0 || step === 1) this.emit({ type: 'devices', devices: devices.deviceStats() });
    return { result, correct: local.correct ?? 0, deviceMetrics };
  }

  /** One training step on this rank's samples, and its metrics for the vote. */
  private async step(ctx: StepContext): Promise<DdpMetrics> {
    const { indices, step, ddp, optimizer, pg } = ctx;
    const { config, job } = this;
    const t0 = performance.now();
    const factor = slowFactor(config.slow, pg.rank);
    if (this.straggler.factor !== factor) this.straggler = new Straggler(factor);
    const { x, y } = await fetchBatch(job.trainSet, indices);
    const { result, correct, deviceMetrics } = await this.backward(ctx, x, y, this.straggler.slow ? { straggler: this.straggler } : {});
    // Robust aggregation refused a rank's gradient (a NaN or an infinity): say which, every step it happens.
    for (const j of ddp.lastAggregation?.step === step ? ddp.lastAggregation.judgments : []) {
      if (j.status === 'refused')
        this.emit({
          type: 'log',
          level: 'warn',
          message: `Step ${step}: rank ${j.rank}'s gradient was refused (${j.reason ?? 'non-finite'}); the others' were aggregated`,
        });
    }
    const a0 = performance.now();
    await ddp.step(optimizer);
    const apply = performance.now() - a0;
    const hash = this.opts.flags.checkWeights ? parseInt(await ddp.weightsHash(), 16) : 0;
    return {
      ...stepBytes(this.comm, result, step, ddp, pg),
      ...deviceMetrics,
      // No samples (balanced batches gave them to faster tabs): no loss and no accuracy, not 0.
      loss: indices.length > 0 ? result.loss : null,
      // Of every label: a language model's accuracy is its next-character accuracy.
      accuracy: indices.length > 0 ? correct / (indices.length * labelsPerSample(job.trainSet)) : null,
      // This rank's share of the step's samples (balanced batches differ between ranks).
      samples: indices.length,
      // A rank given no samples (balanced batches) may finish a step that meets nobody in 0 ms: 0, not 0/0.
      samplesPerSec: indices.length > 0 ? (indices.length / (performance.now() - t0)) * 1000 : 0,
      stepMs: performance.now() - t0,
      ...result.timings,
      apply,
      // A 32-bit hash in two halves, each exact in the float32 the vote carries.
      hashHi: hash >>> 16,
      hashLo: hash & 0xffff,
    };
  }

  private onRound({ pg, ddp }: RoundContext): void {
    const { backend, emit } = this;
    const { gpu } = this.job;
    emit({
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
    if (!this.announcedModel)
      emit({
        type: 'log',
        level: 'info',
        message: `Model ${this.job.modelName}: ${ddp.parameterCount} parameters in ${ddp.buckets.length} bucket(s)`,
      });
    this.announcedModel = true;
    watchLinks(pg, emit);
  }

  /** A timed step's figures (the first compiles shaders: left out of the averages). */
  private addTimed(metrics: DdpMetrics[], rank: number, step: number): void {
    const { sums, bytes, own } = this;
    this.timedSteps++;
    for (const key of Object.keys(sums) as Array<keyof typeof sums>) sums[key] += metrics.reduce((s, m) => s + m[key], 0) / metrics.length;
    const mine = metrics[rank]!;
    this.slowedTotal += mine.slowed;
    bytes.sent += mine.commBytes;
    this.commSpan += metrics.reduce((s, m) => s + m.comm, 0) / metrics.length;
    if (step > this.hookStart) {
      bytes.afterStart += mine.commBytes;
      bytes.stepsAfterStart++;
    }
    bytes.dense += mine.commDenseBytes;
    if (this.comm.averager?.averagesAt(step) || syncsAt(this.comm, step)) bytes.averagings++;
    this.samplesPerSecTotal += metrics.reduce((s, m) => s + m.samplesPerSec, 0);
    const wire = Math.min(...metrics.map((m) => m.allreduce));
    own.compute += mine.compute;
    own.readback += mine.readback;
    own.wire += wire;
    own.waitSlowest += mine.allreduce - wire;
    own.apply += mine.apply;
    own.batch += Math.max(0, mine.stepMs - mine.compute - mine.readback - mine.allreduce - mine.apply);
  }

  private async onStep({ pg, step, epoch, metrics }: RoundContext & { step: number; epoch: number; metrics: DdpMetrics[] }): Promise<void> {
    const { config } = this;
    // The global batch's loss: each rank's mean loss weighted by its samples (balanced batches differ).
    this.lastLoss = weightedLoss(metrics);
    if (this.opts.flags.checkWeights)
      this.hashChecks.push(metrics.every((m) => m.hashHi === metrics[0]!.hashHi && m.hashLo === metrics[0]!.hashLo));
    if (step > 1) this.addTimed(metrics, pg.rank, step);
    this.tensorCounts.push(tf.memory().numTensors);
    const atEpochEnd = this.local ? this.local.endsEpoch(step) : this.state.progress.position >= this.job.trainSet.length;
    if (config.evalEvery > 0 && step % config.evalEvery === 0 && !atEpochEnd) await this.evaluateAndEmit(pg, step, epoch);
    // Between evaluations too, early and then ever more rarely (N, 2N, 4N ...): the writing shows
    // within the first minute, and later samples cost little. Every rank at the same steps.
    else if (sampleDue(step, config.firstSample) && !atEpochEnd) await this.writeSample(step);
  }

  /** After a lost GPU, on the re-created backend: the same model as at the start; the group's state comes with the next round. */
  private async rebuildState({ backend: now, fallbackReason }: RebuildContext): Promise<TrainState> {
    // recreateBackend starts webgpu again, or one of its default fallbacks (webgl, cpu).
    this.backend = { backend: now as BackendName, ...(fallbackReason ? { fallbackReason } : {}) };
    if (fallbackReason) this.emit({ type: 'log', level: 'warn', message: `Backend fallback: ${fallbackReason}` });
    return this.newModelAndState();
  }

  /** runElastic's options: the session, the schedule, DDP's checks and hook, the votes, and this trainer's hooks. */
  runOptions(): ElasticRunOptions<DdpMetrics> {
    const { config, opts, comm, job } = this;
    const { trainSet } = job;
    return {
      ...jobSession(opts),
      // Read at each use (checkpoints): the host's removal of a tab changes it during the run.
      get token() {
        return opts.token;
      },
      min: config.min,
      max: config.max,
      rank: config.min === config.max ? opts.rank : undefined,
      state: this.state,
      ...jobSchedule(config, trainSet.length),
      // An elastic session keeps a checkpoint every 50 steps too: when every tab has gone, the link
      // reopened goes on from there instead of starting a second run under the same name.
      checkpointEvery: config.checkpointEvery > 0 || config.min === config.max ? config.checkpointEvery : 50,
      // A language model's vocabulary too: `npm run export:torch` writes it beside the weights.
      checkpointMeta: { config, ...(job.text ? { vocabulary: job.text.tokenizer.chars } : {}) } as unknown as Json,
      resumeFrom: config.resumeFrom,
      stopVote: opts.stopVote ?? 'any',
      spectate: opts.spectate ?? false,
      // A tab of a shared session is untrusted: a NaN gradient, or replicas that drift apart, end
      // the run with a name instead of spoiling every replica in silence.
      // --aggregation: DDP's gradients, or with DiLoCo its outer step's pseudo-gradients (--attack: for measuring it).
      ddp: { errorIfNonfinite: true, ...(comm.diloco ? {} : this.robust) },
      // Local SGD's replicas differ on purpose between averagings: a hash check would take that for
      // divergence (the NaN check above still guards every step).
      // DiLoCo's replicas too, but runElastic checks those at the next full outer step after each
      // 100th (without streaming: with it the replicas are identical only at the end).
      checkReplicasEvery: comm.averager ? 0 : 100,
      ...(config.linkWindowBytes === null ? {} : { linkWindowBytes: config.linkWindowBytes }),
      // The host's images, streamed: the next step's load while this one computes (a failure shows at that step).
      ...(trainSet.prepare ? { prefetch: (next: number[]) => void trainSet.prepare!(next).catch(() => {}) } : {}),
      ...this.commOptions(),
      step: (ctx) => this.step(ctx),
      onRound: (ctx) => this.onRound(ctx),
      onStep: (ctx) => this.onStep(ctx),
      onEpochEnd: async ({ pg, step, epoch }) => {
        // Each tab's own pictures: the run has just evaluated on every tab's held-out ones.
        await this.evaluateAndEmit(pg, step, epoch, this.local?.evaluatedAt(step));
      },
      ...(this.local ? { localData: this.local.data, onLocalData: this.local.onLocalData } : {}),
      rebuildState: (ctx) => this.rebuildState(ctx),
      onEvent: this.judged.onEvent,
    };
  }

  /** How the ranks' gradients and votes travel: balanced batches, the hook, local SGD, DiLoCo. */
  private commOptions(): Partial<ElasticRunOptions<DdpMetrics>> {
    const { config, comm } = this;
    const hook = comm.hook;
    return {
      // A slow tab (a phone, a background tab) gets fewer samples per step: the group keeps its pace.
      balance: config.balance,
      commHook: hook === undefined ? undefined : () => hook,
      modelAverager: comm.modelAverager,
      diloco: comm.diloco && { ...comm.diloco, ...this.robust },
      // DiLoCo's inner steps meet nowhere: the ranks vote at outer steps, and at least every
      // DILOCO_VOTE_EVERY steps so that a stop, a joiner and the dashboard's figures wait no longer.
      voteEvery: comm.diloco ? Math.min(comm.diloco.syncEvery, DILOCO_VOTE_EVERY) : 1,
      // Votes ride on the gradients (onStep runs a step late), except after the steps an
      // evaluation must see the model of.
      voteAfter: (step: number) => config.evalEvery > 0 && step % config.evalEvery === 0,
      voteWithGradients: config.voteWithGradients,
    };
  }
}
