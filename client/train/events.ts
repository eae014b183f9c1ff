/**
 * What the training job tells its page while it runs: the dashboard (client/ui/) renders these,
 * and the console gets a line for the notable ones. The library (src/) knows nothing of them;
 * the launcher hears the library's own elastic events instead.
 */

import type { ProbeFigure } from './backend_probe.ts';
import type { LinkPath } from '../../src/index.ts';
import type { AggregationJudged } from '../../src/parallel/ddp/contributions.ts';
import type { DeviceInfo, DeviceStats } from '../../src/parallel/data_parallel/data_parallel.ts';
import type { PsSampleCounts, PsServerSlot, PsStatus } from '../../src/parallel/parameter_server/runner.ts';
import type { BackendName, TrainConfig } from '../../src/jobs/train_config.ts';
import type { Accuracy } from '../../src/elastic/local_eval.ts';
import type { FleetEvent } from './fleet.ts';

export type { BackendName, TrainConfig } from '../../src/jobs/train_config.ts';
export type { FleetEvent, FleetInfo, FleetMember } from './fleet.ts';

export interface StepBreakdownMs {
  compute: number;
  readback: number;
  allreduce: number;
  apply: number;
}

/** One rank's figures for one step; every rank receives every rank's (through an allGather). */
export interface RankStepMetrics {
  rank: number;
  /** null: the rank trained no samples this step (see `idle`): it has no loss, which is not a loss of 0. */
  loss: number | null;
  /** Accuracy on this rank's batch; null without samples. */
  accuracy: number | null;
  samplesPerSec: number;
  /**
   * The samples this rank trained this step (ranks may take uneven shares of the global batch);
   * left out by jobs that do not say, whose ranks then count as equal shares.
   */
  samples?: number;
  /** `slowed`: --slow, the ms a straggler waited on purpose in proportion to its compute (left out when 0). */
  breakdownMs: StepBreakdownMs & { slowed?: number };
  /**
   * DDP runs: the bytes this rank sent this step to keep the replicas in step (its gradients'
   * reductions by the --comm-hook, and localsgd's model averaging when it ran), and what the
   * plain float32 ring all-reduce of the same gradients would have sent from it.
   */
  commBytes?: number;
  commDenseBytes?: number;
  /** Pipeline runs: this rank's stage and replica, its idle share of the step, and its waits (ms). */
  pipeline?: { stage: number; replica: number; bubble: number; waitActivations: number; waitGradients: number };
  /** --devices K > 1: this rank's devices (Workers) and their mean compute this step, ms. */
  devices?: { count: number; meanMs: number };
  /**
   * Balanced batches gave this rank no samples this step (the others finish the whole batch
   * sooner than it finishes even a few): its cost as the group measured it (ms per sample, fixed
   * ms per step) and the step at which it gets samples again, to be measured again.
   */
  idle?: { perSampleMs: number; overheadMs: number; probeAt: number };
}

/** One stage's forward (F) and backward (B) passes in a step, ms from the step's start. */
export interface TimelineEntry {
  phase: 'F' | 'B';
  microBatch: number;
  start: number;
  end: number;
}

/** The model's layers and which stage holds each. */
export interface StageLayer {
  index: number;
  className: string;
  parameters: number;
  stage: number;
}

