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
 * state). `commHook` makes this rank's hook once; every round's DDP registers it, numbering its
 * steps on from the run's (GradBucket.step is the run's step). Its state goes with the training
 * state: rank 0 saves its hook's state in each checkpoint, and every rank loads it on resuming
 * from one (rank 0 whole, the others without the per-rank parts: PowerSGD's Q's and iteration,
 * error feedback from zero; see LoadCommHookStateOptions). When a round's state comes from a live
 * replica, the source sends its hook's name and state along: a rank that held no state (a
 * joiner, a rank whose device was lost) takes the shared parts of it (PowerSGD: the warm-start
 * Q's, so that it starts warm; its error feedback starts at zero, as a restarted rank's in
 * torch), and a rank that held state (a survivor, the source) keeps its own hook's state, error
 * feedback included. PowerSGD's reductions stay bit-identical on every rank whatever Q each rank
 * starts from (everything it uses after an all-reduce was all-reduced), so a survivor's Q from a
 * step that failed halfway does no harm. A rank whose hook is not the source's kind ends its run
 * with an error: every rank must run the same hook.
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
import { DistributedDataParallel } from '../parallel/ddp.ts';
import { allreduceHook } from '../parallel/comm_hooks/default_hooks.ts';
import { PeriodicModelAverager } from '../parallel/comm_hooks/local_sgd.ts';
import { DiLoCo, type DiLoCoHeld } from '../parallel/diloco.ts';
import type { CommHook } from '../parallel/comm_hooks/types.ts';
import { disposeQuietly, recreateBackend, watchDevice, type DeviceLostInfo, type DeviceWatch } from '../runtime/device.ts';
import { DeviceLostError, isRecoverable } from '../errors.ts';
import type { ProcessGroup } from '../c10d/process_group.ts';
import { verifyReplicas } from '../parallel/replicas.ts';
import { RendezvousHandler, type RendezvousEvent, type Round } from './rendezvous.ts';
import type { Progress, TrainState } from '../checkpoint/state_dict.ts';
import { recordEvent, type ElasticEvent } from './events.ts';
import { JudgmentWatch, type ContributionOf } from './contributions.ts';
import type { AggregationReport } from '../parallel/robust/reducer.ts';
import { recover, saveState, type Recovered, type RoundRef, type RunRecord } from './recovery.ts';
import { startVote, stepsVote, type StepMetrics, type StepsVote } from './vote.ts';
import { balancedBatchOf, batchOf, planEpoch, planGlobalEpoch, splitBatch } from './epoch.ts';
import { BatchBalancer } from './balance.ts';
import { REGROUP, runAgent, samplerSettings } from './agent.ts';
import { TimelineRecorder } from './timeline.ts';
import { yieldToEventLoop } from '../runtime/ticker.ts';

export type { StepMetrics } from './vote.ts';

export type { ElasticRunOptions, ElasticRunResult, RebuildContext, RoundContext, StepContext } from './types.ts';
import { balanceOf, checkOptions, type ElasticRunOptions, type ElasticRunResult } from './types.ts';

type Outcome = { kind: 'done' } | { kind: 'stopped'; by: number } | { kind: 'regroup' };

/** Trains with `options.step` until the epochs or steps are done or a rank asks to stop. */
export async function runElastic<M extends StepMetrics>(options: ElasticRunOptions<M>): Promise<ElasticRunResult> {
  checkOptions(options);
  const run = new ElasticRun(options);
  const handler = await RendezvousHandler.start({ ...options, reconnect: true }, (e) => run.onRendezvous(e));
  try {
    return await run.run(handler);
  } catch (err) {
    handler.shutdown();
    throw err;
  }
}

