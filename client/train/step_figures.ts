/**
 * The figures each rank contributes per step, and how the dashboard's fleet table shows them
 * (from the library's step event): kept apart from the harness (harness.ts), which re-exports the
 * types and only passes the figures on.
 */
import type { ElasticEvent } from '../../src/index.ts';
import type { StepBalance } from '../../src/elastic/balance.ts';
import type { RankStepMetrics } from './events.ts';

/** What a pipeline run's ranks add to `Metrics` (see pipeline_trainer.ts). */
export type PipelineMetrics = { stage: number; replica: number; bubble: number; waitActivations: number; waitGradients: number };

/** The figures each rank contributes per step (gathered with the step's vote). */
export type Metrics = {
  /** null: the rank trained no samples this step (balanced batches), so it has no loss or accuracy. */
  loss: number | null;
  accuracy: number | null;
  samplesPerSec: number;
  hashHi: number;
  hashLo: number;
  compute: number;
  readback: number;
  allreduce: number;
  apply: number;
  /** --slow: ms this rank waited this step to be its factor slower (0 for the others). */
  slowed: number;
  /** The span of this step's gradient communication (first bucket's start to last bucket's end), ms. */
  comm: number;
  /** The samples this rank trained this step. */
  samples: number;
};

/**
 * What a DDP run's ranks add to `Metrics`: the bytes this rank sent to keep the replicas in step
 * (its backward's `commBytes`, measured; with --comm-hook localsgd plus, at the steps the models
 * are averaged, that averaging's all-reduce, computed: runElastic runs it after the step), and
 * what the plain float32 all-reduce of the same buckets would have sent (computed, see comm.ts).
 */
export type CommMetrics = { commBytes: number; commDenseBytes: number };

/** What a DDP run's ranks add about their devices (--devices): how many, and their mean compute this step (ms; 0 with one device). */
export type DeviceMetrics = { devices: number; deviceMs: number };

/** Each rank's figures of a step, as the dashboard's fleet table shows them. */
export function stepRanks(e: Extract<ElasticEvent, { type: 'step' }>): RankStepMetrics[] {
  return (
    e.metrics as unknown as Array<Metrics & Partial<PipelineMetrics> & Partial<CommMetrics> & Partial<DeviceMetrics> & { samples?: number }>
  ).map((m, rank) => ({
    rank,
    loss: m.loss,
    accuracy: m.accuracy,
    samplesPerSec: m.samplesPerSec,
    // Uneven batches: the samples this rank trained (the fleet table's share of the global batch).
    ...(m.samples === undefined ? {} : { samples: m.samples }),
    // Balanced batches gave it none: why, in the group's own figures.
    ...idleOf(e.balance, rank),
    breakdownMs: {
      compute: m.compute,
      readback: m.readback,
      allreduce: m.allreduce,
      apply: m.apply,
      ...(m.slowed ? { slowed: m.slowed } : {}),
    },
    // A DDP run's ranks: the bytes each sent this step, and the float32 all-reduce's.
    ...(m.commBytes === undefined
      ? {}
      : { commBytes: m.commBytes, ...(m.commDenseBytes === undefined ? {} : { commDenseBytes: m.commDenseBytes }) }),
    // --devices K > 1: the rank's Workers and their mean compute this step.
    ...(m.devices !== undefined && m.devices > 1 ? { devices: { count: m.devices, meanMs: m.deviceMs ?? 0 } } : {}),
    // A pipeline run's ranks: which stage, and how long it waited for its neighbours.
    ...(m.stage === undefined
      ? {}
      : {
          pipeline: {
            stage: m.stage,
            replica: m.replica ?? 0,
            bubble: m.bubble ?? 0,
            waitActivations: m.waitActivations ?? 0,
            waitGradients: m.waitGradients ?? 0,
          },
        }),
  }));
}

/** A rank that balanced batches gave no samples this step: its cost as the group measured it, and when it gets samples again. */
function idleOf(balance: StepBalance | undefined, rank: number): Pick<RankStepMetrics, 'idle'> {
  if (balance?.counts[rank] !== 0) return {};
  const perSampleMs = balance.perSampleMs[rank];
  const overheadMs = balance.overheadMs[rank];
  if (perSampleMs === undefined || overheadMs === undefined) return {};
  return { idle: { perSampleMs, overheadMs, probeAt: balance.probeAt } };
}
