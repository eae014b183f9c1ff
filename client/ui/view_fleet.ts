/** The fleet card: a table row per rank with its browser, backend, device, step time and share of the global batch. */
import { RECENT, type DashboardState } from './dashboard_state.ts';
import { fleetRows, type FleetRow } from './dashboard_fleet.ts';
import { el, rankColour } from './dom.ts';
import { fmtMs, fmtPercent } from './format.ts';
import { changeDetector, setText } from './view_dom.ts';
import './styles/panel_shared.css';
import './styles/panel_fleet.css';

/**
 * The fleet: every rank's browser, backend and device, its time per step and its share of the
 * global batch (drawn on the throttled render). The browser, device and fallback texts come from
 * other tabs: they are cleaned and capped before they get here, and only ever set as text.
 */
export class FleetView {
  readonly node: HTMLElement;
  private readonly body: HTMLTableSectionElement;
  private readonly note: HTMLElement;
  private readonly changed = changeDetector();

  constructor() {
    this.body = el('tbody');
    this.note = el('p', { class: 'card-note', 'data-testid': 'fleet-note' });
    const col = (text: string, cls = '') => el('th', { scope: 'col', ...(cls ? { class: cls } : {}) }, text);
    const table = el(
      'table',
      { class: 'perf-table fleet-table', 'data-testid': 'fleet-table', 'aria-describedby': 'fleet-note' },
      el('caption', { class: 'visually-hidden' }, "Each rank's browser, backend, device, time per step and share of the global batch"),
      el('thead', {}, el('tr', {}, col('Rank'), col('Browser'), col('Backend'), col('Device'), col('Step time', 'num'), col('Share of batch', 'num'))),
      this.body,
    );
    this.note.id = 'fleet-note';
    this.node = el(
      'section',
      { class: 'card fleet-card', 'aria-labelledby': 'fleet-title' },
      el('h2', { id: 'fleet-title', class: 'card-title' }, 'The group’s tabs'),
      el('div', { class: 'table-scroll' }, table),
      this.note,
    );
    this.node.hidden = true;
  }

  render(s: DashboardState): void {
    if (!this.changed([s.fleet, s.recent, s.lastStep, s.self, s.lost, s.worldSize, s.backend, s.config])) return;
    const rows = fleetRows(s);
    this.node.hidden = rows.length === 0;
    this.body.replaceChildren(...rows.map(fleetRow));
    const even = rows.some((r) => r.shareEven);
    setText(this.note, `Step time and share of the global batch over the last ${RECENT} steps${even ? '; the ranks train equal batches' : ''}. Browser and device are as each tab reports itself.`);
  }
}

function fleetRow(row: FleetRow): HTMLTableRowElement {
  const unknown = (text: string) => el('span', { class: 'muted' }, text);
  const backend: Array<Node | string> = row.backend ? [el('strong', {}, row.backend)] : [unknown('–')];
  if (row.fallback) backend.push(el('span', { class: 'fallback', 'data-testid': 'fleet-fallback' }, `⚠ fallback: ${row.fallback}`));
  const share = row.share === null ? '–' : fmtPercent(row.share, row.share < 0.1 ? 1 : 0);
  return el(
    'tr',
    { class: `${row.self ? 'self-row' : ''}${row.lost ? ' lost-row' : ''}`, 'data-rank': row.rank },
    el('th', { scope: 'row' }, el('span', { class: 'rank-swatch', style: `background:${rankColour(row.rank)}` }), `rank ${row.rank}`, row.self ? el('span', { class: 'you' }, ' (this tab)') : ''),
    el('td', { class: 'fleet-browser', 'data-col': 'browser', 'data-label': 'Browser' }, ...(row.browser ? [row.browser, ...(row.platform ? [el('span', { class: 'fleet-sub' }, row.platform)] : [])] : [unknown('not reported yet')])),
    el('td', { class: 'fleet-backend', 'data-col': 'backend', 'data-label': 'Backend' }, ...backend),
    el('td', { class: 'fleet-device', 'data-col': 'device', 'data-label': 'Device' }, row.device ? el('span', { class: 'fleet-device-text' }, row.device) : unknown('–')),
    el(
      'td',
      { class: 'num', 'data-col': 'step', 'data-label': 'Step time' },
      row.stepMs === null ? '–' : fmtMs(row.stepMs),
      ...(row.computeMs !== null && row.stepMs !== null ? [el('span', { class: 'fleet-sub' }, `compute ${fmtMs(row.computeMs)}`)] : []),
    ),
    el('td', { class: 'num', 'data-col': 'share', 'data-unit': 'of the batch' }, share),
  );
}
