/**
 * Which browser each rank runs in (`--browser B` for all ranks, `--browsers B0,B1,...` one per
 * rank): Chromium (headless pages of one Playwright Chromium, launcher/driver.ts) or Firefox (a
 * Firefox process per rank, launcher/firefox.ts). A class is a mixed fleet; this is how a run
 * here is one too.
 */
import { headlessDriver, type RankDriver, type RankHandlers, type RankTarget } from './driver.ts';
import { firefoxDriver, firefoxPath } from './firefox.ts';

export const RANK_BROWSERS = ['chromium', 'firefox'] as const;
export type RankBrowser = (typeof RANK_BROWSERS)[number];

export function isRankBrowser(s: string): s is RankBrowser {
  return (RANK_BROWSERS as readonly string[]).includes(s);
}

/** What browsers a run's ranks open in. */
export interface BrowserPlan {
  /** One per rank opened at the start (--nproc of them). */
  ranks: RankBrowser[];
  /** The browser of pages opened later (--join). */
  join: RankBrowser;
}

/**
 * `--browser B` and `--browsers B0,B1,...` as a plan for `nproc` ranks (undefined: neither given,
 * every rank Chromium). Pages opened by `--join` use --browser's browser, or Chromium with
 * --browsers. Throws an Error that says what to give instead.
 */
export function parseBrowsers(browser: string | undefined, browsers: string | undefined, nproc: number): BrowserPlan | undefined {
  const names = RANK_BROWSERS.join(' or ');
  if (browser !== undefined && browsers !== undefined) {
    throw new Error('give --browser B (every rank) or --browsers B0,B1,... (one per rank), not both');
  }
  if (browser !== undefined) {
    if (!isRankBrowser(browser)) throw new Error(`--browser must be ${names}, got "${browser}"`);
    return { ranks: Array.from({ length: nproc }, () => browser), join: browser };
  }
  if (browsers === undefined) return undefined;
  const list = browsers.split(',').map((b) => b.trim());
  const bad = list.filter((b) => !isRankBrowser(b));
  if (bad.length > 0)
    throw new Error(
      `--browsers takes ${names} for each rank, comma-separated (e.g. --browsers chromium,firefox), got ${bad.map((b) => `"${b}"`).join(', ')}`,
    );
  if (list.length !== nproc) {
    throw new Error(
      `--browsers gives ${list.length} browser${list.length === 1 ? '' : 's'} but --nproc is ${nproc}: give one per rank (e.g. --browsers ${Array.from({ length: nproc }, (_, i) => RANK_BROWSERS[i % 2]).join(',')})`,
    );
  }
  return { ranks: list as RankBrowser[], join: 'chromium' };
}

/** Whether a run with this plan opens pages in `browser` (no plan: every page is Chromium). */
export function opensIn(plan: BrowserPlan | undefined, browser: RankBrowser): boolean {
  if (plan === undefined) return browser === 'chromium';
  return plan.join === browser || plan.ranks.includes(browser);
}

/** Whether the plan opens any Firefox rank. */
export function usesFirefox(plan: BrowserPlan | undefined): boolean {
  return plan !== undefined && (plan.join === 'firefox' || plan.ranks.includes('firefox'));
}

/**
 * What a run with Firefox ranks cannot combine with (none: fine). Firefox ranks are plain
 * processes on this machine: not tabs of the headful Chromium (--tabs), not hosts of the virtual
 * LAN (--lan, whose ranks are Chromiums started in network namespaces), and they do not yet trust a
 * self-signed server's one certificate as Chromium ranks do (--https, --server-cert).
 */
export function firefoxProblems(
  plan: BrowserPlan | undefined,
  o: { tabs?: boolean; lan?: boolean; https?: boolean; serverCert?: boolean; server?: string },
): string[] {
  if (!usesFirefox(plan)) return [];
  const problems: string[] = [];
  if (o.tabs) problems.push('--tabs runs every rank as a tab of one headful Chromium: drop --tabs for Firefox ranks');
  if (o.lan) problems.push('--lan runs every rank as a Chromium in its own network namespace: Firefox ranks do not run on the virtual LAN');
  if (o.https || o.serverCert || o.server?.startsWith('https:')) {
    problems.push(
      "Firefox ranks cannot trust a self-signed certificate yet (Chromium ranks trust exactly the server's): use an http server for runs with Firefox ranks",
    );
  }
  return problems;
}

/**
 * One driver for a mixed fleet: the n-th rank opened gets the plan's n-th browser, later pages
 * (--join) the plan's join browser. Chromium starts on its first rank, so an all-Firefox run starts
 * none. `browserOf(index)` says which browser the page opened n-th runs in.
 */
export function mixedDriver(
  plan: BrowserPlan,
  o: { log: (line: string) => void; chromiumArgs?: readonly string[] },
): RankDriver & { browserOf(index: number): RankBrowser | undefined } {
  if (usesFirefox(plan)) firefoxPath();
  let chromium: Promise<RankDriver> | undefined;
  const firefox = firefoxDriver(o.log);
  const opened: RankBrowser[] = [];
  return {
    name: 'mixed',
    browserOf: (index) => opened[index],
    async newRank(h: RankHandlers): Promise<RankTarget> {
      const browser = plan.ranks[opened.length] ?? plan.join;
      opened.push(browser);
      if (browser === 'firefox') return firefox.newRank(h);
      chromium ??= headlessDriver(o.chromiumArgs ?? []);
      return (await chromium).newRank(h);
    },
    async close(): Promise<void> {
      await Promise.all([
        firefox.close(),
        chromium?.then(
          (d) => d.close(),
          () => {},
        ),
      ]);
    },
  };
}
