/**
 * Elastic training for any training step (what torchrun plus torchft's Manager give a torch
 * script): `runElastic` joins the session's group of min..max ranks and trains through its
 * rounds. At the start of each round every rank gets the state of a replica that held the
 * group's state before (chosen by a rule a joiner's claims cannot sway, see recovery.ts), or the
 * latest checkpoint when nobody has one; the rest of the epoch is re-sharded among the round's
 * ranks from the sampler's position, and training goes on. At each step boundary the ranks
 * vote, in one small gather through the server that also carries each rank's metrics (each row
 * placed at its sender's rank: a rank speaks only for itself): stop (any rank asked, or all with
 * stopVote 'all'), or regroup (members wait to join; after a barrier the round ends and the next
 * one admits them). The vote goes out as a step begins and is read after it (voteWithGradients),
 * with the metrics of the step before: its round trip overlaps the step, one meeting point per step.
 * A lost rank, a lost server or a replaced group ends the round and the next one continues; failures that a new round cannot fix (mismatched ranks, a bug in the
 * step) end the run. A fixed world size is the same code path with min = max: a lost rank then
 * pauses the group until a tab takes its place. A lost WebGPU device ends this rank's step at
 * once with DeviceLostError; given `rebuildState`, the rank re-creates its backend, leaves the
 * group, and rejoins it holding no state, so that recovery gives it the group's. When the run
 * ends (done, or stopped), every rank closes the session's rendezvous, as torch's agents do at
 * shutdown: a tab still waiting to be admitted, or arriving later, fails at once with
 * RendezvousClosedError instead of waiting out its timeout for a group that will never train.
 *
 * The user's step function is a plain training step: it gets this rank's sample indices and the
 * round's DistributedDataParallel, computes and applies the gradients, and returns its metrics.
 *
 * Communication hooks (torch: a hook registered on the DDP model, its state part of the training
 * state): `commHook` makes this rank's hook once; every round's DDP registers it, numbering its
 * steps on from the run's (GradBucket.step is the run's step). Its state goes with the training
 * state, to checkpoints and to the ranks of a new round: see hook_recovery.ts.
 *
 * Local SGD (`modelAverager`, torch's PostLocalSGDOptimizer, with the `postLocalSGD` hook):
 * after each committed step runElastic averages the replicas' weights at the averager's steps.
 * Between averagings the replicas differ by design, so `checkReplicasEvery` then checks only at
 * averaging steps (a check due at a step in between waits for the next one), rank 0 checkpoints
 * its own replica's weights, and a regroup between averagings gives every rank one replica's
 * weights (the source's, as always): an implicit averaging point, where the others' local steps
 * since the last averaging are lost. A run that ends between averagings averages once more at
 * its end, so that every rank ends with the same model.
 *
 * DiLoCo (`diloco`, see parallel/diloco.ts): the DiLoCo object is the rank's hook (inner steps
 * communicate nothing) and runElastic takes its outer step after every H-th committed step, and
 * once more at the end of a run that ends between two. Replicas are identical only after outer
 * steps, where `checkReplicasEvery` checks. At the start of a round, after the state transfer,
 * every rank takes the group's outer state from the source (it is the same on every rank), and
 * the ranks that trained inner steps since the last outer step take one outer step together
 * over them (DiLoCo.rejoin), up to the last step every rank finished (a vote or an outer step:
 * see backToConfirmed), and a joiner starts from the outer weights. With balanced batches a slow
 * rank trains fewer samples per inner step (it does not hold the others), and DiLoCo weighs its
 * pseudo-gradient by them (DiLoCo.countStep).
 */
import { DistributedDataParallel } from './ddp.ts';
import { allreduceHook } from '../comm_hooks/default_hooks.ts';
import type { CommHook } from '../comm_hooks/types.ts';
import { disposeQuietly, recreateBackend } from '../../runtime/device.ts';
import { DeviceLostError, isRecoverable } from '../../wire/errors.ts';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { RendezvousHandler, type RendezvousEvent, type Round } from '../../c10d/rendezvous.ts';
import type { TrainState } from '../../checkpoint/state_dict.ts';
import { recordEvent, type ElasticEvent } from '../events.ts';
import { JudgmentWatch, type ContributionOf } from './contributions.ts';
import type { AggregationReport } from '../robust/reducer.ts';
import { recover, type Recovered, type RoundRef } from '../../elastic/recovery.ts';
import { saveState } from '../../elastic/checkpoints.ts';
import type { RunRecord } from '../../elastic/run_record.ts';
import type { StepMetrics } from '../../elastic/vote.ts';
import { REGROUP, runAgent, samplerSettings } from '../../elastic/agent.ts';
import { TimelineRecorder } from '../../elastic/timeline.ts';
import { DeviceGuard } from './device_guard.ts';
import { LocalSteps } from './local_steps.ts';
import { StepLoop, type StepLoopHost } from './step_loop.ts';
import { loadRecoveredHookState } from './hook_recovery.ts';
import type { DiLoCoHeld } from '../diloco/diloco.ts';
import { LocalDataRun } from './local_data.ts';