class ElasticRun<M extends StepMetrics> {
  private record: RunRecord = { generations: 0, stepsRedone: 0, resumes: [] };
  /** Whether this rank's state is worth keeping (it trained, or received a state). */
  private live = false;
  /** The latest round whose state this rank took (or kept) and trained in: what it tells the next recovery. */
  private heldIn: RoundRef | null = null;
  /** The step started here but not committed, or -1. */
  private inFlight = -1;
  private paused = 0;
  /** This rank in the current round (-1 before the first). */
  private rank = -1;
  /** The current round's key (for events raised outside train()). */
  private roundKey = '';
  /** Robust aggregation: which reports were told already (DDP's and DiLoCo's `lastAggregation` outlive their step). */
  private readonly judgments = new JudgmentWatch();
  /** What the run is doing, in words, for a DeviceLostError. */
  private activity = 'joining the group';
  /** When this rank last left a round (it failed, or it asked for a regroup): the start of the next one's rendezvous. */
  private leftRoundAt: number | null = null;
  private readonly started = performance.now();
  private readonly maxSteps: number;
  private readonly maxEpochs: number;
  private handler!: RendezvousHandler;
  /** The state trained: `o.state`, until a lost device makes `rebuildState` replace it. */
  private state: TrainState;
  /** The device of the running backend (a watch that never fires on backends without one). */
  private device: DeviceWatch;
  /** This rank's communication hook (`o.commHook`'s), kept across rounds; undefined without one. */
  private readonly hook: CommHook | undefined;
  /** The hook's name, or the default's. */
  private readonly hookName: string;
  private readonly averager: PeriodicModelAverager | undefined;
  /** DiLoCo (`o.diloco`): also this rank's hook. */
  private readonly diloco: DiLoCo | undefined;
  /**
   * DiLoCo: the last step every rank is known to have finished (its vote, or an outer step,
   * completed), with this rank's progress and weights then. Inner steps communicate nothing, so a
   * step committed here may be one a lost rank never took: a failed round goes back to this one.
   */
  private confirmed: { progress: Progress; held: DiLoCoHeld } | null = null;
  /** The step after which averageAtEnd averaged (once per step, whichever end comes first). */
  private averagedAtEnd = -1;
  /** Balanced batches: the costs measured from the round's start and each step's split (null: balancing off). */
  private balancer: BatchBalancer | null = null;
  /** Balanced batches: the batch sizes this page has trained (a new size compiles kernels: its time is not its cost). */
  private readonly sizesRun = new Set<number>();
  /** A replica check fell due and waits for an averaging step (with `modelAverager`). */
  private checkDue = false;
  /** The running round's DDP (null between rounds). */
  private ddp: DistributedDataParallel | null = null;
  /** Where this rank's steps spend their time (ElasticRunResult.timeline). */
  private readonly timeline = new TimelineRecorder();

  constructor(private readonly o: ElasticRunOptions<M>) {
    this.state = o.state;
    this.diloco = o.diloco ? new DiLoCo(o.diloco) : undefined;
    this.hook = this.diloco ?? o.commHook?.();
    if (o.commHook && (!this.hook || typeof this.hook.reduce !== 'function' || typeof this.hook.name !== 'string')) {
      throw new TypeError('commHook must return a CommHook: { name, reduce(pg, bucket) } (see comm_hooks/)');
    }
    this.hookName = this.hook?.name ?? allreduceHook().name;
    this.averager = o.modelAverager ? new PeriodicModelAverager(o.modelAverager) : undefined;
    this.device = watchDevice();
    this.maxSteps = o.steps ?? Number.POSITIVE_INFINITY;
    this.maxEpochs = o.steps == null ? (o.epochs ?? 1) : Number.POSITIVE_INFINITY;
  }

  onRendezvous(e: RendezvousEvent): void {
    this.o.onRendezvous?.(e);
    switch (e.type) {
      case 'paused':
        this.paused++;
        return this.emit({ type: 'paused', min: e.min });
      case 'waiting':
        return this.emit({ type: 'waiting', waiting: e.waiting, members: e.members, min: e.min, max: e.max, running: e.running });
      case 'reconnecting':
        return this.emit({ type: 'reconnecting', attempt: e.attempt, waitMs: e.waitMs, reason: e.reason });
      case 'reconnected':
        return this.emit({ type: 'reconnected' });
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
      this.device.stop();
    }
  }

  private rounds(): Promise<ElasticRunResult> {
    return runAgent(this.handler, {
      round: (round, again) => this.round(round, again),
      failed: (round, err) => this.failed(round, err),
      regrouping: (round) => {
        this.leftRoundAt = performance.now();
        this.emit({ type: 'regroup', round: round.key, rank: round.pg.rank, step: this.state.progress.step, waiting: this.handler.numNodesWaiting() });
      },
      peerLost: (round, e) => this.emit({ type: 'peer-lost', round: round.key, rank: round.pg.rank, peer: e.rank, reason: e.reason }),
    });
  }

