/**
 * Per-step metric charts on uPlot: one faint raw line and one smoothed line per rank (the
 * TensorBoard look; a large group as this tab, the mean and the range: chart_lines.ts), plus
 * test-set points from 'eval' events. The data lives in a StepTable that
 * both charts share; a chart only turns columns into uPlot's aligned arrays when it redraws.
 */
// Before uPlot, which reads navigator.language when it loads.
import './locale_guard.ts';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { aggregateColumn, chartLines, linesKey, type ChartLine } from './chart_lines.ts';
import { fmtPercent } from './format.ts';

type Cell = number | null;

/** Columns of values keyed by step, kept sorted by step so uPlot can use them directly. */
export class StepTable {
  readonly x: number[] = [];
  private readonly cols = new Map<string, Cell[]>();
  private readonly rowOf = new Map<number, number>();
  /** Non-null cells per column, kept as values are set (the test hooks read it on every step). */
  private readonly counts = new Map<string, number>();

  /** The row for `step`, inserted in order (steps normally arrive in order, so this appends). */
  private row(step: number): number {
    const existing = this.rowOf.get(step);
    if (existing !== undefined) return existing;
    let at = this.x.length;
    if (at > 0 && this.x[at - 1]! > step) {
      at = this.x.findIndex((s) => s > step);
      this.x.splice(at, 0, step);
      for (const c of this.cols.values()) c.splice(at, 0, null);
      this.rowOf.clear();
      this.x.forEach((s, i) => {
        this.rowOf.set(s, i);
      });
      return at;
    }
    this.x.push(step);
    for (const c of this.cols.values()) c.push(null);
    this.rowOf.set(step, at);
    return at;
  }

  /** null (a rank without samples that step) or a non-finite value: no point, a gap in the line. */
  set(column: string, step: number, value: number | null): void {
    const i = this.row(step);
    const col = this.col(column);
    const next = value !== null && Number.isFinite(value) ? value : null;
    const delta = (next === null ? 0 : 1) - (col[i] === null ? 0 : 1);
    if (delta) this.counts.set(column, (this.counts.get(column) ?? 0) + delta);
    col[i] = next;
  }

  col(name: string): Cell[] {
    let c = this.cols.get(name);
    if (!c) {
      c = new Array<Cell>(this.x.length).fill(null);
      this.cols.set(name, c);
    }
    return c;
  }

  count(name: string): number {
    return this.counts.get(name) ?? 0;
  }
}

/** TensorBoard's debiased exponential moving average; nulls stay gaps. */
function smooth(values: Cell[], weight: number): Cell[] {
  if (weight <= 0) return values;
  const out: Cell[] = new Array<Cell>(values.length);
  let last = 0;
  let n = 0;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v === null || v === undefined) {
      out[i] = null;
      continue;
    }
    last = last * weight + (1 - weight) * v;
    n++;
    out[i] = last / (1 - weight ** n);
  }
  return out;
}

/** uPlot's points filter: the values with no value on either side, which a line without spanGaps does not draw. */
function isolatedPoints(u: uPlot, seriesIdx: number): number[] | null {
  const ys = u.data[seriesIdx] ?? [];
  const out: number[] = [];
  for (let i = 0; i < ys.length; i++) if (ys[i] != null && ys[i - 1] == null && ys[i + 1] == null) out.push(i);
  return out.length > 0 ? out : null;
}

function showLatestInLegend(u: uPlot): void {
  const n = u.data[0].length;
  if (n > 0 && (u.cursor.idx === null || u.cursor.idx === undefined)) u.setLegend({ idx: n - 1 });
}

export interface MetricChartSpec {
  /** Column prefix: `${prefix}:${rank}` per rank. */
  prefix: string;
  /** Column holding eval points, and its legend label. */
  evalColumn: string;
  evalLabel: string;
  yLabel: string;
  percent: boolean;
}

const HEIGHT_WIDE = 260;
const HEIGHT_NARROW = 210;

export class MetricChart {
  private plot: uPlot | null = null;
  private linesKey = '';
  private log = false;
  private readonly observer: ResizeObserver;

  constructor(
    private readonly host: HTMLElement,
    private readonly spec: MetricChartSpec,
  ) {
    // Keep the canvas as wide as its card, whatever the layout does (grid reflow, narrow phones).
    this.observer = new ResizeObserver(() => this.fit());
    this.observer.observe(host);
  }

  private size(): { width: number; height: number } {
    const width = Math.max(160, Math.floor(this.host.clientWidth));
    return { width, height: width < 480 ? HEIGHT_NARROW : HEIGHT_WIDE };
  }

  private fit(): void {
    if (!this.plot) return;
    const s = this.size();
    if (s.width !== this.plot.width || s.height !== this.plot.height) this.plot.setSize(s);
  }