export type { StepMetrics } from '../../elastic/vote.ts';

export type { ElasticRunOptions, ElasticRunResult, RebuildContext, RoundContext, StepContext } from './runner_types.ts';
import { checkOptions, type ElasticRunOptions, type ElasticRunResult } from './runner_types.ts';

/** Trains with `options.step` until the epochs or steps are done or a rank asks to stop. */
export async function runElastic<M extends StepMetrics>(given: ElasticRunOptions<M>): Promise<ElasticRunResult> {
  checkOptions(given);
  // With this rank's own samples, the length is theirs (fixed while the run trains on them).
  const options = given.localData ? { ...given, datasetLength: given.localData.length } : given;
  const release = options.localData?.beginTraining('runElastic');
  try {
    const run = new ElasticRun(options);
    const handler = await RendezvousHandler.start({ ...options, reconnect: true }, (e) => run.onRendezvous(e));
    try {
      return await run.run(handler);
    } catch (err) {
      handler.shutdown();
      throw err;
    }
  } finally {
    release?.();
  }
}

class ElasticRun<M extends StepMetrics> implements StepLoopHost<M> {
  private record: RunRecord = { generations: 0, stepsRedone: 0, resumes: [] };
  /** Whether this rank's state is worth keeping (it trained, or received a state). */
  private live = false;
  /** The latest round whose state this rank took (or kept) and trained in: what it tells the next recovery. */
  private heldIn: RoundRef | null = null;
  /** The step started here but not committed, or -1. */
  inFlight = -1;
  private paused = 0;
  /** The current round's key (for events raised outside the steps). */
  private roundKey = '';
  /** Robust aggregation: which reports were told already (DDP's and DiLoCo's `lastAggregation` outlive their step). */
  private readonly judgments = new JudgmentWatch();
  /** When this rank last left a round (it failed, or it asked for a regroup): the start of the next one's rendezvous. */
  private leftRoundAt: number | null = null;
  readonly started = performance.now();
  readonly maxSteps: number;
  readonly maxEpochs: number;
  handler!: RendezvousHandler;
  /** The state trained: `o.state`, until a lost device makes `rebuildState` replace it. */
  state: TrainState;
  /** This rank's WebGPU device, and what the run is doing on it. */
  readonly guard: DeviceGuard;
  /** This rank's communication hook (`o.commHook`'s, or DiLoCo), kept across rounds; undefined without one. */
  private readonly hook: CommHook | undefined;
  /** The hook's name, or the default's. */
  private readonly hookName: string;
  /** Local SGD's averagings and DiLoCo's outer steps. */
  readonly local: LocalSteps;
  /** Balanced batches: the batch sizes this page has trained (a new size compiles kernels: its time is not its cost). */
  readonly sizesRun = new Set<number>();
  /** With `localData`: this rank's own samples' run. */
  readonly localData: LocalDataRun | null;
  /** The running round's DDP (null between rounds). */
  private ddp: DistributedDataParallel | null = null;
  /** Where this rank's steps spend their time (ElasticRunResult.timeline). */
  readonly timeline = new TimelineRecorder();

  constructor(readonly o: ElasticRunOptions<M>) {
    this.state = o.state;
    this.guard = new DeviceGuard(o.rebuildState !== undefined);
    this.local = new LocalSteps(o, this.guard, (of, report) => this.tellJudgments(of, report));
    this.hook = this.local.diloco ?? o.commHook?.();
    if (o.commHook && (!this.hook || typeof this.hook.reduce !== 'function' || typeof this.hook.name !== 'string')) {
      throw new TypeError('commHook must return a CommHook: { name, reduce(pg, bucket) } (see comm_hooks/)');
    }
    this.hookName = this.hook?.name ?? allreduceHook().name;
    this.localData = o.localData ? new LocalDataRun(o.localData, o, (e) => o.onLocalData?.(e)) : null;
    this.maxSteps = o.steps ?? Number.POSITIVE_INFINITY;
    this.maxEpochs = o.steps == null ? (o.epochs ?? 1) : Number.POSITIVE_INFINITY;
  }

