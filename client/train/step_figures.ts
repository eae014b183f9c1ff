/**
 * Each rank's figures of a step as the dashboard's fleet table shows them, from the library's
 * step event: kept apart from the harness (harness.ts), which only passes them on.
 */
import type { ElasticEvent } from '../../src/index.ts';
import type { StepBalance } from '../../src/elastic/balance.ts';
import type { RankStepMetrics } from './events.ts';
import type { CommMetrics, DeviceMetrics, Metrics, PipelineMetrics } from './harness.ts';

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
