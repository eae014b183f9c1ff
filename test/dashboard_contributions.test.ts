/**
 * The dashboard's "Contribution" column for robust runs, replayed through its pure reducer as
 * dashboard_state.test.ts does: 'aggregation' events add up per rank (refused, absent, cut most,
 * norm against the group's median, trimmed share, clip scale), the cell's text, its warning and
 * its words; nothing for a run under the mean; a new group starts afresh. And the page's side:
 * the tracker that adds the same events up for the run's result (client/train/contributions.ts).
 */
import { describe, expect, it } from 'vitest';
import type { TrainConfig, TrainEvent } from '../client/train/events.ts';
import { initialDashboardState, reduceDashboard, type DashboardEvent, type DashboardState } from '../client/ui/dashboard_state.ts';
import { contributionCells, fmtRatio, showsContributions } from '../client/ui/dashboard_contrib.ts';
import { contributionTracker } from '../client/train/contributions.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import type { RankContribution } from '../src/parallel/ddp/contributions.ts';
import { parseTrainConfig } from '../src/jobs/train_config.ts';

const T0 = Date.UTC(2024, 0, 1, 12, 0, 0);

function replay(events: DashboardEvent[], from: DashboardState = initialDashboardState({ session: 's', at: T0 })): DashboardState {
  let s = from;
  let at = T0 + 1000;
  for (const event of events) {
    s = reduceDashboard(s, { at, event });
    at += 1000;
  }
  return s;
}

const config = (aggregation: string): TrainConfig => {
  const params = new URLSearchParams({ min: '3', max: '3', aggregation });
  return parseTrainConfig((name) => params.get(name));
};
const joined = (rank: number, worldSize = 3): TrainEvent => ({ type: 'joined', rank, worldSize, backend: 'cpu', adapter: null });
const used = (rank: number, normRatio: number, trimmed: number, clipScale = 1): RankContribution => ({
  rank,
  status: 'used',
  normRatio,
  trimmed,
  clipScale,
});
const refused = (rank: number): RankContribution => ({
  rank,
  status: 'refused',
  normRatio: null,
  trimmed: 0,
  clipScale: 1,
  reason: 'a NaN at index 12',
});
const absent = (rank: number): RankContribution => ({
  rank,
  status: 'absent',
  normRatio: null,
  trimmed: 0,
  clipScale: 1,
  reason: 'no samples',
});

function aggregation(
  step: number,
  ranks: RankContribution[],
  kind: 'trimmed-mean' | 'centered-clip' | 'median' = 'trimmed-mean',
  round = 'i.1',
): TrainEvent {
  return { type: 'aggregation', round, step, of: 'gradients', kind, used: ranks.filter((r) => r.status === 'used').length, ranks };
}

/** 3 ranks under a trimmed mean: rank 2 scales its gradient by 1000, rank 1 sends a NaN at step 2 and has no samples at step 3. */
const robustRun = (): DashboardState =>
  replay([
    { type: 'config', config: config('trimmed-mean:1') },
    joined(0),
    aggregation(1, [used(0, 1, 0.5), used(1, 0.9, 0.48), used(2, 1000, 1)]),
    aggregation(2, [used(0, 1, 0.5), refused(1), used(2, 1000, 1)]),
    aggregation(3, [used(0, 1, 0.24), absent(1), used(2, 1000, 0.76)]),
  ]);

