/**
 * One launch's run, once checked and its browsers' driver made: the server (unless given), the
 * ranks' pages and their reports, the faults injected as the run passes their steps (--kill,
 * --freeze, --join, --churn, ...), the wait for the end, and the summary.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { ensureBuilt } from '../signaling/build.ts';
import { startServer, type RunningServer, type ServerOptions } from '../signaling/server.ts';
import type { TlsOptions } from '../signaling/tls.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import { parseReport, ReportError, type Report } from '../src/jobs/job_report.ts';
import type { RankDriver, RankTarget } from './driver.ts';
import { describeReport, type HiddenTab, type RankPage } from './rank_page.ts';
import type { RankBrowser } from './rank_browsers.ts';
import type { Lan } from './lan.ts';
import { globalRank, NodeGroup } from './multinode.ts';
import { FaultTimes } from './fault_times.ts';
import { Churn } from './churn.ts';
import type { RankResult } from './summary_fields.ts';
import { failedOutcome, runSummary, type EndedRun } from './run_summary.ts';
import { openRankLink } from './rank_link.ts';
import { browsersPart, lanPart } from './summary_parts.ts';
import { describeFault, describeTarget, type Fault, type FaultTarget, type LaunchOptions, type LaunchOutcome } from './run_options.ts';

/** After a rank fails, how long the others get to report their own failure before the run stops. */
const FAILURE_GRACE_MS = 1500;
/** How long a fault after a join waits for the joined pages to be in a round. */
const JOIN_ADMIT_MS = 60_000;

/** What a run is made with: the checked options, and what launch() prepared. */
export interface RankRunSetup {
  opts: LaunchOptions;
  token: string;
  script: boolean;
  /** The page the ranks open: '/' for a job, the script's own page. */
  entry: string;
  worldSize: number;
  nodes: { nnodes: number; nodeRank: number; localRanks: number[] } | undefined;
  jobParams: Record<string, string>;
  /** In step order; injected ones are taken off. */
  faults: Fault[];
  summaryBase: Record<string, unknown>;
  serverOptions: ServerOptions;
  tls: TlsOptions | undefined;
  lan: Lan | undefined;
  driver: RankDriver;
  /** --browser/--browsers: which browser each page opens in. */
  browserOf: ((index: number) => RankBrowser | undefined) | undefined;
  log: (line: string) => void;
}

export class RankRun implements EndedRun {
  readonly pages: RankPage[] = [];
  readonly failures: string[] = [];
  readonly events: ElasticEvent[] = [];
  /** Pages that got no rank before the run ended (its rendezvous closed): they trained nothing, and that is no failure. */
  readonly arrivedAfterEnd: Array<{ page: number; message: string }> = [];
  /**
   * Pages that trained but were not in the run at its end, told so by the closed rendezvous: a
   * rank whose last round failed as the others finished it, or one that fell out earlier and
   * came back too late.
   */
  readonly leftBeforeEnd: Array<{ page: number; rank: number | null; message: string }> = [];
  /** --hide: each hidden tab, and its page for the timer probe at the end. */
  readonly hidden: HiddenTab[] = [];
  readonly hiddenPages: Array<{ entry: HiddenTab; page: RankTarget }> = [];
  /** The faults as injected, and how long each took to detect and get over. */
  readonly faultTimes = new FaultTimes();
  private server: RunningServer | undefined;
  private nodeGroup: NodeGroup | undefined;
  // --churn: tabs killed, frozen and joining on a clock from the first step.
  private churn: Churn | undefined;
  private wake: () => void = () => {};
  private allSettled = new Promise<void>((r) => (this.wake = r));
  /** The server URL the ranks opened, for the summary. */
  opened: { url?: string } = {};
  private url = '';
  private reachedStep = 0;
  private busy = Promise.resolve();
  private readonly log: (line: string) => void;

  constructor(readonly s: RankRunSetup) {
    this.log = s.log;
  }

  /** The whole run; always closes what it opened. */
  async run(): Promise<LaunchOutcome> {
    try {
      this.url = await this.serve();
      this.opened = { url: this.url };
      await this.openAll();
      const how = await this.untilEnd();
      return await runSummary(this, how);
    } catch (err) {
      this.log(`[launch] ${(err as Error).message}`);
      return failedOutcome(this, [(err as Error).message], []);
    } finally {
      // A run that failed ends its churn too: no fault may outlive the browsers it would hit.
      this.churn?.stop();
      this.nodeGroup?.close();
      await this.s.driver.close();
      await this.server?.close();
      await this.s.lan?.close();
    }
  }

