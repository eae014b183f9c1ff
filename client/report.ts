/**
 * How a page reports to the launcher (or a Playwright test): the launcher exposes
 * `window.__ddpReport` before the page loads; a person's tab has none and reports nowhere.
 * `elastic` reports carry the library's own events (rounds, the samples each step trained,
 * the end), from the built-in job and from user scripts alike.
 */
import type { ProcessGroup } from '../src/index.ts';
import { setEventHandler } from '../src/parallel/events.ts';
import type { LinkReport, Report } from '../src/jobs/job_report.ts';

export type { LinkReport, Report } from '../src/jobs/job_report.ts';

declare global {
  interface Window {
    __ddpReport?: (report: Report) => void;
    /** The last report, for tests that poll the page instead. */
    __ddpLast?: Report;
    /** Reports sent so far: before it closes a tab (a kill), the launcher takes them all. */
    __ddpSent?: number;
  }
}

export function report(r: Report): void {
  window.__ddpLast = r;
  window.__ddpSent = (window.__ddpSent ?? 0) + 1;
  window.__ddpReport?.(r);
}

/** Sends the library's elastic events of this page to the launcher. */
export function reportElasticEvents(): void {
  if (window.__ddpReport) setEventHandler((event) => report({ type: 'elastic', event }));
}

/** This rank's links now, for its result (read once, at the end of a job). */
export async function linkReport(pg: ProcessGroup): Promise<LinkReport[]> {
  const details = await pg.linkDetails();
  return details
    .sort((a, b) => a.peer - b.peer)
    .map((d) => ({
      peer: d.peer,
      state: d.state,
      local: d.path?.local ?? null,
      remote: d.path?.remote ?? null,
      protocol: d.path?.protocol ?? null,
      rttMs: d.path?.rttMs ?? null,
    }));
}