  /** One round: the state transfer and a DDP for the round's group (`again`: kept from before), then training until the run ends or members wait. */
  private async round(round: Round, again: boolean): Promise<ElasticRunResult | typeof REGROUP> {
    const o = this.o;
    const { pg } = round;
    this.rank = pg.rank;
    this.roundKey = round.key;
    if (!again || !this.ddp) {
      this.activity = `the state transfer at the start of round ${round.key}`;
      // DiLoCo: this rank's own weights, which the state transfer replaces, count in the round's first outer step.
      const held = this.diloco && this.live ? this.backToConfirmed() : null;
      const source = await this.whileDeviceLives(this.startRound(round, held));
      // The DDP numbers its steps on from the run's, which is what hooks see as GradBucket.step.
      // Its start-up sync (a shape check and a broadcast) is what the state transfer just did,
      // unless nobody had a state and every rank starts from its own seeded model.
      this.ddp = await DistributedDataParallel.create(this.state.model, pg, { ...o.ddp, startStep: this.state.progress.step + 1, initSync: source === 'fresh' });
      if (this.hook) this.ddp.registerCommHook(this.hook);
      this.activity = `onRound of round ${round.key}`;
      await this.whileDeviceLives(o.onRound?.({ pg, ddp: this.ddp, step: this.state.progress.step, epoch: this.state.progress.epoch }));
    }
    const ddp = this.ddp;
    const outcome = await this.train(round, ddp);
    if (outcome.kind === 'regroup') return REGROUP;
    // The run is over (every rank voted so); the agent closes the rendezvous.
    this.activity = 'the final weights hash';
    const weightHash = await this.whileDeviceLives(ddp.weightsHash());
    const stoppedBy = outcome.kind === 'stopped' ? outcome.by : null;
    const p = this.state.progress;
    this.emit({ type: 'end', round: round.key, rank: pg.rank, worldSize: pg.worldSize, steps: p.step, epoch: p.epoch, generations: this.record.generations, stepsRedone: this.record.stepsRedone, stoppedBy, weightHash });
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
    const lost = await this.deviceLoss(err);
    const failure = lost ?? err;
    // A rank without its device can go on only with a state rebuilt on a new backend.
    const recoverable = lost ? this.o.rebuildState !== undefined : isRecoverable(err);
    const error = failure instanceof Error ? `${failure.name}: ${failure.message}` : String(failure);
    this.emit({ type: 'failure', round: round.key, rank: round.pg.rank, step: this.state.progress.step, inFlight: this.inFlight > 0 ? this.inFlight : null, error, recoverable });
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
      this.device.stop();
      const backend = await recreateBackend({ rank: lost.rank, during: lost.during });
      this.device = watchDevice();
      const old = this.state;
      const fresh = await this.o.rebuildState!({ backend: backend.backend, ...(backend.fallbackReason ? { fallbackReason: backend.fallbackReason } : {}), error: lost });
      if (!fresh || fresh === old || fresh.model === old.model) {
        throw new TypeError('rebuildState must return a new TrainState with a new model, built after the backend was re-created (the old one lived on the lost device)');
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

  /** The DeviceLostError that `err` stands for when this rank's device is lost; undefined when it is not. */
  private async deviceLoss(err: unknown): Promise<DeviceLostError | undefined> {
    if (err instanceof DeviceLostError) return err;
    const device = this.device;
    // A readback can fail (mapAsync's AbortError) before `device.lost` resolves: give the loss a moment to show.
    if (!device.isLost() && device.backend === 'webgpu' && looksLikeDeviceLoss(err)) await Promise.race([device.lost, sleep(1000)]);
    return device.info ? this.lostError(device.info, err) : undefined;
  }

  private lostError(info: DeviceLostInfo, cause?: unknown): DeviceLostError {
    const advice = this.o.rebuildState ? 'This rank re-creates its backend, rebuilds its state and rejoins the group.' : undefined;
    return new DeviceLostError(this.rank, info.reason, info.message, this.activity, advice, cause === undefined ? undefined : { cause });
  }

  /** Fails with DeviceLostError if the device is lost already: work started on it now could never finish. */
  private throwIfDeviceLost(): void {
    if (this.device.info) throw this.lostError(this.device.info);
  }

  /**
   * `work`, unless the device is lost first: then DeviceLostError at once, whatever `work` does
   * (a step on a lost device may fail late with a cryptic error, or not settle at all).
   */
  private whileDeviceLives<T>(work: T | Promise<T>): Promise<T> {
    const p = Promise.resolve(work);
    const device = this.device;
    return new Promise<T>((resolve, reject) => {
      const off = device.onLost((info) => {
        p.catch(() => {}); // what the abandoned work does next no longer matters
        reject(this.lostError(info));
      });
      p.then(
        (v) => {
          off();
          resolve(v);
        },
        (e: unknown) => {
          off();
          reject(e);
        },
      );
    });
  }

  /** One state for everyone, from a surviving replica (or a checkpoint): see `recover`. */
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
      { url: o.url, session: o.session, token: o.token, resumeFrom: o.resumeFrom, resumeFromToken: o.resumeFromToken, keepSameState: !this.diloco },
      { name: this.hookName, state: () => hook?.stateDict?.() ?? null },
    );
    // Loaded onto a device lost meanwhile, the state is not live: the catch handles the loss.
    this.throwIfDeviceLost();
    const hookNote = this.takeHookState(r, claim.live, pg.rank);
    let outerNote: string | undefined;
    if (this.diloco) {
      this.activity = `DiLoCo's outer step at the start of round ${round.key}`;
      const since = this.diloco.syncedAtStep;
      // An outer step of the failed round that landed but was never told is not this round's.
      this.judgments.pass(this.diloco.lastAggregation);
      const j = await this.diloco.rejoin(pg, this.state.model, held, this.state.progress.step);
      if (j.outerStep) outerNote = `an outer step over the inner steps since step ${since} of ${j.contributors} rank${j.contributors === 1 ? '' : 's'}`;
    }
    const note = [r.note, hookNote, outerNote].filter((n) => n !== undefined).join('; ');
    await this.confirm();
    for (const s of r.skipped) this.emit({ type: 'checkpoint-skipped', name: s.name, reason: s.reason });
    this.live = true;
    this.heldIn = { instance: pg.instance, round: pg.round };
    this.inFlight = -1;
    this.record = { ...r.run, generations: r.run.generations + 1 };
    const p = this.state.progress;
    // A checkpoint (or a peer's state) from another dataset, or a damaged one: past this dataset's
    // end no sampler position means anything, and every resume would fail the same way.
    if (p.position > o.datasetLength) {
      throw new RangeError(`the restored state is at sample ${p.position} of epoch ${p.epoch}, past this dataset's ${o.datasetLength} samples: it is another run's (resume from another checkpoint, or start a new session)`);
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
      source: r.source,
      from: r.from,
      redone: r.redone,
      stepsRedone: this.record.stepsRedone,
      ...(note ? { note } : {}),
      phasesMs: { ...this.phases(round), claims: r.claimsMs },
    });
    if (outerNote) this.tellJudgments('pseudo-gradients', this.diloco?.lastAggregation);
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