  /** Redraw from the table; rebuilds the uPlot instance only when its lines change (the set of ranks). */
  render(table: StepTable, ranks: number[], selfRank: number | null, smoothing: number): void {
    const lines = chartLines(ranks, selfRank);
    const key = `${linesKey(lines)}|${this.log}`;
    if (!this.plot || key !== this.linesKey) {
      this.plot?.destroy();
      this.linesKey = key;
      this.plot = new uPlot(this.options(lines), this.data(table, ranks, lines, smoothing), this.host);
      showLatestInLegend(this.plot);
      return;
    }
    this.plot.setData(this.data(table, ranks, lines, smoothing));
    showLatestInLegend(this.plot);
  }

  /** Log y axis (for loss over long runs); takes effect at the next render. */
  setLogScale(on: boolean): void {
    this.log = on;
  }

  private data(table: StepTable, ranks: number[], lines: ChartLine[], smoothing: number): uPlot.AlignedData {
    // A log axis cannot show zero or negative values: leave them out rather than break the scale.
    const fix = this.log ? (c: Cell[]) => c.map((v) => (v !== null && v > 0 ? v : null)) : (c: Cell[]) => c;
    const column = (r: number) => table.col(`${this.spec.prefix}:${r}`);
    const raw = lines.map(({ source }) =>
      fix(source.kind === 'rank' ? column(source.rank) : aggregateColumn(ranks.map(column), source.kind)),
    );
    return [table.x, ...raw, ...raw.map((c) => smooth(c, smoothing)), fix(table.col(this.spec.evalColumn))];
  }

  private options(lines: ChartLine[]): uPlot.Options {
    const pct = this.spec.percent;
    const fmt = (v: number | null) => (v === null || v === undefined ? '–' : pct ? fmtPercent(v, 1) : v.toFixed(4));
    const rawSeries: uPlot.Series[] = lines.map((l) => ({
      label: `${l.label} (raw)`,
      class: 'raw-series',
      stroke: `${l.colour}40`,
      width: 1,
      // A step without a value (a rank given no samples) is a gap, not a line across it.
      spanGaps: false,
      points: { show: false },
      value: (_u, v) => fmt(v),
    }));
    const smoothSeries: uPlot.Series[] = lines.map((l) => ({
      label: l.label,
      stroke: l.colour,
      width: l.width,
      ...(l.dash ? { dash: l.dash } : {}),
      // A step without a value (a rank given no samples) is a gap, not a line across it.
      spanGaps: false,
      // A value between two gaps (a rank measured again at one step) draws no line: a dot instead.
      points: { show: false, size: 5, filter: isolatedPoints },
      value: (_u, v) => fmt(v),
    }));
    const evalSeries: uPlot.Series = {
      label: this.spec.evalLabel,
      stroke: '#111827',
      fill: '#ffffff',
      width: 2,
      // Points only: evals are sparse, a line between them would suggest values in between.
      paths: () => null,
      points: { show: true, size: 9, stroke: '#111827', fill: '#ffffff', width: 2 },
      value: (_u, v) => fmt(v),
    };
    const n = lines.length;
    const axisFont = '12px system-ui, sans-serif';
    return {
      ...this.size(),
      scales: {
        x: { time: false },
        y: pct ? { range: [0, 1] } : this.log ? { distr: 3, log: 10 } : { range: (_u, _min, max) => [0, max > 0 ? max * 1.05 : 1] },
      },
      axes: [
        {
          label: 'step',
          font: axisFont,
          labelFont: axisFont,
          stroke: '#374151',
          grid: { stroke: '#e5e7eb' },
          ticks: { stroke: '#d1d5db' },
        },
        {
          label: this.spec.yLabel,
          font: axisFont,
          labelFont: axisFont,
          stroke: '#374151',
          grid: { stroke: '#e5e7eb' },
          ticks: { stroke: '#d1d5db' },
          size: 52,
          // uPlot passes null for splits it filtered out (log axes), despite the number[] type.
          values: (_u, splits) =>
            splits.map((v: number | null) => (v === null ? '' : pct ? `${Math.round(v * 100)}%` : String(Number(v.toPrecision(3))))),
        },
      ],
      series: [{ label: 'step', value: (_u, v) => (v === null ? '–' : String(v)) }, ...rawSeries, ...smoothSeries, evalSeries],
      legend: { live: true },
      cursor: { focus: { prox: 24 } },
      focus: { alpha: 0.35 },
      hooks: {
        // When the pointer is not over the chart, the legend shows the latest values (W&B style).
        setCursor: [(u) => showLatestInLegend(u)],
        // Toggling a line ("rank r", "mean of N ranks") in the legend also toggles its (legend-less) raw line.
        setSeries: [
          (u, idx) => {
            if (idx === null || idx < 1 + n || idx > 2 * n) return;
            const rawIdx = idx - n;
            const show = u.series[idx]!.show ?? true;
            if ((u.series[rawIdx]!.show ?? true) !== show) u.setSeries(rawIdx, { show });
          },
        ],
      },
    };
  }

  destroy(): void {
    this.observer.disconnect();
    this.plot?.destroy();
    this.plot = null;
  }
}
