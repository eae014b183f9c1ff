/**
 * What a robust aggregation's judgments become on their way to the host (src/parallel/ddp/contributions.ts):
 * the compact event (norm against the median of the used ones, rounded, reasons capped, at most 64
 * ranks), handed out once per report; the round's tally (refused, absent, cut most, means; a new
 * round starts afresh); the result's summary, and the launcher's `aggregation` (launcher/summary_aggregation.ts).
 */
import { describe, expect, it } from 'vitest';
import type { RankJudgment } from '../src/parallel/robust/aggregators.ts';
import type { AggregationReport } from '../src/parallel/robust/reducer.ts';
import {
  JudgmentWatch,
  MAX_REPORTED_RANKS,
  judgedOf,
  medianUsedNorm,
  summarizeContributions,
  tallyContributions,
  type AggregationJudged,
  type ContributionTally,
} from '../src/parallel/ddp/contributions.ts';
import { summarize } from '../launcher/summaries.ts';

const used = (rank: number, norm: number, trimmed = 0, clipScale = 1): RankJudgment => ({
  rank,
  status: 'used',
  norm,
  distance: norm,
  trimmed,
  clipScale,
});
const refused = (rank: number, reason = 'a NaN at index 3'): RankJudgment => ({
  rank,
  status: 'refused',
  norm: null,
  distance: null,
  trimmed: 0,
  clipScale: 1,
  reason,
  nonfiniteIndex: 3,
});
const absent = (rank: number): RankJudgment => ({
  rank,
  status: 'absent',
  norm: null,
  distance: null,
  trimmed: 0,
  clipScale: 1,
  reason: 'no samples',
});

function report(step: number, judgments: RankJudgment[], kind: AggregationReport['kind'] = 'trimmed-mean'): AggregationReport {
  return {
    kind,
    step,
    judgments,
    used: judgments.filter((j) => j.status === 'used').length,
    values: new Float32Array(4),
    trim: 1,
    tau: 0,
    digests: [],
  };
}

describe('the event: one aggregation made small', () => {
  it('gives each norm against the lower median of the used ones, rounded to 3 significant digits; fractions to 3 decimals', () => {
    const e = judgedOf(report(7, [used(0, 2), used(1, 3), used(2, 2000.123456, 0.987654), refused(3), absent(4)]), 'gradients');
    expect(e).toEqual({
      step: 7,
      of: 'gradients',
      kind: 'trimmed-mean',
      used: 3,
      ranks: [
        { rank: 0, status: 'used', normRatio: 0.667, trimmed: 0, clipScale: 1 },
        { rank: 1, status: 'used', normRatio: 1, trimmed: 0, clipScale: 1 },
        { rank: 2, status: 'used', normRatio: 667, trimmed: 0.988, clipScale: 1 },
        { rank: 3, status: 'refused', normRatio: null, trimmed: 0, clipScale: 1, reason: 'a NaN at index 3' },
        { rank: 4, status: 'absent', normRatio: null, trimmed: 0, clipScale: 1, reason: 'no samples' },
      ],
    });
    // torch.median's lower median for an even count; none without a used contribution.
    expect(medianUsedNorm([used(0, 4), used(1, 1), used(2, 3), used(3, 2)])).toBe(2);
    expect(medianUsedNorm([refused(0), absent(1)])).toBeNull();
  });

  it('stays small: at most 64 ranks, reasons capped; a zero median gives no ratio but for a zero norm', () => {
    const many = judgedOf(
      report(
        1,
        Array.from({ length: 100 }, (_, r) => used(r, 1)),
      ),
      'gradients',
    );
    expect(many.ranks).toHaveLength(MAX_REPORTED_RANKS);
    const long = judgedOf(report(1, [used(0, 1), refused(1, 'x'.repeat(1000))]), 'gradients');
    expect(long.ranks[1]!.reason!.length).toBe(120);
    const zeros = judgedOf(report(1, [used(0, 0), used(1, 0), used(2, 5)]), 'gradients');
    expect(zeros.ranks.map((r) => r.normRatio)).toEqual([1, 1, null]);
  });

  it('hands each report out once (DDP and DiLoCo keep their last one until the next); a passed one never', () => {
    const watch = new JudgmentWatch();
    const a = report(1, [used(0, 1)]);
    expect(watch.take(a, 'gradients')?.step).toBe(1);
    expect(watch.take(a, 'gradients')).toBeNull();
    expect(watch.take(null, 'gradients')).toBeNull();
    const stale = report(2, [used(0, 1)]);
    watch.pass(stale);
    expect(watch.take(stale, 'pseudo-gradients')).toBeNull();
  });
});

