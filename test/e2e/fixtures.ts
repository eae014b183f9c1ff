/** Fixtures: a real server on a free port per test, and helpers to open ranks as pages. */
import { test as base, expect, type Browser, type Page } from '@playwright/test';
import { spawn } from 'node:child_process';
import { PROJECT_ROOT, startServer, type RunningServer } from '../../signaling/server.ts';
import { withToken } from '../../src/wire/session_token.ts';
import { tokenFor } from '../fixtures/session.ts';
import type { Report } from '../../src/jobs/job_report.ts';
import { acquireLane } from './lanes.ts';

export interface RankPage {
  page: Page;
  /** Resolves with the job's result, or rejects with the error the page reported. */
  result: Promise<Record<string, unknown>>;
  reports: Report[];
}

export const test = base.extend<{ server: RunningServer; closeContexts: undefined; lane: undefined }>({
  // A test that times heartbeats, stalls or the network has the tag '@solo': playwright.config.ts
  // runs those first, on one worker, and the lane (test/e2e/lanes.ts) holds the other worker's
  // tests back until they have run.
  lane: [
    // biome-ignore lint/correctness/noEmptyPattern: Playwright reads a fixture's dependencies from this pattern; it has none.
    async ({}, use, testInfo) => {
      if (testInfo.config.workers < 2) return use(undefined);
      const asked = Date.now();
      const mode = testInfo.tags.includes('@solo') ? 'solo' : 'shared';
      // The bound only guards against a lock left behind: a shared test may wait out a run of solo files.
      const release = await acquireLane(testInfo.parallelIndex, mode, 1_800_000);
      const waited = Date.now() - asked;
      // The wait is the other lane's test, not this one's: it neither eats the timeout nor counts as its time.
      if (waited > 0) testInfo.setTimeout(testInfo.timeout + waited);
      if (waited >= 100) testInfo.annotations.push({ type: 'lane-wait', description: String(waited) });
      try {
        await use(undefined);
      } finally {
        await release();
      }
    },
    { auto: true },
  ],
  server: async ({ lane }, use) => {
    void lane;
    const server = await startServer({ port: 0, log: () => {} });
    await use(server);
    await server.close();
  },
  // Every context a test opened on the shared browser (openRanks' among them) closes with the
  // test. Pages left open keep their tickers, reconnect loops and dashboards going: 64 renderers
  // were alive by the 50th test, and each later test ran slower for them.
  closeContexts: [
    async ({ browser, lane }, use) => {
      void lane; // closed before the lane is given back, so a solo test starts with no page of this one running
      await use(undefined);
      await Promise.all(browser.contexts().map((c) => c.close().catch(() => {})));
    },
    { auto: true },
  ],
});
export { expect };

let sessions = 0;
export function sessionName(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}-${++sessions}`;
}

/** Opens one page per rank running `job` with the given URL parameters (at `base`, default the server's URL). */
export async function openRanks(
  browser: Browser,
  server: RunningServer,
  n: number,
  params: Record<string, string>,
  base: string = server.url,
): Promise<RankPage[]> {
  const context = await browser.newContext();
  const ranks: RankPage[] = [];
  for (let i = 0; i < n; i++) {
    const page = await context.newPage();
    const reports: Report[] = [];
    let settle!: { resolve(r: Record<string, unknown>): void; reject(e: Error): void };
    const result = new Promise<Record<string, unknown>>((resolve, reject) => (settle = { resolve, reject }));
    result.catch(() => {});
    page.on('console', (m) => {
      if (process.env.DEBUG_PAGES) console.log(`[page ${i}] ${m.text()}`);
    });
    await page.exposeFunction('__ddpReport', (r: Report) => {
      reports.push(r);
      if (r.type === 'result') settle.resolve(r.result);
      if (r.type === 'error') settle.reject(Object.assign(new Error(r.message), { name: r.name }));
    });
    const url = new URL(base);
    url.search = new URLSearchParams({ world: String(n), rank: String(i), ...params }).toString();
    await page.goto(withToken(url, tokenFor(params.session ?? '')));
    ranks.push({ page, result, reports });
  }
  return ranks;
}

/**
 * A `slow` spec (the launcher's --slow) that holds every rank's steps, up to `maxWorld`, `factor`
 * times their compute: a wait, not work, as on a slower device. A run that must outlast a page's
 * load or a fault's detection then does it in fewer steps, leaving the cores to the other tests.
 */
export function heldSteps(maxWorld: number, factor = 4): string {
  return Array.from({ length: maxWorld }, (_, r) => `${r}:${factor}`).join(',');
}

/** The weights a rank returned (`returnWeights`), as float32. */
export function weightsOf(r: Record<string, unknown>): Float32Array {
  const bytes = Buffer.from(r.weights as string, 'base64');
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
}

export { relativeError } from '../fixtures/tensors.ts';

export interface Launched {
  code: number | null;
  summary: Record<string, unknown>;
  output: string;
}

/** `npm run launch -- ...args`, as a user types it. */
export function launchCommand(args: string[]): Promise<Launched> {
  return new Promise((resolve, reject) => {
    const child = spawn('npm', ['run', '--silent', 'launch', '--', ...args], { cwd: PROJECT_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => {
      const last = output
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .at(-1);
      let summary: Record<string, unknown> = {};
      try {
        summary = JSON.parse(last ?? '{}') as Record<string, unknown>;
      } catch {
        // left empty: the assertions below show the output
      }
      resolve({ code, summary, output });
    });
  });
}
