/**
 * DiLoCo's side of robust aggregation (DiLoCoOptions' `aggregation` and `attack`): each
 * fragment's pseudo-gradients gathered from every rank and aggregated, instead of averaged, so
 * that a member's hostile pseudo-gradient cannot move the outer weights at will. Under a robust
 * kind each rank's pseudo-gradient counts once, unweighted by samples; a rank that trained no
 * samples on the fragment since its last outer step contributes no block.
 */
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { checkAggregationSpec, NoContributionError, type AggregationSpec } from './aggregators.ts';
import { applyAttack, checkAttackPlan, isAttacker, type AttackPlan } from './attacks.ts';
import { RobustReducer, isRobust, type AggregationReport } from './reducer.ts';

export class OuterAggregation {
  readonly spec: AggregationSpec;
  private readonly attack: AttackPlan | undefined;
  /** The last fragment's report (null: none yet, or the mean). */
  last: AggregationReport | null = null;

  constructor(spec: AggregationSpec | undefined, attack: AttackPlan | undefined) {
    this.spec = spec ?? { kind: 'mean' };
    checkAggregationSpec(this.spec);
    if (attack) checkAttackPlan(attack);
    this.attack = attack;
  }

  /** Whether pseudo-gradients are aggregated robustly (else averaged by all-reduce). */
  get robust(): boolean {
    return isRobust(this.spec);
  }

  /** A fragment's reducer (its own centered-clip center), or null under the mean. */
  newReducer(): RobustReducer | null {
    return isRobust(this.spec) ? new RobustReducer(this.spec) : null;
  }

  /** Plays this rank's attack on its own pseudo-gradient (for measuring defences), if it is an attacker. */
  attackOwn(pg: ProcessGroup, delta: Float32Array, step: number, part: number): void {
    if (this.attack && isAttacker(this.attack, pg.rank, pg.worldSize)) applyAttack(this.attack, delta, { rank: pg.rank, step, part });
  }

  /**
   * Collective: fragment `part`'s pseudo-gradients aggregated (`delta`: this rank's, unweighted;
   * none when `present` is false), with how many ranks' entered. When no rank had one, zeros
   * (as the mean of nothing weighed); when every one was refused, NoContributionError.
   */
  reduce(
    pg: ProcessGroup,
    reducer: RobustReducer,
    delta: Float32Array,
    present: boolean,
    step: number,
    part: number,
  ): Promise<{ values: Float32Array; used: number }> {
    if (present) this.attackOwn(pg, delta, step, part);
    return reducer.reduce(pg, present ? delta : null, delta.length, step).then(
      (report) => {
        this.last = report;
        return { values: report.values, used: report.used };
      },
      (err: unknown) => {
        if (err instanceof NoContributionError && err.judgments.every((j) => j.status === 'absent'))
          return { values: new Float32Array(delta.length), used: 0 };
        throw err;
      },
    );
  }
}
