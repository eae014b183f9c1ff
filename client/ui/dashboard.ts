/**
 * The training dashboard every rank's tab shows. It is fed TrainEvents (client/train/events.ts)
 * through `handle()`; each one, like the page's own errors and the stop button, goes through the
 * pure reducer in dashboard_state.ts, and the views (view_*.ts, one per panel) draw the new state.
 *
 * Cheap things (status text, progress and its test hooks, the TIME card, facts, ring, log) are drawn on each
 * event; charts, stat cards, the fleet and throughput tables and a pipeline or parameter-server run's panel
 * redraw at most ~4 times a second on an animation frame, so hundreds of steps a second cost one
 * draw per frame.
 */
// Styles in cascade order: the base first, then each panel's (imported by its view), then the dashboard's
// layout and the UI-wide media rules, which override panel rules of the same weight.
import './styles/base.css';
import type { TrainEvent } from '../train/events.ts';
import {
  initialDashboardState,
  reduceDashboard,
  type ControlAction,
  type DashboardEvent,
  type DashboardState,
  type Role,
} from './dashboard_state.ts';
import { downloadBaseName } from './dashboard_controls.ts';
import { displayPhase } from './dashboard_status.ts';
import { el } from './dom.ts';
import { fetchServerInfo, isLoopbackHost } from './server_info.ts';
import { shareableUrl, withOrigin } from './session_link.ts';
import { withToken } from '../../src/wire/session_token.ts';
import { StatsView } from './view_cards.ts';
import { ChartsView } from './view_charts.ts';
import { ErrorBannerView } from './view_error.ts';
import { FactsView } from './view_facts.ts';
import { FleetView } from './view_fleet.ts';
import { HeaderView } from './view_header.ts';
import { LogView } from './view_log.ts';
import { PerfView } from './view_perf.ts';
import { PipelineView } from './view_pipeline.ts';
import { ProgressView } from './view_progress.ts';
import { PsView } from './view_ps.ts';
import { SampleView } from './view_sample.ts';
import { LocalView } from './view_local.ts';
import { SummaryView } from './view_report.ts';
import { RingCardView } from './view_ring.ts';
import { redrawDelay } from './redraw.ts';
import { yieldToEventLoop } from '../../src/runtime/ticker.ts';
import './styles/dashboard_layout.css';
import './styles/base_media.css';

export type { ControlAction, Role } from './dashboard_state.ts';

export interface DashboardOptions {
  session: string;
  /** This tab's link; the dashboard drops the host's secret and the rank before showing it. */
  shareUrl: string;
  /** "Stop training for everyone", after the person confirmed it. */
  onStop: () => void;
  /** "Download model", with the files' base name: "<session>-step-<n>". */
  onDownload: (baseName: string) => void;
  /** "For PyTorch": the model as a torch state dict and its nn.Module, same base name. */
  onDownloadTorch?: (baseName: string) => void;
  /** The host's "End session", after confirming. */
  onEnd?: () => void;
  /** The host's new minimum number of tabs (1..max). */
  onSetMin?: (min: number) => void;
  /** "Skip the evaluation" after the run (the host's tab, or any tab of a session without a host). */
  onSkipEval?: () => void;
  /** "Continue training" after a failure the page said it can train past. */
  onContinue?: () => void;
  /** The host's "Remove" in the group table, after confirming: the tab at `rank` of round `round`. */
  onRemove?: (target: { rank: number; round: number }) => void;
}

export class Dashboard {
  private state: DashboardState;
  private readonly root: HTMLElement;
  private readonly header: HeaderView;
  private readonly banner: ErrorBannerView;
  private readonly facts: FactsView;
  private readonly progress = new ProgressView();
  private readonly summary = new SummaryView();
  private readonly sample = new SampleView();
  private readonly local = new LocalView();
  private readonly stats = new StatsView();
  private readonly charts: ChartsView;
  private readonly ring = new RingCardView();
  private readonly fleet: FleetView;
  private readonly perf = new PerfView();
  private readonly pipeline = new PipelineView();
  private readonly ps = new PsView();
  private readonly log = new LogView();
  /** The frame that draws the cheap parts, if one is requested. */
  private drawNowFrame: number | undefined;
  /** The redraw scheduled, if one is. */
  private renderTimer: ReturnType<typeof setTimeout> | undefined;
  private lastRender = 0;
  /** How long the last redraw took (ms): its parts' time. */
  private renderMs = 0;
  /** A redraw is running (its parts in tasks of their own). */
  private rendering = false;
  /** A redraw asked for while one ran: whether soon; null if none. */
  private renderAgain: boolean | null = null;
  private destroyed = false;

