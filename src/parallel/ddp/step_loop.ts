/**
 * runElastic's steps in one round: each epoch's rest sharded among the round's ranks (even, or
 * balanced by measured cost), each step's samples trained and committed, and the meetings after
 * it: the vote (stop, regroup, every rank's metrics), DiLoCo's outer step, the replica check and
 * the checkpoint. The vote goes out as a step begins and is read after it where it can
 * (voteWithGradients): its round trip overlaps the step, one meeting point per step.
 */
import type { DistributedDataParallel } from './ddp.ts';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import type { RendezvousHandler, Round } from '../../c10d/rendezvous.ts';
import type { TrainState } from '../../checkpoint/state_dict.ts';
import type { ElasticEvent } from '../events.ts';
import type { ContributionOf } from './contributions.ts';
import type { AggregationReport } from '../robust/reducer.ts';
import { verifyReplicas } from '../replicas.ts';
import { startVote, stepsVote, type StepMetrics, type StepsVote } from '../../elastic/vote.ts';
import { balancedBatchOf, batchOf, planEpoch, planGlobalEpoch, splitBatch } from '../../elastic/epoch.ts';
import { BatchBalancer } from '../../elastic/balance.ts';
import type { TimelineRecorder } from '../../elastic/timeline.ts';
import { yieldToEventLoop } from '../../runtime/ticker.ts';
import type { DeviceGuard } from './device_guard.ts';
import type { LocalSteps } from './local_steps.ts';
import type { LocalDataRun } from './local_data.ts';
import type { LocalEpochRest } from '../../elastic/local_epoch.ts';
import { balanceOf, type ElasticRunOptions } from './runner_types.ts';

export type Outcome = { kind: 'done' } | { kind: 'stopped'; by: number } | { kind: 'regroup' };

/** What a round's steps use of their run (runner.ts's ElasticRun). */
export interface StepLoopHost<M extends StepMetrics> {
  readonly o: ElasticRunOptions<M>;
  readonly state: TrainState;
  readonly handler: RendezvousHandler;
  readonly guard: DeviceGuard;
  readonly local: LocalSteps;
  readonly timeline: TimelineRecorder;
  /** The batch sizes this page has trained (a new size compiles kernels: its time is not its cost). */
  readonly sizesRun: Set<number>;
  /** When the run started (performance.now()), for the step events' elapsedMs. */
  readonly started: number;
  readonly maxSteps: number;
  readonly maxEpochs: number;
  /** The step started here but not committed, or -1. */
  inFlight: number;
  /** With `localData`: this rank's own samples' run (null without). */
  readonly localData: LocalDataRun | null;
  emit(e: ElasticEvent): void;
  tellJudgments(of: ContributionOf, report: AggregationReport | null | undefined): void;
  /** Rank 0 saves a checkpoint (a failed save is reported, not thrown). */
  checkpoint(pg: ProcessGroup): Promise<void>;
}

/** The rest of an epoch in this round: this rank's shard (even), the whole group's (balanced), or the union of the ranks' own samples (localData). */
interface EpochRest {
  plan: ReturnType<typeof planEpoch> | null;
  globalPlan: ReturnType<typeof planGlobalEpoch> | null;
  local: LocalEpochRest | null;
  stepsLeft: number;
  totalSteps: number;
}

/** A step committed since the last vote, with this rank's metrics: the next vote carries them all. */
interface Pending<M> {
  step: number;
  epoch: number;
  metrics: M;
  totalSteps: number;
}

/** A step's vote sent as the step began (voteWithGradients), and what this rank said in it. */
interface VoteInFlight<M extends StepMetrics> {
  vote: Promise<StepsVote<M>> | null;
  wishedStop: boolean;
  /** The split the step before ran with, whose work the vote carries. */
  split: number[] | null;
  /** The vote's outcome once it has come back (the step's own failure may come after it). */
  met: StepsVote<M> | null;
}

