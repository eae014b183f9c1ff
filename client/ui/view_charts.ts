/** The loss and accuracy charts with their smoothing and log-scale controls; the one view that keeps data of its own (the per-step series). */
import type { TrainEvent } from '../train/events.ts';
import { MetricChart, StepTable } from './charts.ts';
import type { DashboardState } from './dashboard_state.ts';
import { el } from './dom.ts';
import { idleNote } from './dashboard_fleet.ts';
import { setText } from './view_dom.ts';
import './styles/panel_charts.css';

/**
 * The loss and accuracy charts with their smoothing and log-scale controls. The per-step series
 * live here, in the charts' StepTable, fed the same step and eval events as the state (see the
 * note in dashboard_state.ts); the cards' test hooks (data-ranks, data-points, data-eval-points)
 * are kept exact on every event, while the canvases redraw on the throttled render.
 */
export class ChartsView {
  readonly node: HTMLElement;
  private readonly table = new StepTable();
  private readonly ranks = new Set<number>();
  private readonly lossCard: HTMLElement;
  private readonly accCard: HTMLElement;
  private readonly lossChart: MetricChart;
  private readonly accChart: MetricChart;
  private smoothing = 0.6;
  /** This tab trained no samples at the last step: why (its line has a gap there). */
  private readonly idle = el('p', { class: 'card-note idle-note', 'data-testid': 'idle-note', role: 'status' });

  constructor(onSettingsChange: () => void) {
    const lossHost = el('div', { class: 'chart-host' });
    const accHost = el('div', { class: 'chart-host' });
    const emptyNote = () => el('p', { class: 'chart-empty' }, 'Waiting for the first step…');
    const logInput = el('input', { id: 'dash-logscale', type: 'checkbox' });
    logInput.addEventListener('change', () => {
      this.lossChart.setLogScale(logInput.checked);
      onSettingsChange();
    });
    const hooks = { 'data-ranks': '', 'data-points': 0, 'data-eval-points': 0 };
    this.lossCard = el(
      'figure',
      { class: 'card chart-card', 'data-testid': 'loss-chart', ...hooks, 'aria-labelledby': 'loss-title' },
      el(
        'figcaption',
        { class: 'chart-head' },
        el(
          'span',
          { id: 'loss-title', class: 'card-title' },
          'Loss per step',
          el('span', { class: 'card-note' }, ' · one line per rank, ● test loss'),
        ),
        el('label', { class: 'check', for: 'dash-logscale' }, logInput, 'Log scale'),
      ),
      lossHost,
      emptyNote(),
    );
    this.accCard = el(
      'figure',
      { class: 'card chart-card', 'data-testid': 'accuracy-chart', ...hooks, 'aria-labelledby': 'acc-title' },
      el(
        'figcaption',
        { class: 'chart-head' },
        el(
          'span',
          { id: 'acc-title', class: 'card-title' },
          'Accuracy per step',
          el('span', { class: 'card-note' }, ' · train batch per rank, ● test set'),
        ),
      ),
      accHost,
      emptyNote(),
    );
    this.lossChart = new MetricChart(lossHost, {
      prefix: 'loss',
      evalColumn: 'evalLoss',
      evalLabel: 'test loss',
      yLabel: 'loss',
      percent: false,
    });
    this.accChart = new MetricChart(accHost, {
      prefix: 'acc',
      evalColumn: 'evalAcc',
      evalLabel: 'test accuracy',
      yLabel: 'accuracy',
      percent: true,
    });

    const smoothInput = el('input', { id: 'dash-smoothing', type: 'range', min: 0, max: 0.95, step: 0.05, value: this.smoothing });
    const smoothOut = el('output', { for: 'dash-smoothing', id: 'dash-smoothing-value' }, this.smoothing.toFixed(2));
    smoothInput.addEventListener('input', () => {
      this.smoothing = Number(smoothInput.value);
      smoothOut.textContent = this.smoothing.toFixed(2);
      onSettingsChange();
    });

    this.node = el(
      'section',
      { class: 'charts-section', 'aria-labelledby': 'charts-title' },
      el(
        'div',
        { class: 'section-head' },
        el('h2', { id: 'charts-title' }, 'Metrics'),
        el('div', { class: 'smoothing' }, el('label', { for: 'dash-smoothing' }, 'Smoothing'), smoothInput, smoothOut),
      ),
      this.idle,
      el('div', { class: 'charts-grid' }, this.lossCard, this.accCard),
    );
    this.idle.hidden = true;
  }

  /** Adds a step's or an eval's points and updates the test hooks. */
  take(event: TrainEvent): void {
    if (event.type === 'step') {
      for (const m of event.ranks) {
        // null (no samples this step): a gap in the rank's line.
        this.table.set(`loss:${m.rank}`, event.step, m.loss);
        this.table.set(`acc:${m.rank}`, event.step, m.accuracy);
        this.ranks.add(m.rank);
      }
    } else if (event.type === 'eval') {
      this.table.set('evalAcc', event.step, event.testAccuracy);
      this.table.set('evalLoss', event.step, event.testLoss);
    } else {
      return;
    }
    const ranks = this.sortedRanks();
    for (const [card, prefix, evalColumn] of [
      [this.lossCard, 'loss', 'evalLoss'],
      [this.accCard, 'acc', 'evalAcc'],
    ] as const) {
      const withPoints = ranks.filter((r) => this.table.count(`${prefix}:${r}`) > 0);
      card.dataset.ranks = withPoints.join(',');
      card.dataset.points = String(withPoints.reduce((n, r) => n + this.table.count(`${prefix}:${r}`), 0));
      card.dataset.evalPoints = String(this.table.count(evalColumn));
      card.classList.toggle('has-data', this.table.x.length > 0);
    }
  }

  /** The two charts' redraws, which the dashboard runs in a task each. */
  drawParts(): Array<(s: DashboardState) => void> {
    return [this.lossChart, this.accChart].map((chart, i) => (s: DashboardState) => {
      if (i === 0) this.showIdle(s);
      if (this.table.x.length > 0) chart.render(this.table, this.sortedRanks(), s.self, this.smoothing);
    });
  }

  private showIdle(s: DashboardState): void {
    const note = idleNote(s, s.self);
    this.idle.hidden = note === null;
    if (note !== null) setText(this.idle, `This tab trained ${note}.`);
  }

  destroy(): void {
    this.lossChart.destroy();
    this.accChart.destroy();
  }

  private sortedRanks(): number[] {
    return [...this.ranks].sort((a, b) => a - b);
  }
}
