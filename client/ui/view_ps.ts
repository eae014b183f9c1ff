/** The Parameter server panel: the layout, this tab's figures as a server or a worker (with the staleness histogram), and the run's samples. */
import type { DashboardState } from './dashboard_state.ts';
import { psPanel, type PsFigure, type PsHistogram, type PsPanel } from './dashboard_ps.ts';
import { el, rankColour } from './dom.ts';
import { fmtInt } from './format.ts';
import { changeDetector, setText } from './view_dom.ts';
import './styles/panel_shared.css';
import './styles/panel_ps.css';

/** Figures as a definition list (label above, figure below), one `data-figure` per item. */
function figureList(figures: readonly PsFigure[], className: string): HTMLDListElement {
  return el(
    'dl',
    { class: `summary-list ps-figures ${className}` },
    ...figures.map((f) =>
      el(
        'div',
        { class: `summary-item${f.warn ? ' warn' : ''}`, 'data-figure': f.key },
        el('dt', {}, f.label),
        el('dd', {}, f.warn ? el('span', { 'aria-hidden': 'true' }, '⚠ ') : '', f.value),
      ),
    ),
  );
}

/**
 * Parameter-server runs only (hidden otherwise): the servers with the parameters each holds and
 * the workers, with their ranks now and this tab's row marked; on a server tab its shard's
 * version, update rate and verdicts, the staleness of the pushes it took (a bar per bucket) and
 * each worker's push rate; on a worker tab its own pulls and pushes; and the run's samples.
 */
export class PsView {
  readonly node: HTMLElement;
  private readonly shape: HTMLElement;
  private readonly layoutBody: HTMLTableSectionElement;
  private readonly server: HTMLElement;
  private readonly serverTitle: HTMLElement;
  private readonly shard: HTMLElement;
  private readonly serverFigures: HTMLElement;
  private readonly staleness: HTMLElement;
  private readonly bars: HTMLElement;
  private readonly stalenessCaption: HTMLElement;
  private readonly ratesBody: HTMLTableSectionElement;
  private readonly worker: HTMLElement;
  private readonly workerFigures: HTMLElement;
  private readonly samples: HTMLElement;
  private readonly samplesBar: HTMLProgressElement;
  private readonly samplesText: HTMLElement;
  private readonly samplesFigures: HTMLElement;
  private readonly changed = changeDetector();

  constructor() {
    const col = (text: string, num = false) => el('th', { scope: 'col', ...(num ? { class: 'num' } : {}) }, text);
    this.shape = el('p', { class: 'card-note ps-shape' });
    this.layoutBody = el('tbody');
    const layout = el(
      'table',
      { class: 'perf-table ps-layout', 'data-testid': 'ps-layout' },
      el(
        'caption',
        { class: 'visually-hidden' },
        'Parameter-server layout: each server with the parameters it holds, and the workers, with their ranks now',
      ),
      el('thead', {}, el('tr', {}, col('Role'), col('Rank'), col('Holds'), col('Tensors', true), col('Parameters', true))),
      this.layoutBody,
    );

    this.serverTitle = el('h3', { id: 'ps-server-title', class: 'ps-subtitle' }, 'This tab’s shard');
    this.shard = el('p', { class: 'ps-shard', 'data-testid': 'ps-shard' });
    this.serverFigures = el('div');
    this.bars = el('div', { class: 'ps-bars', role: 'group', 'aria-labelledby': 'ps-staleness-title' });
    this.stalenessCaption = el('p', { id: 'ps-staleness-caption', class: 'card-note' });
    this.staleness = el(
      'figure',
      {
        class: 'ps-staleness',
        'data-testid': 'ps-staleness',
        'data-total': 0,
        'aria-labelledby': 'ps-staleness-title',
        'aria-describedby': 'ps-staleness-caption',
      },
      el('figcaption', { id: 'ps-staleness-title', class: 'ps-figure-title' }, 'Staleness of the pushes (versions behind)'),
      el('div', { class: 'table-scroll' }, this.bars),
      this.stalenessCaption,
    );
    this.ratesBody = el('tbody');
    const rates = el(
      'table',
      { class: 'perf-table ps-rates', 'data-testid': 'ps-workers' },
      el('caption', { class: 'ps-figure-title' }, 'Pushes to this shard, by worker'),
      el('thead', {}, el('tr', {}, col('Worker'), col('Rank'), col('Pushes/s', true), col('Pushes', true), col('Applied', true))),
      this.ratesBody,
    );
    this.server = el(
      'section',
      { class: 'ps-part ps-server', 'data-testid': 'ps-server', 'aria-labelledby': 'ps-server-title', hidden: true },
      this.serverTitle,
      this.shard,
      this.serverFigures,
      this.staleness,
      el('div', { class: 'table-scroll' }, rates),
    );

    this.workerFigures = el('div');
    this.worker = el(
      'section',
      { class: 'ps-part ps-worker', 'data-testid': 'ps-worker', 'aria-labelledby': 'ps-worker-title', hidden: true },
      el('h3', { id: 'ps-worker-title', class: 'ps-subtitle' }, 'This tab as a worker'),
      this.workerFigures,
    );

    this.samplesBar = el('progress', { id: 'ps-samples-bar', max: 1, value: 0, 'aria-describedby': 'ps-samples-text' });
    this.samplesText = el('p', { id: 'ps-samples-text', class: 'ps-samples-text' });
    this.samplesFigures = el('div');
    this.samples = el(
      'section',
      { class: 'ps-part ps-samples', 'data-testid': 'ps-samples', 'aria-labelledby': 'ps-samples-title', hidden: true },
      el('h3', { class: 'ps-subtitle' }, el('label', { id: 'ps-samples-title', for: 'ps-samples-bar' }, 'Samples of the run')),
      this.samplesBar,
      this.samplesText,
      this.samplesFigures,
    );

    this.node = el(
      'section',
      { class: 'card ps-card', 'aria-labelledby': 'ps-title', 'data-testid': 'ps', hidden: true },
      el('h2', { id: 'ps-title', class: 'card-title' }, 'Parameter server'),
      this.shape,
      el('div', { class: 'table-scroll' }, layout),
      this.server,
      this.worker,
      this.samples,
    );
  }

