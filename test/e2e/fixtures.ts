/** Fixtures: a real server on a free port per test, and helpers to open ranks as pages. */
import { test as base, expect, type Browser, type Page } from '@playwright/test';
import { startServer, type RunningServer } from '../../signaling/server.ts';
import { withToken } from '../../src/session_token.ts';
import { tokenFor } from '../helpers.ts';
import type { Report } from '../../client/report.ts';

export interface RankPage {
  page: Page;
  /** Resolves with the job's result, or rejects with the error the page reported. */
  result: Promise<Record<string, unknown>>;
  reports: Report[];
}

export const test = base.extend<{ server: RunningServer }>({
  server: async ({}, use) => {
    const server = await startServer({ port: 0, log: () => {} });
    await use(server);
    await server.close();
  },
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

/** The weights a rank returned (`returnWeights`), as float32. */
export function weightsOf(r: Record<string, unknown>): Float32Array {
  const bytes = Buffer.from(r.weights as string, 'base64');
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
}

/** ||a - b|| / ||b||. */
export function relativeError(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  let diff = 0;
  let norm = 0;
  for (let i = 0; i < a.length; i++) {
    diff += (a[i]! - b[i]!) ** 2;
    norm += b[i]! ** 2;
  }
  return Math.sqrt(diff / norm);
}
