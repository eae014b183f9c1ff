/**
 * What a parameter-server run takes and gives (`runParameterServer`): its options, the step a
 * worker runs, what each tab reports about once a second, its events and its result; and the
 * check of the options, before anything joins.
 */
import type * as tf from '@tensorflow/tfjs';
import type { StepMetrics } from '../../elastic/vote.ts';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import type { RendezvousOptions } from '../../c10d/rendezvous.ts';
import { checkSchedule, type RunHooks, type ScheduleOptions } from '../../elastic/agent.ts';
import type { PsSampleCounts } from './leases.ts';
import type { ParameterServerShard } from './shard.ts';

export type PsStrategy = 'async' | 'central';

export interface PsServerSlot {
  index: number;
  rank: number;
  parameters: number[];
  numel: number;
}

export interface WorkerStepContext {
  /** The batch's samples (indices into the dataset). */
  indices: number[];
  /** The whole model, holding the values just pulled. */
  model: tf.LayersModel;
  workerId: number;
  /** This worker's step id (its pushes count up). */
  stepId: number;
  /** The epoch the samples belong to. */
  epoch: number;
  pg: ProcessGroup;
}

/** What the worker's step returns: the gradients of its batch's loss, flat in `model.trainableWeights` order (`flatGradients`). */
export interface WorkerStepResult<M extends StepMetrics> {
  grads: Float32Array;
  metrics?: M;
}

/** What a tab is, about once a second (`onStatus`): the layout, and its own figures as a server or a worker. */
export interface PsStatus {
  strategy: PsStrategy;
  rank: number;
  role: 'server' | 'worker';
  servers: PsServerSlot[];
  /** The workers of the current round: their stable worker id and their rank now. */
  workers: Array<{ workerId: number; rank: number }>;
  /** This tab as a server: its shard's figures. */
  server?: {
    index: number;
    version: number;
    /** Updates applied per second over the last few seconds. */
    updatesPerSec: number;
    applied: number;
    stale: number;
    duplicate: number;
    refused: number;
    /** Pushes applied or dropped as stale, by staleness (the last bucket: that staleness and above). */
    stalenessHistogram: number[];
    /** Each worker's pushes to this shard: per second over the last few seconds, and in all (rank null: it left). */
    pushRates: Array<{ workerId: number; rank: number | null; pushesPerSec: number; pushes: number; applied: number }>;
  };
  /** This tab as a worker: its verdicts are server 0's; `lastStaleness` its last push's there. */
  worker?: {
    workerId: number;
    pulls: number;
    pushes: number;
    applied: number;
    stale: number;
    samples: number;
    lastStaleness: number | null;
  };
  /** The run's samples (server 0 counts them; null on a tab that has not heard them yet). */
  samples: PsSampleCounts | null;
}

export type PsRunEvent =
  | {
      type: 'round';
      round: string;
      rank: number;
      worldSize: number;
      role: 'server' | 'worker';
      index: number;
      servers: PsServerSlot[];
      workers: Array<{ workerId: number; rank: number }>;
    }
  /** A server's place is empty: every worker waits for a tab to take it. */
  | { type: 'server-lost'; round: string; index: number; message: string }
  | { type: 'restored'; index: number; version: number; name: string }
  | { type: 'checkpoint'; index: number; version: number; name: string; bytes: number }
  | { type: 'checkpoint-failed'; index: number; version: number; error: string }
  /** Server 0: a worker left holding a lease; its samples are lost. */
  | { type: 'samples-lost'; workerId: number; samples: number }
  | { type: 'peer-lost'; round: string; rank: number; peer: number; reason: string }
  | { type: 'failure'; round: string; rank: number; error: string; recoverable: boolean }
  | { type: 'regroup'; round: string; rank: number; waiting: number }
  | { type: 'stop'; round: string; rank: number; reason: string };