const event = (
  round: string,
  step: number,
  judgments: RankJudgment[],
  kind: AggregationReport['kind'] = 'trimmed-mean',
): AggregationJudged & { round: string } => ({ round, ...judgedOf(report(step, judgments, kind), 'gradients') });

describe('the tally over a round, and the summary in the result', () => {
  const steps = [
    event('i.1', 1, [used(0, 1, 0.5), used(1, 1, 0.5), used(2, 1000, 1)]),
    event('i.1', 2, [used(0, 1, 0.5), refused(1), used(2, 1000, 1)]),
    event('i.1', 3, [used(0, 1, 0.5), absent(1), used(2, 500, 0.9)]),
  ];
  const tally = steps.reduce<ContributionTally | null>((t, e) => tallyContributions(t, e), null)!;

  it('counts refusals, absences and the steps a rank was cut most; means over the steps it was used', () => {
    expect(tally).toMatchObject({ round: 'i.1', of: 'gradients', kind: 'trimmed-mean', aggregations: 3, firstStep: 1, lastStep: 3 });
    expect(tally.ranks.map((r) => [r.rank, r.steps, r.used, r.refused, r.absent, r.cutMost, r.lastNormRatio, r.lastReason])).toEqual([
      [0, 3, 3, 0, 0, 0, 1, null],
      [1, 3, 1, 1, 1, 0, null, 'a NaN at index 3'],
      [2, 3, 3, 0, 0, 3, 500, null],
    ]);
    expect(summarizeContributions(tally)).toEqual({
      kind: 'trimmed-mean',
      of: 'gradients',
      aggregations: 3,
      fromStep: 1,
      toStep: 3,
      ranks: [
        { rank: 0, refusedSteps: 0, absentSteps: 0, cutMostSteps: 0, meanNormRatio: 1, meanTrimmed: 0.5, meanClipScale: 1 },
        { rank: 1, refusedSteps: 1, absentSteps: 1, cutMostSteps: 0, meanNormRatio: 1, meanTrimmed: 0.5, meanClipScale: 1 },
        // Steps 1 and 2: 1000x the median (an honest norm); step 3: 500x.
        { rank: 2, refusedSteps: 0, absentSteps: 0, cutMostSteps: 3, meanNormRatio: 833, meanTrimmed: 0.967, meanClipScale: 1 },
      ],
    });
  });

  it('leaves the tally it adds to as it was, and starts afresh in a new round (its ranks are other tabs)', () => {
    const before = JSON.stringify(tally);
    const next = tallyContributions(tally, event('i.2', 4, [used(0, 1), used(1, 1)]));
    expect(JSON.stringify(tally)).toBe(before);
    expect(next).toMatchObject({ round: 'i.2', aggregations: 1, firstStep: 4, lastStep: 4 });
    expect(next.ranks.map((r) => r.steps)).toEqual([1, 1]);
  });

  it('centered clipping: the rank with the smallest clip scale below 1 is the one clipped most', () => {
    const t = tallyContributions(null, event('i.1', 1, [used(0, 1, 0, 1), used(1, 1, 0, 0.8), used(2, 900, 0, 0.001)], 'centered-clip'));
    expect(t.ranks.map((r) => r.cutMost)).toEqual([0, 0, 1]);
  });

  it("the launcher's summary takes the result that counted the most aggregations, checked field by field", () => {
    const full = summarizeContributions(tally);
    const late = summarizeContributions(tallyContributions(null, steps[2]!));
    const rank = (r: number, aggregation: unknown) => ({ rank: r, worldSize: 3, weightHash: 'h', seconds: 1, aggregation });
    const s = summarize('train', 3, [rank(0, late), rank(1, full), rank(2, { kind: 'bogus', ranks: [] })]);
    expect(s.aggregation).toEqual(full);
    // A run under the mean has none.
    expect(summarize('train', 3, [rank(0, undefined)])).not.toHaveProperty('aggregation');
  });
});
