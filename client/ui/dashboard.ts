/**
 * The training dashboard every rank's tab shows. It is fed TrainEvents (client/train/events.ts)
 * through `handle()` and keeps everything it draws in its own state, so the order of events
 * only has to be roughly right (e.g. a 'step' before 'joined' still plots).
 *
 * Cheap things (status text, progress attributes, test hooks) update synchronously on each
 * event; charts, stat cards and the throughput table redraw at most ~4 times a second on an
 * animation frame, so hundreds of steps a second cost one draw per frame.
 */
import type { BackendName, RankStepMetrics, StepBreakdownMs, TrainConfig, TrainEvent } from '../train/events.ts';
import { MetricChart, StepTable } from './charts.ts';
import { RingView } from './ring_view.ts';
import { el, fmtClock, fmtDuration, fmtInt, fmtNumber, fmtPercent, rankColour, shareField } from './dom.ts';
import './dashboard.css';

export interface DashboardOptions {
  session: string;
  shareUrl: string;
  onStop: () => void;
  onDownload: () => void;
}

type Phase = 'connecting' | 'waiting' | 'starting' | 'training' | 'done' | 'stopped' | 'failed';
type LogLevel = 'info' | 'warn' | 'error';
type StepEvent = Extract<TrainEvent, { type: 'step' }>;

const PHASE_LABEL: Record<Phase, string> = {
  connecting: 'Connecting',
  waiting: 'Waiting for tabs',
  starting: 'Starting',
  training: 'Training',
  done: 'Done',
  stopped: 'Stopped',
  failed: 'Failed',
};

/** Recent steps kept per rank for averages (throughput, time breakdown, stat cards). */
const RECENT = 20;
const MIN_REDRAW_MS = 250;
const MAX_LOG = 400;
const PHASES: Array<keyof StepBreakdownMs> = ['compute', 'readback', 'allreduce', 'apply'];
const PHASE_NAME: Record<keyof StepBreakdownMs, string> = { compute: 'Compute', readback: 'Readback', allreduce: 'All-reduce', apply: 'Apply' };

export class Dashboard {
  // ---- state ----
  private config: TrainConfig | null = null;
  private worldSize: number | null = null;
  private selfRank: number | null = null;
  private backend: { name: BackendName; adapter: string | null; fallbackReason?: string } | null = null;
  private joined = new Set<number>();
  private lost = new Set<number>();
  private links = new Map<number, { state: 'connecting' | 'open' | 'closed'; throughputMBps?: number }>();
  private phase: Phase = 'connecting';
  private shard: Extract<TrainEvent, { type: 'shard' }> | null = null;
  private lastStep: StepEvent | null = null;
  private stepClock: Array<{ step: number; t: number }> = [];
  private recent = new Map<number, RankStepMetrics[]>();
  private rankSet = new Set<number>();
  private lastEval: Extract<TrainEvent, { type: 'eval' }> | null = null;
  private bestEval: number | null = null;
  private stoppedBy: { by: number; atStep: number } | null = null;
  private summary: Record<string, unknown> | null = null;
  /** 'done' arrived: the model exists (also after a stop, which the trainer follows with 'done'). */
  private finished = false;
  /** Title of the error that ended the run, set by fail(). */
  private failure: string | null = null;
  /** Epoch numbering of the job: torch-style 0-based or 1-based, decided by the first epoch seen. */
  private epochBase: 0 | 1 | null = null;
  private readonly table = new StepTable();
  private smoothing = 0.6;

  // ---- rendering ----
  private readonly root: HTMLElement;
  private readonly statusEl: HTMLElement;
  private readonly phasePill: HTMLElement;
  private readonly errorBanner: HTMLElement;
  private readonly facts: Record<'rank' | 'backend' | 'shard' | 'job', HTMLElement>;
  private readonly progressEl: HTMLProgressElement;
  private readonly progressWrap: HTMLElement;
  private readonly progressText: HTMLElement;
  private readonly stats: Record<'loss' | 'acc' | 'test' | 'speed' | 'time', { value: HTMLElement; sub: HTMLElement }>;
  private readonly lossHost: HTMLElement;
  private readonly accHost: HTMLElement;
  private readonly lossChart: MetricChart;
  private readonly accChart: MetricChart;
  private readonly ring = new RingView();
  private readonly perfBody: HTMLTableSectionElement;
  private readonly perfFoot: HTMLTableSectionElement;
  private readonly logList: HTMLOListElement;
  private readonly stopButton: HTMLButtonElement;
  private readonly downloadButton: HTMLButtonElement;
  private readonly summaryCard: HTMLElement;
  private renderPending = false;
  private lastRender = 0;
  private destroyed = false;

