/**
 * Runs one job or user script on N headless ranks (the body of the launcher, callable from
 * benchmarks and tests), with fault injection for elastic runs: kill or freeze a rank's page at
 * a step, open more pages at a step, restart the server at a step.
 */
import type { Browser, Page } from 'playwright';
import { ensureBuilt } from '../signaling/build.ts';
import { startServer, type RunningServer, type ServerOptions } from '../signaling/server.ts';
import type { ElasticEvent } from '../src/elastic/events.ts';
import { newSessionToken, withToken } from '../src/session_token.ts';
import { launchChromium } from './browser.ts';
import { buildScript } from './build_script.ts';
import { summarize, summarizeScript, type RankResult } from './summaries.ts';
import type { Report } from '../client/report.ts';

/** A fault to inject once the run reaches `step` (as reported by any rank). */
export type Fault =
  | { kind: 'kill'; rank: number; step: number }
  | { kind: 'freeze'; rank: number; step: number }
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
  session: string;
  /** The session's secret; the pages get it in their links' fragments. Default: a new one. */
  token?: string;
  timeoutSec: number;
  /** Passed to the job as URL parameters (min, max and backend for a script). */
  jobParams: Record<string, string>;
  faults?: Fault[];
  /** Options for the server the launcher starts. */
  serverOptions?: ServerOptions;
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
  page: Page;
  label: string;
  rank: number | undefined;
  /** Killed or frozen pages are not expected to finish. */
  expected: boolean;
  done: boolean;
  result?: RankResult;
}

export function describeFault(f: Fault): string {
  switch (f.kind) {
    case 'kill':
      return `kill rank ${f.rank} at step ${f.step}`;
    case 'freeze':
      return `freeze rank ${f.rank} at step ${f.step}`;
    case 'join':
      return `open ${f.count} more rank(s) at step ${f.step}`;
    case 'restart-server':
      return `restart the server at step ${f.step}`;
  }
}

/**
 * Freezes a page: first through the page-lifecycle API ("frozen": no timers, no tasks). Headless
 * Chromium 156 accepts that command but keeps running the page's JavaScript, so when a probe shows
 * the page still running, its JavaScript is paused with the debugger as well: to the server and the
 * other ranks the tab then looks exactly like a frozen one (socket open, nothing sent).
 */
async function freeze(page: Page, log: (line: string) => void): Promise<void> {
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Page.setWebLifecycleState', { state: 'frozen' });
  const running = await Promise.race([
    page.evaluate(() => true).catch(() => false),
    new Promise<boolean>((r) => setTimeout(() => r(false), 500)),
  ]);
  if (running) {
    log('[launch] the page still runs after the lifecycle freeze (headless Chromium); pausing its JavaScript too');
    await cdp.send('Debugger.enable');
    await cdp.send('Debugger.pause');
  }
}

/** A job name that is a file path: a user script. */
export function isScript(job: string): boolean {
  return /\.(ts|js|mts|mjs)$/.test(job);
}

