/**
 * Runs one job or user script on N headless ranks (the body of the launcher, callable from
 * benchmarks and tests), with fault injection for elastic runs: kill or freeze a rank's page at
 * a step, lose its WebGPU device, open more pages at a step, restart the server at a step.
 */
import { ensureBuilt } from '../signaling/build.ts';
import { startServer, type RunningServer, type ServerOptions } from '../signaling/server.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import { newSessionToken, withToken } from '../src/wire/session_token.ts';
import { keptCertificate, type TlsOptions } from '../signaling/tls.ts';
import { headlessDriver, type RankDriver, type RankTarget } from './driver.ts';
import { trustArgs } from './browser.ts';
import { tabsDriver } from './tabs.ts';
import { firefoxProblems, mixedDriver, opensIn, type BrowserPlan, type RankBrowser } from './rank_browsers.ts';
import { checkLanSupport, createLan, type Lan, type LanOptions } from './lan.ts';
import { lanDriver } from './lan_driver.ts';
import { findTurnserver } from './turn.ts';
import { buildScript } from './build_script.ts';
import { checkMultiNode, globalRank, NodeGroup } from './multinode.ts';
import { summarize, summarizeScript } from './summaries.ts';
import { commLine } from './summary_comm.ts';
import { devicesLine } from './summary_devices.ts';
import type { RankResult } from './summary_fields.ts';
import { parameterServerLines, type ParameterServerSummary } from './summary_ps.ts';
import { largestWorld, parameterServerFlagsFor, parameterServerParams, parameterServerRun, slowParam, trainFlagProblems, trainJobProblem } from './job_flags.ts';
import type { Report } from '../src/jobs/job_report.ts';
import { FaultTimes } from './fault_times.ts';
import { Churn } from './churn.ts';
import { setTimeout as sleep } from 'node:timers/promises';

/** After a rank fails, how long the others get to report their own failure before the run stops. */
const FAILURE_GRACE_MS = 1500;
/** How long a fault after a join waits for the joined pages to be in a round. */
const JOIN_ADMIT_MS = 60_000;

/**
 * The rank a fault hits: its number, or a browser (--browser, --browsers): the lowest rank
 * running in that browser when the fault comes. An elastic run numbers its ranks in the order
 * they arrive, so in a mixed fleet a rank's number does not say which browser holds it.
 */
export type FaultTarget = number | RankBrowser;

/** "rank 1", or "the firefox rank". */
export function describeTarget(t: FaultTarget): string {
  return typeof t === 'number' ? `rank ${t}` : `the ${t} rank`;
}

/** A fault to inject once the run reaches `step` (as reported by any rank). */
export type Fault =
  | { kind: 'kill'; rank: FaultTarget; step: number }
  | { kind: 'freeze'; rank: FaultTarget; step: number }
  /** Put the rank's tab in the background (--tabs only). */
  | { kind: 'hide'; rank: number; step: number }
  /** Destroy the rank's WebGPU device, as a driver reset loses it: the rank rebuilds and rejoins. */
  | { kind: 'lose-device'; rank: FaultTarget; step: number }
  | { kind: 'join'; count: number; step: number }
  | { kind: 'restart-server'; step: number };

export interface LaunchOptions {
  nproc: number;
  /** A built-in job of the page, or the path of a user script (a module whose default export trains). */
  job: string;
  /** The script's own arguments (for a script). */
  scriptArgs?: string[];
  /** Use this server instead of starting one. */
  server?: string;
  /**
   * The launcher's own server serves https and wss with the self-signed certificate kept in
   * certs/ (made if needed), and the ranks' Chromium trusts exactly that certificate.
   */
  https?: boolean;
  /** The certificate (PEM) of `server`, for the ranks to trust (a self-signed server's certs/cert.pem). */
  serverCert?: string;
  session: string;
  /** The session's secret; the pages get it in their links' fragments. Default: a new one. */
  token?: string;
  timeoutSec: number;
  /** Passed to the job as URL parameters (min, max and backend for a script). */
  jobParams: Record<string, string>;
  faults?: Fault[];
  /** --churn SEC: from the first step, every SEC seconds a tab is killed, joins, is frozen, joins, ... (see churn.ts). */
  churnEverySec?: number;
  /** Options for the server the launcher starts. */
  serverOptions?: ServerOptions;
  /** Run the ranks as tabs of a headful Chromium under Xvfb, with default background throttling. */
  tabs?: boolean;
  /** With `tabs`: start intensive throttling after this many seconds hidden (see TabsOptions). */
  intensiveThrottlingAfterSec?: number;
  /** Machines in the world (torchrun's --nnodes), each running a launcher with `nproc` ranks. Default 1. */
  nnodes?: number;
  /** This machine's place among them, 0..nnodes-1 (torchrun's --node-rank). Default 0. */
  nodeRank?: number;
  /**
   * A LAN in a box (launcher/lan.ts): every rank a Chromium of its own in its own network
   * namespace on a bridge, its link shaped to its rate; the server listens on the bridge. Root only.
   * `isolate`: the ranks cannot reach each other; `turn`: a TURN relay (coturn) for the run.
   */
  lan?: LanOptions;
  /** More Chromium flags for each rank's browser (--lan). */
  rankChromiumArgs?: string[];
  /**
   * The browser of each rank (--browser, --browsers): Chromium or Firefox, and of pages opened by
   * --join. Default: every rank a headless page of one Chromium.
   */
  browsers?: BrowserPlan;
  /** Where rank-prefixed lines go. Default: console.log. */
  log?: (line: string) => void;
}

