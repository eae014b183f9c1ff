/**
 * What the training job tells the page while it runs. The dashboard (client/ui/) renders these;
 * the launcher receives the same objects as progress reports. The library (src/) knows nothing
 * of them.
 */

export type ModelKind = 'mlp' | 'cnn';
export type DatasetKind = 'mnist' | 'synthetic';
export type OptimizerKind = 'sgd' | 'adam';
export type BackendName = 'webgpu' | 'webgl' | 'wasm' | 'cpu';

/** The job's configuration, from the URL (every rank of a session must agree on it). */
export interface TrainConfig {
  model: ModelKind;
  dataset: DatasetKind;
  /** Per-rank batch size. */
  batchSize: number;
  lr: number;
  optimizer: OptimizerKind;
  /** Train this many epochs, unless `steps` is set. */
  epochs: number;
  /** Stop after this many steps in all (overrides epochs when set). */
  steps: number | null;
  seed: number;
  shuffle: boolean;
  backend: BackendName;
  worldSize: number;
  /** Elastic size range (torchrun's --nnodes MIN:MAX), or null for a fixed world size. */
  elastic: { min: number; max: number } | null;
  /** Rank 0 saves a checkpoint every this many steps (0: only at epoch ends of elastic runs). */
  checkpointEvery: number;
  /** Evaluate on the test set every this many steps (0: only at epoch ends). */
  evalEvery: number;
  /** Start from the latest checkpoint of this session instead of from scratch. */
  resumeFrom: string | null;
}

export interface StepBreakdownMs {
  compute: number;
  readback: number;
  allreduce: number;
  apply: number;
}

/** One rank's figures for one step; every rank receives every rank's (through an allGather). */
export interface RankStepMetrics {
  rank: number;
  loss: number;
  /** Accuracy on this rank's batch. */
  accuracy: number;
  samplesPerSec: number;
  breakdownMs: StepBreakdownMs;
}

export type TrainEvent =
  | { type: 'config'; config: TrainConfig }
  | {
      type: 'joined';
      rank: number;
      worldSize: number;
      /** The backend that runs, and why it is not the one asked for, if it is not. */
      backend: BackendName;
      fallbackReason?: string;
      adapter: string | null;
    }
  | { type: 'waiting'; joined: number[]; worldSize: number }
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
  | { type: 'eval'; epoch: number; step: number; testAccuracy: number; testLoss: number }
  | { type: 'link'; peer: number; state: 'connecting' | 'open' | 'closed'; throughputMBps?: number }
  | { type: 'log'; level: 'info' | 'warn' | 'error'; message: string }
  /** A member of the group was lost (its tab closed, froze, or its link broke). */
  | { type: 'rank-lost'; rank: number; reason: string }
  | { type: 'stopped'; by: number; atStep: number }
  | { type: 'done'; summary: Record<string, unknown> };
