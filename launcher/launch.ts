/**
 * The launcher (this project's torchrun): `npm run launch -- --nproc N --job NAME [options]`.
 * Starts a server unless --server is given, opens N headless ranks as pages of one Chromium,
 * prefixes each rank's console with its rank, and prints one JSON summary as its last line.
 * Options it does not know become URL parameters of the job (e.g. --sizes 0,1,7 -> sizes=0,1,7).
 */
import { parseArgs } from 'node:util';
import type { Page } from 'playwright';
import { ensureBuilt } from '../signaling/build.ts';
import { startServer, type RunningServer } from '../signaling/server.ts';
import { launchChromium } from './browser.ts';
import { summarize, type RankResult } from './summaries.ts';
import type { Report } from '../client/report.ts';

const USAGE = `usage: npm run launch -- --nproc N [--job NAME] [--server URL] [--session NAME] [--timeout SECONDS] [--JOBOPTION VALUE ...]`;

interface LaunchOptions {
  nproc: number;
  job: string;
  server?: string;
  session: string;
  timeoutSec: number;
  jobParams: Record<string, string>;
}

function parse(argv: string[]): LaunchOptions {
  const { values, tokens } = parseArgs({
    args: argv,
    strict: false,
    tokens: true,
    options: {
      nproc: { type: 'string' },
      job: { type: 'string' },
      server: { type: 'string' },
      session: { type: 'string' },
      timeout: { type: 'string' },
      help: { type: 'boolean' },
    },
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const nproc = Number(values.nproc);
  if (!Number.isInteger(nproc) || nproc < 1) throw new Error(`--nproc must be a positive integer, got ${String(values.nproc)}\n${USAGE}`);
  const timeoutSec = values.timeout === undefined ? 600 : Number(values.timeout);
  if (!(timeoutSec > 0)) throw new Error(`--timeout must be a positive number of seconds, got ${String(values.timeout)}`);
  const known = new Set(['nproc', 'job', 'server', 'session', 'timeout', 'help']);
  const jobParams: Record<string, string> = {};
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i];
    if (t.kind !== 'option' || known.has(t.name)) continue;
    let value = t.value;
    if (value === undefined) {
      const nextToken = tokens[i + 1];
      if (nextToken?.kind === 'positional') {
        value = nextToken.value;
        i++;
      } else value = 'true';
    }
    jobParams[t.name] = value;
  }
  return {
    nproc,
    job: typeof values.job === 'string' ? values.job : 'rendezvous',
    server: typeof values.server === 'string' ? values.server : undefined,
    session: typeof values.session === 'string' ? values.session : `launch-${Date.now().toString(36)}`,
    timeoutSec,
    jobParams,
  };
}

async function main(): Promise<number> {
  let opts: LaunchOptions;
  try {
    opts = parse(process.argv.slice(2));
  } catch (err) {
    console.error((err as Error).message);
    return 2;
  }
  const summaryBase = { job: opts.job, worldSize: opts.nproc };
  let server: RunningServer | undefined;
  let exitCode = 1;
  let summary: Record<string, unknown> = { ...summaryBase, ok: false };
  const browser = await launchChromium();
  try {
    let base = opts.server;
    if (!base) {
      await ensureBuilt((l) => console.log(`[launch] ${l}`));
      server = await startServer({ port: 0, log: () => {} });
      base = server.url;
      console.log(`[launch] server on ${base}`);
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
      page.on('console', (msg) => console.log(`[${label}] ${msg.text()}`));
      page.on('pageerror', (err) => console.log(`[${label}] page error: ${err.message}`));
      page.on('crash', () => {
        if (!done) {
          done = true;
          failures.push(`${label}: the page crashed`);
          if (++settled === opts.nproc) wake();
        }
      });
      await page.exposeFunction('__ddpReport', (r: Report) => {
        if (r.type === 'rank') label = `rank ${r.rank}`;
        if (done) return;
        if (r.type === 'result') {
          done = true;
          results.set(i, { rank: i, ...r.result } as RankResult);
        } else if (r.type === 'error') {
          done = true;
          failures.push(`${label}: ${r.name}: ${r.message}`);
        } else return;
        if (++settled === opts.nproc) wake();
      });
      const url = new URL(base);
      url.search = new URLSearchParams({ session: opts.session, world: String(opts.nproc), rank: String(i), job: opts.job, ...opts.jobParams }).toString();
      await page.goto(url.toString());
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<'timeout'>((r) => (timer = setTimeout(() => r('timeout'), opts.timeoutSec * 1000)));
    const outcome = await Promise.race([allSettled.then(() => 'settled' as const), timedOut]);
    clearTimeout(timer);
    if (outcome === 'timeout') {
      const missing = Array.from({ length: opts.nproc }, (_, r) => r).filter((r) => !results.has(r));
      failures.push(`timed out after ${opts.timeoutSec} s waiting for rank(s) ${missing.join(', ')} to finish job "${opts.job}"`);
    }
    if (failures.length > 0) {
      for (const f of failures) console.error(`[launch] FAILED ${f}`);
      summary = { ...summaryBase, ok: false, errors: failures };
    } else {
      summary = { ...summarize(opts.job, opts.nproc, [...results.values()]), ok: true };
      exitCode = 0;
    }
  } catch (err) {
    console.error(`[launch] ${(err as Error).message}`);
    summary = { ...summaryBase, ok: false, errors: [(err as Error).message] };
  } finally {
    await browser.close().catch(() => {});
    await server?.close();
  }
  console.log(JSON.stringify(summary));
  return exitCode;
}

process.exitCode = await main();
