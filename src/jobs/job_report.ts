/**
 * What a page reports to the launcher (or a Playwright test) as it runs: the page calls
 * `window.__ddpReport(report)`, which the launcher exposes before the page loads. Both ends
 * import these types from here; the launcher imports nothing from `client/`.
 */
import type { ElasticEvent } from '../parallel/events.ts';

export type Report =
  | { type: 'rank'; rank: number; worldSize: number }
  /** The library's own events (rounds, the samples each step trained, the end), from the built-in job and from user scripts alike. */
  | { type: 'elastic'; event: ElasticEvent }
  | { type: 'result'; result: Record<string, unknown> }
  | { type: 'error'; name: string; message: string };

/** One link as a rank reports it to the launcher: which way its bytes go (see ProcessGroup.linkDetails). */
export interface LinkReport {
  peer: number;
  state: string;
  local: string | null;
  remote: string | null;
  protocol: string | null;
  rttMs: number | null;
}