  /**
   * Loads the hook state that came with the round's state into this rank's hook, as the top of
   * this file says: a checkpoint's on every rank (whole on rank 0, the shared parts elsewhere); a
   * replica's on a rank that held no state (the shared parts); nothing on a rank that held state.
   * Throws when the source's hook is another kind than this rank's; a checkpoint's state for
   * another hook is passed over (a run may change its hook when it resumes), and the note returned
   * says so.
   */
  private takeHookState(r: Recovered, wasLive: boolean, rank: number): string | undefined {
    const { name, state } = r.commHook;
    if (r.source === 'replica') {
      if (name !== null && name !== this.hookName) {
        throw new Error(
          `this rank's communication hook is ${this.hookName}, but the group's (rank ${r.from}'s) is ${name}: every rank must run the same hook (ElasticRunOptions.commHook)`,
        );
      }
      // DiLoCo's state is the group's (the same on every rank): every rank takes the source's.
      if ((!wasLive || this.diloco) && state && state.name === this.hookName) this.hook?.loadStateDict?.(state, { otherRank: true });
      return undefined;
    }
    if (r.source !== 'checkpoint' || !state) return undefined;
    if (!this.hook?.loadStateDict || state.name !== this.hookName) {
      return `the checkpoint's ${state.name} communication hook state is not for this run's hook (${this.hookName}): the hook starts afresh`;
    }
    this.hook.loadStateDict(state, { otherRank: rank !== 0 });
    return undefined;
  }

