/** The run summary card, drawn from the end-of-run report once 'done' arrived. */
import type { DashboardState } from './dashboard_state.ts';
import { runReport } from './dashboard_report.ts';
import { el } from './dom.ts';
import { changeDetector } from './view_dom.ts';
import './styles/panel_shared.css';
import './styles/panel_report.css';

/** The run's summary once 'done' arrived: a few facts for everyone, the rest behind "Details". */
export class SummaryView {
  readonly node: HTMLElement;
  private readonly changed = changeDetector();

  constructor() {
    this.node = el('section', { class: 'card summary-card', hidden: true, 'aria-labelledby': 'summary-title', 'data-testid': 'summary' });
  }

  render(s: DashboardState): void {
    if (!this.changed([s.summary, s.config, s.faults, s.lastStep, s.shard]) || !s.summary) return;
    const report = runReport(s);
    if (!report) return;
    const list = (items: ReadonlyArray<{ label: string; value: string; key: string }>, cls: string) =>
      el(
        'dl',
        { class: cls },
        ...items.map(({ label, value, key }) =>
          el('div', { class: 'summary-item', 'data-key': key }, el('dt', {}, label), el('dd', {}, value)),
        ),
      );
    const details = report.details.length
      ? [
          el(
            'details',
            { class: 'summary-details', 'data-testid': 'summary-details' },
            el('summary', {}, 'Details'),
            list(report.details, 'summary-list details-list'),
          ),
        ]
      : [];
    this.node.replaceChildren(
      el('h2', { id: 'summary-title', class: 'card-title' }, 'Run summary'),
      list(report.main, 'summary-list'),
      ...details,
    );
    this.node.hidden = false;
  }
}
