/**
 * The fleet table's model: every rank of the current group, what it said about itself, its time
 * per step and its share of the global batch.
 */
import type { BackendName } from '../train/events.ts';
import type { DashboardState } from './dashboard_state.ts';
import { rankAverages } from './dashboard_perf.ts';
import { fmtMs, fmtNumber } from './format.ts';

export interface FleetRow {
  rank: number;
  self: boolean;
  lost: boolean;
  /** "Chrome 156"; null until the rank said. */
  browser: string | null;
  /** "Android phone", "Linux". */
  platform: string | null;
  backend: BackendName | null;
  /** Why it runs on a fallback backend. */
  fallback: string | null;
  /** The adapter, the WebGL renderer or the CPU, with the device's RAM when the browser says ("Mali-G715 · 4 GB RAM"). */
  device: string | null;
  /** Mean time per step (and its compute) over the rank's recent steps. */
  stepMs: number | null;
  computeMs: number | null;
  /** The rank's share of the global batch over its recent steps, 0..1; null before a step. */
  share: number | null;
  /** True when the ranks do not report their samples and the share is the even split. */
  shareEven: boolean;
  /** Why the rank trained no samples at the last step (idleNote); null when it trained some. */
  idle: string | null;
}

/**
 * Why `rank` trained no samples at the last step, in the group's own figures (balanced batches:
 * its measured cost, and the step at which it gets samples again to be measured again); null
 * when it trained some, or the step does not say.
 */
export function idleNote(s: DashboardState, rank: number | null): string | null {
  const e = s.lastStep;
  const m = rank === null ? undefined : e?.ranks.find((r) => r.rank === rank);
  if (!e || !m || m.samples !== 0) return null;
  const idle = m.idle;
  if (!idle) return 'no samples this step';
  const fixed = idle.overheadMs >= 0.05 ? ` + ${fmtMs(idle.overheadMs)} a step` : '';
  const again =
    idle.probeAt <= e.totalSteps
      ? `measured again at step ${idle.probeAt}`
      : `the run ends at step ${e.totalSteps}, before its next measurement at step ${idle.probeAt}`;
  return `no samples this step: the group gave them to faster tabs (measured cost ${fmtMs(idle.perSampleMs)}/sample${fixed}; ${again})`;
}

/**
 * Every rank of the current group: what it said about itself (browser, backend, device), its
 * time per step, and its share of the global batch, `samples / sum over ranks` over the recent
 * steps (each rank's batch may differ); a run whose steps do not report `samples` splits evenly.
 */
export function fleetRows(s: DashboardState): FleetRow[] {
  const ranks = new Set<number>(s.fleet.map((m) => m.rank));
  for (const r of s.recent.keys()) ranks.add(r);
  if (s.worldSize !== null && s.worldSize <= 4096) for (let r = 0; r < s.worldSize; r++) ranks.add(r);
  const averages = new Map(rankAverages(s).map((a) => [a.rank, a]));
  // The share: samples over the recent steps, when every rank of the latest step reported them.
  // Only data parallel ranks split a global batch: pipeline stages take the same batches, parameter-server workers their own.
  const splitsBatch = s.config === null || (s.config.pp <= 1 && s.config.strategy === 'ddp');
  const stepRanks = splitsBatch ? (s.lastStep?.ranks.map((m) => m.rank) ?? []) : [];
  const sampleSums = new Map<number, number>();
  let measured = stepRanks.length > 0;
  for (const r of stepRanks) {
    const list = s.recent.get(r) ?? [];
    if (list.length === 0 || !list.every((m) => typeof m.samples === 'number' && Number.isFinite(m.samples) && m.samples >= 0))
      measured = false;
    sampleSums.set(
      r,
      list.reduce((sum, m) => sum + (m.samples ?? 0), 0),
    );
  }
  const total = [...sampleSums.values()].reduce((a, b) => a + b, 0);
  if (!(total > 0)) measured = false;
  return [...ranks]
    .sort((a, b) => a - b)
    .map((rank) => {
      const m = s.fleet.find((f) => f.rank === rank);
      const a = averages.get(rank);
      const inStep = stepRanks.includes(rank);
      // The device's RAM as the browser reports it (navigator.deviceMemory), not the GPU's.
      const memory = m?.memoryGB != null ? `${fmtNumber(m.memoryGB, m.memoryGB < 1 ? 2 : 0)} GB RAM` : null;
      const device = [m?.device ?? null, memory].filter((x): x is string => x !== null).join(' · ');
      return {
        rank,
        self: rank === s.self,
        lost: s.lost.includes(rank),
        browser: m?.browser ?? null,
        platform: m?.platform ?? null,
        backend: m?.backend ?? (rank === s.self ? (s.backend?.name ?? null) : null),
        fallback: m?.fallback ?? null,
        device: device === '' ? null : device,
        stepMs: a && Number.isFinite(a.totalMs) ? a.totalMs : null,
        computeMs: a && Number.isFinite(a.breakdownMs.compute) ? a.breakdownMs.compute : null,
        share: !inStep ? null : measured ? sampleSums.get(rank)! / total : 1 / stepRanks.length,
        shareEven: inStep && !measured,
        idle: inStep ? idleNote(s, rank) : null,
      };
    });
}
