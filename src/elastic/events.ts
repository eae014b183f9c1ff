/**
 * What an elastic run records as it goes (torch.distributed.elastic.events), in the agent's
 * terms: rounds, the samples each step trains on, committed steps, failures, checkpoints, the
 * end. A strategy adds events of its own (DDP's and DiLoCo's robust aggregation); the union of
 * them all, `ElasticEvent`, and the recorder that sends them to the run's `onEvent` and to the
 * process-wide handler are in parallel/events.ts, above every strategy. Events are plain JSON.
 */
import type { StepMetrics } from './vote.ts';
import type { StepBalance } from './balance.ts';
import type { StoreAvailabilityEvent } from '../c10d/store_unavailable.ts';

export type AgentEvent =
  /** A round started training: every rank now holds the same state, taken from `source`. */
  | {
      type: 'round';
      /** Names the round (server instance and round number): equal on every rank of it. */
      round: string;
      rank: number;
      worldSize: number;
      /** Steps committed before this round, and where the epoch stands. */
      step: number;
      epoch: number;
      position: number;
      /** The sampler's settings, so that a reader can rebuild each epoch's order and check the samples trained. */
      datasetLength: number;
      shuffle: boolean;
      seed: number;
      dropLast: boolean;
      /** Where the state came from: nobody had any, a live replica (rank `from`), or a checkpoint. */
      source: 'fresh' | 'replica' | 'checkpoint';
      from: number;
      /** The step in flight when the last round failed, which this round trains again. */
      redone: boolean;
      /** Steps the run has trained again so far: its run record's, carried with the state, so the same on every rank of the round (a late one included). */
      stepsRedone?: number;
      note?: string;
      /** The ranks train on their own samples (runElastic's localData): 'batch' events index each rank's own data, `datasetLength` is this rank's. */
      localData?: boolean;
      /** How many ranks report 'batch' events, each its own shard (the pipeline's replicas); default worldSize. */
      samplers?: number;
      /**
       * Where this rank's way into the round went, in ms: `rendezvous` from leaving its last
       * round (a failure, or a regroup it asked for) until the server's event for this one
       * arrived (null in its first round; 0 when it arrived first, the new round being what
       * failed the last); `state` from the later of the two until it held the group's state
       * (the round's links, the state transfer); `claims`, of `state`, until it held every rank's
       * claim (reading its own state, the round's links, one all-gather): the rest is the transfer.
       */
      phasesMs?: { rendezvous: number | null; state: number; claims?: number };
    }
  /** A step starts on this rank with these samples; the last `padding` of them are the sampler's padding. */
  | { type: 'batch'; round: string; rank: number; step: number; epoch: number; indices: number[]; padding: number }
  /**
   * A step committed on every rank of the round; `metrics` holds each rank's, in rank order (a
   * rank given no samples reports null for its loss and accuracy). `balance`: with balanced
   * batches, the step's split and why (each rank's cost model; when ranks given none get some again).
   */
  | {
      type: 'step';
      round: string;
      rank: number;
      step: number;
      epoch: number;
      totalSteps: number;
      metrics: StepMetrics[];
      elapsedMs: number;
      balance?: StepBalance;
    }
  /** This rank's shard of an epoch in this round. */
  | { type: 'epoch'; round: string; rank: number; epoch: number; samples: number; datasetLength: number; stepsPerEpoch: number }
  | { type: 'peer-lost'; round: string; rank: number; peer: number; reason: string }
  | { type: 'failure'; round: string; rank: number; step: number; inFlight: number | null; error: string; recoverable: boolean }
  | { type: 'paused'; min: number }
  | { type: 'waiting'; waiting: number; members: number; min: number; max: number; running: boolean }
  | { type: 'reconnecting'; attempt: number; waitMs: number; reason: string }
  | { type: 'reconnected' }
  /** The server's shared store does not answer (this rank's store requests are tried again), or answers again: c10d/store_unavailable.ts. */
  | ({ type: 'store' } & StoreAvailabilityEvent)
  | { type: 'regroup'; round: string; rank: number; step: number; waiting: number }
  | { type: 'checkpoint'; step: number; name: string; bytes: number }
  | { type: 'checkpoint-failed'; step: number; error: string }
  | { type: 'checkpoint-skipped'; name: string; reason: string }
  /**
   * This rank's WebGPU device was lost in `round` after `step` committed steps, while doing
   * `during`; its backend now runs again (`backend`, on a new device unless it fell back) with a
   * rebuilt state, and the rank is rejoining the group: its next 'round' event is the rejoin.
   */
  | {
      type: 'device-lost';
      round: string;
      rank: number;
      step: number;
      during: string;
      /** GPUDeviceLostInfo's reason and message. */
      reason: 'destroyed' | 'unknown';
      message: string;
      backend: string;
      fallbackReason?: string;
      /** From noticing the loss to a rebuilt state on the new backend. */
      rebuildMs: number;
    }
  /** The run ended on this rank (done, or stopped by a rank). */
  | {
      type: 'end';
      round: string;
      rank: number;
      worldSize: number;
      steps: number;
      epoch: number;
      generations: number;
      stepsRedone: number;
      stoppedBy: number | null;
      weightHash: string;
    };