  constructor(
    host: HTMLElement,
    private readonly options: DashboardOptions,
  ) {
    this.statusEl = el('p', { class: 'status-line', role: 'status', 'data-testid': 'status' }, 'Connecting to the server…');
    this.phasePill = el('span', { class: 'phase-pill', 'data-phase': 'connecting' }, PHASE_LABEL.connecting);
    this.stopButton = el('button', { type: 'button', class: 'btn btn-danger', 'data-testid': 'stop-button' }, 'Stop training for everyone');
    this.downloadButton = el('button', { type: 'button', class: 'btn btn-primary', 'data-testid': 'download-button', disabled: true, 'aria-describedby': 'download-hint' }, 'Download model');
    this.stopButton.addEventListener('click', () => {
      this.stopButton.disabled = true;
      this.stopButton.textContent = 'Stopping…';
      this.log('info', 'Stop requested by this tab.');
      this.options.onStop();
    });
    this.downloadButton.addEventListener('click', () => this.options.onDownload());

    const share = shareField('dash-share', 'Link for more tabs', options.shareUrl);

    this.errorBanner = el('div', { class: 'error-banner', role: 'alert', 'data-testid': 'error-banner', hidden: true });

    const fact = (label: string, key: string) => {
      const dd = el('dd', { 'data-fact': key }, '–');
      return { node: el('div', { class: 'fact' }, el('dt', {}, label), dd), dd };
    };
    const fRank = fact('This tab', 'rank');
    const fBackend = fact('Backend', 'backend');
    const fShard = fact('Data shard', 'shard');
    const fJob = fact('Job', 'job');
    this.facts = { rank: fRank.dd, backend: fBackend.dd, shard: fShard.dd, job: fJob.dd };

    this.progressEl = el('progress', { id: 'dash-progress', max: 1, value: 0, 'aria-describedby': 'dash-progress-text' });
    this.progressText = el('p', { id: 'dash-progress-text', class: 'progress-text' }, 'No steps yet.');
    this.progressWrap = el(
      'section',
      { class: 'card progress-card', 'data-testid': 'progress', 'data-step': 0, 'data-total': 0, 'data-done': 'false', 'aria-labelledby': 'dash-progress-label' },
      el('label', { id: 'dash-progress-label', for: 'dash-progress', class: 'card-title' }, 'Progress'),
      this.progressEl,
      this.progressText,
    );

    const stat = (label: string, key: string) => {
      const value = el('p', { class: 'stat-value' }, '–');
      const sub = el('p', { class: 'stat-sub' }, '');
      return { node: el('div', { class: 'stat', 'data-stat': key }, el('p', { class: 'stat-label' }, label), value, sub), value, sub };
    };
    const sLoss = stat('Train loss', 'loss');
    const sAcc = stat('Train accuracy', 'acc');
    const sTest = stat('Test accuracy', 'test');
    const sSpeed = stat('Throughput', 'speed');
    const sTime = stat('Time', 'time');
    this.stats = { loss: sLoss, acc: sAcc, test: sTest, speed: sSpeed, time: sTime };

    this.lossHost = el('div', { class: 'chart-host' });
    this.accHost = el('div', { class: 'chart-host' });
    const emptyNote = () => el('p', { class: 'chart-empty' }, 'Waiting for the first step…');
    const logInput = el('input', { id: 'dash-logscale', type: 'checkbox' });
    logInput.addEventListener('change', () => {
      this.lossChart.setLogScale(logInput.checked);
      this.scheduleRender(true);
    });
    const lossCard = el(
      'figure',
      { class: 'card chart-card', 'data-testid': 'loss-chart', 'data-ranks': '', 'data-points': 0, 'data-eval-points': 0, 'aria-labelledby': 'loss-title' },
      el(
        'figcaption',
        { class: 'chart-head' },
        el('span', { id: 'loss-title', class: 'card-title' }, 'Loss per step', el('span', { class: 'card-note' }, ' · one line per rank, ● test loss')),
        el('label', { class: 'check', for: 'dash-logscale' }, logInput, 'Log scale'),
      ),
      this.lossHost,
      emptyNote(),
    );
    const accCard = el(
      'figure',
      { class: 'card chart-card', 'data-testid': 'accuracy-chart', 'data-ranks': '', 'data-points': 0, 'data-eval-points': 0, 'aria-labelledby': 'acc-title' },
      el('figcaption', { class: 'chart-head' }, el('span', { id: 'acc-title', class: 'card-title' }, 'Accuracy per step', el('span', { class: 'card-note' }, ' · train batch per rank, ● test set'))),
      this.accHost,
      emptyNote(),
    );
    this.lossChart = new MetricChart(this.lossHost, { prefix: 'loss', evalColumn: 'evalLoss', evalLabel: 'test loss', yLabel: 'loss', percent: false });
    this.accChart = new MetricChart(this.accHost, { prefix: 'acc', evalColumn: 'evalAcc', evalLabel: 'test accuracy', yLabel: 'accuracy', percent: true });

    const smoothInput = el('input', { id: 'dash-smoothing', type: 'range', min: 0, max: 0.95, step: 0.05, value: this.smoothing });
    const smoothOut = el('output', { for: 'dash-smoothing', id: 'dash-smoothing-value' }, this.smoothing.toFixed(2));
    smoothInput.addEventListener('input', () => {
      this.smoothing = Number(smoothInput.value);
      smoothOut.textContent = this.smoothing.toFixed(2);
      this.scheduleRender(true);
    });

    this.perfBody = el('tbody');
    this.perfFoot = el('tfoot');
    const perfTable = el(
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
      this.perfBody,
      this.perfFoot,
    );
    const perfLegend = el('ul', { class: 'perf-legend', 'aria-hidden': 'true' }, ...PHASES.map((p) => el('li', {}, el('span', { class: `swatch seg-${p}` }), PHASE_NAME[p])));

    this.logList = el('ol', { class: 'event-log', 'data-testid': 'event-log', role: 'log', 'aria-live': 'polite', 'aria-labelledby': 'log-title', tabindex: 0 });
    this.summaryCard = el('section', { class: 'card summary-card', hidden: true, 'aria-labelledby': 'summary-title' });

    this.root = el(
      'div',
      // The page's #app is a live region; switch that off here so chart redraws are not read out.
      // The status line, error banner and log are their own live regions.
      { class: 'ddp-ui dashboard', 'aria-live': 'off' },
      el(
        'header',
        { class: 'dash-header' },
        el(
          'div',
          { class: 'title-row' },
          el('h1', {}, el('span', { class: 'title-kicker' }, 'Session '), el('span', { class: 'session-name' }, options.session)),
          this.phasePill,
          el('div', { class: 'actions' }, this.stopButton, this.downloadButton),
        ),
        this.statusEl,
        el('p', { id: 'download-hint', class: 'visually-hidden' }, 'Available when training is done.'),
      ),
      this.errorBanner,
      el('section', { class: 'card facts-card', 'aria-label': 'This tab and the job' }, el('dl', { class: 'dash-facts' }, fRank.node, fBackend.node, fShard.node, fJob.node), share.root),
      this.progressWrap,
      this.summaryCard,
      el('section', { class: 'stats', 'aria-label': 'Latest figures' }, sLoss.node, sAcc.node, sTest.node, sSpeed.node, sTime.node),
      el(
        'section',
        { class: 'charts-section', 'aria-labelledby': 'charts-title' },
        el(
          'div',
          { class: 'section-head' },
          el('h2', { id: 'charts-title' }, 'Metrics'),
          el('div', { class: 'smoothing' }, el('label', { for: 'dash-smoothing' }, 'Smoothing'), smoothInput, smoothOut),
        ),
        el('div', { class: 'charts-grid' }, lossCard, accCard),
      ),
      el(
        'section',
        { class: 'system-grid', 'aria-label': 'Distributed system' },
        el('section', { class: 'card ring-card', 'aria-labelledby': 'ring-title' }, el('h2', { id: 'ring-title', class: 'card-title' }, 'Ring all-reduce'), this.ring.element),
        el(
          'section',
          { class: 'card perf-card', 'aria-labelledby': 'perf-title' },
          el('h2', { id: 'perf-title', class: 'card-title' }, 'Throughput and step time per rank'),
          el('div', { class: 'table-scroll' }, perfTable),
          perfLegend,
          el('p', { id: 'perf-note', class: 'card-note' }, `Averages over the last ${RECENT} steps. All-reduce time includes waiting for the slowest rank.`),
        ),
        el('section', { class: 'card log-card', 'aria-labelledby': 'log-title' }, el('h2', { id: 'log-title', class: 'card-title' }, 'Event log', el('span', { class: 'card-note' }, ' · newest first')), this.logList),
      ),
    );
    host.append(this.root);
    this.updateRing();
    this.updateFacts();
    this.log('info', `Opened session “${options.session}”.`);
  }

