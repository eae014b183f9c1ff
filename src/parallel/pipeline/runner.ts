/**
 * Pipeline-parallel training, alone or with data parallelism (DDP x pipeline), for any training
 * step: what torchrun runs a torch.distributed.pipelining script under. `runPipeline` joins a
 * session of S x D ranks (a fixed size), lays them out as D replicas of an S-stage pipeline
 * (rank = replica * S + stage), makes the subgroups (each replica's pipeline, each stage's
 * data-parallel group), builds this rank's stage only, wraps it in DDP over its stage's
 * replicas, and trains. The sampler shards by replica: the stages of one replica see the same
 * samples.
 *
 * Failure follows torchrun: a lost rank stops every rank with an error naming the rank and its
 * stage; the group waits until it is complete again (a tab takes the free rank), then every
 * rank rebuilds its stage and loads its part of the latest checkpoint (each stage saves its own
 * part, `stage-<s>`, every `checkpointEvery` steps), or starts afresh when there is none.
 */
import type * as tf from '@tensorflow/tfjs';
import { listCheckpoints } from '../../checkpoint/checkpoint.ts';
import { DistributedDataParallel, type DDPOptions } from '../ddp/ddp.ts';
import { PeerLostError, isRecoverable } from '../../wire/errors.ts';
import { checkSchedule, runAgent, samplerSettings, type LockstepHooks, type RunHooks, type ScheduleOptions } from '../../elastic/agent.ts';
import { recordEvent, type ElasticEvent } from '../events.ts';
import { restoreStatePart, saveState } from '../../elastic/checkpoints.ts';
import type { RunRecord } from '../../elastic/run_record.ts';
import { stepVote, type StepMetrics } from '../../elastic/vote.ts';
import { batchOf, planEpoch } from '../../elastic/epoch.ts';
import type { LayerFactory } from '../../nn/models.ts';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { verifyReplicas } from '../replicas.ts';
import { RendezvousHandler, type RendezvousOptions, type Round } from '../../c10d/rendezvous.ts';
import { TrainState, type Json } from '../../checkpoint/state_dict.ts';
import { PipelineStage } from './stage.ts';

/** Where this rank sits: its stage and replica, and the groups it trains in. */
export interface PipelineMesh {
  world: ProcessGroup;
  /** This replica's pipeline: group rank = stage. */
  pipe: ProcessGroup;
  /** This stage's replicas: group rank = replica. */
  dp: ProcessGroup;
  stage: number;
  replica: number;
  stages: number;
  replicas: number;
}

/** Global rank of `stage` in `replica`. */
export function meshRank(stages: number, replica: number, stage: number): number {
  return replica * stages + stage;
}

/**
 * Makes the subgroups of an S x D layout on `world` (every rank must call it, in the same round):
 * the D pipelines, then the S data-parallel groups.
 */
export async function pipelineMesh(world: ProcessGroup, stages: number, replicas: number): Promise<PipelineMesh> {
  if (world.worldSize !== stages * replicas) {
    throw new RangeError(
      `a pipeline of ${stages} stage(s) x ${replicas} replica(s) needs ${stages * replicas} ranks, the group has ${world.worldSize}`,
    );
  }
  const stage = world.rank % stages;
  const replica = Math.floor(world.rank / stages);
  let pipe: ProcessGroup | null = null;
  let dp: ProcessGroup | null = null;
  for (let d = 0; d < replicas; d++) {
    const g = await world.newGroup(Array.from({ length: stages }, (_, s) => meshRank(stages, d, s)));
    if (d === replica) pipe = g;
  }
  for (let s = 0; s < stages; s++) {
    const g = await world.newGroup(Array.from({ length: replicas }, (_, d) => meshRank(stages, d, s)));
    if (s === stage) dp = g;
  }
  return { world, pipe: pipe!, dp: dp!, stage, replica, stages, replicas };
}

/** The checkpoint part a stage saves and loads. */
export function stagePart(stage: number): string {
  return `stage-${stage}`;
}

export interface PipelineStepContext {
  /** This replica's samples for the step: every stage of the replica gets the same. */
  indices: number[];
  step: number;
  epoch: number;
  stage: PipelineStage;
  /** DDP over this stage's replicas: the stage step leaves the gradients on it; `ddp.step(optimizer)` applies them. */
  ddp: DistributedDataParallel;
  optimizer: tf.Optimizer;
  mesh: PipelineMesh;
}

export interface PipelineRoundContext {
  mesh: PipelineMesh;
  stage: PipelineStage;
  ddp: DistributedDataParallel;
  step: number;
  epoch: number;
}

