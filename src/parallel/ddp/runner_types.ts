/**
 * What an elastic DDP run takes and gives (`runElastic`): its options, what the step and each
 * round get, its result; and the check of the options, before anything joins.
 */
import type * as tf from '@tensorflow/tfjs';
import type { CommHook } from '../comm_hooks/types.ts';
import type { PeriodicModelAveragerOptions } from '../comm_hooks/local_sgd.ts';
import type { DiLoCoOptions } from '../diloco/diloco.ts';
import type { DistributedDataParallel, DDPOptions } from './ddp.ts';
import type { DeviceLostError } from '../../wire/errors.ts';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import type { RendezvousOptions } from '../../c10d/rendezvous.ts';
import type { TrainState } from '../../checkpoint/state_dict.ts';
import type { ElasticEvent } from '../events.ts';
import { checkSchedule, type LockstepHooks, type RunHooks, type ScheduleOptions } from '../../elastic/agent.ts';
import type { StepMetrics } from '../../elastic/vote.ts';
import type { StepTimeline } from '../../elastic/timeline.ts';
import { checkAggregationSpec } from '../robust/aggregators.ts';
import { LocalDataset } from '../../datasets/local.ts';
import type { LocalDataEvent } from './local_data.ts';
import type { LocalEvaluation } from '../../elastic/local_eval.ts';
import { checkAttackPlan } from '../robust/attacks.ts';

export interface StepContext {
  /** This rank's samples for the step (indices into the dataset). */
  indices: number[];
  /** The step's number in the run, from 1. */
  step: number;
  epoch: number;
  /**
   * The round's DDP, with `commHook` registered: `ddp.commHook.name` names the hook reducing the
   * gradients ('allreduce' without one), `ddp.bytesPerStep` the bytes this rank sent per step for
   * them in this round (the averagings of `modelAverager` not included).
   */
  ddp: DistributedDataParallel;
  optimizer: tf.Optimizer;
  pg: ProcessGroup;
}

/** What hooks that run collectives get: every rank of the round calls them at the same step. */
export interface RoundContext {
  pg: ProcessGroup;
  /** The round's DDP (see StepContext.ddp: `ddp.commHook.name`, `ddp.bytesPerStep`). */
  ddp: DistributedDataParallel;
  step: number;
  epoch: number;
}

/**
 * The group to join (`url`, `session`, `min`, `max`, ...: a rendezvous, which the run always
 * rejoins after losing the server) and the training to do in it.
 */