  // ---------------------------------------------------------------- public API

  handle(event: TrainEvent): void {
    if (this.destroyed) return;
    switch (event.type) {
      case 'config':
        this.config = event.config;
        this.worldSize ??= event.config.worldSize;
        this.log('info', `Job: ${describeJob(event.config)}.`);
        this.updateFacts();
        this.updateRing();
        break;
      case 'joined': {
        this.selfRank = event.rank;
        this.worldSize = event.worldSize;
        this.joined.add(event.rank);
        this.backend = { name: event.backend, adapter: event.adapter, fallbackReason: event.fallbackReason };
        if (this.phase === 'connecting') this.phase = 'waiting';
        const how = event.fallbackReason ? `, a fallback from ${this.config?.backend ?? 'the requested backend'}` : event.adapter ? `, ${event.adapter}` : '';
        this.log(event.fallbackReason ? 'warn' : 'info', `This tab joined as rank ${event.rank} of ${event.worldSize} (backend ${event.backend}${how}).`);
        this.updateFacts();
        this.updateRing();
        break;
      }
      case 'waiting': {
        const before = [...this.joined].sort((a, b) => a - b).join(',');
        const now = new Set(event.joined);
        // Someone who had joined and is gone again while the group was training: lost.
        if (this.phase === 'training') {
          for (const r of this.joined) if (!now.has(r)) this.markLost(r, 'left the session');
        }
        this.joined = now;
        this.worldSize = event.worldSize;
        // Before training, the group can still fill up or lose a tab again.
        if (this.phase === 'connecting' || this.phase === 'waiting' || this.phase === 'starting') {
          this.phase = event.joined.length >= event.worldSize ? 'starting' : 'waiting';
        }
        const after = [...now].sort((a, b) => a - b).join(',');
        if (after !== before) this.log('info', `Joined: rank ${event.joined.length ? [...now].sort((a, b) => a - b).join(', ') : 'none yet'} (${event.joined.length} of ${event.worldSize}).`);
        this.updateFacts();
        this.updateRing();
        break;
      }
      case 'shard': {
        this.noteEpoch(event.epoch);
        this.shard = event;
        if (this.phase === 'connecting' || this.phase === 'waiting') this.phase = 'starting';
        this.log('info', `Epoch ${this.epochLabel(event.epoch)}: this rank's shard is ${fmtInt(event.samples)} of ${fmtInt(event.datasetSize)} samples, ${fmtInt(event.stepsPerEpoch)} steps.`);
        this.updateFacts();
        break;
      }
      case 'link': {
        const prev = this.links.get(event.peer);
        this.links.set(event.peer, { state: event.state, throughputMBps: event.throughputMBps ?? (event.state === 'open' ? prev?.throughputMBps : undefined) });
        if (prev?.state !== event.state) {
          const tp = event.throughputMBps !== undefined ? ` (${event.throughputMBps.toFixed(1)} MB/s)` : '';
          this.log(event.state === 'closed' && this.phase === 'training' ? 'warn' : 'info', `Link to rank ${event.peer}: ${event.state}${tp}.`);
        } else if (event.throughputMBps !== undefined && prev.throughputMBps === undefined) {
          this.log('info', `Link to rank ${event.peer}: measured ${event.throughputMBps.toFixed(1)} MB/s.`);
        }
        if (event.state === 'closed' && this.phase === 'training') this.markLost(event.peer, 'its link closed during training');
        this.updateRing();
        break;
      }
      case 'step':
        this.onStep(event);
        break;
      case 'eval': {
        this.noteEpoch(event.epoch);
        this.table.set('evalAcc', event.step, event.testAccuracy);
        this.table.set('evalLoss', event.step, event.testLoss);
        this.lastEval = event;
        this.bestEval = Math.max(this.bestEval ?? -Infinity, event.testAccuracy);
        this.log('info', `Eval at step ${event.step} (epoch ${this.epochLabel(event.epoch)}): test accuracy ${fmtPercent(event.testAccuracy, 2)}, test loss ${fmtNumber(event.testLoss, 4)}.`);
        this.updateChartHooks();
        this.scheduleRender();
        break;
      }
      case 'log':
        this.log(event.level, event.message);
        break;
      case 'rank-lost':
        this.log('error', `Lost rank ${event.rank}: ${event.reason}.`);
        if (!this.finished) {
          this.markLost(event.rank, '', false);
          this.updateRing();
        }
        break;
      case 'stopped':
        this.stoppedBy = { by: event.by, atStep: event.atStep };
        if (!this.finished && this.phase !== 'failed') this.phase = 'stopped';
        this.stopButton.disabled = true;
        this.stopButton.textContent = 'Stopped';
        this.log('warn', `Training stopped by rank ${event.by}${event.by === this.selfRank ? ' (this tab)' : ''} at step ${event.atStep}.`);
        this.updateRing();
        this.updateProgress();
        this.scheduleRender();
        break;
      case 'done':
        this.summary = event.summary;
        this.finished = true;
        // A stopped run still ends with 'done'; keep saying who stopped it.
        if (this.phase !== 'stopped' && this.phase !== 'failed') this.phase = 'done';
        this.stopButton.disabled = true;
        this.stopButton.textContent = this.phase === 'stopped' ? 'Stopped' : 'Training finished';
        this.downloadButton.disabled = false;
        this.log('info', `${this.phase === 'stopped' ? 'Finished after the stop' : 'Done'}. ${summaryLine(event.summary)}`);
        this.renderSummary();
        this.updateRing();
        this.updateProgress();
        this.scheduleRender(true);
        break;
      default:
        // A newer event kind this dashboard does not know yet: ignore rather than break the page.
        break;
    }
    this.updateStatus();
  }

