/**
 * The fleet table's "Contribution" column (robust aggregation only): what the group judged of
 * each rank's gradients (or DiLoCo's pseudo-gradients) over the current round, from the tally in
 * the state (src/parallel/ddp/contributions.ts). A short text per rank, a warning when the rank's norm
 * is far from the group's or it was refused, and a title that says the figures in words.
 */
import { rankMeans, type ContributionTally, type RankTally } from '../../src/parallel/ddp/contributions.ts';
import type { DashboardState } from './dashboard_types.ts';
import { plural } from './dashboard_format.ts';
import { fmtInt, fmtNumber, fmtPercent } from './format.ts';

/** A norm this many times the group's median (or this many times smaller) is "far": a scaled or a vanishing contribution. */
export const FAR_NORM_RATIO = 10;

export interface ContributionCell {
  /** "norm 1.0× · trimmed 12% · refused 0" */
  text: string;
  /** Its norm is far from the group's median, or it was refused at least once. */
  warn: boolean;
  /** The figures in words (the cell's hover text). */
  title: string;
}

/** Whether the session aggregates robustly: its job says so, or the run reported a robust aggregation. */
export function showsContributions(s: DashboardState): boolean {
  const kind = s.config?.aggregation?.kind;
  return (kind !== undefined && kind !== 'mean') || s.contributions !== null;
}

/** "1.0×", "1,000×", "0.05×"; "–" when unknown. */
export function fmtRatio(x: number | null): string {
  if (x === null || !Number.isFinite(x)) return '–';
  if (x >= FAR_NORM_RATIO) return `${fmtInt(x)}×`;
  if (x >= 0.1) return `${x.toFixed(1)}×`;
  return `${fmtNumber(x, 3)}×`;
}

const far = (x: number | null) => x !== null && (x > FAR_NORM_RATIO || x < 1 / FAR_NORM_RATIO);

/** The cell of each rank the tally knows, by rank; empty before the first aggregation. */
export function contributionCells(s: DashboardState): ReadonlyMap<number, ContributionCell> {
  const t = s.contributions;
  const cells = new Map<number, ContributionCell>();
  if (!t) return cells;
  for (const r of t.ranks) cells.set(r.rank, contributionCell(t, r));
  return cells;
}

/** "1", "0.35", "0.0012": a clip scale (0..1] as a factor. */
export function fmtScale(x: number): string {
  if (x >= 1) return '1';
  return x >= 0.01 ? x.toFixed(2) : String(Number(x.toPrecision(2)));
}

/** What the kind cuts, as the cell says it: the trimmed fraction, the share not selected, or the clip scale. */
function cutText(kind: ContributionTally['kind'], m: ReturnType<typeof rankMeans>): string {
  if (kind === 'centered-clip') return `clip ${m.clipScale === null ? '–' : `×${fmtScale(m.clipScale)}`}`;
  const label = kind === 'median' ? 'unselected' : 'trimmed';
  return `${label} ${m.trimmed === null ? '–' : fmtPercent(m.trimmed, 0)}`;
}

export function contributionCell(t: ContributionTally, r: RankTally): ContributionCell {
  const m = rankMeans(r);
  const text = [
    `norm ${fmtRatio(r.lastNormRatio)}`,
    cutText(t.kind, m),
    `refused ${r.refused}`,
    ...(r.absent > 0 ? [`absent ${r.absent}`] : []),
  ].join(' · ');
  return { text, warn: r.refused > 0 || far(r.lastNormRatio) || far(m.normRatio), title: contributionTitle(t, r, m) };
}

/** The figures in words, for a person who has not read the aggregators' paper. */
function contributionTitle(t: ContributionTally, r: RankTally, m: ReturnType<typeof rankMeans>): string {
  const what = t.of === 'gradients' ? 'gradient' : 'pseudo-gradient (DiLoCo)';
  const steps = plural(t.aggregations, t.of === 'gradients' ? 'aggregated step' : 'outer step');
  const lines = [`Rank ${r.rank}'s ${what} over ${steps} of this group (${t.kind}).`];
  lines.push(
    r.lastNormRatio === null
      ? 'Its last one did not enter the aggregate.'
      : `Its last one was ${fmtRatio(r.lastNormRatio)} the median size (L2 norm) of the group's${m.normRatio === null ? '' : `; ${fmtRatio(m.normRatio)} on average`}. Far from 1× (above ${FAR_NORM_RATIO}× or below 1/${FAR_NORM_RATIO}) is suspect.`,
  );
  if (t.kind === 'centered-clip') {
    lines.push(
      m.clipScale === null
        ? 'It was never used.'
        : `Its difference from the group's aggregate was scaled by ${fmtScale(m.clipScale)} on average (1: not clipped).`,
    );
  } else if (m.trimmed !== null) {
    const cut = t.kind === 'median' ? 'were not the median chosen' : 'were trimmed (cut as among the largest or smallest)';
    lines.push(`On average ${fmtPercent(m.trimmed, 0)} of its values ${cut}.`);
  }
  if (r.cutMost > 0) lines.push(`It was the rank ${t.kind === 'centered-clip' ? 'clipped' : 'cut'} most in ${plural(r.cutMost, 'step')}.`);
  lines.push(
    `Refused ${plural(r.refused, 'time')} (a NaN or an infinity)${r.lastReason ? `, last: ${r.lastReason}` : ''}; absent ${plural(r.absent, 'time')} (no samples).`,
  );
  return lines.join('\n');
}