export interface PipelineRunOptions<M extends StepMetrics = StepMetrics>
  extends Omit<RendezvousOptions, 'reconnect' | 'min' | 'max'>,
    ScheduleOptions,
    RunHooks<ElasticEvent>,
    LockstepHooks<PipelineRoundContext, M> {
  /** S: stages per pipeline. */
  stages: number;
  /** D: replicas of the pipeline. Default 1. */
  replicas?: number;
  /** The whole model's layers (see `modelLayers`); each rank builds only its stage's. */
  layers: LayerFactory[];
  inputShape: number[];
  /** Where stages 1 .. S-1 start (layer indices). Default: balanced by parameter count. */
  splitPoints?: number[];
  /** Makes a stage's optimizer (each stage steps its own). */
  optimizer: () => tf.Optimizer;

  /** One training step of this rank's stage (run the stage's schedule, then `ddp.step(optimizer)`). */
  step(ctx: PipelineStepContext): Promise<M | undefined> | Promise<void>;
  /** Each stage's replica 0 saves the stage's part every this many steps (0: never). */
  checkpointEvery?: number;
  /** Resume from this session's checkpoints. Default: this session's. */
  resumeFrom?: string | null;
  resumeFromToken?: string;
  /** Compare the replicas of each stage every this many steps (ReplicaDivergenceError). Default 0. */
  checkReplicasEvery?: number;
  ddp?: DDPOptions;
}

export interface PipelineRunResult {
  mesh: PipelineMesh;
  stage: PipelineStage;
  ddp: DistributedDataParallel;
  state: TrainState;
  steps: number;
  epoch: number;
  generations: number;
  /** Steps trained again after a failure (since the checkpoint the run resumed from). */
  stepsRedone: number;
  resumes: string[];
  stoppedBy: number | null;
  /** Waits for every rank (a barrier), then leaves the group. */
  close(): Promise<void>;
}

/** A lost rank, said in pipeline terms: which stage of which replica it held. */
export function describeMeshFailure(err: unknown, stages: number, replicas: number): string {
  const e = err instanceof Error ? err : new Error(String(err));
  if (e instanceof PeerLostError) {
    const stage = e.rank % stages;
    const replica = Math.floor(e.rank / stages);
    return `rank ${e.rank}, stage ${stage} of ${stages}${replicas > 1 ? ` in replica ${replica}` : ''}, was lost (${e.reason})`;
  }
  return `${e.name}: ${e.message}`;
}

type Outcome = { kind: 'done' } | { kind: 'stopped'; by: number };

/** Trains a pipeline (x data parallel) until the epochs or steps are done or a rank stops it. */
export async function runPipeline<M extends StepMetrics>(o: PipelineRunOptions<M>): Promise<PipelineRunResult> {
  const replicas = o.replicas ?? 1;
  checkSchedule(o);
  for (const [name, v] of [
    ['stages', o.stages],
    ['replicas', replicas],
  ] as const) {
    if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`${name} must be a positive integer, got ${v}`);
  }
  if (o.layers.length < o.stages)
    throw new RangeError(
      `a model of ${o.layers.length} layers cannot be split into ${o.stages} stages: each stage needs at least one layer`,
    );
  const world = o.stages * replicas;
  const emit = (e: ElasticEvent) => {
    o.onEvent?.(e);
    recordEvent(e);
  };
  // A stage waits for the stages before and after it for whole passes (under GPipe, the last
  // stage's forwards and backwards): a live but busy peer has LinkOptions.peerTimeoutMs (120 s).
  const handler = await RendezvousHandler.start({ ...o, min: world, max: world, reconnect: true }, (e) => {
    o.onRendezvous?.(e);
    // What the dashboard shows while the pipeline waits for its ranks.
    if (e.type === 'paused') emit({ type: 'paused', min: e.min });
    else if (e.type === 'waiting')
      emit({ type: 'waiting', waiting: e.waiting, members: e.members, min: e.min, max: e.max, running: e.running });
    else if (e.type === 'reconnecting') emit({ type: 'reconnecting', attempt: e.attempt, waitMs: e.waitMs, reason: e.reason });
    else if (e.type === 'reconnected') emit({ type: 'reconnected' });
  });
  try {
    return await new PipelineRun(o, replicas, handler).run();
  } catch (err) {
    handler.shutdown();
    throw err;
  }
}

class PipelineRun<M extends StepMetrics> {
  private record: RunRecord = { generations: 0, stepsRedone: 0, resumes: [] };
  private state: TrainState | undefined;
  private stage: PipelineStage | undefined;
  private readonly started = performance.now();
  private readonly maxSteps: number;
  private readonly maxEpochs: number;
  /** The furthest step any round committed: steps up to it trained again count as redone. */
  private furthest = 0;

  constructor(
    private readonly o: PipelineRunOptions<M>,
    private readonly replicas: number,
    private readonly handler: RendezvousHandler,
  ) {
    this.maxSteps = o.steps ?? Number.POSITIVE_INFINITY;
    this.maxEpochs = o.steps == null ? (o.epochs ?? 1) : Number.POSITIVE_INFINITY;
  }

