/**
 * How the launcher drives its ranks' pages. Two drivers feed the same report handler in run.ts:
 * headless pages of one Playwright Chromium (the default), and `--tabs` (launcher/tabs.ts): a
 * headful Chromium under Xvfb, driven over the DevTools protocol, with the browser's default
 * background throttling.
 */
import type { Browser, Page } from 'playwright';
import type { Report } from '../client/report.ts';
import { launchChromium } from './browser.ts';

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
  /** document.visibilityState, or an error's text. */
  visibility(): Promise<string>;
  /** For a hidden tab: the longest gap between its own chained 200 ms timers since it was hidden. */
  timerProbe(): Promise<{ longestGapMs: number; ticks: number } | undefined>;
}

export interface RankDriver {
  readonly name: 'headless' | 'tabs';
  newRank(handlers: RankHandlers): Promise<RankTarget>;
  close(): Promise<void>;
}

/**
 * Freezes a page: first through the page-lifecycle API ("frozen": no timers, no tasks). Headless
 * Chromium 156 accepts that command but keeps running the page's JavaScript, so when a probe shows
 * the page still running, its JavaScript is paused with the debugger as well: to the server and the
 * other ranks the tab then looks exactly like a frozen one (socket open, nothing sent).
 */
async function freezePage(page: Page, log: (line: string) => void): Promise<void> {
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

/** The default: headless pages of one Playwright-driven Chromium (`extraArgs`: e.g. `trustArgs`). */
export async function headlessDriver(extraArgs: readonly string[] = []): Promise<RankDriver> {
  const browser: Browser = await launchChromium(extraArgs);
  return {
    name: 'headless',
    async newRank(h: RankHandlers): Promise<RankTarget> {
      const page = await browser.newPage();
      page.on('console', (msg) => h.onConsole(msg.text()));
      page.on('pageerror', (err) => h.onConsole(`page error: ${err.message}`));
      page.on('crash', () => h.onCrash('the page crashed'));
      await page.exposeFunction('__ddpReport', (r: Report) => h.onReport(r));
      return {
        open: async (url) => {
          await page.goto(url);
        },
        kill: () => page.close(),
        freeze: (log) => freezePage(page, log),
        hide: async () => {
          throw new Error('--hide needs --tabs: headless pages are never in the background');
        },
        visibility: () => page.evaluate(() => document.visibilityState as string).catch((e: Error) => `error: ${e.message}`),
        timerProbe: async () => undefined,
      };
    },
    close: () => browser.close().catch(() => {}),
  };
}