  /** A prominent banner that says what went wrong and what the person can do about it. */
  showError(title: string, detail: string, action?: string): void {
    const dismiss = el('button', { type: 'button', class: 'btn btn-quiet', 'aria-label': 'Dismiss this message' }, 'Dismiss');
    dismiss.addEventListener('click', () => this.clearError());
    this.errorBanner.replaceChildren(
      el('span', { class: 'error-icon', 'aria-hidden': 'true' }, '!'),
      el('div', { class: 'error-body' }, el('p', { class: 'error-title' }, title), el('p', { class: 'error-detail' }, detail), ...(action ? [el('p', { class: 'error-action' }, el('strong', {}, 'What to do: '), action)] : [])),
      dismiss,
    );
    this.errorBanner.hidden = false;
    this.errorBanner.dataset.title = title;
    this.log('error', `${title}: ${detail}`);
  }

  /**
   * The run cannot go on (the job threw: a rank lost, config mismatch, server gone for good):
   * show the error and put the whole page in its "failed" state.
   */
  fail(title: string, detail: string, action?: string): void {
    this.failure = title;
    if (!this.finished) this.phase = 'failed';
    this.stopButton.disabled = true;
    this.showError(title, detail, action);
    this.updateRing();
    this.updateProgress();
    this.updateStatus();
    this.scheduleRender();
  }

  clearError(): void {
    this.errorBanner.hidden = true;
    this.errorBanner.replaceChildren();
    delete this.errorBanner.dataset.title;
  }

  /**
   * Grey out a rank that is gone. The event stream has no "rank left" event, so this is also
   * inferred from a 'waiting' event that drops a rank, or this tab's link to it closing mid-run.
   */
  markRankLost(rank: number, reason = 'lost'): void {
    this.markLost(rank, reason);
    this.updateRing();
    this.updateStatus();
  }

  destroy(): void {
    this.destroyed = true;
    this.lossChart.destroy();
    this.accChart.destroy();
    this.root.remove();
  }

  // ---------------------------------------------------------------- events

