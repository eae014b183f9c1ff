/**
 * The dashboard's parts as DOM. Each builds its elements once and then draws a DashboardState,
 * touching the DOM only when what it shows changed; every text and figure comes from
 * dashboard_state.ts and the panels' model modules beside it (dashboard_*.ts). The charts are the
 * exception that keeps data of its own (their per-step series, see ChartsView).
 */
import type { TrainEvent } from '../train/events.ts';
import { MetricChart, StepTable } from './charts.ts';
import { MAX_LOG, RECENT, type DashboardState, type LogEntry } from './dashboard_state.ts';
import { statCards, type StatKey } from './dashboard_cards.ts';
import { CONFIRM, controls } from './dashboard_controls.ts';
import { facts } from './dashboard_facts.ts';
import { fleetRows, type FleetRow } from './dashboard_fleet.ts';
import { BREAKDOWN_NAME, BREAKDOWN_PARTS, commFigures, rankAverages, type RankAverages } from './dashboard_perf.ts';
import { pipelinePanel, timelineModel, type TimelineModel } from './dashboard_pipeline.ts';
import { progressFigures } from './dashboard_progress.ts';
import { psPanel, type PsFigure, type PsHistogram, type PsPanel } from './dashboard_ps.ts';
import { runReport } from './dashboard_report.ts';
import { ringModel } from './dashboard_ring.ts';
import { displayPhase, phaseLabel, statusText } from './dashboard_status.ts';
import { el, rankColour, shareField } from './dom.ts';
import { fmtBytes, fmtClock, fmtInt, fmtMs, fmtPercent } from './format.ts';
import { qrSvg } from './qr.ts';
import { RingView } from './ring_view.ts';

/**
 * True when any input differs (by identity) from the previous call's: the state keeps the
 * identity of parts that did not change, so this is how a view skips redrawing.
 */
function changeDetector(): (inputs: readonly unknown[]) => boolean {
  let last: readonly unknown[] | null = null;
  return (inputs) => {
    const changed = last === null || inputs.some((v, i) => v !== last![i]);
    last = inputs;
    return changed;
  };
}

function setText(node: Node, text: string): void {
  if (node.textContent !== text) node.textContent = text;
}

export interface HeaderActions {
  /** Confirmed in a dialog first. */
  stop(): void;
  /** Confirmed in a dialog first. */
  end(): void;
  setMin(min: number): void;
  download(): void;
  continueTraining(): void;
}

/**
 * A native modal dialog that says what will happen, with Cancel focused first so a stray Enter
 * does nothing; `onConfirm` runs only when the person chose the action.
 */
function confirmDialog(kind: keyof typeof CONFIRM, onConfirm: () => void): { dialog: HTMLDialogElement; open(): void } {
  const text = CONFIRM[kind];
  const dialog = el(
    'dialog',
    { class: 'confirm-dialog', 'aria-labelledby': `${kind}-dialog-title`, 'aria-describedby': `${kind}-dialog-body`, 'data-testid': `${kind}-dialog` },
    el(
      'form',
      { method: 'dialog' },
      el('h2', { id: `${kind}-dialog-title` }, text.title),
      el('p', { id: `${kind}-dialog-body` }, text.body),
      el(
        'div',
        { class: 'dialog-actions' },
        el('button', { value: 'cancel', class: 'btn btn-secondary', autofocus: true }, 'Cancel'),
        el('button', { value: 'confirm', class: 'btn btn-danger-solid', 'data-testid': `${kind}-confirm` }, text.confirm),
      ),
    ),
  );
  dialog.addEventListener('close', () => {
    if (dialog.returnValue === 'confirm') onConfirm();
  });
  return {
    dialog,
    open: () => {
      dialog.returnValue = '';
      if (!dialog.open) dialog.showModal();
    },
  };
}