  onRendezvous(e: RendezvousEvent): void {
    this.o.onRendezvous?.(e);
    switch (e.type) {
      case 'paused':
        this.paused++;
        this.emit({ type: 'paused', min: e.min });
        return;
      case 'waiting':
        this.emit({ type: 'waiting', waiting: e.waiting, members: e.members, min: e.min, max: e.max, running: e.running });
        return;
      case 'reconnecting':
        this.emit({ type: 'reconnecting', attempt: e.attempt, waitMs: e.waitMs, reason: e.reason });
        return;
      case 'reconnected':
        this.emit({ type: 'reconnected' });
        return;
      case 'store':
        this.emit(e);
        return;
      case 'round':
      case 'spectating': // a spectator waits in nextRendezvous; the page hears it through onRendezvous
      case 'control': // the page decides what a host's control means for it
      case 'closed': // nextRendezvous fails with RendezvousClosedError
      case 'faults': // the server's record: the page shows it as it comes (onRendezvous)
        return;
      default: {
        const unknown: never = e;
        void unknown;
      }
    }
  }

  async run(handler: RendezvousHandler): Promise<ElasticRunResult> {
    this.handler = handler;
    try {
      return await this.rounds();
    } finally {
      // The result's DDP goes on without the run: evaluating on a lost device fails on its own.
      this.guard.stop();
    }
  }

  private rounds(): Promise<ElasticRunResult> {
    return runAgent(this.handler, {
      round: (round, again) => this.round(round, again),
      failed: (round, err) => this.failed(round, err),
      regrouping: (round) => {
        this.leftRoundAt = performance.now();
        this.emit({
          type: 'regroup',
          round: round.key,
          rank: round.pg.rank,
          step: this.state.progress.step,
          waiting: this.handler.numNodesWaiting(),
        });
      },
      peerLost: (round, e) => this.emit({ type: 'peer-lost', round: round.key, rank: round.pg.rank, peer: e.rank, reason: e.reason }),
    });
  }