  /** Trains in this round until the run is done, a rank stops it, or members wait to join. */
  private async train(round: Round, ddp: DistributedDataParallel): Promise<Outcome> {
    const o = this.o;
    const { pg } = round;
    const p = this.state.progress;
    const n = pg.worldSize;
    const length = o.datasetLength;
    const balance = balanceOf(o);
    this.balancer = balance ? new BatchBalancer(n, o.batchSize) : null;
    // A check due in the last round may have run on some ranks and not on others (a rank that
    // failed between the vote and the check): the ranks must agree on the steps' collectives, and
    // the round's start left every rank the same state (sent, or the same digest) to check anyway.
    this.checkDue = false;
    let firstInRound = true;
    /** The steps committed since the last vote, with this rank's metrics: the next vote carries them all. */
    const pending: Array<{ step: number; epoch: number; metrics: M; totalSteps: number }> = [];
    const voteEvery = o.voteEvery ?? 1;
    // The vote goes to the server as the step starts and is read after it (its round trip overlaps
    // the gradients' all-reduce: no meeting of its own) where every step meets anyway; it then
    // carries the steps before (their metrics are known only after their own all-reduce).
    const voteDuringStep = (o.voteWithGradients ?? true) && voteEvery === 1 && !this.averager && !this.diloco;
    /** The last step's own work and the split it ran with, not yet voted on (balanced batches learn from it). */
    let unvotedWork: { work: number; split: number[] | null } | null = null;
    while (p.epoch < this.maxEpochs && p.step < this.maxSteps) {
      const epochOptions = { numReplicas: n, rank: pg.rank, batchSize: o.batchSize, shuffle: o.shuffle, seed: o.seed, dropLast: o.dropLast };
      const plan = balance ? null : planEpoch(length, p, epochOptions);
      const globalPlan = balance ? planGlobalEpoch(length, p, epochOptions) : null;
      const { stepsLeft, fullEpochSteps } = (plan ?? globalPlan)!;
      const totalSteps = Math.min(this.maxSteps, p.step + stepsLeft + (this.maxEpochs - p.epoch - 1) * fullEpochSteps);
      const epochSamples = plan ? plan.samples : Math.ceil(length / n);
      if (stepsLeft > 0) this.emit({ type: 'epoch', round: round.key, rank: pg.rank, epoch: p.epoch, samples: epochSamples, datasetLength: length, stepsPerEpoch: fullEpochSteps });
      for (let k = 0; k < stepsLeft && p.step < this.maxSteps; k++) {
        // The run's first step compiles kernels and a round's first warms its links: not timed.
        this.timeline.begin(p.step > 0 && !firstInRound);
        firstInRound = false;
        let batch: number[];
        let padding: number;
        /** The step's samples over all ranks (the sampler's equal shards: this rank's times the world). */
        let globalSamples: number;
        if (globalPlan) {
          const b = balancedBatchOf(globalPlan, k, o.batchSize * n, (count) => this.balancer!.splitOf(count, p.step + 1), pg.rank, n);
          ({ indices: batch, padding, globalSamples } = b);
          ddp.setBatchShare(batch.length, b.globalSamples);
        } else {
          ({ indices: batch, padding } = batchOf(plan!, k, o.batchSize));
          globalSamples = batch.length * n;
        }
        if (o.prefetch && k + 1 < stepsLeft && p.step + 1 < this.maxSteps) o.prefetch(this.nextBatch(plan, globalPlan, k + 1, n, pg.rank));
        // Steps that meet nobody (DiLoCo's inner steps, a world of one) on a backend whose kernels
        // run on the main thread (cpu) chain promises that never leave the microtask queue: without
        // this the page's heartbeats and link messages wait until the tab is evicted as frozen.
        await yieldToEventLoop();
        this.inFlight = p.step + 1;
        this.activity = `step ${p.step + 1}`;
        this.throwIfDeviceLost();
        this.emit({ type: 'batch', round: round.key, rank: pg.rank, step: p.step + 1, epoch: p.epoch, indices: batch, padding });
        const wishedStop = voteDuringStep ? (o.shouldStop?.() ?? false) : false;
        const duringStep = voteDuringStep
          ? startVote<M>(pg, pending.map((x) => x.metrics), { stop: wishedStop, join: this.handler.numNodesWaiting() > 0, stopVote: o.stopVote, work: unvotedWork?.work ?? 0 })
          : null;
        const votedSplit = unvotedWork?.split ?? null;
        this.timeline.lap('other');
        const metrics = (await this.whileDeviceLives(o.step({ indices: batch, step: p.step + 1, epoch: p.epoch, ddp, optimizer: this.state.optimizer, pg }))) ?? ({} as M);

        // Commit: the step's samples are trained on; the group's position moves past them.
        p.position = k === stepsLeft - 1 ? length : Math.min(length, p.position + o.batchSize * n);
        p.step++;
        this.inFlight = -1;
        this.tellJudgments('gradients', ddp.lastAggregation);
        // DiLoCo weighs each rank's pseudo-gradient by the samples it trained (balanced batches give a slow rank fewer).
        if (globalSamples > 0) this.diloco?.countStep(batch.length, globalSamples);
        this.timeline.lap('step');
        let averaged = false;
        if (this.averager) {
          this.activity = `the model averaging after step ${p.step}`;
          averaged = await this.whileDeviceLives(this.averager.average(pg, this.state.model, p.step));
          this.timeline.lap('average');
        }
        if (this.diloco) {
          this.activity = `DiLoCo's outer all-reduces due at step ${p.step}`;
          await this.whileDeviceLives(this.diloco.land(this.state.model, p.step));
          this.timeline.lap('average');
        }

        this.activity = `the end of step ${p.step}`;
        // A step whose batch size is new to this page compiled kernels for it: its time says nothing
        // of the cost, and the rank reports none (0: unknown).
        const work = balance && this.sizesRun.has(batch.length) ? workOf(ddp, batch.length) : 0;
        this.sizesRun.add(batch.length);
        const lastOfRound = k === stepsLeft - 1 || p.step >= this.maxSteps;
        // Before a checkpoint: a diverged state is never saved. With local SGD, only where the replicas were just averaged.
        if ((o.checkReplicasEvery ?? 0) > 0 && p.step % o.checkReplicasEvery! === 0) this.checkDue = true;
        let early: StepsVote<M> | null = null;
        if (duringStep) {
          // The steps before this one were voted on during its step: their events and onStep now.
          early = await duringStep;
          if (votedSplit) this.balancer?.observe(votedSplit, early.works);
          await this.report(round.key, pg, ddp, pending.splice(0), early);
          this.timeline.lap('page');
        }
        pending.push({ step: p.step, epoch: p.epoch, metrics, totalSteps });
        unvotedWork = { work, split: this.balancer?.split ?? null };
        // With voteEvery > 1 the ranks meet at every voteEvery-th step, at outer steps and averagings, and at the end of each epoch and of the run.
        // A vote sent during the step meets on its own only to end the round (a stop, joiners, the epoch's or run's end: this step's metrics would wait for a step that does not come), before a replica check (which can end the run), or where onStep must run before the next step.
        const votes = early
          ? early.stoppedBy !== null || early.regroup || lastOfRound || this.checkDue || (o.voteAfter?.(p.step) ?? false)
          : p.step % voteEvery === 0 || averaged || (this.diloco?.syncsAt(p.step) ?? false) || lastOfRound;
        let vote: StepsVote<M> | null = null;
        if (votes) {
          vote = await this.vote(pg, pending.map((x) => x.metrics), work, wishedStop);
          unvotedWork = null;
          if (this.diloco) await this.confirm();
          this.timeline.lap('vote');
        }
        // DiLoCo's outer steps come after the vote, so that the vote never waits behind an all-reduce this step starts.
        if (this.diloco && !vote?.regroup && vote?.stoppedBy == null) {
          this.activity = `DiLoCo's outer step after step ${p.step}`;
          averaged = await this.whileDeviceLives(this.diloco.sync(pg, this.state.model, p.step));
          if (averaged) await this.confirm();
          this.timeline.lap('average');
        }
        // The outer steps' aggregations landed by now (land, or sync without overlap): the latest fragment's.
        if (this.diloco) this.tellJudgments('pseudo-gradients', this.diloco.lastAggregation);
        if (vote) {
          if (this.balancer?.split) this.balancer.observe(this.balancer.split, vote.works);
          await this.report(round.key, pg, ddp, pending.splice(0), vote);
        }
        if (this.checkDue && ((!this.averager && !this.diloco) || averaged)) {
          this.checkDue = false;
          await this.whileDeviceLives(verifyReplicas(pg, this.state.model));
        }
        if ((o.checkpointEvery ?? 0) > 0 && p.step % o.checkpointEvery! === 0) await this.checkpoint(pg);
        this.timeline.lap('page');
        this.timeline.end();
        if (vote?.stoppedBy != null) {
          await this.averageAtEnd(pg);
          return { kind: 'stopped', by: vote.stoppedBy };
        }
        if (vote?.regroup) return { kind: 'regroup' };
      }
      if (p.position >= length) {
        // The run's last step: local SGD's final averaging comes before the epoch's end (an evaluation there sees the one model).
        if (p.epoch + 1 >= this.maxEpochs || p.step >= this.maxSteps) await this.averageAtEnd(pg);
        this.activity = `the end of epoch ${p.epoch}`;
        await this.whileDeviceLives(o.onEpochEnd?.({ pg, ddp, step: p.step, epoch: p.epoch }));
        p.epoch++;
        p.position = 0;
        if (o.checkpointAtEpochEnd ?? (o.min < o.max || (o.checkpointEvery ?? 0) > 0)) await this.checkpoint(pg);
      }
    }
    await this.averageAtEnd(pg);
    return { kind: 'done' };
  }