export interface ElasticRunOptions<M extends StepMetrics = StepMetrics>
  extends Omit<RendezvousOptions, 'reconnect'>,
    ScheduleOptions,
    RunHooks<ElasticEvent>,
    LockstepHooks<RoundContext, M> {
  state: TrainState;
  /**
   * Split each step's `batchSize * worldSize` samples between the ranks by their measured cost
   * (each rank's compute, readback and straggler time per batch size, gathered with the step's
   * vote: see balance.ts), re-balanced as the figures change, so that a slow device gets fewer
   * samples (none, if even one costs more than the others' whole batches) and the group no longer
   * moves at its pace. A rank given no samples computes nothing that step: `ddp.backward` skips the
   * loss function, contributes zeros and returns loss 0; the step function gets empty `indices`. Gradients are weighed by each rank's share
   * (`ddp.setBatchShare`): the average is still the global batch's, and every sample of an epoch is
   * still trained exactly once. Beyond torch, whose DDP needs equal batches: off by default; off
   * gives DistributedSampler's exact shards.
   */
  balance?: boolean;
  /** @deprecated The same option as `balance` (its name before; read, with a warning once). */
  balanceBatches?: boolean;

  /**
   * This rank's own samples, which never leave it (datasets/local.ts): every rank samples only
   * its own LocalDataset (`ctx.indices` index it), an epoch is over the union of the ranks'
   * samples, each step's `batchSize * worldSize` samples split between the ranks in proportion
   * to their samples left in the epoch, and each rank's gradient weighed by its share: the step's
   * gradient is the mean over the union of the step's batches. A rank without samples (or whose
   * samples are done) takes part with none. Every rank of the run must give one (an empty one
   * will do). `datasetLength` is then not read (runElastic takes localData.length). At each
   * epoch's end the ranks evaluate on their own `heldOut` samples (`onLocalData`,
   * ElasticRunResult.localEvaluation). Not with `balance` (yet).
   */
  localData?: LocalDataset;
  /** With `localData`: each epoch's counts (every rank's samples left, how many left with ranks that went) and each evaluation. */
  onLocalData?(e: LocalDataEvent): void;

  /** One training step on this rank's samples. */
  step(ctx: StepContext): Promise<M | undefined> | Promise<void>;
  /**
   * Called as each step starts with this rank's likely samples of the next step of the epoch, so
   * that a streamed dataset loads them while this step computes. With balanced batches it is a
   * guess (the split as it stands): the next step loads what it lacks. Must not throw.
   */
  prefetch?(indices: number[]): void;
  /**
   * A fresh state (model and optimizer built as at the start) on the backend runElastic has just
   * re-created after this tab's WebGPU device was lost. The rank then rejoins the group holding
   * no state, and recovery loads the group's into this one (from a surviving replica, or the
   * latest checkpoint). The old state's tensors lived on the lost device: runElastic disposes
   * its model and optimizer. Keep the model in a variable this hook updates (or use `ctx.ddp.model`
   * in the step). Without it, a lost device ends the run with DeviceLostError.
   */
  rebuildState?(ctx: RebuildContext): TrainState | Promise<TrainState>;

  /**
   * Every this many committed steps, the ranks compare hashes of their weights (verifyReplicas)
   * and the run ends with ReplicaDivergenceError, naming the ranks that differ, if they are not
   * identical. Costs one weights readback and a tiny all-gather each time. Default 0: never.
   * With `modelAverager`, a check falls due every this many steps and runs at the next averaging
   * step (at once when the step averages): the replicas are only identical there.
   */
  checkReplicasEvery?: number;
  /**
   * The ranks vote (stop, let members join, each rank's metrics) after every this many steps, at
   * each epoch's end and the run's, and after every DiLoCo outer step or model averaging; the
   * vote carries the metrics of every step since the last one, and `onStep` then runs for each
   * of those steps in order. Default 1: a vote per step. More means fewer meeting points (DiLoCo's
   * inner steps then communicate nothing at all), but a stop or a waiting joiner is heard up to
   * this many steps later, and with DiLoCo a failed round goes back to the last vote: every rank's
   * steps since then are trained again.
   */
  voteEvery?: number;
  /**
   * With voteEvery 1 and no local SGD or DiLoCo, each step's vote goes to the server as the step
   * begins and is read after it (its round trip overlaps the gradients' reduction) instead of
   * meeting after the step: one meeting point per step, not two. The vote's rows go through the
   * server (`ProcessGroup.gatherRows`), each placed at its sender's rank, never on the gradients'
   * sum (where any member could write any row). A step's metrics are known only after its own
   * step, so they go with the next step's vote, and `onStep` for step s runs during step s + 1
   * (the model is then one step further; the last step of an epoch or run, a stop and a regroup
   * still vote at once). Default true; false keeps a vote of its own after every step.
   */
  voteWithGradients?: boolean;
  /**
   * Steps after which the ranks vote on their own even where votes ride on the gradients, so that
   * `onStep` for the step runs before the next step trains: e.g. the steps an evaluation in onStep
   * must see the model of.
   */
  voteAfter?: (step: number) => boolean;
  /** Rank 0 saves a checkpoint every this many steps (0: never by step count). */
  checkpointEvery?: number;
  /** Rank 0 saves a checkpoint at each epoch end. Default: when the run is elastic or checkpoints by step. */
  checkpointAtEpochEnd?: boolean;
  /** Resume from this session's checkpoints when no rank has live state. Default: this session's. */
  resumeFrom?: string | null;
  /** The token of the `resumeFrom` session. Default: this session's token. */
  resumeFromToken?: string;
  /**
   * Every round's DDP's options; `startStep` is runElastic's (the run's next step). Robust
   * aggregation for a volunteer session: `ddp: { aggregation: { kind: 'trimmed-mean', trim: 1 } }`
   * (or `median`, `centered-clip`: see DDPOptions.aggregation). Not with
   * `commHook` or `modelAverager`; with `diloco`, give it to `diloco.aggregation` instead (the outer
   * step's pseudo-gradients). `ddp.attack` (for measuring defences) makes the last K ranks of each
   * round attack their own gradients.
   */
  ddp?: DDPOptions;
  /**
   * Makes this rank's DDP communication hook (fp16CompressHook, powerSGD(...), postLocalSGD(...),
   * ...): called once, at the start; the one hook is registered on every round's DDP, since its
   * state (PowerSGD's error feedback and warm-start Q's) is this rank's and lasts across rounds.
   * Its state is saved with checkpoints and sent to joiners (see the top of this file). Every
   * rank must make the same kind of hook. Default: none (the plain float32 all-reduce).
   */
  commHook?: () => CommHook;
  /**
   * Periodic model averaging (torch's PostLocalSGDOptimizer, with `postLocalSGD` as the hook):
   * after each committed step's optimizer step runElastic calls PeriodicModelAverager's
   * `average(pg, model, step)`, which averages the replicas' weights when step > warmupSteps and
   * (step - warmupSteps) is a multiple of `period`. Replicas differ between averagings:
   * `checkReplicasEvery` then checks at averaging steps only. Default: none.
   */
  modelAverager?: PeriodicModelAveragerOptions;
  /**
   * DiLoCo (parallel/diloco.ts): H inner steps with `state.optimizer` on each rank's own samples,
   * communicating nothing, then an outer step (the averaged pseudo-gradient, the outer SGD with
   * Nesterov momentum) after every H-th step. Not with `commHook` or `modelAverager`. Replicas
   * are identical after outer steps only: `checkReplicasEvery` checks there. Default: none.
   */
  diloco?: DiLoCoOptions;
}

