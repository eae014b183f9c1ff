/**
 * Which lines a metric chart draws. Up to MAX_RANK_LINES ranks, one per rank. A class's group
 * (32 tabs) is drawn as this tab's line, the group's mean and its lowest and highest rank at each
 * step: 32 lines of loss on a card are unreadable, and a uPlot chart of 64 series with a live
 * legend of 64 rows took several seconds of a tab's time to build and draw on a machine whose
 * cores 32 tabs share (long enough for the tab to be taken for frozen).
 */
import { rankColour } from './dom.ts';

export const MAX_RANK_LINES = 8;

export type LineSource = { kind: 'rank'; rank: number } | { kind: 'mean' | 'min' | 'max' };

export interface ChartLine {
  source: LineSource;
  label: string;
  colour: string;
  width: number;
  dash?: number[];
}

type Cell = number | null;

export function chartLines(ranks: readonly number[], selfRank: number | null): ChartLine[] {
  if (ranks.length <= MAX_RANK_LINES) {
    return ranks.map((r) => ({
      source: { kind: 'rank', rank: r },
      label: r === selfRank ? `rank ${r} (this tab)` : `rank ${r}`,
      colour: rankColour(r),
      // This tab's own line is a little heavier so it can be picked out without relying on colour.
      width: r === selfRank ? 2.5 : 1.75,
    }));
  }
  const lines: ChartLine[] = [
    { source: { kind: 'mean' }, label: `mean of ${ranks.length} ranks`, colour: '#374151', width: 2 },
    { source: { kind: 'min' }, label: 'lowest rank', colour: '#9ca3af', width: 1.25, dash: [4, 4] },
    { source: { kind: 'max' }, label: 'highest rank', colour: '#9ca3af', width: 1.25, dash: [4, 4] },
  ];
  if (selfRank !== null && ranks.includes(selfRank))
    lines.unshift({
      source: { kind: 'rank', rank: selfRank },
      label: `rank ${selfRank} (this tab)`,
      colour: rankColour(selfRank),
      width: 2.5,
    });
  return lines;
}

/** The lines' key (labels are unique and name the rank, this tab and the group's size): a chart is built again only when it changes. */
export function linesKey(lines: readonly ChartLine[]): string {
  return lines.map((l) => l.label).join('|');
}

/** The mean, lowest or highest of the ranks' columns at each row; null where no rank has a value. */
export function aggregateColumn(columns: ReadonlyArray<readonly Cell[]>, kind: 'mean' | 'min' | 'max'): Cell[] {
  const rows = columns.reduce((n, c) => Math.max(n, c.length), 0);
  const out = new Array<Cell>(rows);
  for (let i = 0; i < rows; i++) {
    let n = 0;
    let acc = kind === 'min' ? Infinity : kind === 'max' ? -Infinity : 0;
    for (const c of columns) {
      const v = c[i];
      if (v === null || v === undefined) continue;
      n++;
      acc = kind === 'min' ? Math.min(acc, v) : kind === 'max' ? Math.max(acc, v) : acc + v;
    }
    out[i] = n === 0 ? null : kind === 'mean' ? acc / n : acc;
  }
  return out;
}