/** Title, phase pill, the session's controls (as this tab's role allows), and the status line. */
export class HeaderView {
  readonly node: HTMLElement;
  private readonly status: HTMLElement;
  private readonly pill: HTMLElement;
  private readonly stop: HTMLButtonElement;
  private readonly end: HTMLButtonElement;
  private readonly continueButton: HTMLButtonElement;
  private readonly download: HTMLButtonElement;
  private readonly downloadHint: HTMLElement;
  private readonly minGroup: HTMLElement;
  private readonly minInput: HTMLInputElement;
  private readonly minError: HTMLElement;
  private readonly note: HTMLElement;

  constructor(session: string, on: HeaderActions) {
    this.status = el('p', { class: 'status-line', role: 'status', 'data-testid': 'status' });
    this.pill = el('span', { class: 'phase-pill', 'data-testid': 'phase-pill' });
    const stopDialog = confirmDialog('stop', on.stop);
    const endDialog = confirmDialog('end', on.end);
    this.stop = el('button', { type: 'button', class: 'btn btn-danger', 'data-testid': 'stop-button', 'aria-haspopup': 'dialog' });
    this.end = el('button', { type: 'button', class: 'btn btn-danger', 'data-testid': 'end-button', 'aria-haspopup': 'dialog', hidden: true }, 'End session');
    this.continueButton = el('button', { type: 'button', class: 'btn btn-primary', 'data-testid': 'continue-button', hidden: true }, 'Continue training');
    this.download = el('button', { type: 'button', class: 'btn btn-primary', 'data-testid': 'download-button', disabled: true, 'aria-describedby': 'download-hint' }, 'Download model');
    this.downloadHint = el('p', { id: 'download-hint', class: 'visually-hidden' }, 'Available when training is done.');
    this.stop.addEventListener('click', stopDialog.open);
    this.end.addEventListener('click', endDialog.open);
    this.continueButton.addEventListener('click', on.continueTraining);
    this.download.addEventListener('click', on.download);

    // The host's control of the minimum: typed, then applied with the button (or Enter).
    this.minInput = el('input', { id: 'dash-min', type: 'number', min: 1, step: 1, inputmode: 'numeric', 'data-testid': 'min-input', 'aria-describedby': 'dash-min-hint dash-min-error' });
    this.minError = el('p', { id: 'dash-min-error', class: 'field-error', role: 'alert' });
    const setMin = el('button', { type: 'submit', class: 'btn btn-secondary', 'data-testid': 'min-set' }, 'Set');
    this.minGroup = el(
      'form',
      { class: 'host-controls', 'aria-label': 'Host controls', hidden: true, novalidate: true },
      el('label', { for: 'dash-min' }, 'Keep training with at least'),
      this.minInput,
      el('span', { 'aria-hidden': 'true' }, 'tabs'),
      setMin,
      el('p', { id: 'dash-min-hint', class: 'field-hint' }, 'Tabs may close, reload or join: training goes on while at least this many are in.'),
      this.minError,
    );
    this.minGroup.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const max = Number(this.minInput.max);
      const n = Number(this.minInput.value);
      if (!Number.isInteger(n) || n < 1 || n > max) {
        this.minError.textContent = `Enter a whole number from 1 to ${max}.`;
        this.minInput.setAttribute('aria-invalid', 'true');
        return;
      }
      this.minError.textContent = '';
      this.minInput.removeAttribute('aria-invalid');
      on.setMin(n);
    });
    this.note = el('p', { class: 'role-note', 'data-testid': 'role-note', hidden: true });

    this.node = el(
      'header',
      { class: 'dash-header' },
      el(
        'div',
        { class: 'title-row' },
        el('h1', {}, el('span', { class: 'title-kicker' }, 'Session '), el('span', { class: 'session-name' }, session)),
        this.pill,
        el('div', { class: 'actions' }, this.continueButton, this.stop, this.end, this.download),
      ),
      this.minGroup,
      this.note,
      this.status,
      this.downloadHint,
      stopDialog.dialog,
      endDialog.dialog,
    );
  }

  render(s: DashboardState): void {
    setText(this.status, statusText(s));
    const phase = displayPhase(s);
    if (this.pill.dataset.phase !== phase) this.pill.dataset.phase = phase;
    setText(this.pill, phaseLabel(s));
    const c = controls(s);
    this.stop.hidden = !c.stop.visible;
    this.stop.disabled = c.stop.disabled;
    setText(this.stop, c.stop.label);
    this.end.hidden = !c.end.visible;
    this.end.disabled = c.end.disabled;
    this.continueButton.hidden = !c.continueVisible;
    this.download.disabled = !c.downloadEnabled;
    setText(this.downloadHint, c.downloadEnabled ? 'Saves the model as two files named after the session and step: <session>-step-<n>.json and its .weights.bin.' : 'Available when training is done.');
    this.minGroup.hidden = !c.min.visible;
    this.minInput.max = String(c.min.max);
    this.minInput.disabled = c.min.disabled;
    // Do not overwrite what the host is typing.
    if (document.activeElement !== this.minInput && this.minInput.value !== String(c.min.value)) this.minInput.value = String(c.min.value);
    this.note.hidden = c.note === null;
    setText(this.note, c.note ?? '');
  }
}