describe('the Contribution column', () => {
  it('adds up each rank over the aggregations', () => {
    const t = robustRun().contributions!;
    expect(t).toMatchObject({ kind: 'trimmed-mean', of: 'gradients', aggregations: 3, firstStep: 1, lastStep: 3 });
    expect(t.ranks.map((r) => [r.rank, r.used, r.refused, r.absent, r.cutMost, r.lastNormRatio])).toEqual([
      [0, 3, 0, 0, 0, 1],
      [1, 1, 1, 1, 0, null],
      [2, 3, 0, 0, 3, 1000],
    ]);
  });

  it("says each rank's last norm against the group's median, its mean trimmed share and its refusals; warns where the norm is far off or it was refused", () => {
    const cells = contributionCells(robustRun());
    expect([0, 1, 2].map((r) => [cells.get(r)!.text, cells.get(r)!.warn])).toEqual([
      ['norm 1.0× · trimmed 41% · refused 0', false],
      ['norm – · trimmed 48% · refused 1 · absent 1', true],
      ['norm 1,000× · trimmed 92% · refused 0', true],
    ]);
    expect(cells.get(2)!.title).toBe(
      [
        "Rank 2's gradient over 3 aggregated steps of this group (trimmed-mean).",
        "Its last one was 1,000× the median size (L2 norm) of the group's; 1,000× on average. Far from 1× (above 10× or below 1/10) is suspect.",
        'On average 92% of its values were trimmed (cut as among the largest or smallest).',
        'It was the rank cut most in 3 steps.',
        'Refused 0 times (a NaN or an infinity); absent 0 times (no samples).',
      ].join('\n'),
    );
    expect(cells.get(1)!.title).toContain('Refused 1 time (a NaN or an infinity), last: a NaN at index 12; absent 1 time (no samples).');
  });

  it('centered clipping shows the mean clip scale; the median the share not selected', () => {
    const clip = contributionCells(
      replay([
        { type: 'config', config: config('centered-clip') },
        aggregation(1, [used(0, 1, 0, 1), used(1, 1.2, 0, 1), used(2, 1000, 0, 0.0012)], 'centered-clip'),
      ]),
    );
    expect(clip.get(2)!.text).toBe('norm 1,000× · clip ×0.0012 · refused 0');
    expect(clip.get(1)!.text).toBe('norm 1.2× · clip ×1 · refused 0');
    expect(clip.get(2)!.title).toContain('It was the rank clipped most in 1 step.');
    const median = contributionCells(replay([aggregation(1, [used(0, 1, 0.6), used(1, 0.05, 0.7)], 'median')]));
    expect([median.get(0)!.text, median.get(1)!.text, median.get(1)!.warn]).toEqual([
      'norm 1.0× · unselected 60% · refused 0',
      'norm 0.05× · unselected 70% · refused 0',
      true,
    ]);
  });

  it('is shown only when the session aggregates robustly; a new group starts afresh', () => {
    const mean = replay([{ type: 'config', config: config('mean') }, joined(0)]);
    expect(showsContributions(mean)).toBe(false);
    expect(contributionCells(mean).size).toBe(0);
    const robust = robustRun();
    expect(showsContributions(robust)).toBe(true);
    const regrouped = replay([joined(1, 2)], robust);
    expect(regrouped.contributions).toBeNull();
    expect(showsContributions(regrouped)).toBe(true);
    // A late event of another round does not mix with this one's.
    const next = replay([aggregation(9, [used(0, 1, 0), used(1, 1, 0)], 'trimmed-mean', 'i.2')], robust);
    expect(next.contributions).toMatchObject({ round: 'i.2', aggregations: 1 });
  });

  it('reads ratios as a person would', () => {
    expect([fmtRatio(1), fmtRatio(0.96), fmtRatio(12.4), fmtRatio(12345), fmtRatio(0.012), fmtRatio(null)]).toEqual([
      '1.0×',
      '1.0×',
      '12×',
      '12,345×',
      '0.012×',
      '–',
    ]);
  });
});

describe("the page's result", () => {
  it('adds up the aggregation events on their way to the dashboard, and says them in the result', () => {
    const passed: ElasticEvent[] = [];
    const tracker = contributionTracker((e) => passed.push(e));
    expect(tracker.result()).toEqual({});
    const e: ElasticEvent = {
      type: 'aggregation',
      round: 'i.1',
      rank: 0,
      step: 1,
      of: 'pseudo-gradients',
      kind: 'median',
      used: 2,
      ranks: [used(0, 1, 0.5), used(1, 30, 0.5)],
    };
    tracker.onEvent(e);
    tracker.onEvent({ type: 'paused', min: 2 });
    expect(passed).toEqual([e, { type: 'paused', min: 2 }]);
    expect(tracker.result().aggregation).toEqual({
      kind: 'median',
      of: 'pseudo-gradients',
      aggregations: 1,
      fromStep: 1,
      toStep: 1,
      ranks: [
        { rank: 0, refusedSteps: 0, absentSteps: 0, cutMostSteps: 1, meanNormRatio: 1, meanTrimmed: 0.5, meanClipScale: 1 },
        { rank: 1, refusedSteps: 0, absentSteps: 0, cutMostSteps: 1, meanNormRatio: 30, meanTrimmed: 0.5, meanClipScale: 1 },
      ],
    });
  });
});
