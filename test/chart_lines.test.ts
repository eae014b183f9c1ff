import { describe, expect, it } from 'vitest';
import { MAX_RANK_LINES, aggregateColumn, chartLines, linesKey } from '../client/ui/chart_lines.ts';

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

describe('chart lines', () => {
  it('draws one line per rank up to MAX_RANK_LINES, this tab heavier', () => {
    const lines = chartLines(range(MAX_RANK_LINES), 3);
    expect(lines.map((l) => l.label)).toEqual(range(MAX_RANK_LINES).map((r) => (r === 3 ? 'rank 3 (this tab)' : `rank ${r}`)));
    expect(lines.every((l) => l.source.kind === 'rank')).toBe(true);
    expect(lines[3]!.width).toBeGreaterThan(lines[0]!.width);
  });

  it('draws a larger group as this tab, its mean and its range: a few series however many ranks', () => {
    for (const n of [MAX_RANK_LINES + 1, 32, 60]) {
      const lines = chartLines(range(n), 5);
      expect(lines.map((l) => l.label)).toEqual(['rank 5 (this tab)', `mean of ${n} ranks`, 'lowest rank', 'highest rank']);
      expect(lines.map((l) => l.source)).toEqual([{ kind: 'rank', rank: 5 }, { kind: 'mean' }, { kind: 'min' }, { kind: 'max' }]);
    }
    // A spectator (no rank of its own) sees the group only.
    expect(chartLines(range(32), null).map((l) => l.source.kind)).toEqual(['mean', 'min', 'max']);
  });

  it('keys the chart by its lines: the same ranks, the same key; a new group size or own rank, a new one', () => {
    expect(linesKey(chartLines(range(32), 1))).toBe(linesKey(chartLines(range(32), 1)));
    expect(linesKey(chartLines(range(32), 1))).not.toBe(linesKey(chartLines(range(31), 1)));
    expect(linesKey(chartLines(range(32), 1))).not.toBe(linesKey(chartLines(range(32), 2)));
    expect(linesKey(chartLines([0, 1], 0))).not.toBe(linesKey(chartLines([0, 2], 0)));
  });

  it('aggregates the ranks at each step, skipping gaps', () => {
    const cols = [
      [1, 2, null, 4],
      [3, null, null, 8],
      [5, 6, null],
    ];
    expect(aggregateColumn(cols, 'mean')).toEqual([3, 4, null, 6]);
    expect(aggregateColumn(cols, 'min')).toEqual([1, 2, null, 4]);
    expect(aggregateColumn(cols, 'max')).toEqual([5, 6, null, 8]);
    expect(aggregateColumn([], 'mean')).toEqual([]);
  });
});