export async function launch(opts: LaunchOptions): Promise<LaunchOutcome> {
  const log = opts.log ?? ((line: string) => console.log(line));
  const token = opts.token ?? newSessionToken();
  const script = isScript(opts.job);
  const summaryBase = { [script ? 'script' : 'job']: opts.job, worldSize: opts.nproc };
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
  const browser = await launchChromium();
  const faults = [...(opts.faults ?? [])].sort((a, b) => a.step - b.step);
  if (faults.some((f) => f.kind === 'restart-server') && opts.server) {
    throw new Error('--restart-server needs the launcher to run its own server; drop --server');
  }
  const pages: RankPage[] = [];
  const failures: string[] = [];
  const injected: Array<{ fault: string; atStep: number; at: number; detectedAfterMs?: number }> = [];
  let wake: () => void = () => {};
  let allSettled = new Promise<void>((r) => (wake = r));
  // A rank that failed for good fails the run at once (torchrun's default): the others may wait on it forever.
  const checkSettled = () => {
    if (failures.length > 0 || pages.every((p) => p.done || !p.expected)) wake();
  };
  try {
    let base = opts.server;
    if (!base) {
      if (!script) await ensureBuilt((l) => log(`[launch] ${l}`));
      server = await startServer({ port: 0, log: () => {}, ...opts.serverOptions });
      base = server.url;
      log(`[launch] server on ${base}`);
    }
    const url = base;
    let reachedStep = 0;
    let busy = Promise.resolve();

    const onStep = (step: number) => {
      if (step <= reachedStep) return;
      reachedStep = step;
      // Faults run one at a time, in order, as the run passes their step.
      while (faults.length > 0 && faults[0].step <= step) {
        const fault = faults.shift()!;
        busy = busy.then(() => inject(fault, step)).catch((err: Error) => {
          failures.push(`could not ${describeFault(fault)}: ${err.message}`);
          wake();
        });
      }
    };

    const inject = async (fault: Fault, step: number): Promise<void> => {
      log(`[launch] step ${step}: ${describeFault(fault)}`);
      injected.push({ fault: describeFault(fault), atStep: step, at: Date.now() });
      switch (fault.kind) {
        case 'kill':
        case 'freeze': {
          const target = pages.find((p) => p.rank === fault.rank && p.expected && !p.done);
          if (!target) throw new Error(`no running page holds rank ${fault.rank}`);
          target.expected = false;
          if (fault.kind === 'kill') await target.page.close();
          else await freeze(target.page, log);
          checkSettled();
          return;
        }
        case 'join':
          for (let i = 0; i < fault.count; i++) await openPage(browser, url, undefined);
          return;
        case 'restart-server': {
          const port = server!.port;
          await server!.close();
          server = await startServer({ port, log: () => {}, ...opts.serverOptions });
          log(`[launch] server restarted on port ${port}`);
          return;
        }
      }
    };

    const openPage = async (b: Browser, serverUrl: string, rank: number | undefined): Promise<void> => {
      const index = pages.length;
      const page = await b.newPage();
      const rp: RankPage = { index, page, label: rank === undefined ? `page ${index}` : `rank ${rank}`, rank, expected: true, done: false };
      pages.push(rp);
      const finish = (failure?: string) => {
        if (rp.done) return;
        rp.done = true;
        if (failure && rp.expected) failures.push(failure);
        checkSettled();
      };
      page.on('console', (msg) => log(`[${rp.label}] ${msg.text()}`));
      page.on('pageerror', (err) => log(`[${rp.label}] page error: ${err.message}`));
      page.on('crash', () => finish(`${rp.label}: the page crashed`));
      await page.exposeFunction('__ddpReport', (r: Report) => {
        switch (r.type) {
          case 'rank':
            rp.rank = r.rank;
            rp.label = `rank ${r.rank}`;
            return;
          case 'elastic': {
            const e = r.event;
            events.push(e);
            if (e.type === 'round') {
              rp.rank = e.rank;
              rp.label = `rank ${e.rank}`;
            }
            if (e.type === 'step') onStep(e.step);
            if (e.type === 'peer-lost') {
              // How long the survivors took to notice a killed or frozen rank.
              const f = injected.find((x) => (x.fault.startsWith('kill') || x.fault.startsWith('freeze')) && x.detectedAfterMs === undefined);
              if (f) f.detectedAfterMs = Date.now() - f.at;
            }
            return;
          }
          case 'result':
            rp.result = { rank: rp.rank ?? index, ...r.result } as RankResult;
            finish();
            return;
          case 'error':
            finish(`${rp.label}: ${r.name}: ${r.message}`);
            return;
        }
      });
      const u = new URL(entry, serverUrl);
      const params = new URLSearchParams({ session: opts.session, world: String(opts.nproc), ...(script ? {} : { job: opts.job }), ...opts.jobParams });
      if (rank !== undefined && opts.jobParams.min === undefined && !script) params.set('rank', String(rank));
      for (const arg of opts.scriptArgs ?? []) params.append('arg', arg);
      u.search = params.toString();
      await page.goto(withToken(u, token));
    };

    for (let i = 0; i < opts.nproc; i++) await openPage(browser, url, i);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<'timeout'>((r) => (timer = setTimeout(() => r('timeout'), opts.timeoutSec * 1000)));
    // A join fault adds pages later: wait again until those have settled too.
    let how: 'settled' | 'timeout' = 'settled';
    for (;;) {
      how = await Promise.race([allSettled.then(() => 'settled' as const), timedOut]);
      await busy;
      if (how === 'timeout' || pages.every((p) => p.done || !p.expected) || failures.length > 0) break;
      allSettled = new Promise<void>((r) => (wake = r));
      checkSettled();
    }
    clearTimeout(timer);
    if (how === 'timeout') {
      const missing = pages.filter((p) => p.expected && !p.done).map((p) => p.label);
      failures.push(`timed out after ${opts.timeoutSec} s waiting for ${missing.join(', ')} to finish job "${opts.job}"`);
    }
    if (faults.length > 0) failures.push(`the run ended before these faults could be injected: ${faults.map(describeFault).join('; ')}`);
    const results = pages.filter((p) => p.expected && p.result).map((p) => p.result!);
    if (failures.length > 0) {
      for (const f of failures) log(`[launch] FAILED ${f}`);
      return { ok: false, summary: { ...summaryBase, ok: false, errors: failures }, results };
    }
    const summary = script ? summarizeScript(opts.job, opts.nproc, results, events) : summarize(opts.job, opts.nproc, results, events);
    const faultsOut = injected.map(({ at: _at, ...rest }) => rest);
    return { ok: true, summary: { ...summary, ...(faultsOut.length ? { faults: faultsOut } : {}), ok: true }, results };
  } catch (err) {
    log(`[launch] ${(err as Error).message}`);
    return { ok: false, summary: { ...summaryBase, ok: false, errors: [(err as Error).message] }, results: [] };
  } finally {
    await browser.close().catch(() => {});
    await server?.close();
  }
}