  constructor(host: HTMLElement, options: DashboardOptions) {
    this.state = initialDashboardState({ session: options.session, at: Date.now() });
    this.header = new HeaderView(options.session, {
      stop: () => {
        this.dispatch({ type: 'stop-requested' });
        options.onStop();
      },
      end: () => {
        this.dispatch({ type: 'end-requested' });
        options.onEnd?.();
      },
      setMin: (min) => {
        this.dispatch({ type: 'min-requested', min });
        options.onSetMin?.(min);
      },
      continueTraining: () => {
        if (!this.state.canContinue) return;
        this.dispatch({ type: 'continue-requested' });
        options.onContinue?.();
      },
      skipEval: () => {
        this.dispatch({ type: 'skip-eval-requested' });
        options.onSkipEval?.();
      },
      download: () => options.onDownload(downloadBaseName(this.state)),
      downloadTorch: () => options.onDownloadTorch?.(downloadBaseName(this.state)),
    });
    this.banner = new ErrorBannerView(() => this.clearError());
    const share = shareableUrl(options.shareUrl);
    this.facts = new FactsView(share);
    void this.preferReachableLink(share);
    this.charts = new ChartsView(() => this.scheduleRender(true));
    this.fleet = new FleetView((target) => {
      this.dispatch({ type: 'remove-requested', rank: target.rank });
      options.onRemove?.(target);
    });
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
      this.sample.node,
      this.local.node,
      this.charts.node,
      this.pipeline.node,
      this.ps.node,
      el(
        'section',
        { class: 'system-grid', 'aria-label': 'Distributed system' },
        this.fleet.node,
        this.ring.node,
        this.perf.node,
        this.log.node,
      ),
    );
    host.append(this.root);
    this.drawNow();
  }

  handle(event: TrainEvent): void {
    this.dispatch(event);
  }

  /** Shown or not: a tab of a session on its own pictures shows the dashboard once it joins. */
  setVisible(visible: boolean): void {
    // Its own display (a grid) would win over the hidden attribute's.
    this.root.style.display = visible ? '' : 'none';
  }

  /** A prominent banner that says what went wrong and what the person can do about it. */
  showError(title: string, detail: string, action?: string): void {
    this.dispatch({ type: 'error-shown', title, detail, action });
  }

  /**
   * The run cannot go on (the job threw: a rank lost, config mismatch, server gone for good):
   * show the error and put the whole page in its "failed" state. `canContinue`: the page can
   * train on from here, so a "Continue training" button calls `onContinue`.
   */
  fail(title: string, detail: string, action?: string, opts: { canContinue?: boolean } = {}): void {
    this.dispatch({ type: 'failed', title, detail, action, canContinue: opts.canContinue === true });
  }

  /**
   * What this tab may do: the host's tab gets "Stop training for everyone", "End session" and
   * the minimum; other tabs of a hosted session say the host controls it; a session without a
   * host (the launcher's) keeps the stop button on every tab. A spectator watches a full session.
   */
  setRole(role: Role): void {
    this.dispatch({ type: 'role', host: role.host, hasHost: role.hasHost, spectator: role.spectator });
  }

  /** Whether the page holds a model to download (e.g. still after a failure). */
  setDownloadable(available: boolean): void {
    this.dispatch({ type: 'downloadable', available });
  }

  /** The host stopped the run, ended the session or set a new minimum: every tab says so. */
  controlEvent(action: ControlAction, min?: number): void {
    this.dispatch({ type: 'control', action, min });
  }

  /**
   * The host removed a tab and the session's token changed: the link for more tabs (and its QR
   * code) carries the new one from now on; `reason` is the server's words for what happened.
   */
  linkChanged(token: string, reason: string): void {
    this.facts.setShareUrl(withToken(this.facts.shareUrl, token));
    this.dispatch({ type: 'link-changed', reason });
  }

  /** The group's fault history as the server recorded it (the same on every tab). */
  faultHistory(
    counts: Extract<DashboardEvent, { type: 'faults' }>['counts'],
    entries: Extract<DashboardEvent, { type: 'faults' }>['entries'],
  ): void {
    this.dispatch({ type: 'faults', counts, entries });
  }

  /** The host removed this tab: it stopped, and says so (not as a failure). */
  removed(): void {
    this.dispatch({ type: 'removed' });
  }

  /** The run finished before this tab got a rank: said plainly, not as a failure. */
  watchedEnd(rank: number | null = null): void {
    this.dispatch({ type: 'watched-end', rank });
  }

  /** Every rank is taken and this tab does not spectate: said plainly, not as a failure. */
  full(ranks: number | null = null): void {
    this.dispatch({ type: 'full', ranks });
  }

  clearError(): void {
    this.dispatch({ type: 'error-dismissed' });
  }

  destroy(): void {
    this.destroyed = true;
    if (this.drawNowFrame !== undefined) cancelAnimationFrame(this.drawNowFrame);
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
    this.scheduleDrawNow();
    // What the throttled parts (charts, stat cards, throughput table, pipeline and parameter-server panels) draw from.
    const throttledInputs = [
      next.recent,
      next.lastStep,
      next.lastEval,
      next.summary,
      next.phase,
      next.lost,
      next.self,
      next.config,
      next.pipeline,
      next.timeline,
      next.pipelineRanks,
      next.ps,
      next.fleet,
    ] as const;
    const before = [
      prev.recent,
      prev.lastStep,
      prev.lastEval,
      prev.summary,
      prev.phase,
      prev.lost,
      prev.self,
      prev.config,
      prev.pipeline,
      prev.timeline,
      prev.pipelineRanks,
      prev.ps,
      prev.fleet,
    ] as const;
    // The final figures are drawn at once rather than up to a quarter second later.
    if (throttledInputs.some((v, i) => v !== before[i])) this.scheduleRender(event.type === 'done');
  }

  /**
   * The cheap parts draw once per frame, however many events came in it: a round's start brings
   * an event per rank and per link, each of which redrew the ring and the header (at 32 tabs on
   * two cores, seconds of one task). rAF does not run in a hidden tab, which draws when shown.
   */
  private scheduleDrawNow(): void {
    if (this.drawNowFrame !== undefined) return;
    this.drawNowFrame = requestAnimationFrame(() => {
      this.drawNowFrame = undefined;
      if (!this.destroyed) this.drawNow();
    });
  }

  /** The parts cheap enough to draw at every frame with news. */
  private drawNow(): void {
    const s = this.state;
    this.root.dataset.phase = displayPhase(s);
    this.header.render(s);
    this.banner.render(s);
    this.facts.render(s);
    this.progress.render(s);
    this.stats.renderTime(s);
    this.summary.render(s);
    this.sample.render(s);
    this.local.render(s);
    this.ring.render(s);
    this.log.render(s);
  }

  /**
   * A tab opened as 127.0.0.1 would show a link only this machine can open: when the server
   * says where others reach it (GET /api/info), the link uses that address instead.
   */
  private async preferReachableLink(share: string): Promise<void> {
    // The launcher's headless ranks (they report through __ddpReport) share no links.
    if (!isLoopbackHost(new URL(share).hostname) || window.__ddpReport) return;
    const info = await fetchServerInfo();
    const url = info?.urls[0];
    // The link shown now: its token may have changed while the server was asked.
    if (url && !this.destroyed) this.facts.setShareUrl(withOrigin(this.facts.shareUrl, url));
  }

  private scheduleRender(soon = false): void {
    // A redraw asked for while one runs comes after it (soon if either asked for soon).
    if (this.rendering) {
      this.renderAgain = this.renderAgain === true || soon;
      return;
    }
    // A redraw waiting out the budget is brought forward by one asked for soon (the run's end).
    if (this.renderTimer !== undefined && !soon) return;
    clearTimeout(this.renderTimer);
    const wait = redrawDelay({ now: performance.now(), lastRender: this.lastRender, lastRenderMs: this.renderMs, soon });
    // rAF does not run in hidden tabs, so a background rank spends nothing on drawing until shown.
    this.renderTimer = setTimeout(() => requestAnimationFrame(() => void this.render()), wait);
  }

  /**
   * Each part draws in a task of its own, so that the training's messages and the liveness ticks
   * get the main thread between them: at 32 tabs on two cores a redraw of every part in one task
   * took several seconds, long enough for a tab to be taken for frozen. Its time, for the budget,
   * is the parts' own (uPlot's drawing microtask included), not the waits between them.
   */
  private async render(): Promise<void> {
    this.renderTimer = undefined;
    if (this.destroyed) return;
    this.rendering = true;
    const parts: Array<(s: DashboardState) => void> = [
      ...this.charts.drawParts(),
      (s) => this.stats.render(s),
      (s) => this.perf.render(s),
      (s) => this.fleet.render(s),
      (s) => this.pipeline.render(s),
      (s) => this.ps.render(s),
    ];
    let busy = 0;
    for (const part of parts) {
      if (this.destroyed) return;
      const start = performance.now();
      part(this.state);
      // uPlot draws in a microtask of its own, queued by the part: this await resumes after it.
      await Promise.resolve();
      busy += performance.now() - start;
      await yieldToEventLoop();
    }
    this.rendering = false;
    this.lastRender = performance.now();
    this.renderMs = busy;
    const again = this.renderAgain;
    this.renderAgain = null;
    if (again !== null) this.scheduleRender(again);
  }
}