/** A prominent banner that says what went wrong and what the person can do about it. */
export class ErrorBannerView {
  readonly node: HTMLElement;
  private readonly changed = changeDetector();

  constructor(private readonly onDismiss: () => void) {
    this.node = el('div', { class: 'error-banner', role: 'alert', 'data-testid': 'error-banner', hidden: true });
  }

  render(s: DashboardState): void {
    const error = s.error;
    if (!this.changed([error])) return;
    if (!error) {
      this.node.hidden = true;
      this.node.replaceChildren();
      delete this.node.dataset.title;
      return;
    }
    const dismiss = el('button', { type: 'button', class: 'btn btn-quiet', 'aria-label': 'Dismiss this message' }, 'Dismiss');
    dismiss.addEventListener('click', this.onDismiss);
    const action = error.action ? [el('p', { class: 'error-action' }, el('strong', {}, 'What to do: '), error.action)] : [];
    this.node.replaceChildren(
      el('span', { class: 'error-icon', 'aria-hidden': 'true' }, '!'),
      el('div', { class: 'error-body' }, el('p', { class: 'error-title' }, error.title), el('p', { class: 'error-detail' }, error.detail), ...action),
      dismiss,
    );
    this.node.hidden = false;
    this.node.dataset.title = error.title;
  }
}

/** This tab's rank, backend, data shard and job, and the link for more tabs. */
export class FactsView {
  readonly node: HTMLElement;
  private readonly dd: Record<'rank' | 'browser' | 'backend' | 'devices' | 'shard' | 'job', HTMLElement>;
  private readonly devicesNode: HTMLElement;
  private readonly changed = changeDetector();

  private readonly share: { root: HTMLElement; input: HTMLInputElement };
  private readonly qr: HTMLDetailsElement;

  constructor(shareUrl: string) {
    const fact = (label: string, key: string) => {
      const dd = el('dd', { 'data-fact': key }, '–');
      return { node: el('div', { class: 'fact' }, el('dt', {}, label), dd), dd };
    };
    const rank = fact('This tab', 'rank');
    const browser = fact('Browser', 'browser');
    const backend = fact('Backend', 'backend');
    const devices = fact('Devices', 'devices');
    devices.node.hidden = true;
    this.devicesNode = devices.node;
    const shard = fact('Data shard', 'shard');
    const job = fact('Job', 'job');
    this.dd = { rank: rank.dd, browser: browser.dd, backend: backend.dd, devices: devices.dd, shard: shard.dd, job: job.dd };
    this.share = shareField('dash-share', 'Link for more tabs', shareUrl);
    this.share.input.setAttribute('data-testid', 'dash-share-link');
    this.qr = el('details', { class: 'qr-details' }, el('summary', {}, 'Show the link as a QR code'));
    // Drawn when opened: most tabs never need it.
    this.qr.addEventListener('toggle', () => this.drawQr());
    this.node = el('section', { class: 'card facts-card', 'aria-label': 'This tab and the job' }, el('dl', { class: 'dash-facts' }, rank.node, browser.node, backend.node, devices.node, shard.node, job.node), this.share.root, this.qr);
  }

  /** A better link to share (e.g. from an address other machines can reach). */
  setShareUrl(url: string): void {
    this.share.input.value = url;
    this.drawQr();
  }