  /** This rank's samples of step k of the epoch, with balanced batches as split now (prefetch's guess; the split itself is left as it is). */
  private nextBatch(plan: ReturnType<typeof planEpoch> | null, globalPlan: ReturnType<typeof planGlobalEpoch> | null, k: number, n: number, rank: number): number[] {
    if (!globalPlan) return batchOf(plan!, k, this.o.batchSize).indices;
    const last = this.balancer?.split;
    const split = (count: number) => (last && last.length === n && last.reduce((a, b) => a + b, 0) === count ? last : splitBatch(count, new Array<number>(n).fill(1), 1));
    return balancedBatchOf(globalPlan, k, this.o.batchSize * n, split, rank, n).indices;
  }

  /**
   * Local SGD: a run that ends (or is stopped) between two averagings averages once more, so that
   * it ends with one model on every rank, as plain DDP does (torch's PostLocalSGDOptimizer leaves
   * that to the script). Every rank gets here after the same step.
   */
  private async averageAtEnd(pg: ProcessGroup): Promise<void> {
    const step = this.state.progress.step;
    if (this.diloco && !this.diloco.inSync(step)) {
      this.activity = `DiLoCo's last outer step, after step ${step}`;
      await this.whileDeviceLives(this.diloco.syncNow(pg, this.state.model, step));
      this.tellJudgments('pseudo-gradients', this.diloco.lastAggregation);
      return;
    }
    if (!this.averager || step <= this.averager.warmupSteps || this.averager.averagesAt(step) || this.averagedAtEnd === step) return;
    this.activity = `the final model averaging after step ${step}`;
    await this.whileDeviceLives(this.averager.averageNow(pg, this.state.model));
    this.averagedAtEnd = step;
  }

