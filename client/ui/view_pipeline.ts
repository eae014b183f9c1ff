/** The Pipeline panel: the stages table, the bubble, and the latest step's schedule as a timeline. */
import type { DashboardState } from './dashboard_state.ts';
import { pipelinePanel, timelineModel, type TimelineModel } from './dashboard_pipeline.ts';
import { el, rankColour } from './dom.ts';
import { fmtInt, fmtPercent } from './format.ts';
import { changeDetector, setText } from './view_dom.ts';
import './styles/panel_shared.css';
import './styles/panel_pipeline.css';

/**
 * Pipeline runs only (hidden otherwise): the stages with their layers, parameters and ranks, this
 * tab's stage marked, the bubble by the formula and as measured, and the latest step's schedule
 * as it ran (a row per stage, a box per forward or backward pass, drawn with plain elements).
 */
export class PipelineView {
  readonly node: HTMLElement;
  private readonly shape: HTMLElement;
  private readonly body: HTMLTableSectionElement;
  private readonly bubble: HTMLElement;
  private readonly timeline: HTMLElement;
  private readonly timelineTitle: HTMLElement;
  private readonly rows: HTMLElement;
  private readonly caption: HTMLElement;
  private readonly empty: HTMLElement;
  private readonly layoutChanged = changeDetector();
  private readonly timelineChanged = changeDetector();

  constructor() {
    this.shape = el('p', { class: 'card-note pp-shape' });
    this.body = el('tbody');
    const table = el(
      'table',
      { class: 'perf-table pp-table' },
      el(
        'caption',
        { class: 'visually-hidden' },
        'Pipeline stages: the layers each holds, its parameters, the ranks holding it and its measured bubble',
      ),
      el(
        'thead',
        {},
        el(
          'tr',
          {},
          el('th', { scope: 'col' }, 'Stage'),
          el('th', { scope: 'col' }, 'Layers'),
          el('th', { scope: 'col', class: 'num' }, 'Parameters'),
          el('th', { scope: 'col' }, 'Ranks'),
          el('th', { scope: 'col', class: 'num' }, 'Bubble'),
        ),
      ),
      this.body,
    );
    this.bubble = el('p', { class: 'pp-bubble', 'data-testid': 'pipeline-bubble' });
    this.timelineTitle = el('span', { id: 'pp-timeline-title', class: 'card-title' }, 'Schedule');
    this.rows = el('div', { class: 'tl-rows' });
    this.caption = el('p', { id: 'pp-timeline-caption', class: 'card-note' });
    this.empty = el('p', { class: 'card-note' }, 'The schedule as it ran appears after the first steps.');
    const legend = el(
      'ul',
      { class: 'perf-legend tl-legend', 'aria-hidden': 'true' },
      el('li', {}, el('span', { class: 'swatch tl-F' }), 'Forward (F), micro-batch number inside'),
      el('li', {}, el('span', { class: 'swatch tl-B' }), 'Backward (B)'),
      el('li', {}, el('span', { class: 'swatch tl-idle' }), 'Idle: the bubble'),
    );
    this.timeline = el(
      'figure',
      {
        class: 'pp-timeline',
        'data-testid': 'pipeline-timeline',
        'data-step': '',
        'data-boxes': 0,
        'aria-labelledby': 'pp-timeline-title',
        'aria-describedby': 'pp-timeline-caption',
        hidden: true,
      },
      el('figcaption', {}, this.timelineTitle),
      el('div', { class: 'table-scroll' }, this.rows),
      legend,
      this.caption,
    );
    this.node = el(
      'section',
      { class: 'card pipeline-card', 'aria-labelledby': 'pipeline-title', 'data-testid': 'pipeline', hidden: true },
      el('h2', { id: 'pipeline-title', class: 'card-title' }, 'Pipeline'),
      this.shape,
      el('div', { class: 'table-scroll' }, table),
      this.bubble,
      this.empty,
      this.timeline,
    );
  }