export class StepLoop<M extends StepMetrics> {
  private readonly pg: ProcessGroup;
  private readonly n: number;
  private readonly balance: boolean;
  /** Balanced batches: the costs measured from the round's start and each step's split (null: balancing off). */
  readonly balancer: BatchBalancer | null;
  /**
   * A replica check fell due and waits for an averaging step (with `modelAverager`). A check due
   * in the last round may have run on some ranks and not on others (a rank that failed between
   * the vote and the check): the ranks must agree on the steps' collectives, and the round's start
   * left every rank the same state (sent, or the same digest) to check anyway: each round starts without one.
   */
  private checkDue = false;
  private firstInRound = true;
  private readonly pending: Array<Pending<M>> = [];
  private readonly voteEvery: number;
  /**
   * The vote goes to the server as the step starts and is read after it (its round trip overlaps
   * the gradients' all-reduce: no meeting of its own) where every step meets anyway; it then
   * carries the steps before (their metrics are known only after their own all-reduce).
   */
  private readonly voteDuringStep: boolean;
  /** The last step's own work and the split it ran with, not yet voted on (balanced batches learn from it). */
  private unvotedWork: { work: number; split: number[] | null } | null = null;

  constructor(
    private readonly host: StepLoopHost<M>,
    private readonly round: Round,
    private readonly ddp: DistributedDataParallel,
  ) {
    const o = host.o;
    this.pg = round.pg;
    this.n = this.pg.worldSize;
    this.balance = balanceOf(o);
    this.balancer = this.balance ? new BatchBalancer(this.n, o.batchSize) : null;
    this.voteEvery = o.voteEvery ?? 1;
    this.voteDuringStep = (o.voteWithGradients ?? true) && this.voteEvery === 1 && !host.local.averager && !host.local.diloco;
  }

  /** Trains in this round until the run is done, a rank stops it, or members wait to join. */
  async run(): Promise<Outcome> {
    const { host } = this;
    const p = host.state.progress;
    while (p.epoch < host.maxEpochs && p.step < host.maxSteps) {
      const rest = host.localData ? await this.localRest(host.localData) : this.epochRest();
      let k = 0;
      for (; k < rest.stepsLeft && p.step < host.maxSteps; k++) {
        const outcome = await this.step(rest, k);
        if (outcome) return outcome;
      }
      if (rest.local ? k >= rest.stepsLeft : p.position >= host.o.datasetLength) await this.endEpoch();
    }
    await host.local.atEnd(this.pg, host.state);
    // A run that ends mid-epoch (its steps are done) evaluates the model it ends with; every rank ends at the same step.
    if (host.localData && host.localData.evaluatedAt !== p.step) await this.evaluateLocal(host.localData);
    return { kind: 'done' };
  }

  /** The epoch's rest as this round shards it; its 'epoch' event when steps are left. */
  private epochRest(): EpochRest {
    const { host, pg, n } = this;
    const { o } = host;
    const p = host.state.progress;
    const length = o.datasetLength;
    const epochOptions = { numReplicas: n, rank: pg.rank, batchSize: o.batchSize, shuffle: o.shuffle, seed: o.seed, dropLast: o.dropLast };
    const plan = this.balance ? null : planEpoch(length, p, epochOptions);
    const globalPlan = this.balance ? planGlobalEpoch(length, p, epochOptions) : null;
    const { stepsLeft, fullEpochSteps } = (plan ?? globalPlan)!;
    const totalSteps = Math.min(host.maxSteps, p.step + stepsLeft + (host.maxEpochs - p.epoch - 1) * fullEpochSteps);
    const epochSamples = plan ? plan.samples : Math.ceil(length / n);
    if (stepsLeft > 0)
      host.emit({
        type: 'epoch',
        round: this.round.key,
        rank: pg.rank,
        epoch: p.epoch,
        samples: epochSamples,
        datasetLength: length,
        stepsPerEpoch: fullEpochSteps,
      });
    return { plan, globalPlan, local: null, stepsLeft, totalSteps };
  }

  /** localData: the epoch's rest over the union of the ranks' own samples, from the counts exchange; its 'epoch' event. */
  private async localRest(localData: LocalDataRun): Promise<EpochRest> {
    const { host, pg } = this;
    const p = host.state.progress;
    host.guard.activity = `the local data counts of epoch ${p.epoch}`;
    const local = await host.guard.whileLives(localData.plan(pg, this.round.key, p, host.o.batchSize * this.n));
    const { stepsLeft, fullEpochSteps } = local;
    const totalSteps = Math.min(host.maxSteps, p.step + stepsLeft + (host.maxEpochs - p.epoch - 1) * fullEpochSteps);
    if (stepsLeft > 0)
      host.emit({
        type: 'epoch',
        round: this.round.key,
        rank: pg.rank,
        epoch: p.epoch,
        samples: local.counts.remaining[pg.rank]!,
        datasetLength: localData.dataset.length,
        stepsPerEpoch: fullEpochSteps,
      });
    return { plan: null, globalPlan: null, local, stepsLeft, totalSteps };
  }