  /** DiLoCo: every rank has finished the step committed last (its vote or outer step completed): the point a failed round goes back to. */
  private async confirm(): Promise<void> {
    if (!this.diloco) return;
    this.confirmed = { progress: { ...this.state.progress }, held: await this.whileDeviceLives(this.diloco.hold(this.state.model, this.state.progress.step)) };
  }

  /**
   * DiLoCo, before a round's state transfer: a step committed here after the last confirmed one
   * (its vote failed) may be one that a lost rank never took, its samples trained by nobody. This
   * rank goes back to the confirmed step (it claims that step, with the next one in flight, so
   * that the next round trains it again) and offers the weights it had then to the round's outer step.
   */
  private backToConfirmed(): DiLoCoHeld | null {
    const c = this.confirmed;
    if (!c) return null;
    if (c.progress.step < this.state.progress.step) {
      Object.assign(this.state.progress, c.progress);
      this.inFlight = c.progress.step + 1;
    }
    return c.held;
  }

  /**
   * One gather through the server per vote: [stop, join wanted, work ms, ...this rank's metrics of each step since
   * the last vote] from every rank. `wishedStop`: this rank already asked (in a vote sent during the step).
   */
  private vote(pg: ProcessGroup, mine: M[], work: number, wishedStop = false): Promise<StepsVote<M>> {
    return stepsVote(pg, mine, { stop: wishedStop || (this.o.shouldStop?.() ?? false), join: this.handler.numNodesWaiting() > 0, stopVote: this.o.stopVote, work });
  }

