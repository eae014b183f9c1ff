/** One rank's page as the launcher follows it (its rank, its reports, how it left the run), and its reports in words. */
import type { Report } from '../src/jobs/job_report.ts';
import type { RankTarget } from './driver.ts';
import type { RankBrowser } from './rank_browsers.ts';
import type { RankResult } from './summary_fields.ts';

export interface RankPage {
  index: number;
  page: RankTarget;
  label: string;
  rank: number | undefined;
  /** Killed or frozen pages are not expected to finish, nor are pages that arrived after the run ended. */
  expected: boolean;
  done: boolean;
  /** The page trained in a round (an elastic 'round' event): it was part of the run. */
  trained?: boolean;
  /** Its browser, with --browser or --browsers. */
  browser?: RankBrowser;
  result?: RankResult;
  /** The page's last report and when: what a timeout names for a page that went quiet. */
  lastReport?: { what: string; at: number };
  /** The fault that took it out of the run, or that the run ended without it (RendezvousClosedError). */
  out?: 'killed' | 'frozen' | 'ended without it';
}

/** A tab put in the background (--hide), and its own timers' longest gap while hidden. */
export interface HiddenTab {
  rank: number;
  atStep: number;
  longestTimerGapMs?: number;
}

/** A page's report in a few words, for a timeout's message. */
export function describeReport(r: Report): string {
  switch (r.type) {
    case 'rank':
      return `its rank (${r.rank} of ${r.worldSize})`;
    case 'elastic': {
      const e = r.event;
      const at = 'step' in e && typeof e.step === 'number' ? ` at step ${e.step}` : '';
      return `the elastic event '${e.type}'${'round' in e && typeof e.round === 'string' ? ` of round ${e.round}` : ''}${at}`;
    }
    default:
      return `'${r.type}'`;
  }
}