  /** One round: the state transfer and a DDP for the round's group (`again`: kept from before), then training until the run ends or members wait. */
  private async round(round: Round, again: boolean): Promise<ElasticRunResult | typeof REGROUP> {
    const o = this.o;
    const { pg } = round;
    this.guard.rank = pg.rank;
    this.roundKey = round.key;
    if (!again || !this.ddp) {
      this.guard.activity = `the state transfer at the start of round ${round.key}`;
      // DiLoCo: this rank's own weights, which the state transfer replaces, count in the round's first outer step.
      const held = this.local.diloco && this.live ? this.backToConfirmed() : null;
      const source = await this.guard.whileLives(this.startRound(round, held));
      // The DDP numbers its steps on from the run's, which is what hooks see as GradBucket.step.
      // Its start-up sync (a shape check and a broadcast) is what the state transfer just did,
      // unless nobody had a state and every rank starts from its own seeded model.
      this.ddp = await DistributedDataParallel.create(this.state.model, pg, {
        ...o.ddp,
        startStep: this.state.progress.step + 1,
        initSync: source === 'fresh',
      });
      if (this.hook) this.ddp.registerCommHook(this.hook);
      this.guard.activity = `onRound of round ${round.key}`;
      await this.guard.whileLives(o.onRound?.({ pg, ddp: this.ddp, step: this.state.progress.step, epoch: this.state.progress.epoch }));
    }
    const ddp = this.ddp;
    const outcome = await new StepLoop(this, round, ddp).run();
    if (outcome.kind === 'regroup') return REGROUP;
    // The run is over (every rank voted so); the agent closes the rendezvous.
    this.guard.activity = 'the final weights hash';
    const weightHash = await this.guard.whileLives(ddp.weightsHash());
    const stoppedBy = outcome.kind === 'stopped' ? outcome.by : null;
    const p = this.state.progress;
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
      weightHash,
    });
    return {
      pg,
      ddp,
      rank: pg.rank,
      worldSize: pg.worldSize,
      steps: p.step,
      epoch: p.epoch,
      generations: this.record.generations,
      stepsRedone: this.record.stepsRedone,
      pausedGenerations: this.paused,
      resumes: [...this.record.resumes],
      stoppedBy,
      weightHash,
      timeline: this.timeline.read(),
      ...(this.localData ? { localEvaluation: this.localData.lastEvaluation } : {}),
      close: async () => {
        // A rank that left early would end the round under the others' last collectives.
        await pg.barrier().catch(() => {});
        this.handler.shutdown();
      },
    };
  }

  /** A failed round: reported; a rank that lost its device rebuilds its state and rejoins (when it can), the others form a new round. */
  private async failed(round: Round, err: unknown): Promise<'retry' | 'rejoined'> {
    this.leftRoundAt = performance.now();
    this.ddp = null;
    const lost = await this.guard.lossOf(err);
    const failure = lost ?? err;
    // A rank without its device can go on only with a state rebuilt on a new backend.
    const recoverable = lost ? this.o.rebuildState !== undefined : isRecoverable(err);
    const error = failure instanceof Error ? `${failure.name}: ${failure.message}` : String(failure);
    this.emit({
      type: 'failure',
      round: round.key,
      rank: round.pg.rank,
      step: this.state.progress.step,
      inFlight: this.inFlight > 0 ? this.inFlight : null,
      error,
      recoverable,
    });
    if (!recoverable) throw failure;
    if (!lost) return 'retry';
    // A rank that lost its device leaves and joins again, which makes the next round.
    await this.rebuild(round, lost);
    return 'rejoined';
  }

  /**
   * After a lost device: leaves the group (the others go on at once), re-creates the backend,
   * has the user rebuild the state on it, and rejoins holding no state, so that the next round's
   * recovery gives this rank the group's state from a surviving replica (or the checkpoint).
   */
  private async rebuild(round: Round, lost: DeviceLostError): Promise<void> {
    const started = performance.now();
    const step = this.state.progress.step;
    await this.handler.rejoin(async () => {
      this.guard.stop();
      const backend = await recreateBackend({ rank: lost.rank, during: lost.during });
      this.guard.watchAgain();
      const old = this.state;
      const fresh = await this.o.rebuildState!({
        backend: backend.backend,
        ...(backend.fallbackReason ? { fallbackReason: backend.fallbackReason } : {}),
        error: lost,
      });
      if (!fresh || fresh === old || fresh.model === old.model) {
        throw new TypeError(
          'rebuildState must return a new TrainState with a new model, built after the backend was re-created (the old one lived on the lost device)',
        );
      }
      // The old tensors lived on the lost device: free what the engine still counts.
      disposeQuietly(old, old.model);
      this.state = fresh;
      this.live = false;
      this.heldIn = null;
      this.emit({
        type: 'device-lost',
        round: round.key,
        rank: lost.rank,
        step,
        during: lost.during,
        reason: lost.reason,
        message: lost.detail,
        backend: backend.backend,
        ...(backend.fallbackReason ? { fallbackReason: backend.fallbackReason } : {}),
        rebuildMs: performance.now() - started,
      });
    });
  }

  /** One state for everyone, from a surviving replica (or a checkpoint): see `recover`. */
  /** DiLoCo, before a round's state transfer: back to the last step every rank finished (see LocalSteps.backToConfirmed). */
  private backToConfirmed(): DiLoCoHeld | null {
    const back = this.local.backToConfirmed(this.state);
    if (back.inFlight !== undefined) this.inFlight = back.inFlight;
    return back.held;
  }

  private async startRound(round: Round, held: DiLoCoHeld | null): Promise<Recovered['source']> {
    const { pg } = round;
    const o = this.o;
    const claim = { live: this.live, inFlight: this.inFlight, heldIn: this.heldIn };
    const hook = this.hook;
    const r = await recover(
      pg,
      this.state,
      this.record,
      claim,
      {
        url: o.url,
        session: o.session,
        token: o.token,
        resumeFrom: o.resumeFrom,
        resumeFromToken: o.resumeFromToken,
        keepSameState: !this.local.diloco,
      },
      { name: this.hookName, state: () => hook?.stateDict?.() ?? null },
    );
    // Loaded onto a device lost meanwhile, the state is not live: the catch handles the loss.
    this.guard.throwIfLost();
    const hookNote = loadRecoveredHookState(this.hook, this.hookName, r, {
      wasLive: claim.live,
      rank: pg.rank,
      groupState: this.local.diloco !== undefined,
    });
    let outerNote: string | undefined;
    const diloco = this.local.diloco;
    if (diloco) {
      this.guard.activity = `DiLoCo's outer step at the start of round ${round.key}`;
      const since = diloco.syncedAtStep;
      // An outer step of the failed round that landed but was never told is not this round's.
      this.judgments.pass(diloco.lastAggregation);
      const j = await diloco.rejoin(pg, this.state.model, held, this.state.progress.step);
      if (j.outerStep)
        outerNote = `an outer step over the inner steps since step ${since} of ${j.contributors} rank${j.contributors === 1 ? '' : 's'}`;
    }
    const note = [r.note, hookNote, outerNote].filter((n) => n !== undefined).join('; ');
    await this.local.confirm(this.state);
    for (const s of r.skipped) this.emit({ type: 'checkpoint-skipped', name: s.name, reason: s.reason });
    this.live = true;
    this.heldIn = { instance: pg.instance, round: pg.round };
    this.inFlight = -1;
    this.record = { ...r.run, generations: r.run.generations + 1 };
    const p = this.state.progress;
    // A checkpoint (or a peer's state) from another dataset, or a damaged one: past this dataset's
    // end no sampler position means anything, and every resume would fail the same way.
    // (With local data the position counts the union's samples, which no rank can check.)
    if (!this.localData && p.position > o.datasetLength) {
      throw new RangeError(
        `the restored state is at sample ${p.position} of epoch ${p.epoch}, past this dataset's ${o.datasetLength} samples: it is another run's (resume from another checkpoint, or start a new session)`,
      );
    }
    this.emit({
      type: 'round',
      round: round.key,
      rank: pg.rank,
      worldSize: pg.worldSize,
      step: p.step,
      epoch: p.epoch,
      position: p.position,
      ...samplerSettings(o),
      ...(this.localData ? { localData: true } : {}),
      source: r.source,
      from: r.from,
      redone: r.redone,
      stepsRedone: this.record.stepsRedone,
      ...(note ? { note } : {}),
      phasesMs: { ...this.phases(round), claims: r.claimsMs },
    });
    if (outerNote) this.tellJudgments('pseudo-gradients', diloco?.lastAggregation);
    return r.source;
  }

  /**
   * Where this rank's way into `round` went (the 'round' event's `phasesMs`). Its event may have
   * come before this rank noticed that the last round failed (the new round is what failed it):
   * then the rendezvous cost it nothing, and the state is timed from when it left.
   */
  private phases(round: Round): { rendezvous: number | null; state: number } {
    const left = this.leftRoundAt;
    const start = left === null ? round.receivedAt : Math.max(left, round.receivedAt);
    return { rendezvous: left === null ? null : Math.max(0, round.receivedAt - left), state: performance.now() - start };
  }

  /** Rank 0 saves; a failed save is reported and training goes on (the previous checkpoint is still there). */
  async checkpoint(pg: ProcessGroup): Promise<void> {
    if (pg.rank !== 0) return;
    const step = this.state.progress.step;
    try {
      const commHook = this.hook?.stateDict?.() ?? null;
      const saved = await saveState(this.state, this.record, {
        url: this.o.url,
        session: this.o.session,
        token: this.o.token,
        meta: this.o.checkpointMeta,
        commHook,
      });
      this.emit({ type: 'checkpoint', step, name: saved.name, bytes: saved.bytes });
    } catch (err) {
      // Not a failed save but a lost device: the run handles that.
      if (this.guard.isLost() || err instanceof DeviceLostError) throw err;
      this.emit({ type: 'checkpoint-failed', step, error: (err as Error).message });
    }
  }

  /** A robust aggregation not told yet: its judgments, as an 'aggregation' event. */
  tellJudgments(of: ContributionOf, report: AggregationReport | null | undefined): void {
    const judged = this.judgments.take(report, of);
    if (judged) this.emit({ type: 'aggregation', round: this.roundKey, rank: this.guard.rank, ...judged });
  }

  emit(e: ElasticEvent): void {
    this.o.onEvent?.(e);
    recordEvent(e);
  }
}