  /** The voted steps' events and onStep, in order, with every rank's metrics. */
  private async report(round: string, pg: ProcessGroup, ddp: DistributedDataParallel, steps: Array<{ step: number; epoch: number; metrics: M; totalSteps: number }>, vote: StepsVote<M>): Promise<void> {
    for (const [j, x] of steps.entries()) {
      const all = vote.steps[j]!;
      // Balanced batches: the split's reasons (a rank given no samples has no loss for the step).
      const balance = this.balancer?.decisionOf(x.step);
      this.emit({ type: 'step', round, rank: pg.rank, step: x.step, epoch: x.epoch, totalSteps: x.totalSteps, metrics: all, elapsedMs: performance.now() - this.started, ...(balance ? { balance } : {}) });
      await this.whileDeviceLives(this.o.onStep?.({ pg, ddp, step: x.step, epoch: x.epoch, metrics: all }));
    }
  }

  /** Rank 0 saves; a failed save is reported and training goes on (the previous checkpoint is still there). */
  private async checkpoint(pg: ProcessGroup): Promise<void> {
    if (pg.rank !== 0) return;
    const step = this.state.progress.step;
    try {
      const commHook = this.hook?.stateDict?.() ?? null;
      const saved = await saveState(this.state, this.record, { url: this.o.url, session: this.o.session, token: this.o.token, meta: this.o.checkpointMeta, commHook });
      this.emit({ type: 'checkpoint', step, name: saved.name, bytes: saved.bytes });
    } catch (err) {
      // Not a failed save but a lost device: the run handles that.
      if (this.device.isLost() || err instanceof DeviceLostError) throw err;
      this.emit({ type: 'checkpoint-failed', step, error: (err as Error).message });
    }
  }

  /** A robust aggregation not told yet: its judgments, as an 'aggregation' event. */
  private tellJudgments(of: ContributionOf, report: AggregationReport | null | undefined): void {
    const judged = this.judgments.take(report, of);
    if (judged) this.emit({ type: 'aggregation', round: this.roundKey, rank: this.rank, ...judged });
  }

  private emit(e: ElasticEvent): void {
    this.o.onEvent?.(e);
    recordEvent(e);
  }
}

/**
 * This rank's own work at its last step in ms (forward, backward, readback and a straggler's
 * waits; not the waits for other ranks): what balanced batches split by. 0 (unknown) for a step
 * without samples.
 */
function workOf(ddp: DistributedDataParallel, samples: number): number {
  const t = ddp.lastTimings;
  if (!t || samples <= 0) return 0;
  return t.compute + t.readback + t.slowed;
}

/** An error a WebGPU readback or submission gives once its device is lost. */
function looksLikeDeviceLoss(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  return err.name === 'AbortError' || err.name === 'OperationError' || /device (was |is )?lost|mapAsync|GPUDevice/i.test(err.message);
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