  /** --browser/--browsers: each page's browser, rank and whether it finished, in every summary (summary_parts.ts). */
  browsersPart(): Record<string, unknown> {
    return browsersPart(this.pages, this.s.browserOf);
  }

  /** --lan: each rank's address and rate, in every summary (failures too). */
  lanPart(): Record<string, unknown> {
    return lanPart(this.pages, this.s.lan);
  }

  /** Each running tab's visibility (--tabs). */
  sampleVisibility(): Promise<Array<{ rank: number; state: string }>> {
    return Promise.all(
      this.pages.filter((p) => p.expected).map(async (p) => ({ rank: p.rank ?? p.index, state: await p.page.visibility() })),
    );
  }

  /** The launcher's own server, started (a job's pages built first), or the one given; its URL. */
  private async serve(): Promise<string> {
    const { opts, script, lan, tls, serverOptions, token } = this.s;
    if (opts.server) return opts.server;
    if (!script) await ensureBuilt((l) => this.log(`[launch] ${l}`));
    this.server = await startServer({
      port: 0,
      log: () => {},
      ...(lan ? { host: lan.serverAddress } : {}),
      ...serverOptions,
      ...(tls ? { tls } : {}),
    });
    // The launcher is the session's host: it creates it, so its ranks' links work from any address.
    await this.server.createSession(opts.session, token);
    this.log(`[launch] server on ${this.server.url}`);
    return this.server.url;
  }

  // A rank that failed for good fails the run at once (torchrun's default): the others may wait on it forever.
  private checkSettled(): void {
    if (this.failures.length > 0 || this.pages.every((p) => p.done || !p.expected)) this.wake();
  }

  /** This node's ranks' pages opened (after joining the other nodes), and the churn's clock set. */
  private async openAll(): Promise<void> {
    const { opts, nodes } = this.s;
    const nodeRank = nodes?.nodeRank ?? 0;
    if (nodes) await this.joinNodes(nodes);
    // Every rank's browser first, then their pages: a browser that takes seconds to start (a
    // Firefox rank) does not make its page arrive after the first round has formed without it.
    // (Only with --browser/--browsers: the --tabs driver opens a rank's tab with its link.)
    if (this.s.browserOf) {
      const initial: RankPage[] = [];
      for (let i = 0; i < opts.nproc; i++) initial.push(await this.addPage(globalRank(nodeRank, opts.nproc, i)));
      for (const rp of initial) await this.navigate(rp);
    } else {
      for (let i = 0; i < opts.nproc; i++) await this.openPage(globalRank(nodeRank, opts.nproc, i));
    }
    if (opts.churnEverySec !== undefined) this.churn = this.newChurn(opts.churnEverySec);
    if (opts.tabs)
      this.log(`[launch] visibility at start: ${(await this.sampleVisibility()).map((v) => `rank ${v.rank} ${v.state}`).join(', ')}`);
  }

  /** Another node's failure stops this one too (torchrun's agents fail the whole world). */
  private async joinNodes(nodes: NonNullable<RankRunSetup['nodes']>): Promise<void> {
    const { opts, token, worldSize } = this.s;
    const { nnodes, nodeRank } = nodes;
    this.nodeGroup = await NodeGroup.join(this.url, opts.session, token, nnodes, nodeRank, opts.timeoutSec * 1000);
    this.nodeGroup.watchFailures((message) => {
      if (message.startsWith(`node ${nodeRank} `)) return;
      this.failures.push(message);
      this.wake();
    }, opts.timeoutSec * 1000);
    this.log(`[launch] node ${nodeRank} of ${nnodes}: ranks ${nodes.localRanks.join(', ')} of a world of ${worldSize}`);
  }

  /** --churn SEC: from the first step, a fault every SEC seconds on the page that holds its rank then. */
  private newChurn(everySec: number): Churn {
    const min = Number(this.s.opts.jobParams.min ?? 1);
    const running = () => this.pages.filter((p) => p.expected && !p.done && p.trained && p.rank !== undefined).map((p) => p.rank!);
    return new Churn(everySec * 1000, min, running, (f) => {
      const step = this.reachedStep;
      const fault: Fault = f.kind === 'join' ? { kind: 'join', count: 1, step } : { kind: f.kind, rank: f.rank, step };
      // The page that holds the rank now: by the time the fault's turn comes (after the last
      // fault's injection), a regroup may have given that rank number to another page.
      const page = f.kind === 'join' ? undefined : this.pages.find((p) => p.expected && !p.done && p.trained && p.rank === f.rank);
      this.busy = this.busy
        .then(() => {
          if (page && (!page.expected || page.done))
            return this.log(`[launch] churn: ${describeFault(fault)} skipped: page ${page.index} is no longer running`);
          return this.inject(fault, step, true, page);
        })
        .catch((err: Error) => this.log(`[launch] churn: could not ${describeFault(fault)}: ${err.message}`));
      return this.busy;
    });
  }