  render(s: DashboardState): void {
    if (!this.changed([s.ps, s.config])) return;
    const panel = psPanel(s);
    this.node.hidden = panel === null;
    if (!panel) return;
    const d = this.node.dataset;
    d.role = panel.role;
    d.strategy = panel.strategy;
    d.rank = String(panel.rank);
    d.servers = String(panel.layout.filter((r) => r.role === 'server').length);
    d.workers = String(panel.layout.filter((r) => r.role === 'worker').length);
    setText(this.shape, panel.shape);
    this.renderLayout(panel);
    this.renderServer(panel);
    this.renderWorker(panel);
    this.renderSamples(panel);
  }

  private renderLayout(panel: PsPanel): void {
    this.layoutBody.replaceChildren(
      ...panel.layout.map((row) =>
        el(
          'tr',
          {
            class: row.self ? 'self-row' : '',
            'data-role': row.role,
            'data-id': row.id,
            'data-rank': row.rank,
            'data-self': row.self ? 'true' : 'false',
          },
          el('th', { scope: 'row' }, row.name, row.self ? el('span', { class: 'you' }, ' (this tab)') : ''),
          el(
            'td',
            { class: 'pp-ranks' },
            el('span', { class: 'rank-swatch', style: `background:${rankColour(row.rank)}` }),
            `rank ${row.rank}`,
          ),
          el('td', { class: 'ps-holds' }, row.holds),
          el('td', { class: 'num', 'data-unit': 'tensors' }, row.tensors === null ? '' : fmtInt(row.tensors)),
          el('td', { class: 'num', 'data-unit': 'parameters' }, row.numel === null ? '' : fmtInt(row.numel)),
        ),
      ),
    );
  }

  private renderServer(panel: PsPanel): void {
    const sv = panel.server;
    this.server.hidden = sv === null;
    if (!sv) return;
    setText(this.serverTitle, `This tab’s shard: server ${sv.index}`);
    setText(this.shard, `Holds ${sv.shardText}`);
    this.serverFigures.replaceChildren(figureList(sv.figures, 'ps-server-figures'));
    this.renderHistogram(sv.histogram);
    this.ratesBody.replaceChildren(
      ...(sv.pushRates.length
        ? sv.pushRates.map((r) =>
            el(
              'tr',
              { 'data-worker-id': r.workerId, class: r.rank === null ? 'ps-left' : '' },
              el('th', { scope: 'row' }, `worker ${r.workerId}`),
              el('td', {}, r.rank === null ? 'left' : `rank ${r.rank}`),
              el('td', { class: 'num', 'data-unit': 'pushes/s' }, r.rateText),
              el('td', { class: 'num', 'data-unit': 'pushes' }, fmtInt(r.pushes)),
              el('td', { class: 'num', 'data-unit': 'applied' }, fmtInt(r.applied)),
            ),
          )
        : [el('tr', {}, el('td', { class: 'empty', colspan: 5 }, 'No pushes yet.'))]),
    );
  }

  private renderHistogram(h: PsHistogram): void {
    this.staleness.dataset.total = String(h.total);
    setText(this.stalenessCaption, h.caption);
    this.bars.replaceChildren(
      ...h.bars.map((b) => {
        const bar = el('span', {
          class: `ps-bar${b.tail ? ' tail' : ''}`,
          role: 'img',
          'aria-label': b.ariaLabel,
          title: b.ariaLabel,
          'data-staleness': b.staleness,
          'data-count': b.count,
        });
        // A bucket with pushes stays visible however tall the tallest is.
        bar.style.height = b.count > 0 ? `max(2px, ${(100 * b.height).toFixed(2)}%)` : '0';
        return el(
          'div',
          { class: 'ps-bar-col' },
          el('span', { class: 'ps-bar-count', 'aria-hidden': 'true' }, b.count > 0 ? fmtInt(b.count) : ''),
          el('span', { class: 'ps-bar-track' }, bar),
          el('span', { class: 'ps-bar-label', 'aria-hidden': 'true' }, b.label),
        );
      }),
    );
  }

  private renderWorker(panel: PsPanel): void {
    const w = panel.worker;
    this.worker.hidden = w === null;
    if (!w) return;
    this.workerFigures.replaceChildren(figureList(w.figures, 'ps-worker-figures'));
  }

  private renderSamples(panel: PsPanel): void {
    const sm = panel.samples;
    this.samples.hidden = sm === null;
    if (!sm) return;
    this.samples.dataset.warn = String(sm.warn);
    this.samples.dataset.leased = String(sm.leased);
    this.samples.dataset.target = String(sm.target);
    this.samplesBar.max = Math.max(1, sm.target);
    this.samplesBar.value = Math.min(sm.leased, Math.max(1, sm.target));
    setText(this.samplesText, sm.leasedText);
    this.samplesFigures.replaceChildren(figureList(sm.figures, 'ps-samples-figures'));
  }
}
