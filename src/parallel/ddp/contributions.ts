/**
 * What a robust aggregation judged of each rank's contribution, made small enough to travel with
 * every step (runElastic's 'aggregation' event), and added up over a round (the page's dashboard
 * and its result for the launcher). Every rank aggregates the same blocks the same way, so every
 * rank's event says the same; a reader may take any rank's.
 *
 * - `normRatio`: the contribution's L2 norm over the lower median (torch.median's, as the
 *   aggregators use) of the norms of the contributions used; 1 is typical, 1000 a scaled gradient.
 * - `trimmed`: the fraction of its coordinates that did not enter the aggregate (trimmed mean:
 *   cut; median: not the one selected); `clipScale`: centered clipping's scale (1: not clipped).
 *
 * Figures are rounded (ratios and clip scales to 3 significant digits, trimmed fractions to 3 decimals), a refusal's reason capped,
 * and at most MAX_REPORTED_RANKS ranks reported (the train job's largest world).
 */
import type { AggregationKind, RankJudgment } from '../robust/aggregators.ts';
import type { AggregationReport } from '../robust/reducer.ts';

/** The most ranks one event reports (the job's worlds are smaller; a larger one's last ranks are left out). */
export const MAX_REPORTED_RANKS = 64;
const MAX_REASON_CHARS = 120;

/** What was aggregated: DDP's gradients, or DiLoCo's pseudo-gradients at its outer steps. */
export type ContributionOf = 'gradients' | 'pseudo-gradients';

/** One rank's contribution to one aggregation, rounded. */
export interface RankContribution {
  rank: number;
  status: RankJudgment['status'];
  /** Its norm over the median norm of the used contributions; null when absent, refused, or the median is 0. */
  normRatio: number | null;
  /** Fraction of its coordinates left out of the aggregate (0 when absent or refused). */
  trimmed: number;
  /** Centered clipping's last scale (1: not clipped; 1 for the other kinds). */
  clipScale: number;
  /** Why it was refused or left out. */
  reason?: string;
}

/** One aggregation's judgments, as the 'aggregation' event carries them. */
export interface AggregationJudged {
  /** The step (DDP) or the step after which the outer step started (DiLoCo). */
  step: number;
  of: ContributionOf;
  kind: AggregationKind;
  /** Contributions in the aggregate. */
  used: number;
  /** One per rank, in rank order (at most MAX_REPORTED_RANKS). */
  ranks: RankContribution[];
}

/** 3 significant digits: enough to tell 1.0x from 1000x, small in JSON. */
const sig3 = (x: number): number => Number(x.toPrecision(3));
const frac3 = (x: number): number => Math.round(x * 1000) / 1000;

/** The lower median of the used contributions' norms (null when none was used). */
export function medianUsedNorm(judgments: readonly RankJudgment[]): number | null {
  const norms = judgments.filter((j) => j.status === 'used' && j.norm !== null && Number.isFinite(j.norm)).map((j) => j.norm!);
  if (norms.length === 0) return null;
  norms.sort((a, b) => a - b);
  return norms[Math.floor((norms.length - 1) / 2)]!;
}

/** `report`'s judgments made small. */
export function judgedOf(report: Pick<AggregationReport, 'step' | 'kind' | 'used' | 'judgments'>, of: ContributionOf): AggregationJudged {
  const median = medianUsedNorm(report.judgments);
  const ranks = report.judgments.slice(0, MAX_REPORTED_RANKS).map((j): RankContribution => {
    const ratio = j.status !== 'used' || j.norm === null || median === null ? null : median > 0 ? j.norm / median : j.norm === 0 ? 1 : null;
    return {
      rank: j.rank,
      status: j.status,
      normRatio: ratio === null || !Number.isFinite(ratio) ? null : sig3(ratio),
      trimmed: frac3(j.trimmed),
      // An attacker's scale is tiny (1e-3 for a gradient 1000x the median): significant digits, not decimals.
      clipScale: sig3(j.clipScale),
      ...(j.reason ? { reason: j.reason.length > MAX_REASON_CHARS ? `${j.reason.slice(0, MAX_REASON_CHARS - 1)}…` : j.reason } : {}),
    };
  });
  return { step: report.step, of, kind: report.kind, used: report.used, ranks };
}

/**
 * Hands each aggregation report out once: DDP's and DiLoCo's `lastAggregation` keep the last one
 * until the next, and the runner looks at them after every step.
 */
export class JudgmentWatch {
  private readonly seen = new WeakSet<AggregationReport>();

  /** `report` made small if it was not handed out before; null otherwise (or for none). */
  take(report: AggregationReport | null | undefined, of: ContributionOf): AggregationJudged | null {
    if (!report || this.seen.has(report)) return null;
    this.seen.add(report);
    return judgedOf(report, of);
  }

  /** Marks `report` as handed out without handing it out (one from a round that failed). */
  pass(report: AggregationReport | null | undefined): void {
    if (report) this.seen.add(report);
  }
}

// ---------------------------------------------------------------- over a round