  private onStep(e: StepEvent): void {
    this.noteEpoch(e.epoch);
    if (this.phase !== 'done' && this.phase !== 'stopped' && this.phase !== 'failed') this.phase = 'training';
    if (this.worldSize === null || e.ranks.length > this.worldSize) this.worldSize = e.ranks.length;
    const firstStep = this.lastStep === null;
    const newEpoch = this.lastStep !== null && e.epoch !== this.lastStep.epoch;
    this.lastStep = e;
    for (const m of e.ranks) {
      this.table.set(`loss:${m.rank}`, e.step, m.loss);
      this.table.set(`acc:${m.rank}`, e.step, m.accuracy);
      this.rankSet.add(m.rank);
      // A rank that reports figures has plainly joined.
      this.joined.add(m.rank);
      let list = this.recent.get(m.rank);
      if (!list) this.recent.set(m.rank, (list = []));
      list.push(m);
      if (list.length > RECENT) list.shift();
    }
    this.stepClock.push({ step: e.step, t: e.elapsedSec });
    if (this.stepClock.length > RECENT + 1) this.stepClock.shift();
    if (firstStep) {
      this.log('info', `Training started: first step done with ${e.ranks.length} rank${e.ranks.length === 1 ? '' : 's'}.`);
      this.updateRing();
    }
    if (newEpoch) this.log('info', `Epoch ${this.epochLabel(e.epoch)} started at step ${e.step}.`);
    this.updateProgress();
    this.updateChartHooks();
    this.scheduleRender();
  }

  private noteEpoch(epoch: number): void {
    if (this.epochBase === null) this.epochBase = epoch === 0 ? 0 : 1;
  }

  /** 1-based epoch for people, whatever the job counts from. */
  private epochLabel(epoch: number): string {
    return String(epoch + (this.epochBase === 0 ? 1 : 0));
  }

  private epochOf(epoch: number): string {
    const total = this.config && this.config.steps === null ? ` of ${this.config.epochs}` : '';
    return `${this.epochLabel(epoch)}${total}`;
  }

  private markLost(rank: number, reason: string, log = true): void {
    if (this.lost.has(rank)) return;
    this.lost.add(rank);
    if (log) this.log('error', `Rank ${rank} lost: ${reason}.`);
  }

  private log(level: LogLevel, message: string): void {
    const now = new Date();
    const li = el(
      'li',
      { class: `log-entry level-${level}`, 'data-level': level },
      el('time', { datetime: now.toISOString() }, fmtClock(now)),
      el('span', { class: 'log-level' }, level === 'info' ? 'info' : level === 'warn' ? 'warning' : 'error'),
      el('span', { class: 'log-msg' }, message),
    );
    this.logList.prepend(li);
    while (this.logList.childElementCount > MAX_LOG) this.logList.lastElementChild?.remove();
  }

  // ---------------------------------------------------------------- synchronous updates

  private updateStatus(): void {
    const text = this.statusText();
    if (this.statusEl.textContent !== text) this.statusEl.textContent = text;
    if (this.phasePill.dataset.phase !== this.phase) {
      this.phasePill.dataset.phase = this.phase;
      this.phasePill.textContent = PHASE_LABEL[this.phase];
    }
    this.root.dataset.phase = this.phase;
  }

  private statusText(): string {
    const list = (s: Iterable<number>) => [...s].sort((a, b) => a - b).join(', ');
    const lostNote = this.lost.size ? ` Lost: rank ${list(this.lost)}.` : '';
    switch (this.phase) {
      case 'connecting':
        return 'Connecting to the server…';
      case 'waiting': {
        const world = this.worldSize ?? this.config?.worldSize;
        if (world === undefined) return 'Waiting for the other tabs…';
        const more = Math.max(0, world - this.joined.size);
        const joined = this.joined.size ? ` (joined: ${list(this.joined)})` : '';
        return `Waiting for ${more} more tab${more === 1 ? '' : 's'}${joined}. Share the link below.`;
      }
      case 'starting':
        return `All ${this.worldSize ?? ''} tabs joined. Connecting the ring and loading data…`.replace('  ', ' ');
      case 'training': {
        const e = this.lastStep;
        const w = this.worldSize ?? 0;
        return `Training${e ? ` (epoch ${this.epochOf(e.epoch)})` : ''} on ${w || '?'} rank${w === 1 ? '' : 's'}.${lostNote}`;
      }
      case 'done': {
        const final = this.finalTestAccuracy();
        const acc = final !== null ? ` Final test accuracy ${fmtPercent(final)}.` : '';
        const steps = this.lastStep ? ` ${fmtInt(this.lastStep.step)} steps in ${fmtDuration(this.lastStep.elapsedSec)}.` : '';
        return `Done.${steps}${acc} The model can be downloaded.`;
      }
      case 'failed':
        return `Training failed${this.lastStep ? ` at step ${fmtInt(this.lastStep.step)}` : ''}: ${this.failure ?? 'see the message below'}.`;
      case 'stopped': {
        const s = this.stoppedBy;
        if (!s) return 'Stopped.';
        const who = s.by === this.selfRank ? `rank ${s.by} (this tab)` : `rank ${s.by}`;
        const final = this.finalTestAccuracy();
        const after = this.finished ? `${final !== null ? ` Test accuracy ${fmtPercent(final)}.` : ''} The model trained so far can be downloaded.` : '';
        return `Stopped by ${who} at step ${fmtInt(s.atStep)}.${lostNote}${after}`;
      }
    }
  }