  private drawQr(): void {
    if (!this.qr.open) return;
    const figure = el('figure', { class: 'qr' }, qrSvg(this.share.input.value, 'QR code of the link for more tabs'), el('figcaption', {}, 'Point a camera at it to open the session.'));
    this.qr.querySelector('figure')?.remove();
    this.qr.append(figure);
  }

  render(s: DashboardState): void {
    if (!this.changed([s.config, s.self, s.worldSize, s.backend, s.devices, s.shard, s.epochBase, s.fleet])) return;
    const f = facts(s);
    setText(this.dd.rank, f.rank.text);
    setText(this.dd.browser, f.browser);
    this.dd.rank.style.setProperty('--rank-colour', f.rank.rank === null ? 'transparent' : rankColour(f.rank.rank));
    this.dd.rank.classList.toggle('has-rank', f.rank.rank !== null);
    const b = f.backend;
    if (b.kind === 'running') {
      const parts: Array<Node | string> = [el('strong', {}, b.name), b.detail];
      if (b.fallback) parts.push(el('span', { class: 'fallback' }, b.fallback));
      this.dd.backend.replaceChildren(...parts);
    } else {
      setText(this.dd.backend, b.kind === 'requested' ? `${b.name} (requested)` : '–');
    }
    this.devicesNode.hidden = f.devices === null;
    this.dd.devices.replaceChildren(...(f.devices ?? []).flatMap((d) => [el('span', { class: 'device' }, d.text), ...(d.fallback ? [el('span', { class: 'fallback' }, d.fallback)] : [])]));
    setText(this.dd.shard, f.shard);
    setText(this.dd.job, f.job);
  }
}

/** The progress bar, its text, and the test hooks data-step / data-total / data-done. */
export class ProgressView {
  readonly node: HTMLElement;
  private readonly bar: HTMLProgressElement;
  private readonly text: HTMLElement;

  constructor() {
    this.bar = el('progress', { id: 'dash-progress', max: 1, value: 0, 'aria-describedby': 'dash-progress-text' });
    this.text = el('p', { id: 'dash-progress-text', class: 'progress-text' });
    this.node = el(
      'section',
      { class: 'card progress-card', 'data-testid': 'progress', 'data-step': 0, 'data-total': 0, 'data-done': 'false', 'aria-labelledby': 'dash-progress-label' },
      el('label', { id: 'dash-progress-label', for: 'dash-progress', class: 'card-title' }, 'Progress'),
      this.bar,
      this.text,
    );
  }

  render(s: DashboardState): void {
    const p = progressFigures(s);
    this.bar.max = p.max;
    this.bar.value = p.value;
    this.node.dataset.step = String(p.step);
    this.node.dataset.total = String(p.total);
    this.node.dataset.done = String(p.done);
    this.node.dataset.state = s.phase;
    setText(this.text, p.text);
  }
}

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
      el('dl', { class: cls }, ...items.map(({ label, value, key }) => el('div', { class: 'summary-item', 'data-key': key }, el('dt', {}, label), el('dd', {}, value))));
    const details = report.details.length
      ? [el('details', { class: 'summary-details', 'data-testid': 'summary-details' }, el('summary', {}, 'Details'), list(report.details, 'summary-list details-list'))]
      : [];
    this.node.replaceChildren(el('h2', { id: 'summary-title', class: 'card-title' }, 'Run summary'), list(report.main, 'summary-list'), ...details);
    this.node.hidden = false;
  }
}

const STAT_LABEL: Record<StatKey, string> = { loss: 'Train loss', acc: 'Train accuracy', test: 'Test accuracy', speed: 'Throughput', time: 'Time' };
const STAT_ORDER: readonly StatKey[] = ['loss', 'acc', 'test', 'speed', 'time'];

/** The five latest figures (drawn on the throttled render). */
export class StatsView {
  readonly node: HTMLElement;
  private readonly cards = new Map<StatKey, { value: HTMLElement; sub: HTMLElement }>();