/** One rank's contributions over the aggregations of a round. */
export interface RankTally {
  rank: number;
  /** Aggregations it was judged in (any status). */
  steps: number;
  used: number;
  /** Refused: a NaN or an infinity in its contribution. */
  refused: number;
  /** Absent: it had no samples (no contribution). */
  absent: number;
  /** Aggregations where it was the one cut most: the largest trimmed fraction (above 0), or the smallest clip scale (below 1), of those used. */
  cutMost: number;
  /** Sum and count of its norm ratios (used, with a median), and the last one (null: not used last time). */
  normRatioSum: number;
  normRatios: number;
  lastNormRatio: number | null;
  /** Sums over the aggregations it was used in. */
  trimmedSum: number;
  clipScaleSum: number;
  /** The last refusal's reason. */
  lastReason: string | null;
}

/** A round's aggregations, rank by rank (ranks are renumbered in a new round: its tally starts afresh). */
export interface ContributionTally {
  round: string;
  of: ContributionOf;
  kind: AggregationKind;
  aggregations: number;
  firstStep: number;
  lastStep: number;
  ranks: readonly RankTally[];
}

function emptyRank(rank: number): RankTally {
  return {
    rank,
    steps: 0,
    used: 0,
    refused: 0,
    absent: 0,
    cutMost: 0,
    normRatioSum: 0,
    normRatios: 0,
    lastNormRatio: null,
    trimmedSum: 0,
    clipScaleSum: 0,
    lastReason: null,
  };
}

/** The ranks cut most in `e`: the largest trimmed fraction above 0, or the smallest clip scale below 1, among those used. */
function cutMostRanks(e: AggregationJudged): Set<number> {
  const used = e.ranks.filter((r) => r.status === 'used');
  const maxTrim = Math.max(0, ...used.map((r) => r.trimmed));
  const minClip = Math.min(1, ...used.map((r) => r.clipScale));
  return new Set(used.filter((r) => (maxTrim > 0 && r.trimmed === maxTrim) || (minClip < 1 && r.clipScale === minClip)).map((r) => r.rank));
}

function addRank(t: RankTally, c: RankContribution, cutMost: boolean): RankTally {
  const used = c.status === 'used';
  return {
    rank: t.rank,
    steps: t.steps + 1,
    used: t.used + (used ? 1 : 0),
    refused: t.refused + (c.status === 'refused' ? 1 : 0),
    absent: t.absent + (c.status === 'absent' ? 1 : 0),
    cutMost: t.cutMost + (cutMost ? 1 : 0),
    normRatioSum: t.normRatioSum + (c.normRatio ?? 0),
    normRatios: t.normRatios + (c.normRatio === null ? 0 : 1),
    lastNormRatio: c.normRatio,
    trimmedSum: t.trimmedSum + (used ? c.trimmed : 0),
    clipScaleSum: t.clipScaleSum + (used ? c.clipScale : 0),
    lastReason: c.status === 'refused' ? (c.reason ?? 'non-finite') : t.lastReason,
  };
}

/** `prev` with the aggregation `e` of `round` added (a new tally for a new round). Pure: `prev` is left as it was. */
export function tallyContributions(prev: ContributionTally | null, e: AggregationJudged & { round: string }): ContributionTally {
  const base = prev !== null && prev.round === e.round ? prev : null;
  const cut = cutMostRanks(e);
  const byRank = new Map((base?.ranks ?? []).map((r) => [r.rank, r]));
  for (const c of e.ranks) byRank.set(c.rank, addRank(byRank.get(c.rank) ?? emptyRank(c.rank), c, cut.has(c.rank)));
  return {
    round: e.round,
    of: e.of,
    kind: e.kind,
    aggregations: (base?.aggregations ?? 0) + 1,
    firstStep: base ? Math.min(base.firstStep, e.step) : e.step,
    lastStep: base ? Math.max(base.lastStep, e.step) : e.step,
    ranks: [...byRank.values()].sort((a, b) => a.rank - b.rank),
  };
}

/** Its mean norm ratio, trimmed fraction and clip scale (null when it was never used). */
export function rankMeans(t: RankTally): { normRatio: number | null; trimmed: number | null; clipScale: number | null } {
  return {
    normRatio: t.normRatios > 0 ? t.normRatioSum / t.normRatios : null,
    trimmed: t.used > 0 ? t.trimmedSum / t.used : null,
    clipScale: t.used > 0 ? t.clipScaleSum / t.used : null,
  };
}

/** A run's result (the launcher's summary): the aggregation and, per rank, its refusals, absences and means. */
export interface ContributionSummary {
  kind: AggregationKind;
  of: ContributionOf;
  /** Aggregations counted (of the last round), and the steps they span. */
  aggregations: number;
  fromStep: number;
  toStep: number;
  ranks: Array<{
    rank: number;
    refusedSteps: number;
    absentSteps: number;
    cutMostSteps: number;
    meanNormRatio: number | null;
    meanTrimmed: number | null;
    meanClipScale: number | null;
  }>;
}

export function summarizeContributions(t: ContributionTally): ContributionSummary {
  const r = (x: number | null) => (x === null ? null : sig3(x));
  return {
    kind: t.kind,
    of: t.of,
    aggregations: t.aggregations,
    fromStep: t.firstStep,
    toStep: t.lastStep,
    ranks: t.ranks.map((x) => {
      const m = rankMeans(x);
      return {
        rank: x.rank,
        refusedSteps: x.refused,
        absentSteps: x.absent,
        cutMostSteps: x.cutMost,
        meanNormRatio: r(m.normRatio),
        meanTrimmed: m.trimmed === null ? null : frac3(m.trimmed),
        meanClipScale: r(m.clipScale),
      };
    }),
  };
}
