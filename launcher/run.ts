/**
 * Runs one job on N headless ranks (the body of the launcher, callable from benchmarks).
 */
import type { Page } from 'playwright';
import { ensureBuilt } from '../signaling/build.ts';
import { startServer, type RunningServer } from '../signaling/server.ts';
import { launchChromium } from './browser.ts';
import { summarize, type RankResult } from './summaries.ts';
import type { Report } from '../client/report.ts';

export interface LaunchOptions {
  nproc: number;
  job: string;
  /** Use this server instead of starting one. */
  server?: string;
  session: string;
  timeoutSec: number;
  /** Passed to the job as URL parameters. */
  jobParams: Record<string, string>;
  /** Where rank-prefixed lines go. Default: console.log. */
  log?: (line: string) => void;
}

export interface LaunchOutcome {
  ok: boolean;
  summary: Record<string, unknown>;
  /** Each rank's own result, as the page returned it. */
  results: RankResult[];
}

export async function launch(opts: LaunchOptions): Promise<LaunchOutcome> {
  const log = opts.log ?? ((line: string) => console.log(line));
  const summaryBase = { job: opts.job, worldSize: opts.nproc };
  let server: RunningServer | undefined;
  let outcome: LaunchOutcome = { ok: false, summary: { ...summaryBase, ok: false }, results: [] };
  const browser = await launchChromium();
  try {
    let base = opts.server;
    if (!base) {
      await ensureBuilt((l) => log(`[launch] ${l}`));
      server = await startServer({ port: 0, log: () => {} });
      base = server.url;
      log(`[launch] server on ${base}`);
    }
    const results = new Map<number, RankResult>();
    const failures: string[] = [];
    let settled = 0;
    let wake: () => void = () => {};
    const allSettled = new Promise<void>((r) => (wake = r));
    const pages: Page[] = [];
    for (let i = 0; i < opts.nproc; i++) {
      const page = await browser.newPage();
      pages.push(page);
      let label = `rank ${i}`;
      let done = false;
      const finish = (failure?: string) => {
        if (done) return;
        done = true;
        if (failure) failures.push(failure);
        if (++settled === opts.nproc) wake();
      };
      page.on('console', (msg) => log(`[${label}] ${msg.text()}`));
      page.on('pageerror', (err) => log(`[${label}] page error: ${err.message}`));
      page.on('crash', () => finish(`${label}: the page crashed`));
      await page.exposeFunction('__ddpReport', (r: Report) => {
        if (r.type === 'rank') label = `rank ${r.rank}`;
        else if (r.type === 'result') {
          if (!done) results.set(i, { rank: i, ...r.result } as RankResult);
          finish();
        } else if (r.type === 'error') finish(`${label}: ${r.name}: ${r.message}`);
      });
      const url = new URL(base);
      url.search = new URLSearchParams({ session: opts.session, world: String(opts.nproc), rank: String(i), job: opts.job, ...opts.jobParams }).toString();
      await page.goto(url.toString());
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<'timeout'>((r) => (timer = setTimeout(() => r('timeout'), opts.timeoutSec * 1000)));
    const how = await Promise.race([allSettled.then(() => 'settled' as const), timedOut]);
    clearTimeout(timer);
    if (how === 'timeout') {
      const missing = Array.from({ length: opts.nproc }, (_, r) => r).filter((r) => !results.has(r));
      failures.push(`timed out after ${opts.timeoutSec} s waiting for rank(s) ${missing.join(', ')} to finish job "${opts.job}"`);
    }
    if (failures.length > 0) {
      for (const f of failures) log(`[launch] FAILED ${f}`);
      outcome = { ok: false, summary: { ...summaryBase, ok: false, errors: failures }, results: [...results.values()] };
    } else {
      outcome = { ok: true, summary: { ...summarize(opts.job, opts.nproc, [...results.values()]), ok: true }, results: [...results.values()] };
    }
  } catch (err) {
    log(`[launch] ${(err as Error).message}`);
    outcome = { ok: false, summary: { ...summaryBase, ok: false, errors: [(err as Error).message] }, results: [] };
  } finally {
    await browser.close().catch(() => {});
    await server?.close();
  }
  return outcome;
}
