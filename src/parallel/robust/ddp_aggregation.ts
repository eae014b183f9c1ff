/**
 * DistributedDataParallel's side of robust aggregation (its `aggregation` and `attack` options):
 * which reducer runs, which attack this rank plays (for measuring defences), what cannot combine
 * with a robust kind (communication hooks, values carried on the sum), and the step itself:
 * this rank's whole gradient gathered with every rank's and replaced by their aggregate.
 */
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { isPlainAllreduce } from '../comm_hooks/default_hooks.ts';
import type { CommHook } from '../comm_hooks/types.ts';
import { checkAggregationSpec, NoContributionError, type AggregationSpec } from './aggregators.ts';
import { applyAttack, checkAttackPlan, isAttacker, type AttackPlan, type AttackSpec } from './attacks.ts';
import { RobustReducer, describeAggregation, isRobust, type AggregationReport } from './reducer.ts';

/** The outcome of a robust step: the aggregate is in place (finite or not), or no rank's gradient was usable. */
export type RobustStepOutcome = { kind: 'aggregated'; finite: boolean } | { kind: 'refused'; index: number };

export class DDPAggregation {
  readonly spec: AggregationSpec;
  /** null under the mean (DDP's bucketed all-reduces). */
  readonly reducer: RobustReducer | null;
  /** This rank's attack (null for an honest rank). */
  readonly attack: AttackSpec | null;
  /** The last robust step's report. */
  last: AggregationReport | null = null;

  constructor(options: { aggregation?: AggregationSpec; attack?: AttackPlan }, rank: number, worldSize: number) {
    this.spec = options.aggregation ?? { kind: 'mean' };
    checkAggregationSpec(this.spec);
    this.reducer = isRobust(this.spec) ? new RobustReducer(this.spec) : null;
    if (options.attack) checkAttackPlan(options.attack);
    this.attack = options.attack && isAttacker(options.attack, rank, worldSize) ? options.attack : null;
  }

  /** Throws if `hook` cannot reduce under this aggregation (any hook but the plain all-reduce, under a robust kind). */
  checkHook(hook: CommHook): void {
    if (!this.reducer || isPlainAllreduce(hook)) return;
    const diloco = hook.localSteps
      ? "; for DiLoCo, give the aggregation to DiLoCo's outer step (DiLoCoOptions.aggregation) and leave DDP's the mean"
      : '';
    throw new Error(
      `the communication hook ${hook.name} cannot combine with robust aggregation (${describeAggregation(this.spec)}): the aggregation replaces the all-reduce a hook would compress or skip, and needs every rank's whole gradient as sent${diloco}`,
    );
  }

  /** Throws under a robust kind: nothing rides on a sum there. */
  checkCarry(): void {
    if (!this.reducer) return;
    throw new Error(
      `carry: values cannot ride on the gradients under robust aggregation (${describeAggregation(this.spec)}): the gradients are gathered and aggregated, not summed, and a sum could not carry per-rank facts anyway (any rank adds into any value); exchange them on their own (runElastic does: no votes on the gradients then)`,
    );
  }

  /** Plays this rank's attack on its own contribution (`part`: a bucket's index), when it has one and samples. */
  attackOwn(values: Float32Array, rank: number, step: number, part: number, hasSamples: boolean): void {
    if (this.attack && hasSamples) applyAttack(this.attack, values, { rank, step, part });
  }

  /**
   * Collective, under a robust kind: `grad` (this rank's whole gradient; nothing from it when it
   * has no samples) is gathered with every rank's and replaced by the aggregate, the same bits on
   * every rank. When no rank's gradient is usable, `grad` is left alone and the outcome names the
   * first refused rank's first non-finite index.
   */
  async reduce(pg: ProcessGroup, grad: Float32Array, hasSamples: boolean, step: number): Promise<RobustStepOutcome> {
    if (hasSamples) this.attackOwn(grad, pg.rank, step, 0, true);
    let report: AggregationReport;
    try {
      report = await this.reducer!.reduce(pg, hasSamples ? grad : null, grad.length, step);
    } catch (err) {
      const refused = err instanceof NoContributionError ? err.judgments.find((j) => j.nonfiniteIndex !== undefined) : undefined;
      if (!refused) throw err;
      return { kind: 'refused', index: refused.nonfiniteIndex! };
    }
    this.last = report;
    grad.set(report.values);
    let finite = true;
    for (let i = 0; i < grad.length && finite; i++) finite = Number.isFinite(grad[i]!);
    return { kind: 'aggregated', finite };
  }
}
