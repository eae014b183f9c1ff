/**
 * How a page reports to the launcher (or a Playwright test): the launcher exposes
 * `window.__ddpReport` before the page loads; a person's tab has none and reports nowhere.
 * `elastic` reports carry the library's own events (rounds, the samples each step trained,
 * the end), from the built-in job and from user scripts alike.
 */
import { setEventHandler, type ElasticEvent } from '../src/index.ts';

export type Report =
  | { type: 'rank'; rank: number; worldSize: number }
  | { type: 'elastic'; event: ElasticEvent }
  | { type: 'result'; result: Record<string, unknown> }
  | { type: 'error'; name: string; message: string };

declare global {
  interface Window {
    __ddpReport?: (report: Report) => void;
    /** The last report, for tests that poll the page instead. */
    __ddpLast?: Report;
  }
}

export function report(r: Report): void {
  window.__ddpLast = r;
  window.__ddpReport?.(r);
}

/** Sends the library's elastic events of this page to the launcher. */
export function reportElasticEvents(): void {
  if (window.__ddpReport) setEventHandler((event) => report({ type: 'elastic', event }));
}