  async run(): Promise<PipelineRunResult> {
    // A pipeline is a fixed size: waiting members are spectators, a round never asks for a regroup.
    return runAgent(this.handler, { round: (round) => this.round(round), failed: (round, err) => this.failed(round, err) });
  }

  /** One round: the mesh, this rank's stage restored from the newest checkpoint all stages have, then training to the end. */
  private async round(round: Round): Promise<PipelineRunResult> {
    const { pg } = round;
    const mesh = await pipelineMesh(pg, this.o.stages, this.replicas);
    const { stage, state } = this.build(mesh);
    const ddp = await DistributedDataParallel.create(stage.model, mesh.dp, { ...this.o.ddp, name: 'pipeline' });
    await this.restore(round, mesh, state);
    const ctx = () => ({ mesh, stage, ddp, step: state.progress.step, epoch: state.progress.epoch });
    await this.o.onRound?.(ctx());
    const outcome = await this.train(round, mesh, stage, ddp, state, ctx);
    const p = state.progress;
    const stoppedBy = outcome.kind === 'stopped' ? outcome.by : null;
    this.emit({
      type: 'end',
      round: round.key,
      rank: pg.rank,
      worldSize: pg.worldSize,
      steps: p.step,
      epoch: p.epoch,
      generations: this.record.generations,
      stepsRedone: this.record.stepsRedone,
      stoppedBy,
      weightHash: await ddp.weightsHash(),
    });
    return {
      mesh,
      stage,
      ddp,
      state,
      steps: p.step,
      epoch: p.epoch,
      generations: this.record.generations,
      stepsRedone: this.record.stepsRedone,
      resumes: [...this.record.resumes],
      stoppedBy,
      close: async () => {
        await pg.barrier().catch(() => {});
        this.handler.shutdown();
      },
    };
  }

  private async failed(round: Round, err: unknown): Promise<'retry'> {
    const recoverable = isRecoverable(err);
    const error = describeMeshFailure(err, this.o.stages, this.replicas);
    this.emit({
      type: 'failure',
      round: round.key,
      rank: round.pg.rank,
      step: this.state?.progress.step ?? 0,
      inFlight: null,
      error,
      recoverable,
    });
    if (!recoverable) throw err;
    return 'retry';
  }

  /** This rank's stage and a fresh state for it (every round: what it held before is replaced by the checkpoint). */
  private build(mesh: PipelineMesh): { stage: PipelineStage; state: TrainState } {
    if (this.state) {
      this.state.dispose();
      this.stage!.model.dispose();
    }
    const stage = new PipelineStage({
      layers: this.o.layers,
      inputShape: this.o.inputShape,
      group: mesh.pipe,
      ...(this.o.splitPoints ? { splitPoints: this.o.splitPoints } : {}),
    });
    this.stage = stage;
    this.state = new TrainState({ model: stage.model, optimizer: this.o.optimizer });
    return { stage, state: this.state };
  }

  /**
   * Every rank loads its stage's part of the newest checkpoint step that every stage has saved,
   * or starts afresh when some stage has none.
   */
  private async restore(round: Round, mesh: PipelineMesh, state: TrainState): Promise<void> {
    const o = this.o;
    const session = o.resumeFrom ?? o.session;
    const token = o.resumeFromToken ?? o.token;
    const part = stagePart(mesh.stage);
    const saved = await listCheckpoints(o.url, session, { token, part });
    const latest = saved.reduce((m, c) => Math.max(m, c.step ?? -1), -1);
    // With the step every stage has, each rank's furthest committed step: a new tab knows none.
    const all = await mesh.world.allGather(Float32Array.of(latest, this.furthest));
    const step = Math.min(...all.filter((_, i) => i % 2 === 0));
    this.furthest = Math.max(...all.filter((_, i) => i % 2 === 1));
    let source: 'fresh' | 'checkpoint' = 'fresh';
    let note: string | undefined;
    if (step >= 0) {
      const r = await restoreStatePart(state, {
        url: o.url,
        session: o.session,
        token: o.token,
        resumeFrom: o.resumeFrom,
        resumeFromToken: o.resumeFromToken,
        part,
        step,
      });
      source = 'checkpoint';
      note = `every stage resumed from its checkpoint at step ${step}`;
      this.record = { ...r.run, resumes: [...r.run.resumes, note] };
    } else if (this.furthest > 0) {
      note = 'no checkpoint of every stage: the run starts again from step 0';
      this.record = { ...this.record, resumes: [...this.record.resumes, note] };
    }
    const redone = Math.max(0, this.furthest - state.progress.step);
    this.record = { ...this.record, generations: this.record.generations + 1, stepsRedone: this.record.stepsRedone + redone };
    const p = state.progress;
    this.emit({
      type: 'round',
      round: round.key,
      rank: mesh.world.rank,
      worldSize: mesh.world.worldSize,
      step: p.step,
      epoch: p.epoch,
      position: p.position,
      ...samplerSettings(o),
      source,
      from: 0,
      redone: redone > 0,
      stepsRedone: this.record.stepsRedone,
      ...(note ? { note } : {}),
      samplers: mesh.replicas,
    });
  }