  private updateFacts(): void {
    const world = this.worldSize ?? this.config?.worldSize;
    const worldText = world ? ` · world size ${world}` : '';
    this.facts.rank.textContent = this.selfRank === null ? `joining…${worldText}` : `rank ${this.selfRank}${worldText}`;
    this.facts.rank.style.setProperty('--rank-colour', this.selfRank === null ? 'transparent' : rankColour(this.selfRank));
    this.facts.rank.classList.toggle('has-rank', this.selfRank !== null);

    const b = this.backend;
    if (b) {
      const cpuOnly = b.name === 'wasm' || b.name === 'cpu';
      const parts: Array<Node | string> = [el('strong', {}, b.name), b.adapter ? ` · ${b.adapter}` : cpuOnly ? ' · on the CPU' : ' · adapter not reported'];
      if (b.fallbackReason) parts.push(el('span', { class: 'fallback' }, `⚠ Fallback from ${this.config?.backend ?? 'the requested backend'}: ${b.fallbackReason}`));
      this.facts.backend.replaceChildren(...parts);
    } else if (this.config) {
      this.facts.backend.textContent = `${this.config.backend} (requested)`;
    }

    const s = this.shard;
    this.facts.shard.textContent = s ? `${fmtInt(s.samples)} of ${fmtInt(s.datasetSize)} samples · epoch ${this.epochOf(s.epoch)} · ${fmtInt(s.stepsPerEpoch)} steps/epoch` : '–';

    const c = this.config;
    this.facts.job.textContent = c ? describeJob(c) : '–';
  }

  private finalTestAccuracy(): number | null {
    const fromSummary = this.summary?.testAccuracy;
    if (typeof fromSummary === 'number' && Number.isFinite(fromSummary)) return fromSummary;
    return this.lastEval?.testAccuracy ?? null;
  }

  private updateProgress(): void {
    const e = this.lastStep;
    const total = e?.totalSteps ?? 0;
    const step = e?.step ?? 0;
    this.progressEl.max = Math.max(total, 1);
    this.progressEl.value = this.phase === 'done' && total > 0 ? total : Math.min(step, total || 1);
    this.progressWrap.dataset.step = String(step);
    this.progressWrap.dataset.total = String(total);
    this.progressWrap.dataset.done = String(this.finished);
    this.progressWrap.dataset.state = this.phase;
  }

  /** Test hooks on the chart cards, kept exact on every event (the canvases lag by a frame). */
  private updateChartHooks(): void {
    const ranks = [...this.rankSet].sort((a, b) => a - b);
    for (const [card, prefix, evalCol] of [
      [this.lossHost.parentElement, 'loss', 'evalLoss'],
      [this.accHost.parentElement, 'acc', 'evalAcc'],
    ] as const) {
      if (!card) continue;
      const withPoints = ranks.filter((r) => this.table.count(`${prefix}:${r}`) > 0);
      card.dataset.ranks = withPoints.join(',');
      card.dataset.points = String(withPoints.reduce((n, r) => n + this.table.count(`${prefix}:${r}`), 0));
      card.dataset.evalPoints = String(this.table.count(evalCol));
      card.classList.toggle('has-data', this.table.x.length > 0);
    }
  }

  private updateRing(): void {
    this.ring.update({
      worldSize: this.worldSize ?? this.config?.worldSize ?? Math.max(1, this.joined.size),
      self: this.selfRank,
      joined: this.joined,
      lost: this.lost,
      observedLinks: this.links,
      ringProven: this.lastStep !== null,
      active: this.phase === 'training',
    });
  }

  // ---------------------------------------------------------------- throttled rendering

  private scheduleRender(soon = false): void {
    if (this.renderPending) return;
    this.renderPending = true;
    const wait = soon ? 0 : Math.max(0, this.lastRender + MIN_REDRAW_MS - performance.now());
    // rAF does not run in hidden tabs, so a background rank spends nothing on drawing until shown.
    setTimeout(() => requestAnimationFrame(() => this.render()), wait);
  }

  private render(): void {
    this.renderPending = false;
    if (this.destroyed) return;
    this.lastRender = performance.now();
    const ranks = [...this.rankSet].sort((a, b) => a - b);
    if (this.table.x.length > 0) {
      this.lossChart.render(this.table, ranks, this.selfRank, this.smoothing);
      this.accChart.render(this.table, ranks, this.selfRank, this.smoothing);
    }
    this.renderProgressText();
    this.renderStats();
    this.renderPerf();
  }

  private stepRate(): number | null {
    const c = this.stepClock;
    if (c.length >= 2) {
      const a = c[0]!;
      const b = c[c.length - 1]!;
      if (b.t > a.t && b.step > a.step) return (b.step - a.step) / (b.t - a.t);
    }
    const e = this.lastStep;
    return e && e.elapsedSec > 0 ? e.step / e.elapsedSec : null;
  }

  private eta(): number | null {
    const e = this.lastStep;
    const rate = this.stepRate();
    if (!e || !rate) return null;
    return Math.max(0, (e.totalSteps - e.step) / rate);
  }

  private renderProgressText(): void {
    const e = this.lastStep;
    if (!e) return;
    const pct = e.totalSteps > 0 ? Math.floor((100 * e.step) / e.totalSteps) : 0;
    const rate = this.stepRate();
    const eta = this.eta();
    const parts = [`Epoch ${this.epochOf(e.epoch)}`, `step ${fmtInt(e.step)} / ${fmtInt(e.totalSteps)} (${pct}%)`];
    if (this.phase === 'done') parts.push(`finished in ${fmtDuration(e.elapsedSec)}`);
    else if (this.phase === 'stopped') parts.push(`stopped after ${fmtDuration(e.elapsedSec)}`);
    else if (this.phase === 'failed') parts.push(`failed after ${fmtDuration(e.elapsedSec)}`);
    else {
      if (rate) parts.push(`${rate >= 10 ? rate.toFixed(0) : rate.toFixed(1)} steps/s`);
      parts.push(eta === null ? 'estimating time left…' : `about ${fmtDuration(eta)} left`);
    }
    this.progressText.textContent = parts.join(' · ');
  }

