/**
 * The dashboard's model of a run on each tab's own pictures (dataset local): every tab's accuracy
 * on its own held-out pictures, the group's (the sample-weighted mean), and the pictures each tab
 * holds, as rows the view (view_local.ts) draws. Pure: state in, figures out.
 */
import type { DashboardEvent, DashboardState } from './dashboard_types.ts';
import { logAt } from './dashboard_reducer_util.ts';
import { fmtInt, fmtPercent } from './format.ts';

type LocalEvent = Extract<DashboardEvent, { type: 'local-eval' | 'local-counts' }>;

export function onLocal(state: DashboardState, event: LocalEvent, at: number): DashboardState {
  const local = state.local ?? { evaluation: null, counts: null };
  if (event.type === 'local-counts') return { ...state, local: { ...local, counts: event } };
  const { own, group } = event;
  return logAt(at)(
    { ...state, local: { ...local, evaluation: event } },
    'info',
    `Held-out pictures at step ${event.step}: this tab ${accuracyText(own)}, the group ${accuracyText(group)}.`,
  );
}

/** "80.0% (8 of 10)", or "no test pictures". */
export function accuracyText(a: { correct: number; count: number; accuracy: number | null }): string {
  return a.accuracy === null ? 'no test pictures' : `${fmtPercent(a.accuracy)} (${fmtInt(a.correct)} of ${fmtInt(a.count)})`;
}

export interface LocalRow {
  rank: number;
  self: boolean;
  /** Pictures the tab trains on this epoch (its own count, as it said). */
  pictures: number | null;
  accuracy: string;
}

/** The card's figures: the group's accuracy, this tab's, and a row per tab; null before anything is known. */
export function localFigures(s: DashboardState): { group: string; own: string; step: number | null; rows: LocalRow[] } | null {
  const local = s.local;
  if (!local) return null;
  const ev = local.evaluation;
  const n = Math.max(ev?.ranks.length ?? 0, local.counts?.samples.length ?? 0);
  const rows = Array.from({ length: n }, (_, rank) => {
    const a = ev?.ranks[rank];
    return {
      rank,
      self: rank === s.self,
      pictures: local.counts?.samples[rank] ?? null,
      accuracy: a ? accuracyText(a) : '–',
    };
  });
  return {
    group: ev ? accuracyText(ev.group) : 'after the first evaluation',
    own: ev ? accuracyText(ev.own) : '–',
    step: ev?.step ?? null,
    rows,
  };
}