export interface ParameterServerRunOptions<M extends StepMetrics = StepMetrics>
  extends Omit<RendezvousOptions, 'reconnect' | 'min' | 'rank'>,
    Omit<ScheduleOptions, 'dropLast'>,
    RunHooks<PsRunEvent> {
  /** 'async' (default): ParameterServerStrategy; 'central': CentralStorageStrategy (K = 1, synchronous). */
  strategy?: PsStrategy;
  /** K: ranks that serve the variables. Default 1. */
  numServers?: number;
  /** Fewest ranks to train with. Default K + 1 (one worker). */
  min?: number;
  /** The whole model, built alike on every rank (the same seed): servers take their shard's initial values from it, workers compute on it. */
  model: tf.LayersModel;
  /** Makes a server's optimizer (one per shard). */
  optimizer: () => tf.Optimizer;
  /**
   * The schedule (ScheduleOptions): `batchSize` samples per worker per step; `epochs` are virtual
   * epochs (the dataset's size in samples, this many times); `steps` counts pushes by all workers
   * together (async) or steps (central). No `dropLast`: a lease's batch may be short.
   */
  /** Async: drop pushes whose staleness exceeds this. Default: no bound. */
  maxStaleness?: number;
  /** Async: scale a push's gradients by 1/(1 + staleness). Default false. */
  scaleLrByStaleness?: boolean;
  /** Each server saves its shard every this many updates (0: never). Default 0. */
  checkpointEvery?: number;
  /** A server new to its place loads its shard's latest checkpoint, when there is one. Default true. */
  resume?: boolean;
  /** A worker's step: the gradients of `ctx.indices` on `ctx.model`. */
  step(ctx: WorkerStepContext): Promise<WorkerStepResult<M>>;
  /** Asked by server 0 at each request: true once the run should end (a host's stop, say). */
  shouldStop?(): boolean;
  /** After each of this worker's steps, with its metrics. */
  onWorkerStep?(e: {
    workerId: number;
    stepId: number;
    indices: number[];
    metrics: M | undefined;
    computeMs: number;
    staleness: number | null;
  }): void;
  /** About once a second (`statusIntervalMs`), and at each round. */
  onStatus?(s: PsStatus): void;
  statusIntervalMs?: number;
  /** A round starts, once roles are known (watch the group's links here, say). */
  onRound?(ctx: { pg: ProcessGroup; role: 'server' | 'worker'; index: number }): void;
  /** Aborting it ends this rank's run at once, as closing its tab would: it leaves the group, and the run rejects with the signal's reason. */
  signal?: AbortSignal;
}

export interface ParameterServerRunResult {
  role: 'server' | 'worker';
  /** Server index, or worker id. */
  index: number;
  pg: ProcessGroup;
  rank: number;
  worldSize: number;
  /** The model with the final parameters of every shard (the same on every rank). */
  model: tf.LayersModel;
  servers: PsServerSlot[];
  workers: number;
  /** Each server's final version. */
  versions: number[];
  samples: PsSampleCounts;
  /** This server's shard figures (role server). */
  shard?: ReturnType<ParameterServerShard['stats']> & { updatesPerSec: number | null };
  /** This worker's figures (role worker). */
  worker?: {
    workerId: number;
    pulls: number;
    pushes: number;
    applied: number;
    stale: number;
    refused: number;
    samples: number;
    stalenessHistogram: number[];
  };
  checkpoints: number;
  restoredFrom: number | null;
  generations: number;
  stoppedBy: 'done' | 'request';
  /** Waits until every rank is done (a barrier), then leaves the group. */
  close(): Promise<void>;
}

/** Refuses options no run can use, saying what to give instead. */
export function checkOptions(o: ParameterServerRunOptions<StepMetrics>, strategy: PsStrategy, K: number): void {
  const positiveInt = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v) && v > 0;
  if (strategy !== 'async' && strategy !== 'central')
    throw new RangeError(`strategy must be 'async' or 'central', got ${String(strategy)}`);
  if (!positiveInt(K)) throw new RangeError(`numServers must be a positive integer, got ${K}`);
  if (strategy === 'central' && K !== 1)
    throw new RangeError(`CentralStorage keeps every variable on one server: numServers must be 1, got ${K}`);
  if (!(positiveInt(o.max) && o.max > K))
    throw new RangeError(`max must leave at least one worker beside the ${K} server(s): got ${o.max}, give at least ${K + 1}`);
  if (o.min !== undefined && !(positiveInt(o.min) && o.min > K && o.min <= o.max))
    throw new RangeError(`min must be from ${K + 1} (the servers and one worker) to max ${o.max}, got ${o.min}`);
  // Leases cycle through the dataset: it cannot be empty (a DDP run's may).
  if (!(Number.isSafeInteger(o.datasetLength) && o.datasetLength > 0))
    throw new RangeError(`datasetLength must be a positive integer, got ${o.datasetLength}`);
  checkSchedule(o);
  if (o.maxStaleness !== undefined && !(Number.isSafeInteger(o.maxStaleness) && o.maxStaleness >= 0))
    throw new RangeError(`maxStaleness must be a non-negative integer, got ${o.maxStaleness}`);
  if (o.checkpointEvery !== undefined && !(Number.isSafeInteger(o.checkpointEvery) && o.checkpointEvery >= 0))
    throw new RangeError(`checkpointEvery must be a non-negative integer, got ${o.checkpointEvery}`);
  if (strategy === 'central' && (o.maxStaleness !== undefined || o.scaleLrByStaleness))
    throw new RangeError('maxStaleness and scaleLrByStaleness are for asynchronous training; CentralStorage is synchronous (staleness 0)');
}