  /** Until every expected page is done, one failed (and the others had a moment to say why), or the timeout. */
  private async untilEnd(): Promise<'settled' | 'timeout'> {
    const { opts } = this.s;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<'timeout'>((r) => (timer = setTimeout(() => r('timeout'), opts.timeoutSec * 1000)));
    // A join fault adds pages later: wait again until those have settled too.
    let how: 'settled' | 'timeout' = 'settled';
    for (;;) {
      how = await Promise.race([this.allSettled.then(() => 'settled' as const), timedOut]);
      await this.busy;
      if (this.failures.length > 0) {
        // The first failure is often a consequence (a link its peer's failure closed): give the
        // other pages a moment to report theirs, so that the summary names the cause too.
        for (let waited = 0; waited < FAILURE_GRACE_MS && !this.pages.every((p) => p.done || !p.expected); waited += 100) await sleep(100);
        break;
      }
      if (how === 'timeout' || this.pages.every((p) => p.done || !p.expected)) break;
      this.allSettled = new Promise<void>((r) => (this.wake = r));
      this.checkSettled();
    }
    clearTimeout(timer);
    this.churn?.stop();
    if (this.churn)
      this.log(
        `[launch] churn: ${this.churn.injected} faults injected, every ${opts.churnEverySec} s; ${this.churn.skipped} ticks skipped while a fault was still being injected`,
      );
    return how;
  }

  /** What ended the run, as failures: the pages the timeout caught, faults never injected, no page finished. */
  endFailures(how: 'settled' | 'timeout'): void {
    const { opts, faults } = this.s;
    if (how === 'timeout') {
      const missing = this.pages.filter((p) => p.expected && !p.done);
      this.failures.push(
        `timed out after ${opts.timeoutSec} s waiting for ${missing.map((p) => p.label).join(', ')} to finish job "${opts.job}"`,
      );
      // Where each went quiet: its last report, and how long before the timeout.
      for (const p of missing)
        this.log(
          `[launch] ${p.label} (page ${p.index}): ${p.lastReport ? `last reported ${p.lastReport.what}, ${((Date.now() - p.lastReport.at) / 1000).toFixed(1)} s before the timeout` : 'reported nothing'}`,
        );
    }
    if (faults.length > 0)
      this.failures.push(`the run ended before these faults could be injected: ${faults.map(describeFault).join('; ')}`);
    if (this.failures.length === 0 && this.results().length === 0)
      this.failures.push(`no page finished job "${opts.job}": every one was killed, frozen, or ended without the run`);
  }

  /** The finishing pages' results. */
  results(): RankResult[] {
    return this.pages.filter((p) => p.expected && p.result).map((p) => p.result!);
  }

  /** With --nnodes: this node's outcome for the others, then theirs: the run succeeded only if every node's did. */
  async nodeOutcomes(): Promise<void> {
    const group = this.nodeGroup;
    if (!group) return;
    const { opts, nodes } = this.s;
    await group.report({
      nodeRank: nodes!.nodeRank,
      ok: this.failures.length === 0,
      ...(this.failures.length ? { errors: this.failures } : {}),
    });
    if (this.failures.length > 0) return;
    for (const o of await group.outcomes(opts.timeoutSec * 1000)) {
      if (!o.ok) this.failures.push(`node ${o.nodeRank} failed: ${(o.errors ?? []).join('; ')}`);
    }
  }

  private onStep(step: number): void {
    if (step <= this.reachedStep) return;
    this.reachedStep = step;
    this.churn?.start();
    const { faults } = this.s;
    // Faults run one at a time, in order, as the run passes their step. A join is done when its
    // pages are in a round: a fault after it comes after that, not in the same regroup.
    while (faults.length > 0 && faults[0]!.step <= step) {
      const fault = faults.shift()!;
      this.busy = this.busy
        .then(async () => {
          const before = this.pages.length;
          await this.inject(fault, step);
          if (fault.kind === 'join') await this.untilAdmitted(this.pages.slice(before), fault);
        })
        .catch((err: Error) => {
          this.failures.push(`could not ${describeFault(fault)}: ${err.message}`);
          this.wake();
        });
    }
  }