export interface ElasticRunResult {
  /** The last round's group and DDP, still open: evaluate with them, then `close()`. */
  pg: ProcessGroup;
  ddp: DistributedDataParallel;
  rank: number;
  worldSize: number;
  steps: number;
  epoch: number;
  /** Rounds the run trained in, and steps trained twice because a round failed mid-step. */
  generations: number;
  stepsRedone: number;
  /** Rounds this rank saw paused below the minimum. */
  pausedGenerations: number;
  resumes: string[];
  stoppedBy: number | null;
  weightHash: string;
  /** Where this rank's steps spent their time: mean ms per step, by phase. */
  timeline: StepTimeline;
  /** With `localData`: the last epoch end's evaluation (this rank's own held-out accuracy, every rank's and the group's). */
  localEvaluation?: LocalEvaluation | null;
  /** Waits until every rank of the group is done (a barrier), then leaves it and closes the connection. */
  close(): Promise<void>;
}

/** What `rebuildState` learns: which backend now runs, and what was lost. */
export interface RebuildContext {
  /** 'webgpu' on a new device, or the fallback when WebGPU did not come back. */
  backend: string;
  fallbackReason?: string;
  error: DeviceLostError;
}

/** Refuses options no run can use, saying which and what was given. */
export function checkOptions(o: ElasticRunOptions<StepMetrics>): void {
  checkSchedule(o);
  if (o.diloco && (o.commHook || o.modelAverager))
    throw new TypeError(
      'diloco is a strategy of its own: leave commHook and modelAverager unset with it (DiLoCo is its own hook, and its outer step averages the models)',
    );
  const aggregation = o.ddp?.aggregation;
  if (aggregation !== undefined) {
    checkAggregationSpec(aggregation);
    if (aggregation.kind !== 'mean' && (o.diloco || o.commHook || o.modelAverager)) {
      const other = o.diloco ? 'diloco' : o.commHook ? 'commHook' : 'modelAverager';
      throw new TypeError(
        `ddp.aggregation ${aggregation.kind} does not combine with ${other}: robust aggregation replaces the gradients' all-reduce${o.diloco ? "; with DiLoCo, give it to diloco.aggregation (the outer step's pseudo-gradients)" : ', which a hook or local SGD would compress or skip'}`,
      );
    }
  }
  if (o.ddp?.attack) checkAttackPlan(o.ddp.attack);
  if (o.localData !== undefined) {
    if (!(o.localData instanceof LocalDataset))
      throw new TypeError("localData must be a LocalDataset (datasets/local.ts): this rank's own samples");
    if (balanceOf(o))
      throw new TypeError(
        'balance does not combine with localData yet: each step is split by the samples each rank has left; leave balance unset',
      );
  }
  if (o.diloco?.aggregation) checkAggregationSpec(o.diloco.aggregation);
  if (o.diloco?.attack) checkAttackPlan(o.diloco.attack);
  for (const name of ['balance', 'balanceBatches'] as const) {
    if (o[name] !== undefined && typeof o[name] !== 'boolean') throw new TypeError(`${name} must be true or false, got ${String(o[name])}`);
  }
  if (o.balance !== undefined && o.balanceBatches !== undefined && o.balance !== o.balanceBatches) {
    throw new TypeError(
      `balance ${o.balance} and balanceBatches ${o.balanceBatches} disagree: balanceBatches is balance's old name, give balance alone`,
    );
  }
  if (o.voteEvery !== undefined && !(Number.isSafeInteger(o.voteEvery) && o.voteEvery >= 1))
    throw new RangeError(`voteEvery must be an integer >= 1, got ${o.voteEvery}`);
  for (const name of ['checkpointEvery', 'checkReplicasEvery'] as const) {
    const v = o[name];
    if (v !== undefined && !(Number.isSafeInteger(v) && v >= 0)) throw new RangeError(`${name} must be a non-negative integer, got ${v}`);
  }
}

/** Whether the deprecated `balanceBatches` was warned about (once per page). */
let balanceBatchesWarned = false;

/** Balanced batches asked for: `balance`, or its old name `balanceBatches` (with a warning, once). */
export function balanceOf(o: { balance?: boolean; balanceBatches?: boolean }): boolean {
  if (o.balanceBatches !== undefined && !balanceBatchesWarned) {
    balanceBatchesWarned = true;
    console.warn('runElastic: balanceBatches is deprecated, use balance (the same option, as the train job and the launcher name it)');
  }
  return (o.balance ?? o.balanceBatches) === true;
}