  render(s: DashboardState): void {
    if (this.layoutChanged([s.pipeline, s.pipelineRanks, s.lost, s.config])) this.renderLayout(s);
    if (this.timelineChanged([s.timeline, s.pipeline])) this.renderTimeline(timelineModel(s));
  }

  private renderLayout(s: DashboardState): void {
    const panel = pipelinePanel(s);
    this.node.hidden = panel === null;
    if (!panel) return;
    this.node.dataset.stages = String(panel.stages.length);
    this.node.dataset.selfStage = String(panel.selfStage);
    setText(
      this.shape,
      `${panel.shape} · this tab holds stage ${panel.selfStage}${panel.stages[0] && panel.stages[0].ranks.length > 1 ? ` of replica ${panel.selfReplica}` : ''}`,
    );
    this.body.replaceChildren(
      ...panel.stages.map((row) =>
        el(
          'tr',
          { class: row.self ? 'self-row' : '', 'data-stage': row.stage },
          el('th', { scope: 'row' }, `stage ${row.stage}`, row.self ? el('span', { class: 'you' }, ' (this tab)') : ''),
          el('td', { class: 'pp-layers' }, row.layersText),
          el('td', { class: 'num', 'data-unit': 'parameters' }, fmtInt(row.parameters)),
          el(
            'td',
            { class: 'pp-ranks' },
            ...row.ranks.map((r) =>
              el(
                'span',
                { class: `pp-rank${row.lost.includes(r) ? ' lost' : ''}`, title: row.lost.includes(r) ? `rank ${r} (lost)` : `rank ${r}` },
                el('span', { class: 'rank-swatch', style: `background:${rankColour(r)}` }),
                `${r}`,
              ),
            ),
          ),
          el('td', { class: 'num', 'data-unit': 'bubble' }, row.bubble === null ? '–' : fmtPercent(row.bubble)),
        ),
      ),
    );
    setText(this.bubble, panel.bubbleText);
  }

  private renderTimeline(model: TimelineModel | null): void {
    this.timeline.hidden = model === null;
    this.empty.hidden = model !== null;
    if (!model) return;
    setText(this.timelineTitle, `Schedule of step ${fmtInt(model.step)}`);
    setText(this.caption, model.caption);
    this.timeline.dataset.step = String(model.step);
    this.timeline.dataset.boxes = String(model.rows.reduce((n, r) => n + r.boxes.length, 0));
    const pct = (x: number) => `${(100 * Math.min(1, Math.max(0, x))).toFixed(3)}%`;
    const rows = model.rows.map((row) =>
      el(
        'div',
        { class: `tl-row${row.self ? ' self' : ''}`, role: 'group', 'aria-label': row.label, 'data-stage': row.stage },
        el(
          'span',
          { class: 'tl-label', 'aria-hidden': 'true' },
          `stage ${row.stage}`,
          row.self ? el('span', { class: 'you' }, ' (this tab)') : '',
        ),
        el(
          'div',
          { class: 'tl-track' },
          ...row.boxes.map((b) =>
            el(
              'span',
              {
                class: `tl-box tl-${b.phase}`,
                role: 'img',
                'aria-label': b.label,
                title: b.label,
                style: `left:${pct(b.left)};width:${pct(b.width)}`,
                'data-phase': b.phase,
                'data-micro-batch': b.microBatch,
              },
              el('span', { 'aria-hidden': 'true' }, String(b.microBatch)),
            ),
          ),
        ),
      ),
    );
    const axis = el(
      'div',
      { class: 'tl-row tl-axis', 'aria-hidden': 'true' },
      el('span', { class: 'tl-label' }),
      el(
        'div',
        { class: 'tl-track tl-ticks' },
        ...model.ticks.map((t) =>
          el('span', { class: `tl-tick${t.at === 0 ? ' first' : t.at > 0.97 ? ' last' : ''}`, style: `left:${pct(t.at)}` }, t.label),
        ),
      ),
    );
    this.rows.replaceChildren(...rows, axis);
  }
}