  private renderStats(): void {
    const mean = (f: (m: RankStepMetrics) => number) => {
      let sum = 0;
      let n = 0;
      for (const list of this.recent.values()) {
        for (const m of list) {
          const v = f(m);
          if (!Number.isFinite(v)) continue;
          sum += v;
          n++;
        }
      }
      return n ? sum / n : NaN;
    };
    const e = this.lastStep;
    if (e) {
      const loss = mean((m) => m.loss);
      this.stats.loss.value.textContent = fmtNumber(loss, loss < 1 ? 4 : 3);
      this.stats.loss.sub.textContent = `all ranks, last ${Math.min(RECENT, this.stepClock.length)} steps`;
      this.stats.acc.value.textContent = fmtPercent(mean((m) => m.accuracy));
      this.stats.acc.sub.textContent = 'training batches, same window';
      const total = this.totalSamplesPerSec();
      this.stats.speed.value.replaceChildren(fmtInt(total), el('span', { class: 'unit' }, ' samples/s'));
      this.stats.speed.sub.textContent = `${this.recent.size} rank${this.recent.size === 1 ? '' : 's'} · global batch ${this.config ? fmtInt(this.config.batchSize * e.ranks.length) : '?'}`;
      this.stats.time.value.textContent = fmtDuration(e.elapsedSec);
      const eta = this.eta();
      this.stats.time.sub.textContent = this.phase === 'done' ? 'total training time' : this.phase === 'stopped' ? 'until stopped' : this.phase === 'failed' ? 'until it failed' : eta === null ? 'elapsed' : `elapsed · about ${fmtDuration(eta)} left`;
    }
    const ev = this.lastEval;
    const final = this.summary?.testAccuracy;
    const finalLoss = this.summary?.testLoss;
    if (this.finished && typeof final === 'number') {
      // The trainer evaluates once more at the end (e.g. after a stop) without an 'eval' event.
      this.stats.test.value.textContent = fmtPercent(final);
      this.stats.test.sub.textContent = `final${typeof finalLoss === 'number' ? `, loss ${fmtNumber(finalLoss, 3)}` : ''}`;
    } else if (ev) {
      this.stats.test.value.textContent = fmtPercent(ev.testAccuracy);
      const best = this.bestEval !== null && this.bestEval > ev.testAccuracy ? ` · best ${fmtPercent(this.bestEval)}` : '';
      this.stats.test.sub.textContent = `at step ${fmtInt(ev.step)}, loss ${fmtNumber(ev.testLoss, 3)}${best}`;
    } else if (e) {
      this.stats.test.sub.textContent = 'no evaluation yet';
    }
  }

  private totalSamplesPerSec(): number {
    let total = 0;
    for (const list of this.recent.values()) total += avg(list.map((m) => m.samplesPerSec));
    return total;
  }

  private renderPerf(): void {
    const ranks = [...this.recent.keys()].sort((a, b) => a - b);
    const rows = ranks.map((r) => {
      const list = this.recent.get(r)!;
      const b = Object.fromEntries(PHASES.map((p) => [p, avg(list.map((m) => m.breakdownMs[p]))])) as Record<keyof StepBreakdownMs, number>;
      const totalMs = PHASES.reduce((s, p) => s + b[p], 0);
      return { rank: r, sps: avg(list.map((m) => m.samplesPerSec)), b, totalMs };
    });
    const maxMs = Math.max(1, ...rows.map((r) => r.totalMs));
    this.perfBody.replaceChildren(
      ...rows.map((row) => {
        const bar = el('div', { class: 'stack', role: 'img', 'aria-label': PHASES.map((p) => `${PHASE_NAME[p]} ${row.b[p].toFixed(1)} ms`).join(', ') });
        bar.style.width = `${(100 * row.totalMs) / maxMs}%`;
        for (const p of PHASES) {
          if (row.b[p] <= 0) continue;
          const seg = el('span', { class: `seg seg-${p}`, title: `${PHASE_NAME[p]}: ${row.b[p].toFixed(1)} ms` });
          seg.style.flexGrow = String(row.b[p]);
          bar.append(seg);
        }
        const figures = el('div', { class: 'stack-figures' }, ...PHASES.map((p) => el('span', { class: `fig fig-${p}` }, `${PHASE_NAME[p]} ${fmtMs(row.b[p])}`)));
        const isSelf = row.rank === this.selfRank;
        const tr = el(
          'tr',
          { class: `${isSelf ? 'self-row' : ''}${this.lost.has(row.rank) ? ' lost-row' : ''}`, 'data-rank': row.rank },
          el('th', { scope: 'row' }, el('span', { class: 'rank-swatch', style: `background:${rankColour(row.rank)}` }), `rank ${row.rank}`, isSelf ? el('span', { class: 'you' }, ' (this tab)') : ''),
          el('td', { class: 'num', 'data-unit': 'samples/s' }, fmtInt(row.sps)),
          el('td', { class: 'num', 'data-unit': 'per step' }, fmtMs(row.totalMs)),
          el('td', { class: 'bar-col' }, bar, figures),
        );
        return tr;
      }),
    );
    this.perfFoot.replaceChildren(
      rows.length
        ? el('tr', {}, el('th', { scope: 'row' }, 'All ranks'), el('td', { class: 'num', 'data-unit': 'samples/s' }, fmtInt(rows.reduce((s, r) => s + r.sps, 0))), el('td', { class: 'num' }, ''), el('td', { class: 'bar-col' }, ''))
        : el('tr', {}, el('td', { colspan: 4, class: 'empty' }, 'No steps yet.')),
    );
  }