  constructor() {
    this.node = el('section', { class: 'stats', 'aria-label': 'Latest figures' });
    for (const key of STAT_ORDER) {
      const value = el('p', { class: 'stat-value' }, '–');
      const sub = el('p', { class: 'stat-sub' }, '');
      this.cards.set(key, { value, sub });
      this.node.append(el('div', { class: 'stat', 'data-stat': key }, el('p', { class: 'stat-label' }, STAT_LABEL[key]), value, sub));
    }
  }

  render(s: DashboardState): void {
    const figures = statCards(s);
    for (const [key, card] of this.cards) {
      const f = figures[key];
      if (f.unit) card.value.replaceChildren(f.value, el('span', { class: 'unit' }, f.unit));
      else setText(card.value, f.value);
      setText(card.sub, f.sub);
    }
  }
}

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
        el('span', { id: 'loss-title', class: 'card-title' }, 'Loss per step', el('span', { class: 'card-note' }, ' · one line per rank, ● test loss')),
        el('label', { class: 'check', for: 'dash-logscale' }, logInput, 'Log scale'),
      ),
      lossHost,
      emptyNote(),
    );
    this.accCard = el(
      'figure',
      { class: 'card chart-card', 'data-testid': 'accuracy-chart', ...hooks, 'aria-labelledby': 'acc-title' },
      el('figcaption', { class: 'chart-head' }, el('span', { id: 'acc-title', class: 'card-title' }, 'Accuracy per step', el('span', { class: 'card-note' }, ' · train batch per rank, ● test set'))),
      accHost,
      emptyNote(),
    );
    this.lossChart = new MetricChart(lossHost, { prefix: 'loss', evalColumn: 'evalLoss', evalLabel: 'test loss', yLabel: 'loss', percent: false });
    this.accChart = new MetricChart(accHost, { prefix: 'acc', evalColumn: 'evalAcc', evalLabel: 'test accuracy', yLabel: 'accuracy', percent: true });

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
      el('div', { class: 'section-head' }, el('h2', { id: 'charts-title' }, 'Metrics'), el('div', { class: 'smoothing' }, el('label', { for: 'dash-smoothing' }, 'Smoothing'), smoothInput, smoothOut)),
      el('div', { class: 'charts-grid' }, this.lossCard, this.accCard),
    );
  }

  /** Adds a step's or an eval's points and updates the test hooks. */
  take(event: TrainEvent): void {
    if (event.type === 'step') {
      for (const m of event.ranks) {
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

  draw(s: DashboardState): void {
    if (this.table.x.length === 0) return;
    const ranks = this.sortedRanks();
    this.lossChart.render(this.table, ranks, s.self, this.smoothing);
    this.accChart.render(this.table, ranks, s.self, this.smoothing);
  }

  destroy(): void {
    this.lossChart.destroy();
    this.accChart.destroy();
  }

  private sortedRanks(): number[] {
    return [...this.ranks].sort((a, b) => a - b);
  }
}

/** The ring all-reduce picture, redrawn when its inputs change. */
export class RingCardView {
  readonly node: HTMLElement;
  private readonly ring = new RingView();
  private readonly changed = changeDetector();

  constructor() {
    this.node = el('section', { class: 'card ring-card', 'aria-labelledby': 'ring-title' }, el('h2', { id: 'ring-title', class: 'card-title' }, 'Ring all-reduce'), this.ring.element);
  }

  render(s: DashboardState): void {
    if (this.changed([s.worldSize, s.config, s.self, s.joined, s.lost, s.links, s.ringProven, s.phase === 'training'])) this.ring.update(ringModel(s));
  }
}

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
        el('tr', {}, el('th', { scope: 'col' }, 'Rank'), el('th', { scope: 'col', class: 'num' }, 'Samples/s'), el('th', { scope: 'col', class: 'num' }, 'ms/step'), el('th', { scope: 'col', class: 'bar-col' }, 'Where the time goes')),
      ),
      this.body,
      this.foot,
    );
    const legend = el('ul', { class: 'perf-legend', 'aria-hidden': 'true' }, ...BREAKDOWN_PARTS.map((p) => el('li', {}, el('span', { class: `swatch seg-${p}` }), BREAKDOWN_NAME[p])));
    this.node = el(
      'section',
      { class: 'card perf-card', 'aria-labelledby': 'perf-title' },
      el('h2', { id: 'perf-title', class: 'card-title' }, 'Throughput and step time per rank'),
      el('div', { class: 'table-scroll' }, table),
      legend,
      this.comm,
      el('p', { id: 'perf-note', class: 'card-note' }, `Averages over the last ${RECENT} steps. All-reduce time includes waiting for the slowest rank.`),
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
        ? el('tr', {}, el('th', { scope: 'row' }, 'All ranks'), el('td', { class: 'num', 'data-unit': 'samples/s' }, fmtInt(total)), el('td', { class: 'num' }, ''), el('td', { class: 'bar-col' }, ''))
        : el('tr', {}, el('td', { colspan: 4, class: 'empty' }, 'No steps yet.')),
    );
  }
}