  /** The running page a fault's target names (a browser: its lowest rank that has one). */
  private runningPage(target: FaultTarget): RankPage {
    const running = this.pages.filter((p) => p.expected && !p.done);
    const page =
      typeof target === 'number'
        ? running.find((p) => p.rank === target)
        : running.filter((p) => (p.browser ?? 'chromium') === target && p.rank !== undefined).sort((a, b) => a.rank! - b.rank!)[0];
    if (!page)
      throw new Error(typeof target === 'number' ? `no running page holds rank ${target}` : `no running ${target} page holds a rank`);
    if (typeof target !== 'number') this.log(`[launch] ${describeTarget(target)} is rank ${page.rank} (page ${page.index})`);
    return page;
  }

  /** Until the pages a join opened are in a round (or done: the run ended), at most JOIN_ADMIT_MS; then the next fault comes anyway. */
  private async untilAdmitted(opened: RankPage[], join: Fault): Promise<void> {
    const t0 = Date.now();
    while (opened.some((p) => !p.trained && !p.done)) {
      if (Date.now() - t0 > JOIN_ADMIT_MS) {
        const waiting = opened.filter((p) => !p.trained && !p.done).map((p) => p.label);
        this.log(
          `[launch] ${waiting.join(', ')} (${describeFault(join)}) not in a round after ${JOIN_ADMIT_MS / 1000} s: the next fault comes without waiting longer`,
        );
        return;
      }
      await sleep(50);
    }
  }

  /** Injects `fault`; `background` (--churn): returns once it has begun, without waiting for a page to close, freeze or load. */
  private async inject(fault: Fault, step: number, background = false, page?: RankPage): Promise<void> {
    // A kill or freeze hits its page, resolved before anything is recorded: a fault that hit nothing is no fault.
    const target = fault.kind === 'kill' || fault.kind === 'freeze' ? (page ?? this.runningPage(fault.rank)) : undefined;
    this.log(`[launch] step ${step}: ${describeFault(fault)}${page ? ` (page ${page.index})` : ''}`);
    const record = this.faultTimes.add({ fault: describeFault(fault), kind: fault.kind, atStep: step });
    switch (fault.kind) {
      case 'kill':
      case 'freeze':
        record.page = target!.index;
        return this.takeOut(fault, target!, background);
      case 'hide': {
        const hidden = this.pages.find((p) => p.rank === fault.rank && !p.done);
        if (!hidden) throw new Error(`no running page holds rank ${fault.rank}`);
        await hidden.page.hide(this.log);
        const entry = { rank: fault.rank, atStep: step };
        this.hidden.push(entry);
        this.hiddenPages.push({ entry, page: hidden.page });
        return;
      }
      case 'lose-device': {
        // The page is still expected to finish: it rebuilds its state and rejoins.
        const lost = this.runningPage(fault.rank);
        record.page = lost.index;
        await lost.page.loseDevice();
        return;
      }
      case 'join':
        record.pages = [];
        for (let i = 0; i < fault.count; i++) {
          record.pages.push(this.pages.length);
          await this.join(background);
        }
        return;
      case 'restart-server':
        return this.restartServer();
    }
  }

  /** A kill or a freeze: the page is out of the run. */
  private async takeOut(fault: Fault & { kind: 'kill' | 'freeze' }, target: RankPage, background: boolean): Promise<void> {
    target.expected = false;
    target.out = fault.kind === 'kill' ? 'killed' : 'frozen';
    const done = fault.kind === 'kill' ? target.page.kill() : target.page.freeze(this.log);
    // --churn: the clock goes on while the page closes or freezes (beside 32 training tabs
    // on two cores a busy page took 40 s to close, and the ticks meanwhile would be lost).
    if (background)
      void done
        .catch((err: Error) => this.log(`[launch] churn: could not ${describeFault(fault)}: ${err.message}`))
        .finally(() => this.checkSettled());
    else await done;
    this.checkSettled();
  }

  /** One more page; `background` (--churn): its page loads while the clock goes on (a minute or more beside 32 training tabs). */
  private async join(background: boolean): Promise<void> {
    if (!background) return this.openPage(undefined);
    const rp = await this.addPage(undefined);
    this.navigate(rp).catch((err: Error) => {
      this.log(`[launch] churn: ${rp.label} did not open: ${err.message}`);
      rp.expected = false;
      this.checkSettled();
    });
  }

