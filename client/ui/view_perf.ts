/** The performance card: per-rank throughput and a bar of where each rank's step time goes, and a DDP run's communication. */
import { RECENT, type DashboardState } from './dashboard_state.ts';
import { BREAKDOWN_NAME, BREAKDOWN_PARTS, commFigures, rankAverages, type RankAverages } from './dashboard_perf.ts';
import { el, rankColour } from './dom.ts';
import { fmtBytes, fmtInt, fmtMs } from './format.ts';
import { setText } from './view_dom.ts';
import './styles/panel_shared.css';
import './styles/panel_perf.css';

/** Per-rank throughput and where each rank's step time goes (drawn on the throttled render). */
export class PerfView {
  readonly node: HTMLElement;
  private readonly body: HTMLTableSectionElement;
  private readonly foot: HTMLTableSectionElement;
  /** DDP runs: the communication hook, bytes per step and the ratio to the float32 all-reduce. */
  private readonly comm: HTMLElement;

  constructor() {
    this.body = el('tbody');
    this.foot = el('tfoot');
    this.comm = el('p', { class: 'card-note perf-comm', 'data-testid': 'perf-comm', hidden: true });
    const table = el(
      'table',
      { class: 'perf-table', 'aria-describedby': 'perf-note' },
      el('caption', { class: 'visually-hidden' }, 'Per-rank throughput and step time breakdown, averaged over recent steps'),
      el(
        'thead',
        {},
        el(
          'tr',
          {},
          el('th', { scope: 'col' }, 'Rank'),
          el('th', { scope: 'col', class: 'num' }, 'Samples/s'),
          el('th', { scope: 'col', class: 'num' }, 'ms/step'),
          el('th', { scope: 'col', class: 'bar-col' }, 'Where the time goes'),
        ),
      ),
      this.body,
      this.foot,
    );
    const legend = el(
      'ul',
      { class: 'perf-legend', 'aria-hidden': 'true' },
      ...BREAKDOWN_PARTS.map((p) => el('li', {}, el('span', { class: `swatch seg-${p}` }), BREAKDOWN_NAME[p])),
    );
    this.node = el(
      'section',
      { class: 'card perf-card', 'aria-labelledby': 'perf-title' },
      el('h2', { id: 'perf-title', class: 'card-title' }, 'Throughput and step time per rank'),
      el('div', { class: 'table-scroll' }, table),
      legend,
      this.comm,
      el(
        'p',
        { id: 'perf-note', class: 'card-note' },
        `Averages over the last ${RECENT} steps. All-reduce time includes waiting for the slowest rank.`,
      ),
    );
  }

  render(s: DashboardState): void {
    const rows = rankAverages(s);
    const comm = commFigures(s);
    this.comm.hidden = comm === null;
    setText(this.comm, comm?.text ?? '');
    const maxMs = Math.max(1, ...rows.map((r) => (Number.isFinite(r.totalMs) ? r.totalMs : 0)));
    this.body.replaceChildren(...rows.map((row) => perfRow(row, maxMs)));
    const total = rows.reduce((sum, r) => sum + (Number.isFinite(r.samplesPerSec) ? r.samplesPerSec : 0), 0);
    this.foot.replaceChildren(
      rows.length
        ? el(
            'tr',
            {},
            el('th', { scope: 'row' }, 'All ranks'),
            el('td', { class: 'num', 'data-unit': 'samples/s' }, fmtInt(total)),
            el('td', { class: 'num' }, ''),
            el('td', { class: 'bar-col' }, ''),
          )
        : el('tr', {}, el('td', { colspan: 4, class: 'empty' }, 'No steps yet.')),
    );
  }
}

function perfRow(row: RankAverages, maxMs: number): HTMLTableRowElement {
  const b = row.breakdownMs;
  const bar = el('div', {
    class: 'stack',
    role: 'img',
    'aria-label': BREAKDOWN_PARTS.map((p) => `${BREAKDOWN_NAME[p]} ${b[p].toFixed(1)} ms`).join(', '),
  });
  bar.style.width = `${(100 * row.totalMs) / maxMs}%`;
  for (const p of BREAKDOWN_PARTS) {
    if (!(b[p] > 0)) continue;
    const seg = el('span', { class: `seg seg-${p}`, title: `${BREAKDOWN_NAME[p]}: ${b[p].toFixed(1)} ms` });
    seg.style.flexGrow = String(b[p]);
    bar.append(seg);
  }
  const figures = el(
    'div',
    { class: 'stack-figures' },
    ...BREAKDOWN_PARTS.map((p) => el('span', { class: `fig fig-${p}` }, `${BREAKDOWN_NAME[p]} ${fmtMs(b[p])}`)),
  );
  // DDP runs: what the rank sent per step (--comm-hook).
  if (row.bytesPerStep !== undefined) figures.append(el('span', { class: 'sent' }, `Sent ${fmtBytes(row.bytesPerStep)}/step`));
  // --devices: the rank's Workers and their compute per step.
  if (row.devices)
    figures.append(
      el('span', { class: 'devices', 'data-testid': 'rank-devices' }, `${row.devices.count} devices, ${fmtMs(row.devices.meanMs)} each`),
    );
  return el(
    'tr',
    { class: `${row.self ? 'self-row' : ''}${row.lost ? ' lost-row' : ''}`, 'data-rank': row.rank },
    el(
      'th',
      { scope: 'row' },
      el('span', { class: 'rank-swatch', style: `background:${rankColour(row.rank)}` }),
      `rank ${row.rank}`,
      row.self ? el('span', { class: 'you' }, ' (this tab)') : '',
    ),
    el('td', { class: 'num', 'data-unit': 'samples/s' }, fmtInt(row.samplesPerSec)),
    el('td', { class: 'num', 'data-unit': 'per step' }, fmtMs(row.totalMs)),
    el('td', { class: 'bar-col' }, bar, figures),
  );
}
