/**
 * The ring card's model: what the ring view draws, and how a link's bytes travel, in words.
 */
import type { DashboardState } from './dashboard_types.ts';
import type { RingModel } from './ring_view.ts';

/** How a link's bytes travel, in words: "directly (host ↔ host)", "through a TURN relay (relay ↔ relay)". */
export function pathWords(path: { local: string | null; remote: string | null; rttMs: number | null }): string {
  const pair = `${path.local ?? 'unknown'} ↔ ${path.remote ?? 'unknown'}`;
  const how =
    path.local === 'relay' || path.remote === 'relay'
      ? 'through a TURN relay'
      : path.local === 'host' && path.remote === 'host'
        ? 'directly'
        : path.local === null || path.remote === null
          ? 'by an unknown path'
          : 'directly, through NAT';
  return `${how} (${pair})${path.rttMs === null ? '' : `, round trip ${path.rttMs} ms`}`;
}

/** What the ring view draws. */
export function ringModel(s: DashboardState): RingModel {
  return {
    worldSize: s.worldSize ?? s.config?.max ?? Math.max(1, s.joined.length),
    self: s.self,
    joined: new Set(s.joined),
    lost: new Set(s.lost),
    observedLinks: s.links,
    ringProven: s.ringProven,
    active: s.phase === 'training',
    step: s.stepClock.at(-1)?.step ?? 0,
  };
}