  /** An epoch's end: local SGD's final averaging when the run ends (an evaluation there sees the one model), onEpochEnd, the checkpoint. */
  private async endEpoch(): Promise<void> {
    const { host, pg, ddp } = this;
    const { o } = host;
    const p = host.state.progress;
    if (p.epoch + 1 >= host.maxEpochs || p.step >= host.maxSteps) await host.local.atEnd(pg, host.state);
    if (host.localData) await this.evaluateLocal(host.localData);
    host.guard.activity = `the end of epoch ${p.epoch}`;
    await host.guard.whileLives(o.onEpochEnd?.({ pg, ddp, step: p.step, epoch: p.epoch }));
    p.epoch++;
    p.position = 0;
    if (o.checkpointAtEpochEnd ?? (o.min < o.max || (o.checkpointEvery ?? 0) > 0)) await host.checkpoint(pg);
  }

  /** localData: every rank's accuracy on its own held-out samples, and the group's (a collective). */
  private async evaluateLocal(localData: LocalDataRun): Promise<void> {
    const { host } = this;
    const p = host.state.progress;
    host.guard.activity = `the evaluation on local held-out samples after step ${p.step}`;
    await host.guard.whileLives(localData.evaluate(this.pg, host.state.model, this.round.key, p));
  }

  /** Step k of the epoch's rest: trained, committed, and met on; the round's outcome when it ends here. */
  private async step(rest: EpochRest, k: number): Promise<Outcome | null> {
    const { host, pg, ddp } = this;
    const { o, guard, timeline } = host;
    const p = host.state.progress;
    // The run's first step compiles kernels and a round's first warms its links: not timed.
    timeline.begin(p.step > 0 && !this.firstInRound);
    this.firstInRound = false;
    const { indices: batch, padding, globalSamples } = this.samplesOf(rest, k);
    if (o.prefetch && k + 1 < rest.stepsLeft && p.step + 1 < host.maxSteps) o.prefetch(this.nextBatch(rest, k + 1));
    // Steps that meet nobody (DiLoCo's inner steps, a world of one) on a backend whose kernels
    // run on the main thread (cpu) chain promises that never leave the microtask queue: without
    // this the page's heartbeats and link messages wait until the tab is evicted as frozen.
    await yieldToEventLoop();
    host.inFlight = p.step + 1;
    guard.activity = `step ${p.step + 1}`;
    guard.throwIfLost();
    host.emit({ type: 'batch', round: this.round.key, rank: pg.rank, step: p.step + 1, epoch: p.epoch, indices: batch, padding });
    const sent = this.sendVote();
    timeline.lap('other');
    // A step that returns nothing resolves to undefined: the same as one that returns no metrics.
    const ctx = { indices: batch, step: p.step + 1, epoch: p.epoch, ddp, optimizer: host.state.optimizer, pg };
    const metrics =
      (await guard.whileLives(o.step(ctx) as Promise<M | undefined>).catch(async (err: unknown) => {
        await this.reportMetVote(sent);
        throw err;
      })) ?? ({} as M);
    // Commit: the step's samples are trained on; the group's position moves past them.
    if (rest.local) p.position += globalSamples;
    else p.position = k === rest.stepsLeft - 1 ? o.datasetLength : Math.min(o.datasetLength, p.position + o.batchSize * this.n);
    p.step++;
    if (rest.local) host.localData!.commit(rest.local, k, p);
    host.inFlight = -1;
    host.tellJudgments('gradients', ddp.lastAggregation);
    // DiLoCo weighs each rank's pseudo-gradient by the samples it trained (balanced batches give a slow rank fewer).
    if (globalSamples > 0) host.local.diloco?.countStep(batch.length, globalSamples);
    timeline.lap('step');
    const averaged = await host.local.afterStep(pg, host.state.model, p.step, () => timeline.lap('average'));
    guard.activity = `the end of step ${p.step}`;
    // A step whose batch size is new to this page compiled kernels for it: its time says nothing
    // of the cost, and the rank reports none (0: unknown).
    const work = this.balance && host.sizesRun.has(batch.length) ? workOf(ddp, batch.length) : 0;
    host.sizesRun.add(batch.length);
    const lastOfRound = k === rest.stepsLeft - 1 || p.step >= host.maxSteps;
    return this.meet({ metrics, totalSteps: rest.totalSteps, work, averaged, lastOfRound }, sent);
  }

