/** `links` in a run's summary: every rank's links as it reported them, so a run says whether its bytes went directly or through a relay. */
import type { RankResult } from './summary_fields.ts';

/** One link seen from one end, in the summary. */
export interface LinkSummary {
  rank: number;
  peer: number;
  /** This end's ICE candidate type of the selected pair: host, srflx, prflx, relay (null: unknown). */
  local: string | null;
  remote: string | null;
  protocol: string | null;
  rttMs: number | null;
}

const CANDIDATE = /^(host|srflx|prflx|relay)$/;

/**
 * `links`: every rank's links as it reported them (each link twice, once from each end), so a run
 * says whether its bytes went directly or through a relay. Fields are checked: a page's result is
 * its own to fill.
 */
export function linksOf(ranks: RankResult[]): { links?: LinkSummary[] } {
  const out: LinkSummary[] = [];
  for (const r of ranks) {
    if (!Array.isArray(r.links)) continue;
    for (const l of r.links.slice(0, 1024) as unknown[]) {
      if (typeof l !== 'object' || l === null) continue;
      const o = l as Record<string, unknown>;
      if (!Number.isInteger(o.peer)) continue;
      const type = (v: unknown) => (typeof v === 'string' && CANDIDATE.test(v) ? v : null);
      out.push({
        rank: r.rank,
        peer: o.peer as number,
        local: type(o.local),
        remote: type(o.remote),
        protocol: o.protocol === 'udp' || o.protocol === 'tcp' ? o.protocol : null,
        rttMs: typeof o.rttMs === 'number' && Number.isFinite(o.rttMs) ? o.rttMs : null,
      });
    }
  }
  return out.length > 0 ? { links: out.sort((a, b) => a.rank - b.rank || a.peer - b.peer) } : {};
}
