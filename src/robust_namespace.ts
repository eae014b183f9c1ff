/**
 * `robust`: robust aggregation's parts (opt-in per session through `DDPOptions.aggregation` /
 * `DiLoCoOptions.aggregation`): the aggregators, the reducer, the exchange of contributions,
 * their tallies, and the attacks that exist to measure the defences.
 */
export {
  aggregate,
  checkAggregationSpec,
  DEFAULT_CLIP_ITERATIONS,
  type Aggregation,
  type RankJudgment,
} from './parallel/robust/aggregators.ts';
export { RobustReducer, isRobust, describeAggregation, type AggregationReport } from './parallel/robust/reducer.ts';
export { gatherContributions, type GatheredContributions } from './parallel/robust/exchange.ts';
export {
  applyAttack,
  isAttacker,
  ATTACK_KINDS,
  type AttackKind,
  type AttackSpec,
  type AttackPlan,
  type AttackContext,
} from './parallel/robust/attacks.ts';
export {
  judgedOf,
  tallyContributions,
  summarizeContributions,
  rankMeans,
  MAX_REPORTED_RANKS,
  type AggregationJudged,
  type ContributionOf,
  type ContributionSummary,
  type ContributionTally,
  type RankContribution,
  type RankTally,
} from './parallel/ddp/contributions.ts';