  private renderSummary(): void {
    const s = this.summary;
    if (!s) return;
    const entries = summaryEntries(s);
    this.summaryCard.replaceChildren(
      el('h2', { id: 'summary-title', class: 'card-title' }, 'Run summary'),
      entries.length
        ? el('dl', { class: 'summary-list' }, ...entries.map(({ label, value }) => el('div', { class: 'summary-item' }, el('dt', {}, label), el('dd', {}, value))))
        : el('p', {}, 'Training finished.'),
    );
    this.summaryCard.hidden = false;
  }
}

// ---------------------------------------------------------------- helpers

function avg(xs: number[]): number {
  const ok = xs.filter(Number.isFinite);
  return ok.length ? ok.reduce((a, b) => a + b, 0) / ok.length : NaN;
}

function fmtMs(ms: number): string {
  return Number.isFinite(ms) ? `${ms >= 100 ? ms.toFixed(0) : ms.toFixed(1)} ms` : '–';
}

function describeJob(c: TrainConfig): string {
  const length = c.steps !== null ? `${fmtInt(c.steps)} steps` : `${c.epochs} epoch${c.epochs === 1 ? '' : 's'}`;
  return `${c.model} on ${c.dataset} · ${c.optimizer} lr ${c.lr} · batch ${c.batchSize}/rank (${c.batchSize * c.worldSize} global) · ${length}`;
}

/** "testAccuracy" -> "Test accuracy"; duration keys lose their unit ("elapsedSec" -> "Elapsed"). */
function humanKey(k: string): string {
  const base = isDurationKey(k) ? k.replace(/_?(sec|seconds)$/i, '') : k.replace(/Ms$/, '');
  if (base === '') return 'Time';
  const words = base.replace(/([a-z0-9])([A-Z])/g, '$1 $2').replace(/[_-]+/g, ' ').toLowerCase();
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/** Keys like elapsedSec / seconds are durations; samplesPerSec is not. */
function isDurationKey(k: string): boolean {
  return !/per ?sec/i.test(k) && /(sec|seconds)$/i.test(k);
}

function fmtSummaryValue(k: string, v: unknown): string {
  if (v === null || v === undefined) return '–';
  if (k === 'stoppedBy' && typeof v === 'number') return `rank ${v}`;
  if (typeof v === 'number') {
    if (/acc/i.test(k) && v >= 0 && v <= 1) return fmtPercent(v, 2);
    if (isDurationKey(k)) return fmtDuration(v);
    if (/Ms$/.test(k)) return fmtMs(v);
    if (/per ?sec/i.test(k)) return fmtInt(v);
    return fmtNumber(v, 4);
  }
  return String(v);
}

/** Shown already in the header, or not for people (the weights themselves, index lists). */
const SUMMARY_SKIP = new Set(['rank', 'worldSize', 'backend', 'model', 'dataset', 'weights']);
const SUMMARY_FIRST = ['testAccuracy', 'testLoss', 'finalLoss', 'steps', 'epochs', 'seconds', 'elapsedSec', 'samplesPerSec', 'stoppedBy', 'weightHash'];

/**
 * The summary's scalar entries, most interesting first. One level of nested numbers (the
 * trainer's breakdownMs) is flattened; arrays and long strings are left out.
 */
function summaryEntries(s: Record<string, unknown>): Array<{ key: string; label: string; value: string }> {
  const out: Array<{ key: string; label: string; value: string }> = [];
  const scalar = (v: unknown) => v === null || typeof v === 'number' || typeof v === 'boolean' || (typeof v === 'string' && v.length <= 80);
  for (const [k, v] of Object.entries(s)) {
    if (SUMMARY_SKIP.has(k)) continue;
    if (scalar(v)) out.push({ key: k, label: humanKey(k), value: fmtSummaryValue(k, v) });
    else if (v && typeof v === 'object' && !Array.isArray(v)) {
      const inner = Object.entries(v as Record<string, unknown>);
      if (inner.length > 0 && inner.length <= 8 && inner.every(([, x]) => x === null || typeof x === 'number')) {
        const unitKey = /Ms$/.test(k) ? 'Ms' : '';
        for (const [sub, x] of inner) out.push({ key: k, label: `${humanKey(k)}: ${sub}`, value: fmtSummaryValue(`${sub}${unitKey}`, x) });
      }
    }
  }
  const order = (key: string) => {
    const i = SUMMARY_FIRST.indexOf(key);
    return i < 0 ? SUMMARY_FIRST.length : i;
  };
  return out.sort((a, b) => order(a.key) - order(b.key));
}

function summaryLine(s: Record<string, unknown>): string {
  return summaryEntries(s)
    .slice(0, 6)
    .map((e) => `${e.label}: ${e.value}`)
    .join(', ');
}
