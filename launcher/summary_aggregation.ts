/**
 * Robust aggregation in a training run's summary: the kind and, per rank, what the group judged
 * of its contributions (the page's result `aggregation`: src/parallel/ddp/contributions.ts). Every rank
 * judges alike, so one rank's result says it for all: the one that counted the most aggregations
 * (a rank that joined late, or a last round that started afresh, counted fewer).
 */
import type { ContributionSummary } from '../src/parallel/ddp/contributions.ts';
import { count, finite, record, type RankResult } from './summary_fields.ts';

const KINDS = new Set(['trimmed-mean', 'median', 'centered-clip', 'mean']);
const OF = new Set(['gradients', 'pseudo-gradients']);
/** The most ranks a summary lists (the job's largest world). */
const MAX_RANKS = 64;

type RankRow = ContributionSummary['ranks'][number];

/** A result's `aggregation`, checked field by field (a page's result is its own to fill); null when it is not one. */
function contributionSummary(v: unknown): ContributionSummary | null {
  const a = record(v);
  if (
    !a ||
    typeof a.kind !== 'string' ||
    !KINDS.has(a.kind) ||
    typeof a.of !== 'string' ||
    !OF.has(a.of) ||
    count(a.aggregations) === null ||
    !Array.isArray(a.ranks)
  )
    return null;
  const ranks = a.ranks.slice(0, MAX_RANKS).flatMap((x): RankRow[] => {
    const r = record(x);
    if (!r || count(r.rank) === null) return [];
    return [
      {
        rank: r.rank as number,
        refusedSteps: count(r.refusedSteps) ?? 0,
        absentSteps: count(r.absentSteps) ?? 0,
        cutMostSteps: count(r.cutMostSteps) ?? 0,
        meanNormRatio: finite(r.meanNormRatio),
        meanTrimmed: finite(r.meanTrimmed),
        meanClipScale: finite(r.meanClipScale),
      },
    ];
  });
  return {
    kind: a.kind as ContributionSummary['kind'],
    of: a.of as ContributionSummary['of'],
    aggregations: a.aggregations as number,
    fromStep: count(a.fromStep) ?? 0,
    toStep: count(a.toStep) ?? 0,
    ranks,
  };
}

/** `{ aggregation }` when the ranks aggregated robustly (their results say so); empty otherwise. */
export function aggregationSummary(ranks: readonly RankResult[]): { aggregation?: ContributionSummary } {
  let best: ContributionSummary | null = null;
  for (const r of ranks) {
    const s = contributionSummary(r.aggregation);
    if (s && (!best || s.aggregations > best.aggregations)) best = s;
  }
  return best ? { aggregation: best } : {};
}
