/**
 * What a person's browser does: the ranks as headful windows under Xvfb with the browser's default
 * background throttling (the launcher's --tabs), and one rank's tab sent to the background
 * mid-run. It must not hang the run: it finishes, the tab really was hidden, replicas agree.
 * The speed comparison is a benchmark (npm run bench:background), not a timed test.
 */
import { readFileSync, readdirSync } from 'node:fs';
import type { Report } from '../../src/jobs/job_report.ts';
import { launch } from '../../launcher/run.ts';
import { startServer } from '../../signaling/server.ts';
import { tabsDriver } from '../../launcher/tabs.ts';
import { withToken } from '../../src/wire/session_token.ts';
import { tokenFor } from '../fixtures/session.ts';
import { expect, sessionName, test } from './fixtures.ts';

// Each test times heartbeats, stalls or throttling: '@solo', alone on the machine (playwright.config.ts).
const solo = { tag: '@solo' };

test('a rank whose tab goes to the background at step 5 trains on to the end (headful, default throttling)', solo, async () => {
  test.setTimeout(240_000);
  const lines: string[] = [];
  const { ok, summary } = await launch({
    nproc: 2,
    job: 'train',
    session: sessionName('background'),
    timeoutSec: 180,
    tabs: true,
    // The default backend (WebGPU): on cpu the 60 steps end within a second or two of the hide, before the
    // browser's throttling shows (a longest gap of 832 ms once on CI). One epoch and a small test
    // set: the evaluations are not the subject.
    jobParams: { dataset: 'synthetic', trainSize: '4096', testSize: '64', batchSize: '32', steps: '60', evalEvery: '0' },
    faults: [{ kind: 'hide', rank: 1, step: 5 }],
    log: (l) => lines.push(l),
  });
  if (!ok) console.log(lines.slice(-30).join('\n'));
  expect(ok, JSON.stringify(summary)).toBe(true);
  expect(summary.steps).toBe(60);
  expect(summary.identical).toBe(true);
  const hidden = summary.hidden as Array<{ rank: number; atStep: number; longestTimerGapMs: number }>;
  expect(hidden).toMatchObject([{ rank: 1, atStep: 5 }]);
  // The browser did throttle the tab: its own 200 ms timers fired about once a second.
  expect(hidden[0]!.longestTimerGapMs).toBeGreaterThanOrEqual(900);
  expect(summary.visibility).toEqual([
    { rank: 0, state: 'visible' },
    { rank: 1, state: 'hidden' },
  ]);
});

test(
  'a tab hidden while it waits for the group, under intensive throttling, keeps its place and trains when the group fills',
  solo,
  async () => {
    // Intensive throttling (one timer wake-up a minute) after 1 s hidden instead of minutes. A rank
    // that waits in the lobby has no WebRTC link and no title updates, so nothing exempts it: only
    // heartbeats that tick from a Worker keep the server from evicting it. The server's liveness
    // bounds are 3 s (5 and 10 s by default) so that the page's own timers are starved for three
    // times both within seconds.
    test.setTimeout(240_000);
    const livenessMs = 3_000;
    const server = await startServer({ port: 0, log: () => {}, heartbeatTimeoutMs: livenessMs, busyTimeoutMs: livenessMs });
    const driver = await tabsDriver(() => {}, { intensiveThrottlingAfterSec: 1 });
    try {
      // The launcher drives its Chromium over a pipe: no DevTools port where another local user
      // could read the session's token from the tabs' URLs.
      const chromiums = readdirSync('/proc')
        .filter((d) => /^\d+$/.test(d))
        .map((d) => {
          try {
            return readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0');
          } catch {
            return [];
          }
        })
        .filter((argv) => argv.some((a) => a.startsWith('--window-size=900,700')));
      expect(chromiums.length, 'the --tabs Chromium was not found among the processes').toBeGreaterThan(0);
      expect(chromiums.filter((argv) => argv.some((a) => a.startsWith('--remote-debugging-port')))).toEqual([]);
      expect(chromiums.some((argv) => argv.includes('--remote-debugging-pipe'))).toBe(true);
      const session = sessionName('intensive');
      const open = async (rank: number) => {
        const reports: Report[] = [];
        let settle!: { resolve(r: Record<string, unknown>): void; reject(e: Error): void };
        const result = new Promise<Record<string, unknown>>((resolve, reject) => (settle = { resolve, reject }));
        result.catch(() => {});
        const tab = await driver.newRank({
          onReport: (r) => {
            reports.push(r);
            if (r.type === 'result') settle.resolve(r.result);
            if (r.type === 'error') settle.reject(new Error(`rank ${rank}: ${r.name}: ${r.message}`));
          },
          onConsole: () => {},
          onCrash: (reason) => settle.reject(new Error(`rank ${rank}: ${reason}`)),
        });
        const url = new URL(server.url);
        url.search = new URLSearchParams({
          session,
          world: '2',
          rank: String(rank),
          job: 'train',
          dataset: 'synthetic',
          trainSize: '1024',
          batchSize: '32',
          steps: '20',
          evalEvery: '0',
          backend: 'cpu',
        }).toString();
        await tab.open(withToken(url, tokenFor(session)));
        return { tab, reports, result };
      };
      const first = await open(0);
      await first.tab.hide(() => {});
      expect(await first.tab.visibility()).toBe('hidden');
      // The page's own chained timers show when intensive throttling is in force: a gap of three
      // liveness bounds or more (basic throttling alone gives about 1 s).
      let gap = 0;
      for (const deadline = Date.now() + 120_000; gap < 3 * livenessMs && Date.now() < deadline; ) {
        await new Promise((r) => setTimeout(r, 500));
        gap = (await first.tab.timerProbe())?.longestGapMs ?? 0;
      }
      expect(gap, 'intensive throttling never applied to the hidden tab').toBeGreaterThanOrEqual(3 * livenessMs);
      const second = await open(1);
      const [a, b] = await Promise.all([first.result, second.result]);
      expect(a.steps).toBe(20);
      expect(a.weightHash).toBe(b.weightHash);
      // The server never lost the hidden rank: no reconnect, one round.
      const events = first.reports.flatMap((r) => (r.type === 'elastic' ? [r.event] : []));
      expect(events.filter((e) => e.type === 'reconnecting')).toEqual([]);
      expect(a.generations).toBe(1);
    } finally {
      await driver.close();
      await server.close();
    }
  },
);