export interface LaunchOutcome {
  ok: boolean;
  summary: Record<string, unknown>;
  /** Each finishing rank's own result, as the page returned it. */
  results: RankResult[];
}

interface RankPage {
  index: number;
  page: RankTarget;
  label: string;
  rank: number | undefined;
  /** Killed or frozen pages are not expected to finish, nor are pages that arrived after the run ended. */
  expected: boolean;
  done: boolean;
  /** The page trained in a round (an elastic 'round' event): it was part of the run. */
  trained?: boolean;
  /** Its browser, with --browser or --browsers. */
  browser?: RankBrowser;
  result?: RankResult;
  /** The page's last report and when: what a timeout names for a page that went quiet. */
  lastReport?: { what: string; at: number };
  /** The fault that took it out of the run, or that the run ended without it (RendezvousClosedError). */
  out?: 'killed' | 'frozen' | 'ended without it';
}

/** How long the launcher's server waits for more tabs once the minimum is in, before the first round (`--last-call`). */
export const LAST_CALL_MS = 5_000;

export function describeFault(f: Fault): string {
  switch (f.kind) {
    case 'kill':
      return `kill ${describeTarget(f.rank)} at step ${f.step}`;
    case 'freeze':
      return `freeze ${describeTarget(f.rank)} at step ${f.step}`;
    case 'hide':
      return `hide rank ${f.rank}'s tab at step ${f.step}`;
    case 'lose-device':
      return `lose ${describeTarget(f.rank)}'s WebGPU device at step ${f.step}`;
    case 'join':
      return `open ${f.count} more rank(s) at step ${f.step}`;
    case 'restart-server':
      return `restart the server at step ${f.step}`;
  }
}

/** A page's report in a few words, for a timeout's message. */
function describeReport(r: Report): string {
  switch (r.type) {
    case 'rank':
      return `its rank (${r.rank} of ${r.worldSize})`;
    case 'elastic': {
      const e = r.event;
      const at = 'step' in e && typeof e.step === 'number' ? ` at step ${e.step}` : '';
      return `the elastic event '${e.type}'${'round' in e && typeof e.round === 'string' ? ` of round ${e.round}` : ''}${at}`;
    }
    default:
      return `'${r.type}'`;
  }
}

/** A job name that is a file path: a user script. */
export function isScript(job: string): boolean {
  return /\.(ts|js|mts|mjs)$/.test(job);
}

