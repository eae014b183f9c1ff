/**
 * Parts every run summary carries, successes and failures alike (run_summary.ts): which browser
 * each page ran in (--browser/--browsers) and each rank's address and rate (--lan).
 */
import type { Lan } from './lan.ts';
import type { RankBrowser } from './rank_browsers.ts';
import type { RankPage } from './rank_page.ts';

/** --browser/--browsers: each page's browser, rank and whether it finished (killed pages and late arrivals included). */
export function browsersPart(
  pages: RankPage[],
  browserOf: ((index: number) => RankBrowser | undefined) | undefined,
): Record<string, unknown> {
  return browserOf
    ? {
        browsers: pages.map((p) => ({
          page: p.index,
          rank: p.rank ?? null,
          browser: p.browser ?? 'chromium',
          finished: p.expected && p.result !== undefined,
        })),
      }
    : {};
}

/** --lan: each rank's address and rate. */
export function lanPart(pages: RankPage[], lan: Lan | undefined): Record<string, unknown> {
  return lan
    ? {
        lan: lan.summary(
          pages
            .filter((p) => p.page?.host)
            .map((p) => ({ rank: p.rank, host: p.page.host!, finished: p.expected && p.result !== undefined })),
        ),
      }
    : {};
}
