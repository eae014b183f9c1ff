/**
 * How the launcher drives its ranks' pages. Two drivers feed the same report handler in run.ts:
 * headless pages of one Playwright Chromium (the default), and `--tabs` (launcher/tabs.ts): a
 * headful Chromium under Xvfb, driven over the DevTools protocol, with the browser's default
 * background throttling. With `--lan` (launcher/lan_driver.ts) each rank is a Chromium of its own
 * in its own network namespace. With `--browser firefox` or `--browsers ...` (launcher/rank_browsers.ts)
 * a rank may be a Firefox process instead (launcher/firefox.ts).
 */
import type { Browser, Page } from 'playwright-core';
import type { Report } from '../src/jobs/job_report.ts';
import { launchChromium } from './browser.ts';
import type { LanHost } from './lan.ts';

/** Calls the page's `__ddpLoseDevice` hook (client/device_hook.ts); an expression, so both drivers can evaluate it. */
export const LOSE_DEVICE_EXPRESSION = `typeof window.__ddpLoseDevice === 'function' ? window.__ddpLoseDevice() : 'the page has no __ddpLoseDevice hook (not a training page or script of this project?)'`;

/** What the hook answers when it destroyed the device (client/device_hook.ts's DEVICE_DESTROYED). */
const DESTROYED = 'destroyed';

/** Throws unless the page's answer says the device was destroyed. */
export function checkDeviceLost(answer: unknown): void {
  if (answer !== DESTROYED) throw new Error(String(answer));
}

export interface RankHandlers {
  onReport(r: Report): void;
  onConsole(line: string): void;
  /** The page crashed or its target went away without the launcher closing it. */
  onCrash(reason: string): void;
}

/** One rank's page. */
export interface RankTarget {
  /** Navigates to the rank's URL, with `window.__ddpReport` defined before the page's scripts run. */
  open(url: string): Promise<void>;
  /** Kills the rank: closes its page. */
  kill(): Promise<void>;
  /** Freezes the page (no timers, no tasks; socket left open). */
  freeze(log: (line: string) => void): Promise<void>;
  /** Puts the page in the background (tabs only). */
  hide(log: (line: string) => void): Promise<void>;
  /** Destroys the page's WebGPU device (its `__ddpLoseDevice` hook); fails when the page has none. */
  loseDevice(): Promise<void>;
  /** document.visibilityState, or an error's text. */
  visibility(): Promise<string>;
  /** For a hidden tab: the longest gap between its own chained 200 ms timers since it was hidden. */
  timerProbe(): Promise<{ longestGapMs: number; ticks: number } | undefined>;
  /** The rank's host on the virtual LAN (--lan). */
  readonly host?: LanHost;
}

export interface RankDriver {
  readonly name: 'headless' | 'tabs' | 'lan' | 'firefox' | 'mixed';
  newRank(handlers: RankHandlers): Promise<RankTarget>;
  close(): Promise<void>;
}

/**
 * Freezes a page: through the page-lifecycle API ("frozen": no timers, no tasks) and, since
 * headless Chromium 156 accepts that command but keeps running the page's JavaScript, by pausing
 * its JavaScript with the debugger as well: to the server and the other ranks the tab then looks
 * exactly like a frozen one (socket open, nothing sent). Always both: a probe of whether the page
 * still ran took over its 500 ms bound beside busy tabs, and the "frozen" page trained on.
 * Returns what thaws it again (as a tab does when it is shown, or the computer wakes).
 */
export async function freezePage(page: Page, log: (line: string) => void): Promise<() => Promise<void>> {
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Page.setWebLifecycleState', { state: 'frozen' });
  await cdp.send('Debugger.enable');
  await cdp.send('Debugger.pause');
  log('[launch] page frozen (lifecycle state "frozen", and its JavaScript paused: headless Chromium runs a frozen page on)');
  return async () => {
    await cdp.send('Page.setWebLifecycleState', { state: 'active' });
    await cdp.send('Debugger.resume');
    await cdp.send('Debugger.disable');
    await cdp.detach();
  };
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Wires a Playwright page to a rank's handlers (the headless and --lan drivers). */
export async function playwrightRank(page: Page, h: RankHandlers): Promise<RankTarget & { takeReports(): Promise<void> }> {
  page.on('console', (msg) => h.onConsole(msg.text()));
  page.on('pageerror', (err) => h.onConsole(`page error: ${err.message}`));
  page.on('crash', () => h.onCrash('the page crashed'));
  let received = 0;
  // Before a kill, every report the page has sent is taken (the page counts them): a report
  // sent just before the tab closes, such as the batch of a step the others then commit with
  // this rank's part, is not lost with it. Then the page closes at once, running its pagehide
  // (its leave notice), as a closed tab does. Bounded: a page that cannot answer closes anyway.
  const takeReports = async (): Promise<void> => {
    const sent = await Promise.race([page.evaluate(() => window.__ddpSent ?? 0).catch(() => 0), sleep(1000).then(() => 0)]);
    for (const until = Date.now() + 1000; received < sent && Date.now() < until; ) await sleep(10);
  };

  await page.exposeFunction('__ddpReport', (r: Report) => {
    received++;
    h.onReport(r);
  });
  return {
    open: async (url) => {
      // Playwright's 30 s default is too short for a page that loads while 30 other tabs train on the same cores.
      await page.goto(url, { timeout: PAGE_LOAD_TIMEOUT_MS });
    },
    takeReports,
    kill: async () => {
      await takeReports();
      await page.close();
    },
    freeze: async (log) => {
      await freezePage(page, log);
    },
    hide: async () => {
      throw new Error('--hide needs --tabs: headless pages are never in the background');
    },
    loseDevice: async () => checkDeviceLost(await page.evaluate(LOSE_DEVICE_EXPRESSION)),
    visibility: () => page.evaluate(() => document.visibilityState as string).catch((e: Error) => `error: ${e.message}`),
    timerProbe: async () => undefined,
  };
}

/** How long a rank's page may take to load (its scripts, TF.js) before the launch fails. */
const PAGE_LOAD_TIMEOUT_MS = 180_000;

/** The default: headless pages of one Playwright-driven Chromium (`extraArgs`: e.g. `trustArgs`). */
export async function headlessDriver(extraArgs: readonly string[] = []): Promise<RankDriver> {
  const browser: Browser = await launchChromium(extraArgs);
  return {
    name: 'headless',
    newRank: async (h: RankHandlers) => playwrightRank(await browser.newPage(), h),
    close: () => browser.close().catch(() => {}),
  };
}