export async function launch(opts: LaunchOptions): Promise<LaunchOutcome> {
  // Pages' console lines and store values can carry a peer's words (an abort notice): no control
  // characters (terminal escape sequences, fake line breaks) reach the terminal.
  const print = opts.log ?? ((line: string) => console.log(line));
  const log = (line: string) => print(printable(line));
  const token = opts.token ?? newSessionToken();
  const script = isScript(opts.job);
  const nnodes = opts.nnodes ?? 1;
  const nodeRank = opts.nodeRank ?? 0;
  const problems = checkMultiNode({ nnodes, nodeRank, server: opts.server, token: opts.token, sessionGiven: true });
  if (problems.length > 0) throw new Error(problems.join('\n'));
  const worldSize = nnodes * opts.nproc;
  const nodes = nnodes > 1 ? { nnodes, nodeRank, localRanks: Array.from({ length: opts.nproc }, (_, i) => globalRank(nodeRank, opts.nproc, i)) } : undefined;
  const summaryBase = { [script ? 'script' : 'job']: opts.job, worldSize, ...(nodes ? { nodes } : {}) };
  const events: ElasticEvent[] = [];
  let server: RunningServer | undefined;
  // A script is served as its own page, built by Vite next to the built-in one.
  let entry = '/';
  if (script) {
    try {
      entry = await buildScript(opts.job, (l) => log(`[launch] ${l}`));
    } catch (err) {
      const message = `could not build ${opts.job}: ${(err as Error).message}`;
      log(`[launch] FAILED ${message}`);
      return { ok: false, summary: { ...summaryBase, ok: false, errors: [message] }, results: [] };
    }
  }
  if (opts.job === 'train') {
    const problems = trainFlagProblems(opts.jobParams, { nproc: opts.nproc, nnodes });
    if (problems.length > 0) throw new Error(problems.join('\n'));
  }
  const psFlags = script ? [] : parameterServerFlagsFor(opts.job, opts.jobParams);
  if (psFlags.length > 0) throw new Error(`${psFlags.join(', ')} ${psFlags.length > 1 ? 'are' : 'is'} for --job train, not --job ${opts.job}`);
  // A parameter-server run is elastic by default: a lost worker must not pause the others.
  const jobParams = opts.job === 'train' ? parameterServerParams(opts.jobParams) : opts.jobParams;
  const psRun = opts.job === 'train' ? parameterServerRun(jobParams) : null;
  if (psRun && opts.jobParams.min === undefined) {
    log(`[launch] --strategy ${psRun.strategy}: ${psRun.servers} server${psRun.servers === 1 ? '' : 's'} and ${worldSize - psRun.servers} worker${worldSize - psRun.servers === 1 ? '' : 's'}, elastic down to --min ${jobParams.min} (give --min to change it)`);
  }
  if (opts.jobParams.slow !== undefined) {
    if (!script && opts.job !== 'train') throw new Error(`--slow is for --job train and scripts, not --job ${opts.job}`);
    slowParam([opts.jobParams.slow], largestWorld(opts.jobParams, { nproc: opts.nproc, nnodes }));
  }
  if (opts.job === 'train') {
    // Every other rule of the job's options, as the pages will check them: refused here, before any page opens.
    const problem = trainJobProblem(jobParams, worldSize);
    if (problem) throw new Error(problem);
  }
  const faults = [...(opts.faults ?? [])].sort((a, b) => a.step - b.step);
  if (faults.some((f) => f.kind === 'restart-server') && opts.server) {
    throw new Error('--restart-server needs the launcher to run its own server; drop --server');
  }
  if (faults.some((f) => f.kind === 'hide') && !opts.tabs) {
    throw new Error('--hide needs --tabs: headless pages are never in the background');
  }
  if (opts.intensiveThrottlingAfterSec !== undefined && !opts.tabs) {
    throw new Error('--intensive-throttling-after needs --tabs: headless pages are never throttled');
  }
  if (opts.https && opts.server) {
    throw new Error("--https serves the launcher's own server over TLS; for a server already running, give its URL (https://...) and, if self-signed, its certificate with --server-cert FILE");
  }
  let tls: TlsOptions | undefined;
  if (opts.https) {
    try {
      tls = await keptCertificate({ log: (l) => log(`[launch] ${l}`) });
    } catch (err) {
      const message = `could not make a certificate for --https: ${(err as Error).message}`;
      log(`[launch] FAILED ${message}`);
      return { ok: false, summary: { ...summaryBase, ok: false, errors: [message] }, results: [] };
    }
  }
  for (const f of faults) {
    if ((f.kind === 'kill' || f.kind === 'freeze' || f.kind === 'lose-device') && typeof f.rank === 'string' && !opensIn(opts.browsers, f.rank)) {
      throw new Error(`${describeFault(f)}: no rank of this run opens in ${f.rank} (give --browser or --browsers with it)`);
    }
  }
  const firefoxIssues = firefoxProblems(opts.browsers, { tabs: opts.tabs, lan: opts.lan !== undefined, https: opts.https, serverCert: opts.serverCert !== undefined, server: opts.server });
  if (firefoxIssues.length > 0) throw new Error(firefoxIssues.join('\n'));
  // The ranks trust the one certificate the server presents, nothing more.
  const trusted = tls ? trustArgs(tls.cert) : opts.serverCert ? trustArgs(opts.serverCert) : [];
  if (opts.lan) {
    if (opts.tabs) throw new Error('--lan and --tabs do not go together: --tabs runs every rank in one headful Chromium');
    if (opts.server) throw new Error('--lan needs the launcher to run its own server on the virtual LAN; drop --server');
    if (opts.lan.turn) findTurnserver();
    if (opts.lan.rates && opts.lan.rates.length !== opts.nproc) {
      throw new Error(`--lan-rates gives ${opts.lan.rates.length} rate(s) but --nproc is ${opts.nproc}: give one rate per rank`);
    }
    checkLanSupport();
  }
  // Before the server: it listens on the LAN's bridge.
  let lan: Lan | undefined;
  if (opts.lan) {
    try {
      lan = await createLan(opts.lan, (l) => log(`[launch] ${l}`));
    } catch (err) {
      log(`[launch] FAILED ${(err as Error).message}`);
      return { ok: false, summary: { ...summaryBase, ok: false, errors: [(err as Error).message] }, results: [] };
    }
    log(`[launch] lan: ${lan.subnet} (${lan.names.lanNs}), server on ${lan.serverAddress} (its link not shaped)${opts.lan.isolate ? '; hosts isolated: each reaches only the server' : ''}${opts.lan.delayMs ? `; each host's packets out held ${opts.lan.delayMs} ms (rank to rank round trip +${2 * opts.lan.delayMs} ms)` : ''}`);
  }
  // --turn: the server mints the ranks' credentials for the run's relay (an explicit `ice` wins).
  const lanIce = lan?.iceConfig();
  // The launcher opens its tabs one after another (0.5-2.5 s apart on a loaded machine): its server
  // waits LAST_CALL_MS after the minimum for more before the first round (torch's last call), so
  // that a run of --nproc tabs starts with all of them rather than with the first --min.
  const serverOptions = { settleMs: LAST_CALL_MS, ...(lanIce ? { ice: lanIce } : {}), ...opts.serverOptions };
  const mixed = opts.browsers ? mixedDriver(opts.browsers, { log, chromiumArgs: trusted }) : undefined;
  const driver: RankDriver = lan
    ? lanDriver(lan, { log, extraArgs: [...(opts.rankChromiumArgs ?? []), ...trusted] })
    : opts.tabs
      ? await tabsDriver(log, { intensiveThrottlingAfterSec: opts.intensiveThrottlingAfterSec, extraArgs: trusted })
      : (mixed ?? (await headlessDriver(trusted)));
  const hidden: Array<{ rank: number; atStep: number; longestTimerGapMs?: number }> = [];
  const hiddenPages: Array<{ entry: (typeof hidden)[number]; page: RankTarget }> = [];
  const pages: RankPage[] = [];
  const failures: string[] = [];
  /** Pages that got no rank before the run ended (its rendezvous closed): they trained nothing, and that is no failure. */
  const arrivedAfterEnd: Array<{ page: number; message: string }> = [];
  /**
   * Pages that trained but were not in the run at its end, told so by the closed rendezvous: a
   * rank whose last round failed as the others finished it, or one that fell out earlier and
   * came back too late.
   */
  const leftBeforeEnd: Array<{ page: number; rank: number | null; message: string }> = [];
  let nodeGroup: NodeGroup | undefined;
  /** The faults as injected, and how long each took to detect and get over. */
  const faultTimes = new FaultTimes();
  // --churn: tabs killed, frozen and joining on a clock from the first step.
  let churn: Churn | undefined;
  let wake: () => void = () => {};
  let allSettled = new Promise<void>((r) => (wake = r));
  // --browser/--browsers: each page's browser, rank and whether it finished (killed pages and late arrivals included), in every summary.
  const browsersPart = () =>
    mixed ? { browsers: pages.map((p) => ({ page: p.index, rank: p.rank ?? null, browser: p.browser ?? 'chromium', finished: p.expected && p.result !== undefined })) } : {};
  // --lan: each rank's address and rate, in every summary (failures too).
  const lanPart = () =>
    lan ? { lan: lan.summary(pages.filter((p) => p.page?.host).map((p) => ({ rank: p.rank, host: p.page.host!, finished: p.expected && p.result !== undefined }))) } : {};
  // The server URL the ranks opened, for the summary.
  let opened: { url?: string } = {};
  // A rank that failed for good fails the run at once (torchrun's default): the others may wait on it forever.
  const checkSettled = () => {
    if (failures.length > 0 || pages.every((p) => p.done || !p.expected)) wake();
  };
  try {
    let base = opts.server;
    if (!base) {
      if (!script) await ensureBuilt((l) => log(`[launch] ${l}`));
      server = await startServer({ port: 0, log: () => {}, ...(lan ? { host: lan.serverAddress } : {}), ...serverOptions, ...(tls ? { tls } : {}) });
      // The launcher is the session's host: it creates it, so its ranks' links work from any address.
      await server.createSession(opts.session, token);
      base = server.url;
      log(`[launch] server on ${base}`);
    }
    const url = base;
    opened = { url };
    const sampleVisibility = () =>
      Promise.all(pages.filter((p) => p.expected).map(async (p) => ({ rank: p.rank ?? p.index, state: await p.page.visibility() })));
    let reachedStep = 0;
    let busy = Promise.resolve();

    const onStep = (step: number) => {
      if (step <= reachedStep) return;
      reachedStep = step;
      churn?.start();
      // Faults run one at a time, in order, as the run passes their step. A join is done when its
      // pages are in a round: a fault after it comes after that, not in the same regroup.
      while (faults.length > 0 && faults[0].step <= step) {
        const fault = faults.shift()!;
        busy = busy.then(async () => {
          const before = pages.length;
          await inject(fault, step);
          if (fault.kind === 'join') await untilAdmitted(pages.slice(before), fault);
        }).catch((err: Error) => {
          failures.push(`could not ${describeFault(fault)}: ${err.message}`);
          wake();
        });
      }
    };

    /** The running page a fault's target names (a browser: its lowest rank that has one). */
    const runningPage = (target: FaultTarget): RankPage => {
      const running = pages.filter((p) => p.expected && !p.done);
      const page =
        typeof target === 'number'
          ? running.find((p) => p.rank === target)
          : running.filter((p) => (p.browser ?? 'chromium') === target && p.rank !== undefined).sort((a, b) => a.rank! - b.rank!)[0];
      if (!page) throw new Error(typeof target === 'number' ? `no running page holds rank ${target}` : `no running ${target} page holds a rank`);
      if (typeof target !== 'number') log(`[launch] ${describeTarget(target)} is rank ${page.rank} (page ${page.index})`);
      return page;
    };

    /** Until the pages a join opened are in a round (or done: the run ended), at most JOIN_ADMIT_MS; then the next fault comes anyway. */
    const untilAdmitted = async (opened: RankPage[], join: Fault): Promise<void> => {
      const t0 = Date.now();
      while (opened.some((p) => !p.trained && !p.done)) {
        if (Date.now() - t0 > JOIN_ADMIT_MS) {
          const waiting = opened.filter((p) => !p.trained && !p.done).map((p) => p.label);
          log(`[launch] ${waiting.join(', ')} (${describeFault(join)}) not in a round after ${JOIN_ADMIT_MS / 1000} s: the next fault comes without waiting longer`);
          return;
        }
        await sleep(50);
      }
    };

    /** Injects `fault`; `background` (--churn): returns once it has begun, without waiting for a page to close, freeze or load. */
    const inject = async (fault: Fault, step: number, background = false, page?: RankPage): Promise<void> => {
      // A kill or freeze hits its page, resolved before anything is recorded: a fault that hit nothing is no fault.
      const target = fault.kind === 'kill' || fault.kind === 'freeze' ? (page ?? runningPage(fault.rank)) : undefined;
      log(`[launch] step ${step}: ${describeFault(fault)}${page ? ` (page ${page.index})` : ''}`);
      const record = faultTimes.add({ fault: describeFault(fault), kind: fault.kind, atStep: step });
      switch (fault.kind) {
        case 'kill':
        case 'freeze': {
          if (!target) return;
          target.expected = false;
          target.out = fault.kind === 'kill' ? 'killed' : 'frozen';
          record.page = target.index;
          const done = fault.kind === 'kill' ? target.page.kill() : target.page.freeze(log);
          // --churn: the clock goes on while the page closes or freezes (beside 32 training tabs
          // on two cores a busy page took 40 s to close, and the ticks meanwhile would be lost).
          if (background) void done.catch((err: Error) => log(`[launch] churn: could not ${describeFault(fault)}: ${err.message}`)).finally(checkSettled);
          else await done;
          checkSettled();
          return;
        }
        case 'hide': {
          const target = pages.find((p) => p.rank === fault.rank && !p.done);
          if (!target) throw new Error(`no running page holds rank ${fault.rank}`);
          await target.page.hide(log);
          const entry = { rank: fault.rank, atStep: step };
          hidden.push(entry);
          hiddenPages.push({ entry, page: target.page });
          return;
        }
        case 'lose-device': {
          // The page is still expected to finish: it rebuilds its state and rejoins.
          const target = runningPage(fault.rank);
          record.page = target.index;
          await target.page.loseDevice();
          return;
        }
        case 'join':
          record.pages = [];
          for (let i = 0; i < fault.count; i++) {
            record.pages.push(pages.length);
            if (!background) {
              await openPage(url, undefined);
              continue;
            }
            // --churn: the clock goes on while the page loads (a minute or more beside 32 training tabs).
            const rp = await addPage(undefined);
            navigate(rp, url).catch((err: Error) => {
              log(`[launch] churn: ${rp.label} did not open: ${err.message}`);
              rp.expected = false;
              checkSettled();
            });
          }
          return;
        case 'restart-server': {
          const port = server!.port;
          await server!.close();
          server = await startServer({ port, log: () => {}, ...(lan ? { host: lan.serverAddress } : {}), ...serverOptions, ...(tls ? { tls } : {}) });
          await server.createSession(opts.session, token);
          log(`[launch] server restarted on port ${port}`);
          return;
        }
      }
    };

    /** A rank's page, blank: its browser started and its handlers wired. `navigate` opens the rank's link in it. */
    const addPage = async (rank: number | undefined): Promise<RankPage> => {
      const index = pages.length;
      const rp = { index, label: rank === undefined ? `page ${index}` : `rank ${rank}`, rank, expected: true, done: false } as RankPage;
      const finish = (failure?: string) => {
        if (rp.done) return;
        rp.done = true;
        if (failure && rp.expected) failures.push(failure);
        checkSettled();
      };
      // Both drivers feed this one handler.
      const onReport = (r: Report) => {
        rp.lastReport = { what: describeReport(r), at: Date.now() };
        switch (r.type) {
          case 'rank':
            rp.rank = r.rank;
            rp.label = `rank ${r.rank}`;
            return;
          case 'elastic': {
            const e = r.event;
            // Robust runs: every rank reports every step's judgments, which the pages' results add up
            // (their `aggregation`); kept here they would grow with ranks x ranks x steps.
            if (e.type !== 'aggregation') events.push(e);
            if (e.type === 'round') {
              rp.trained = true;
              rp.rank = e.rank;
              rp.label = `rank ${e.rank}`;
            }
            faultTimes.onEvent(index, e);
            if (e.type === 'step') onStep(e.step);
            // The run is over, or its last step is done: no more churn (a tab killed or frozen now
            // would only miss the summary, and leave the others nothing to regroup for).
            if (e.type === 'end' || (e.type === 'step' && e.step >= e.totalSteps)) churn?.stop();
            return;
          }
          case 'result':
            rp.result = { rank: rp.rank ?? index, ...r.result } as RankResult;
            finish();
            return;
          case 'error':
            // torch's agents arriving after the end get RendezvousClosedError and exit: a tab
            // that opened late (or waited beyond a full group) missed the run, it did not fail it.
            if (r.name === 'RendezvousClosedError' && !rp.trained) {
              rp.expected = false;
              arrivedAfterEnd.push({ page: index, message: r.message });
              log(`[launch] ${rp.label} arrived after the run ended and trained nothing: ${r.message}`);
            } else if (r.name === 'RendezvousClosedError') {
              // The others finished the run without it: a lost rank, as a killed one is, not a failed run.
              rp.expected = false;
              rp.out = 'ended without it';
              leftBeforeEnd.push({ page: index, rank: rp.rank ?? null, message: r.message });
              log(`[launch] ${rp.label} trained, but the run ended without it: ${r.message}`);
            }
            finish(`${rp.label}: ${r.name}: ${r.message}`);
            return;
        }
      };
      rp.page = await driver.newRank({
        onReport,
        onConsole: (line) => log(`[${rp.label}] ${line}`),
        onCrash: (reason) => finish(`${rp.label}: ${reason}`),
      });
      if (mixed) rp.browser = mixed.browserOf(index);
      pages.push(rp);
      return rp;
    };

    const navigate = async (rp: RankPage, serverUrl: string): Promise<void> => {
      const rank = rp.rank;
      const u = new URL(entry, serverUrl);
      const params = new URLSearchParams({ session: opts.session, world: String(worldSize), ...(script ? {} : { job: opts.job }), ...jobParams });
      if (rank !== undefined && jobParams.min === undefined && !script) params.set('rank', String(rank));
      for (const arg of opts.scriptArgs ?? []) params.append('arg', arg);
      u.search = params.toString();
      try {
        await rp.page.open(withToken(u, token));
      } catch (err) {
        const cert = /net::(ERR_CERT_[A-Z_]+)/.exec((err as Error).message)?.[1];
        if (!cert) throw err;
        // Playwright's message carries the page's link, token included: say what to do instead.
        throw new Error(
          opts.https
            ? `the ranks refused the launcher's own certificate (${cert}): remove certs/ (or CERT_DIR) to make a new one`
            : `the ranks do not trust ${serverUrl}'s certificate (${cert}): for a self-signed server give its certificate with --server-cert FILE (its certs/cert.pem)`,
        );
      }
    };

    const openPage = async (serverUrl: string, rank: number | undefined): Promise<void> => navigate(await addPage(rank), serverUrl);

    if (nnodes > 1) {
      // Another node's failure stops this one too (torchrun's agents fail the whole world).
      nodeGroup = await NodeGroup.join(url, opts.session, token, nnodes, nodeRank, opts.timeoutSec * 1000);
      nodeGroup.watchFailures((message) => {
        if (message.startsWith(`node ${nodeRank} `)) return;
        failures.push(message);
        wake();
      }, opts.timeoutSec * 1000);
      log(`[launch] node ${nodeRank} of ${nnodes}: ranks ${nodes!.localRanks.join(', ')} of a world of ${worldSize}`);
    }
    // Every rank's browser first, then their pages: a browser that takes seconds to start (a
    // Firefox rank) does not make its page arrive after the first round has formed without it.
    // (Only with --browser/--browsers: the --tabs driver opens a rank's tab with its link.)
    if (mixed) {
      const initial: RankPage[] = [];
      for (let i = 0; i < opts.nproc; i++) initial.push(await addPage(globalRank(nodeRank, opts.nproc, i)));
      for (const rp of initial) await navigate(rp, url);
    } else {
      for (let i = 0; i < opts.nproc; i++) await openPage(url, globalRank(nodeRank, opts.nproc, i));
    }
    if (opts.churnEverySec !== undefined) {
      const min = Number(opts.jobParams.min ?? 1);
      const running = () => pages.filter((p) => p.expected && !p.done && p.trained && p.rank !== undefined).map((p) => p.rank!);
      churn = new Churn(opts.churnEverySec * 1000, min, running, (f) => {
        const fault: Fault = f.kind === 'join' ? { kind: 'join', count: 1, step: reachedStep } : { kind: f.kind, rank: f.rank, step: reachedStep };
        // The page that holds the rank now: by the time the fault's turn comes (after the last
        // fault's injection), a regroup may have given that rank number to another page.
        const page = f.kind === 'join' ? undefined : pages.find((p) => p.expected && !p.done && p.trained && p.rank === f.rank);
        busy = busy
          .then(() => {
            if (page && (!page.expected || page.done)) return log(`[launch] churn: ${describeFault(fault)} skipped: page ${page.index} is no longer running`);
            return inject(fault, reachedStep, true, page);
          })
          .catch((err: Error) => log(`[launch] churn: could not ${describeFault(fault)}: ${err.message}`));
        return busy;
      });
    }
    if (opts.tabs) log(`[launch] visibility at start: ${(await sampleVisibility()).map((v) => `rank ${v.rank} ${v.state}`).join(', ')}`);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<'timeout'>((r) => (timer = setTimeout(() => r('timeout'), opts.timeoutSec * 1000)));
    // A join fault adds pages later: wait again until those have settled too.
    let how: 'settled' | 'timeout' = 'settled';
    for (;;) {
      how = await Promise.race([allSettled.then(() => 'settled' as const), timedOut]);
      await busy;
      if (failures.length > 0) {
        // The first failure is often a consequence (a link its peer's failure closed): give the
        // other pages a moment to report theirs, so that the summary names the cause too.
        for (let waited = 0; waited < FAILURE_GRACE_MS && !pages.every((p) => p.done || !p.expected); waited += 100) await sleep(100);
        break;
      }
      if (how === 'timeout' || pages.every((p) => p.done || !p.expected)) break;
      allSettled = new Promise<void>((r) => (wake = r));
      checkSettled();
    }
    clearTimeout(timer);
    churn?.stop();
    if (churn) log(`[launch] churn: ${churn.injected} faults injected, every ${opts.churnEverySec} s; ${churn.skipped} ticks skipped while a fault was still being injected`);
    if (how === 'timeout') {
      const missing = pages.filter((p) => p.expected && !p.done);
      failures.push(`timed out after ${opts.timeoutSec} s waiting for ${missing.map((p) => p.label).join(', ')} to finish job "${opts.job}"`);
      // Where each went quiet: its last report, and how long before the timeout.
      for (const p of missing) log(`[launch] ${p.label} (page ${p.index}): ${p.lastReport ? `last reported ${p.lastReport.what}, ${((Date.now() - p.lastReport.at) / 1000).toFixed(1)} s before the timeout` : 'reported nothing'}`);
    }
    if (faults.length > 0) failures.push(`the run ended before these faults could be injected: ${faults.map(describeFault).join('; ')}`);
    const results = pages.filter((p) => p.expected && p.result).map((p) => p.result!);
    if (failures.length === 0 && results.length === 0) failures.push(`no page finished job "${opts.job}": every one was killed, frozen, or ended without the run`);
    if (nodeGroup) {
      // This node's outcome for the others, then theirs: the run succeeded only if every node's did.
      await nodeGroup.report({ nodeRank, ok: failures.length === 0, ...(failures.length ? { errors: failures } : {}) });
      if (failures.length === 0) {
        for (const o of await nodeGroup.outcomes(opts.timeoutSec * 1000)) {
          if (!o.ok) failures.push(`node ${o.nodeRank} failed: ${(o.errors ?? []).join('; ')}`);
        }
      }
    }
    if (failures.length > 0) {
      for (const f of failures) log(`[launch] FAILED ${f}`);
      return { ok: false, summary: { ...summaryBase, ...opened, ok: false, errors: [...failures], ...browsersPart(), ...lanPart() }, results };
    }
    const visibility = opts.tabs ? await sampleVisibility() : undefined;
    if (visibility) log(`[launch] visibility at the end: ${visibility.map((v) => `rank ${v.rank} ${v.state}`).join(', ')}`);
    for (const { entry, page } of hiddenPages) {
      const probe = await page.timerProbe();
      if (probe) {
        (entry as { longestTimerGapMs?: number }).longestTimerGapMs = probe.longestGapMs;
        log(`[launch] rank ${entry.rank}'s own timers while hidden: longest gap ${probe.longestGapMs} ms over ${probe.ticks} ticks`);
      }
    }
    const summary = script ? summarizeScript(opts.job, worldSize, results, events) : summarize(opts.job, worldSize, results, events);
    // A parameter-server run's figures in a few lines, before the JSON (which stays the last line).
    if (summary.parameterServer) for (const line of parameterServerLines(summary.parameterServer as ParameterServerSummary)) log(`[launch] ${line}`);
    // A DDP run's hook and bytes per step (--comm-hook), in one line.
    const comm = script ? null : commLine(summary);
    if (comm) log(`[launch] ${comm}`);
    const devices = script ? null : devicesLine(summary);
    if (devices) log(`[launch] ${devices}`);
    const faultsOut = faultTimes.report();
    // With faults, the last round's ranks that did not reach the run's end, and why (killed or
    // frozen in its last steps, or its last round failed as the others finished): what the
    // summary's weightHashes (the final ranks' own, from their 'end' events) lack of worldSize.
    const last = faultsOut.length > 0 || leftBeforeEnd.length > 0 ? faultTimes.lastRound() : null;
    const lastRound = last && {
      worldSize: last.worldSize,
      // Every page: its last rank, whether it is in the last round and has a result, and what took it out.
      pages: pages.map((p) => ({ page: p.index, rank: p.rank ?? null, inLastRound: last.pages.some((x) => x.page === p.index), result: p.result !== undefined, ...(p.out ? { out: p.out } : {}) })),
      without: last.pages.filter((p) => !p.ended).map(({ page, rank }) => ({ page, rank, why: pages[page]?.out ?? 'no end' })),
    };
    return { ok: true, summary: { ...summary, ...opened, ...(nodes ? { nodes } : {}), ...(faultsOut.length ? { faults: faultsOut } : {}), ...(arrivedAfterEnd.length ? { arrivedAfterEnd } : {}), ...(leftBeforeEnd.length ? { leftBeforeEnd } : {}), ...(lastRound ? { lastRound } : {}), ...(visibility ? { visibility, hidden } : {}), ...browsersPart(), ...lanPart(), ok: true }, results };
  } catch (err) {
    log(`[launch] ${(err as Error).message}`);
    return { ok: false, summary: { ...summaryBase, ...opened, ok: false, errors: [(err as Error).message], ...browsersPart(), ...lanPart() }, results: [] };
  } finally {
    // A run that failed ends its churn too: no fault may outlive the browsers it would hit.
    churn?.stop();
    nodeGroup?.close();
    await driver.close();
    await server?.close();
    await lan?.close();
  }
}

/** `text` with control characters (escape sequences, line breaks) shown as \xNN; tabs kept. */
export function printable(text: string): string {
  return text.replace(/[\u0000-\u0008\u000a-\u001f\u007f-\u009f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
}