  /** The step's samples on this rank, their padding, and the step's samples over all ranks. */
  private samplesOf(rest: EpochRest, k: number): { indices: number[]; padding: number; globalSamples: number } {
    const { host, n, pg } = this;
    const { o } = host;
    if (rest.local) {
      // Each rank's own samples: its share of the split, its gradient weighed by it.
      const b = rest.local.batchAt(k);
      this.ddp.setBatchShare(b.indices.length, b.globalSamples);
      return { indices: b.indices, padding: 0, globalSamples: b.globalSamples };
    }
    if (rest.globalPlan) {
      const b = balancedBatchOf(
        rest.globalPlan,
        k,
        o.batchSize * n,
        (count) => this.balancer!.splitOf(count, host.state.progress.step + 1),
        pg.rank,
        n,
      );
      this.ddp.setBatchShare(b.indices.length, b.globalSamples);
      return b;
    }
    const b = batchOf(rest.plan!, k, o.batchSize);
    // The sampler's equal shards: this rank's times the world.
    return { ...b, globalSamples: b.indices.length * n };
  }

  /** This rank's samples of step k of the epoch, with balanced batches as split now (prefetch's guess; the split itself is left as it is). */
  private nextBatch(rest: EpochRest, k: number): number[] {
    const { n, pg } = this;
    if (rest.local) return rest.local.peekNext(k - 1);
    if (!rest.globalPlan) return batchOf(rest.plan!, k, this.host.o.batchSize).indices;
    const last = this.balancer?.split;
    const split = (count: number) =>
      last && last.length === n && last.reduce((a, b) => a + b, 0) === count ? last : splitBatch(count, new Array<number>(n).fill(1), 1);
    return balancedBatchOf(rest.globalPlan, k, this.host.o.batchSize * n, split, pg.rank, n).indices;
  }

  /** With votes during steps: this step's vote, sent now, carrying the steps before. */
  private sendVote(): VoteInFlight<M> {
    const { o, handler } = this.host;
    const wishedStop = this.voteDuringStep ? (o.shouldStop?.() ?? false) : false;
    const vote = this.voteDuringStep
      ? startVote<M>(
          this.pg,
          this.pending.map((x) => x.metrics),
          { stop: wishedStop, join: handler.numNodesWaiting() > 0, stopVote: o.stopVote, work: this.unvotedWork?.work ?? 0 },
        )
      : null;
    const sent: VoteInFlight<M> = { vote, wishedStop, split: this.unvotedWork?.split ?? null, met: null };
    vote?.then(
      (v) => (sent.met = v),
      () => {},
    );
    return sent;
  }

  /**
   * A step that failed after its vote came back (a rank lost mid-step had sent its row as the step
   * began): the steps that vote carries are reported all the same, as they would have been after
   * the step; without this the step before every fault had no step event and no onStep. Only in
   * a group that broke: a hook's collectives then fail at once (what they fail with is the round's
   * failure again), where after another error (a timeout, a bug in the step) they would wait on
   * ranks still in their step.
   */
  private async reportMetVote(sent: VoteInFlight<M>): Promise<void> {
    if (!sent.met || this.pending.length === 0 || this.pg.error === undefined) return;
    await this.report(this.pending.splice(0), sent.met).catch(() => {});
  }