function perfRow(row: RankAverages, maxMs: number): HTMLTableRowElement {
  const b = row.breakdownMs;
  const bar = el('div', { class: 'stack', role: 'img', 'aria-label': BREAKDOWN_PARTS.map((p) => `${BREAKDOWN_NAME[p]} ${b[p].toFixed(1)} ms`).join(', ') });
  bar.style.width = `${(100 * row.totalMs) / maxMs}%`;
  for (const p of BREAKDOWN_PARTS) {
    if (!(b[p] > 0)) continue;
    const seg = el('span', { class: `seg seg-${p}`, title: `${BREAKDOWN_NAME[p]}: ${b[p].toFixed(1)} ms` });
    seg.style.flexGrow = String(b[p]);
    bar.append(seg);
  }
  const figures = el('div', { class: 'stack-figures' }, ...BREAKDOWN_PARTS.map((p) => el('span', { class: `fig fig-${p}` }, `${BREAKDOWN_NAME[p]} ${fmtMs(b[p])}`)));
  // DDP runs: what the rank sent per step (--comm-hook).
  if (row.bytesPerStep !== undefined) figures.append(el('span', { class: 'sent' }, `Sent ${fmtBytes(row.bytesPerStep)}/step`));
  // --devices: the rank's Workers and their compute per step.
  if (row.devices) figures.append(el('span', { class: 'devices', 'data-testid': 'rank-devices' }, `${row.devices.count} devices, ${fmtMs(row.devices.meanMs)} each`));
  return el(
    'tr',
    { class: `${row.self ? 'self-row' : ''}${row.lost ? ' lost-row' : ''}`, 'data-rank': row.rank },
    el('th', { scope: 'row' }, el('span', { class: 'rank-swatch', style: `background:${rankColour(row.rank)}` }), `rank ${row.rank}`, row.self ? el('span', { class: 'you' }, ' (this tab)') : ''),
    el('td', { class: 'num', 'data-unit': 'samples/s' }, fmtInt(row.samplesPerSec)),
    el('td', { class: 'num', 'data-unit': 'per step' }, fmtMs(row.totalMs)),
    el('td', { class: 'bar-col' }, bar, figures),
  );
}

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
      el('caption', { class: 'visually-hidden' }, 'Pipeline stages: the layers each holds, its parameters, the ranks holding it and its measured bubble'),
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
      { class: 'pp-timeline', 'data-testid': 'pipeline-timeline', 'data-step': '', 'data-boxes': 0, 'aria-labelledby': 'pp-timeline-title', 'aria-describedby': 'pp-timeline-caption', hidden: true },
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
    setText(this.shape, `${panel.shape} · this tab holds stage ${panel.selfStage}${panel.stages[0] && panel.stages[0].ranks.length > 1 ? ` of replica ${panel.selfReplica}` : ''}`);
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
              el('span', { class: `pp-rank${row.lost.includes(r) ? ' lost' : ''}`, title: row.lost.includes(r) ? `rank ${r} (lost)` : `rank ${r}` }, el('span', { class: 'rank-swatch', style: `background:${rankColour(r)}` }), `${r}`),
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
        el('span', { class: 'tl-label', 'aria-hidden': 'true' }, `stage ${row.stage}`, row.self ? el('span', { class: 'you' }, ' (this tab)') : ''),
        el(
          'div',
          { class: 'tl-track' },
          ...row.boxes.map((b) =>
            el(
              'span',
              { class: `tl-box tl-${b.phase}`, role: 'img', 'aria-label': b.label, title: b.label, style: `left:${pct(b.left)};width:${pct(b.width)}`, 'data-phase': b.phase, 'data-micro-batch': b.microBatch },
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
        ...model.ticks.map((t) => el('span', { class: `tl-tick${t.at === 0 ? ' first' : t.at > 0.97 ? ' last' : ''}`, style: `left:${pct(t.at)}` }, t.label)),
      ),
    );
    this.rows.replaceChildren(...rows, axis);
  }
}

