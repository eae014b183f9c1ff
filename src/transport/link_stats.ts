/** A link's network path out of WebRTC's stats: which ICE candidate pair carries it, and how fast. */
import type { CandidateType, PathSample } from './peer_link.ts';

const CANDIDATE_TYPES: ReadonlySet<string> = new Set(['host', 'srflx', 'prflx', 'relay']);
/** A peer connection's stats hold a few entries per candidate; more than this is not a stats report we understand. */
const MAX_STATS_ENTRIES = 2_000;

/**
 * The selected candidate pair out of a `getStats()` report's entries: the transport's
 * `selectedCandidatePairId` (the standard, Chromium), else a pair marked `selected` (Firefox),
 * else the nominated, succeeded pair that carried the most. Undefined when no pair is selected yet.
 * Reads defensively: every field is checked, nothing is trusted to be there.
 */
export function selectedPath(stats: Iterable<unknown>, now = Date.now()): PathSample | undefined {
  const byId = new Map<string, Record<string, unknown>>();
  const transports: Array<Record<string, unknown>> = [];
  const pairs: Array<Record<string, unknown>> = [];
  let count = 0;
  for (const s of stats) {
    if (++count > MAX_STATS_ENTRIES) break;
    if (typeof s !== 'object' || s === null) continue;
    const entry = s as Record<string, unknown>;
    if (typeof entry.id === 'string') byId.set(entry.id, entry);
    if (entry.type === 'transport') transports.push(entry);
    else if (entry.type === 'candidate-pair') pairs.push(entry);
  }
  const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : null);
  let pair: Record<string, unknown> | undefined;
  let transport: Record<string, unknown> | undefined;
  for (const t of transports) {
    const id = t.selectedCandidatePairId;
    const p = typeof id === 'string' ? byId.get(id) : undefined;
    if (p?.type === 'candidate-pair') {
      pair = p;
      transport = t;
      break;
    }
  }
  pair ??= pairs.find((p) => p.selected === true);
  pair ??= pairs
    .filter((p) => p.nominated === true && p.state === 'succeeded')
    .sort((a, b) => (num(b.bytesSent) ?? 0) - (num(a.bytesSent) ?? 0))[0];
  if (!pair) return undefined;
  transport ??= transports.find((t) => t.id === pair.transportId);
  const candidate = (id: unknown): Record<string, unknown> | undefined => (typeof id === 'string' ? byId.get(id) : undefined);
  const local = candidate(pair.localCandidateId);
  const remote = candidate(pair.remoteCandidateId);
  const type = (c: Record<string, unknown> | undefined): CandidateType | null =>
    typeof c?.candidateType === 'string' && CANDIDATE_TYPES.has(c.candidateType) ? (c.candidateType as CandidateType) : null;
  const rtt = num(pair.currentRoundTripTime);
  // The transport's counters survive a change of the selected pair (the pair's restart at zero).
  const counters = transport && num(transport.bytesSent) !== null ? transport : pair;
  return {
    local: type(local),
    remote: type(remote),
    protocol: typeof local?.protocol === 'string' && /^(udp|tcp)$/.test(local.protocol) ? local.protocol : null,
    rttMs: rtt === null ? null : Math.round(rtt * 1e4) / 10,
    bytesSent: num(counters.bytesSent) ?? 0,
    bytesReceived: num(counters.bytesReceived) ?? 0,
    at: num(pair.timestamp) ?? now,
  };
}