  private async train(
    round: Round,
    mesh: PipelineMesh,
    stage: PipelineStage,
    ddp: DistributedDataParallel,
    state: TrainState,
    ctx: () => PipelineRoundContext,
  ): Promise<Outcome> {
    const o = this.o;
    const p = state.progress;
    const d = this.replicas;
    const length = o.datasetLength;
    while (p.epoch < this.maxEpochs && p.step < this.maxSteps) {
      // The sampler shards by replica: every stage of a replica walks the same samples.
      const plan = planEpoch(length, p, {
        numReplicas: d,
        rank: mesh.replica,
        batchSize: o.batchSize,
        shuffle: o.shuffle,
        seed: o.seed,
        dropLast: o.dropLast,
      });
      const { stepsLeft, fullEpochSteps } = plan;
      const totalSteps = Math.min(this.maxSteps, p.step + stepsLeft + (this.maxEpochs - p.epoch - 1) * fullEpochSteps);
      if (stepsLeft > 0)
        this.emit({
          type: 'epoch',
          round: round.key,
          rank: mesh.world.rank,
          epoch: p.epoch,
          samples: plan.samples,
          datasetLength: length,
          stepsPerEpoch: fullEpochSteps,
        });
      for (let k = 0; k < stepsLeft && p.step < this.maxSteps; k++) {
        const { indices: batch, padding } = batchOf(plan, k, o.batchSize);
        // One stage per replica reports the samples: the others train on the same ones.
        if (mesh.stage === 0)
          this.emit({ type: 'batch', round: round.key, rank: mesh.replica, step: p.step + 1, epoch: p.epoch, indices: batch, padding });
        const metrics =
          (await o.step({ indices: batch, step: p.step + 1, epoch: p.epoch, stage, ddp, optimizer: state.optimizer, mesh })) ?? ({} as M);
        p.position = k === stepsLeft - 1 ? length : Math.min(length, p.position + o.batchSize * d);
        p.step++;
        this.furthest = Math.max(this.furthest, p.step);
        const vote = await stepVote(mesh.world, metrics, { stop: o.shouldStop?.() ?? false, join: false, stopVote: o.stopVote });
        this.emit({
          type: 'step',
          round: round.key,
          rank: mesh.world.rank,
          step: p.step,
          epoch: p.epoch,
          totalSteps,
          metrics: vote.metrics,
          elapsedMs: performance.now() - this.started,
        });
        await o.onStep?.({ ...ctx(), metrics: vote.metrics });
        if ((o.checkReplicasEvery ?? 0) > 0 && p.step % o.checkReplicasEvery! === 0) await verifyReplicas(mesh.dp, stage.model);
        if ((o.checkpointEvery ?? 0) > 0 && p.step % o.checkpointEvery! === 0) await this.checkpoint(mesh, state);
        if (vote.stoppedBy !== null) return { kind: 'stopped', by: vote.stoppedBy };
      }
      if (p.position >= length) {
        await o.onEpochEnd?.(ctx());
        p.epoch++;
        p.position = 0;
        if ((o.checkpointEvery ?? 0) > 0) await this.checkpoint(mesh, state);
      }
    }
    return { kind: 'done' };
  }

  /** Replica 0 of each stage saves the stage's part; a failed save is reported and training goes on. */
  private async checkpoint(mesh: PipelineMesh, state: TrainState): Promise<void> {
    if (mesh.replica !== 0) return;
    const step = state.progress.step;
    const stage = this.stage!;
    const meta: Json = {
      ...(isObject(this.o.checkpointMeta) ? this.o.checkpointMeta : {}),
      pipeline: { stage: mesh.stage, stages: mesh.stages, splitPoints: stage.splitPoints },
    };
    try {
      const saved = await saveState(state, this.record, {
        url: this.o.url,
        session: this.o.session,
        token: this.o.token,
        meta,
        part: stagePart(mesh.stage),
      });
      this.emit({ type: 'checkpoint', step, name: `${stagePart(mesh.stage)}/${saved.name}`, bytes: saved.bytes });
    } catch (err) {
      this.emit({ type: 'checkpoint-failed', step, error: `${stagePart(mesh.stage)}: ${(err as Error).message}` });
    }
  }

  private emit(e: ElasticEvent): void {
    this.o.onEvent?.(e);
    recordEvent(e);
  }
}

function isObject(v: Json | undefined): v is { [key: string]: Json } {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