/** Figures as a definition list (label above, figure below), one `data-figure` per item. */
function figureList(figures: readonly PsFigure[], className: string): HTMLDListElement {
  return el(
    'dl',
    { class: `summary-list ps-figures ${className}` },
    ...figures.map((f) =>
      el('div', { class: `summary-item${f.warn ? ' warn' : ''}`, 'data-figure': f.key }, el('dt', {}, f.label), el('dd', {}, f.warn ? el('span', { 'aria-hidden': 'true' }, '⚠ ') : '', f.value)),
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
      el('caption', { class: 'visually-hidden' }, 'Parameter-server layout: each server with the parameters it holds, and the workers, with their ranks now'),
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
      { class: 'ps-staleness', 'data-testid': 'ps-staleness', 'data-total': 0, 'aria-labelledby': 'ps-staleness-title', 'aria-describedby': 'ps-staleness-caption' },
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
          { class: row.self ? 'self-row' : '', 'data-role': row.role, 'data-id': row.id, 'data-rank': row.rank, 'data-self': row.self ? 'true' : 'false' },
          el('th', { scope: 'row' }, row.name, row.self ? el('span', { class: 'you' }, ' (this tab)') : ''),
          el('td', { class: 'pp-ranks' }, el('span', { class: 'rank-swatch', style: `background:${rankColour(row.rank)}` }), `rank ${row.rank}`),
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
        const bar = el('span', { class: `ps-bar${b.tail ? ' tail' : ''}`, role: 'img', 'aria-label': b.ariaLabel, title: b.ariaLabel, 'data-staleness': b.staleness, 'data-count': b.count });
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

/** The event log, newest first; only entries it has not drawn yet are added. */
export class LogView {
  readonly node: HTMLElement;
  private readonly list: HTMLOListElement;
  /** Id of the first entry not drawn yet. */
  private drawnUpTo = 0;

  constructor() {
    this.list = el('ol', { class: 'event-log', 'data-testid': 'event-log', role: 'log', 'aria-live': 'polite', 'aria-labelledby': 'log-title', tabindex: 0 });
    this.node = el('section', { class: 'card log-card', 'aria-labelledby': 'log-title' }, el('h2', { id: 'log-title', class: 'card-title' }, 'Event log', el('span', { class: 'card-note' }, ' · newest first')), this.list);
  }

  render(s: DashboardState): void {
    const fresh: LogEntry[] = [];
    for (const entry of s.log) {
      if (entry.id < this.drawnUpTo) break;
      fresh.push(entry);
    }
    if (fresh.length === 0) return;
    // Oldest of the new ones first, each on top of the list.
    for (const entry of fresh.reverse()) {
      const at = new Date(entry.at);
      this.list.prepend(
        el(
          'li',
          { class: `log-entry level-${entry.level}`, 'data-level': entry.level },
          el('time', { datetime: at.toISOString() }, fmtClock(at)),
          el('span', { class: 'log-level' }, entry.level === 'info' ? 'info' : entry.level === 'warn' ? 'warning' : 'error'),
          el('span', { class: 'log-msg' }, entry.message),
        ),
      );
    }
    this.drawnUpTo = s.nextLogId;
    while (this.list.childElementCount > MAX_LOG) this.list.lastElementChild?.remove();
  }
}
