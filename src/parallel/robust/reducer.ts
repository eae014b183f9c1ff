/**
 * Robust aggregation as a collective step: gather every rank's own contribution (exchange.ts),
 * aggregate it the same way on every rank (aggregators.ts), and keep what centered clipping
 * carries from one step to the next (its center: the previous aggregate, the same bits on every
 * rank). DDP reduces a step's whole gradient with one; DiLoCo one per fragment of its outer step.
 *
 * The center lives as long as the reducer: a DDP made for a new elastic round (or a resumed run)
 * starts centered clipping from zeros again, on every rank alike.
 */
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { aggregate, checkAggregationSpec, type Aggregation, type AggregationSpec } from './aggregators.ts';
import { gatherContributions } from './exchange.ts';

/** One aggregation as a step's caller sees it: the aggregate, the judgments, and what was received. */
export interface AggregationReport extends Aggregation {
  /** The step (DDP's) or outer step (DiLoCo's) it was for. */
  step: number;
  /** digest48 of each rank's block as this rank received it (exchange.ts), for equivocation checks. */
  digests: Array<readonly [number, number]>;
}

export class RobustReducer {
  readonly spec: AggregationSpec;
  /** centered-clip: the previous aggregate, where the next one starts (null: zeros). */
  private center: Float32Array | null = null;

  constructor(spec: AggregationSpec) {
    checkAggregationSpec(spec);
    this.spec = spec;
  }

  /**
   * Collective (every rank of `pg`, in the same order as its other collectives): gathers each
   * rank's `values` (null: none from this rank this step) and aggregates them. The exchange is
   * issued before this returns its promise, so several calls keep their order on every rank.
   * Throws NoContributionError (aggregators.ts) when no rank's block is usable.
   */
  reduce(pg: ProcessGroup, values: Float32Array | null, numel: number, step: number): Promise<AggregationReport> {
    const gathered = gatherContributions(pg, values, numel, step);
    return gathered.then(({ blocks, digests }) => {
      const result = aggregate(this.spec, blocks, this.center);
      if (this.spec.kind === 'centered-clip') this.center = result.values.slice();
      return { ...result, step, digests };
    });
  }
}

/** Whether `spec` asks for robust aggregation (anything but the mean, which the ring all-reduce computes). */
export function isRobust(spec: AggregationSpec | undefined): spec is Exclude<AggregationSpec, { kind: 'mean' }> {
  return spec !== undefined && spec.kind !== 'mean';
}

/** "trimmed-mean (trim 1)", "centered-clip (tau 0.5, 3 iterations)": for messages. */
export function describeAggregation(spec: AggregationSpec): string {
  switch (spec.kind) {
    case 'trimmed-mean':
      return `trimmed-mean (trim ${spec.trim})`;
    case 'centered-clip':
      return `centered-clip (tau ${spec.tau}${spec.iterations === undefined ? '' : `, ${spec.iterations} iterations`})`;
    default:
      return spec.kind;
  }
}
