/**
 * The training dashboard every rank's tab shows. It is fed TrainEvents (client/train/events.ts)
 * through `handle()`; each one, like the page's own errors and the stop button, goes through the
 * pure reducer in dashboard_state.ts, and the views in dashboard_views.ts draw the new state.
 *
 * Cheap things (status text, progress and its test hooks, facts, ring, log) are drawn on each
 * event; charts, stat cards and the throughput table redraw at most ~4 times a second on an
 * animation frame, so hundreds of steps a second cost one draw per frame.
 */
import type { TrainEvent } from '../train/events.ts';
import { initialDashboardState, reduceDashboard, type DashboardEvent, type DashboardState } from './dashboard_state.ts';
import { ChartsView, ErrorBannerView, FactsView, HeaderView, LogView, PerfView, ProgressView, RingCardView, StatsView, SummaryView } from './dashboard_views.ts';
import { el } from './dom.ts';
import './dashboard.css';

export interface DashboardOptions {
  session: string;
  shareUrl: string;
  onStop: () => void;
  onDownload: () => void;
}

const MIN_REDRAW_MS = 250;

export class Dashboard {
  private state: DashboardState;
  private readonly root: HTMLElement;
  private readonly header: HeaderView;
  private readonly banner: ErrorBannerView;
  private readonly facts: FactsView;
  private readonly progress = new ProgressView();
  private readonly summary = new SummaryView();
  private readonly stats = new StatsView();
  private readonly charts: ChartsView;
  private readonly ring = new RingCardView();
  private readonly perf = new PerfView();
  private readonly log = new LogView();
  private renderPending = false;
  private lastRender = 0;
  private destroyed = false;

  constructor(host: HTMLElement, options: DashboardOptions) {
    this.state = initialDashboardState({ session: options.session, at: Date.now() });
    this.header = new HeaderView(options.session, {
      stop: () => {
        this.dispatch({ type: 'stop-requested' });
        options.onStop();
      },
      download: () => options.onDownload(),
    });
    this.banner = new ErrorBannerView(() => this.clearError());
    this.facts = new FactsView(options.shareUrl);
    this.charts = new ChartsView(() => this.scheduleRender(true));
    this.root = el(
      'div',
      // The page's #app is a live region; switch that off here so chart redraws are not read out.
      // The status line, error banner and log are their own live regions.
      { class: 'ddp-ui dashboard', 'aria-live': 'off' },
      this.header.node,
      this.banner.node,
      this.facts.node,
      this.progress.node,
      this.summary.node,
      this.stats.node,
      this.charts.node,
      el('section', { class: 'system-grid', 'aria-label': 'Distributed system' }, this.ring.node, this.perf.node, this.log.node),
    );
    host.append(this.root);
    this.drawNow();
  }

  handle(event: TrainEvent): void {
    this.dispatch(event);
  }

  /** A prominent banner that says what went wrong and what the person can do about it. */
  showError(title: string, detail: string, action?: string): void {
    this.dispatch({ type: 'error-shown', title, detail, action });
  }

  /**
   * The run cannot go on (the job threw: a rank lost, config mismatch, server gone for good):
   * show the error and put the whole page in its "failed" state.
   */
  fail(title: string, detail: string, action?: string): void {
    this.dispatch({ type: 'failed', title, detail, action });
  }

  clearError(): void {
    this.dispatch({ type: 'error-dismissed' });
  }

  destroy(): void {
    this.destroyed = true;
    this.charts.destroy();
    this.root.remove();
  }

  private dispatch(event: DashboardEvent): void {
    if (this.destroyed) return;
    const prev = this.state;
    const next = reduceDashboard(prev, { at: Date.now(), event });
    this.state = next;
    if (event.type === 'step' || event.type === 'eval') this.charts.take(event);
    if (next === prev) return;
    this.drawNow();
    // What the throttled parts (charts, stat cards, throughput table) draw from.
    const throttledInputs = [next.recent, next.lastStep, next.lastEval, next.summary, next.phase, next.lost, next.self, next.config] as const;
    const before = [prev.recent, prev.lastStep, prev.lastEval, prev.summary, prev.phase, prev.lost, prev.self, prev.config] as const;
    // The final figures are drawn at once rather than up to a quarter second later.
    if (throttledInputs.some((v, i) => v !== before[i])) this.scheduleRender(event.type === 'done');
  }

  /** The parts cheap enough to draw on every event. */
  private drawNow(): void {
    const s = this.state;
    this.root.dataset.phase = s.phase;
    this.header.render(s);
    this.banner.render(s);
    this.facts.render(s);
    this.progress.render(s);
    this.summary.render(s);
    this.ring.render(s);
    this.log.render(s);
  }

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
    this.charts.draw(this.state);
    this.stats.render(this.state);
    this.perf.render(this.state);
  }
}