  /**
   * After a committed step: the vote (read, or held now), DiLoCo's outer step, the voted steps'
   * events and onStep, the replica check and the checkpoint; the outcome when the round ends.
   */
  private async meet(
    s: { metrics: M; totalSteps: number; work: number; averaged: boolean; lastOfRound: boolean },
    sent: VoteInFlight<M>,
  ): Promise<Outcome | null> {
    const { host, pg } = this;
    const { o, timeline, local } = host;
    const p = host.state.progress;
    let averaged = s.averaged;
    // Before a checkpoint: a diverged state is never saved. With local SGD, only where the replicas were just averaged.
    if ((o.checkReplicasEvery ?? 0) > 0 && p.step % o.checkReplicasEvery! === 0) this.checkDue = true;
    const early = await this.readEarlyVote(sent);
    this.pending.push({ step: p.step, epoch: p.epoch, metrics: s.metrics, totalSteps: s.totalSteps });
    this.unvotedWork = { work: s.work, split: this.balancer?.split ?? null };
    let vote: StepsVote<M> | null = null;
    if (this.votesNow(early, averaged, s.lastOfRound)) {
      vote = await this.vote(s.work, sent.wishedStop);
      this.unvotedWork = null;
      if (local.diloco) await local.confirm(host.state);
      timeline.lap('vote');
    }
    // DiLoCo's outer steps come after the vote, so that the vote never waits behind an all-reduce this step starts.
    if (local.diloco && !vote?.regroup && vote?.stoppedBy == null) {
      host.guard.activity = `DiLoCo's outer step after step ${p.step}`;
      averaged = await host.guard.whileLives(local.diloco.sync(pg, host.state.model, p.step));
      if (averaged) await local.confirm(host.state);
      timeline.lap('average');
    }
    // The outer steps' aggregations landed by now (land, or sync without overlap): the latest fragment's.
    if (local.diloco) host.tellJudgments('pseudo-gradients', local.diloco.lastAggregation);
    if (vote) {
      if (this.balancer?.split) this.balancer.observe(this.balancer.split, vote.works);
      await this.report(this.pending.splice(0), vote);
    }
    if (this.checkDue && ((!local.averager && !local.diloco) || averaged)) {
      this.checkDue = false;
      await host.guard.whileLives(verifyReplicas(pg, host.state.model));
    }
    if ((o.checkpointEvery ?? 0) > 0 && p.step % o.checkpointEvery! === 0) await host.checkpoint(pg);
    timeline.lap('page');
    timeline.end();
    if (vote?.stoppedBy != null) {
      await local.atEnd(pg, host.state);
      return { kind: 'stopped', by: vote.stoppedBy };
    }
    return vote?.regroup ? { kind: 'regroup' } : null;
  }

  /** The vote sent during the step, read: the steps before this one were voted on, their events and onStep now. */
  private async readEarlyVote(sent: VoteInFlight<M>): Promise<StepsVote<M> | null> {
    if (!sent.vote) return null;
    const early = await sent.vote;
    if (sent.split) this.balancer?.observe(sent.split, early.works);
    await this.report(this.pending.splice(0), early);
    this.host.timeline.lap('page');
    return early;
  }

  /**
   * Whether the ranks vote after this step. With voteEvery > 1 they meet at every voteEvery-th
   * step, at outer steps and averagings, and at the end of each epoch and of the run. A vote sent
   * during the step meets on its own only to end the round (a stop, joiners, the epoch's or run's
   * end: this step's metrics would wait for a step that does not come), before a replica check
   * (which can end the run), or where onStep must run before the next step.
   */
  private votesNow(early: StepsVote<M> | null, averaged: boolean, lastOfRound: boolean): boolean {
    const { o, local } = this.host;
    const step = this.host.state.progress.step;
    return early
      ? early.stoppedBy !== null || early.regroup || lastOfRound || this.checkDue || (o.voteAfter?.(step) ?? false)
      : step % this.voteEvery === 0 || averaged || (local.diloco?.syncsAt(step) ?? false) || lastOfRound;
  }

  /**
   * One gather through the server per vote: [stop, join wanted, work ms, ...this rank's metrics of each step since
   * the last vote] from every rank. `wishedStop`: this rank already asked (in a vote sent during the step).
   */
  private vote(work: number, wishedStop: boolean): Promise<StepsVote<M>> {
    const { o, handler } = this.host;
    return stepsVote(
      this.pg,
      this.pending.map((x) => x.metrics),
      { stop: wishedStop || (o.shouldStop?.() ?? false), join: handler.numNodesWaiting() > 0, stopVote: o.stopVote, work },
    );
  }

  /** The voted steps' events and onStep, in order, with every rank's metrics. */
  private async report(steps: Array<Pending<M>>, vote: StepsVote<M>): Promise<void> {
    const { host, pg, ddp } = this;
    for (const [j, x] of steps.entries()) {
      const all = vote.steps[j]!;
      // Balanced batches: the split's reasons (a rank given no samples has no loss for the step).
      const balance = this.balancer?.decisionOf(x.step);
      host.emit({
        type: 'step',
        round: this.round.key,
        rank: pg.rank,
        step: x.step,
        epoch: x.epoch,
        totalSteps: x.totalSteps,
        metrics: all,
        elapsedMs: performance.now() - host.started,
        ...(balance ? { balance } : {}),
      });
      await host.guard.whileLives(host.o.onStep?.({ pg, ddp, step: x.step, epoch: x.epoch, metrics: all }));
    }
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