export type TrainEvent =
  | { type: 'config'; config: TrainConfig }
  | {
      type: 'joined';
      rank: number;
      worldSize: number;
      /** The server's round this rank is in: ranks name tabs within it (the host removes a tab by its rank and round). */
      round?: number;
      /** The backend that runs, and why it is not the one asked for, if it is not. */
      backend: BackendName;
      fallbackReason?: string;
      adapter: string | null;
      /** backend=auto: each backend's measured time per step of this job's model (the chosen one is `backend`). */
      probe?: ProbeFigure[];
    }
  /**
   * Not training yet, or paused: `arrived` tabs are in the session and it needs `min` (it
   * starts at once with `max`). `paused` when a running group fell below its minimum.
   */
  | { type: 'waiting'; arrived: number; min: number; max: number; paused: boolean }
  | {
      type: 'shard';
      epoch: number;
      /** Samples this rank sees this epoch (torch's num_samples, padding included). */
      samples: number;
      datasetSize: number;
      stepsPerEpoch: number;
    }
  | {
      type: 'step';
      epoch: number;
      /** Steps done so far in the run (1-based after the first). */
      step: number;
      totalSteps: number;
      /** Every rank's figures for this step, in rank order. */
      ranks: RankStepMetrics[];
      /** Seconds since training started. */
      elapsedSec: number;
    }
  /**
   * A robust aggregation (DDP's step, DiLoCo's outer step) in the server's round `round`: what the
   * group judged of each rank's contribution (src/parallel/ddp/contributions.ts), the same on every rank.
   */
  | ({ type: 'aggregation'; round: string } & AggregationJudged)
  | { type: 'eval'; epoch: number; step: number; testAccuracy: number; testLoss: number }
  /**
   * Each tab's own pictures (dataset local): every rank's accuracy on its own held-out pictures
   * (each as the rank itself said), this tab's, and the group's (the sample-weighted mean).
   */
  | { type: 'local-eval'; epoch: number; step: number; own: Accuracy; ranks: Accuracy[]; group: Accuracy }
  /** Each tab's own pictures: at an epoch's start in a round, every rank's pictures held and left in the epoch, and how many left with tabs that went (null: this tab cannot tell). */
  | { type: 'local-counts'; epoch: number; step: number; samples: number[]; remaining: number[]; left: number | null }
  /** A language model's text after `prompt`, sampled from this tab's replica at `step` (seeded by the step: the same on identical replicas). */
  | { type: 'sample'; step: number; prompt: string; text: string }
  | {
      type: 'link';
      peer: number;
      state: 'connecting' | 'open' | 'closed';
      /** Payload bytes both ways per second over the last two seconds. */
      throughputMBps?: number;
      /** The network path under the link (candidate types, RTT, bytes per second on the wire). */
      path?: LinkPath;
    }
  | { type: 'log'; level: 'info' | 'warn' | 'error'; message: string }
  /** The session's store (its server's Redis) refuses this tab's requests, which are tried again (`unavailable`: the server's words), or answers again (null). */
  | { type: 'store'; unavailable: string | null }
  /** Each rank's browser, backend and device (from the store, untrusted and cleaned: see fleet.ts), once per round. */
  | FleetEvent
  /**
   * --devices K > 1: this tab's devices (DataParallel Workers) and, once it trained, each one's
   * figures (steps, samples, mean compute, live tensors). Sent when they start and every few steps.
   */
  | { type: 'devices'; devices: Array<DeviceInfo & Partial<DeviceStats>> }
  /** A member of the group was lost (its tab closed, froze, or its link broke). */
  | { type: 'rank-lost'; rank: number; reason: string }
  /**
   * Steps the run has trained again so far (a step in flight when a round failed), as of the
   * latest round: the run record's, carried with the state, so every rank of a round says the same.
   */
  | { type: 'steps-redone'; steps: number }
  | { type: 'stopped'; by: number; atStep: number }
  /**
   * The evaluation after the run: the weights are final (they can be saved now), and this rank
   * has evaluated `done` of its `total` test samples at `step`; `skipped` once the host skipped it.
   */
  | { type: 'evaluating'; step: number; done: number; total: number; skipped?: boolean }
  | { type: 'done'; summary: Record<string, unknown> }
  /** A pipeline run: this tab's place (stage, replica) and which layers each stage holds. */
  | {
      type: 'pipeline';
      stage: number;
      stages: number;
      replica: number;
      replicas: number;
      schedule: 'gpipe' | '1f1b';
      microBatches: number;
      layers: StageLayer[];
      /** Idle share of a step by the formula (S-1)/(M+S-1). */
      bubbleFormula: number;
    }
  /**
   * A parameter-server run (--strategy ps|central), about once a second on every rank: the layout
   * (which rank serves which parameters, which ranks are workers), and this tab's own figures as
   * a server (its shard) or as a worker.
   */
  | PsStatusEvent
  /** The schedule as it ran in one step of replica 0's pipeline: each stage's passes. */
  | { type: 'timeline'; step: number; stages: Array<{ stage: number; totalMs: number; entries: TimelineEntry[] }> };

/**
 * A parameter-server run's status as the library reports it (`runParameterServer`'s `onStatus`):
 * one definition, so the page shows what the run says.
 */
export type PsStatusEvent = { type: 'ps' } & PsStatus;
export type PsServerInfo = PsServerSlot;
/** Samples of a parameter-server run, counted by server 0 (virtual epochs: `target` is epochs x the dataset). */
export type PsSamples = PsSampleCounts;