  private async restartServer(): Promise<void> {
    const { opts, lan, tls, serverOptions, token } = this.s;
    const port = this.server!.port;
    await this.server!.close();
    this.server = await startServer({
      port,
      log: () => {},
      ...(lan ? { host: lan.serverAddress } : {}),
      ...serverOptions,
      ...(tls ? { tls } : {}),
    });
    await this.server.createSession(opts.session, token);
    this.log(`[launch] server restarted on port ${port}`);
  }

  /** A rank's page, blank: its browser started and its handlers wired. `navigate` opens the rank's link in it. */
  private async addPage(rank: number | undefined): Promise<RankPage> {
    const index = this.pages.length;
    const rp = { index, label: rank === undefined ? `page ${index}` : `rank ${rank}`, rank, expected: true, done: false } as RankPage;
    // Every driver feeds this one handler.
    rp.page = await this.s.driver.newRank({
      onReport: (r) => this.onReport(rp, r),
      onConsole: (line) => this.log(`[${rp.label}] ${line}`),
      onCrash: (reason) => this.finish(rp, `${rp.label}: ${reason}`),
    });
    if (this.s.browserOf) rp.browser = this.s.browserOf(index);
    this.pages.push(rp);
    return rp;
  }

  private finish(rp: RankPage, failure?: string): void {
    if (rp.done) return;
    rp.done = true;
    if (failure && rp.expected) this.failures.push(failure);
    this.checkSettled();
  }

  /** A page's report: checked at the boundary (it comes from a page), then followed. */
  private onReport(rp: RankPage, raw: unknown): void {
    let r: Report;
    try {
      r = parseReport(raw);
    } catch (err) {
      if (!(err instanceof ReportError)) throw err;
      this.finish(rp, `${rp.label} sent a report that is not one: ${err.message}`);
      return;
    }
    rp.lastReport = { what: describeReport(r), at: Date.now() };
    switch (r.type) {
      case 'rank':
        rp.rank = r.rank;
        rp.label = `rank ${r.rank}`;
        return;
      case 'elastic':
        this.onEvent(rp, r.event);
        return;
      case 'result':
        rp.result = { rank: rp.rank ?? rp.index, ...r.result } as RankResult;
        this.finish(rp);
        return;
      case 'error':
        this.onError(rp, r);
        return;
    }
  }

  private onEvent(rp: RankPage, e: ElasticEvent): void {
    // Robust runs: every rank reports every step's judgments, which the pages' results add up
    // (their `aggregation`); kept here they would grow with ranks x ranks x steps.
    if (e.type !== 'aggregation') this.events.push(e);
    if (e.type === 'round') {
      rp.trained = true;
      rp.rank = e.rank;
      rp.label = `rank ${e.rank}`;
    }
    this.faultTimes.onEvent(rp.index, e);
    if (e.type === 'step') this.onStep(e.step);
    // The run is over, or its last step is done: no more churn (a tab killed or frozen now
    // would only miss the summary, and leave the others nothing to regroup for).
    if (e.type === 'end' || (e.type === 'step' && e.step >= e.totalSteps)) this.churn?.stop();
  }

  private onError(rp: RankPage, r: Extract<Report, { type: 'error' }>): void {
    // torch's agents arriving after the end get RendezvousClosedError and exit: a tab
    // that opened late (or waited beyond a full group) missed the run, it did not fail it.
    if (r.name === 'RendezvousClosedError' && !rp.trained) {
      rp.expected = false;
      this.arrivedAfterEnd.push({ page: rp.index, message: r.message });
      this.log(`[launch] ${rp.label} arrived after the run ended and trained nothing: ${r.message}`);
    } else if (r.name === 'RendezvousClosedError') {
      // The others finished the run without it: a lost rank, as a killed one is, not a failed run.
      rp.expected = false;
      rp.out = 'ended without it';
      this.leftBeforeEnd.push({ page: rp.index, rank: rp.rank ?? null, message: r.message });
      this.log(`[launch] ${rp.label} trained, but the run ended without it: ${r.message}`);
    }
    this.finish(rp, `${rp.label}: ${r.name}: ${r.message}`);
  }

  /** Opens the rank's link in its page (rank_link.ts). */
  private navigate(rp: RankPage): Promise<void> {
    return openRankLink(rp, this.s, this.url);
  }

  private async openPage(rank: number | undefined): Promise<void> {
    return this.navigate(await this.addPage(rank));
  }
}
