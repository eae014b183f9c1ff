/**
 * The performance card's model: each rank's recent throughput and time breakdown, and a DDP run's
 * communication (its hook and bytes per step).
 */
import type { StepBreakdownMs } from '../train/events.ts';
import type { DashboardState } from './dashboard_state.ts';
import { mean } from './dashboard_format.ts';
import { describeCommHook } from './dashboard_job.ts';
import { fmtBytes, fmtNumber } from './format.ts';

export const BREAKDOWN_PARTS: ReadonlyArray<keyof StepBreakdownMs> = ['compute', 'readback', 'allreduce', 'apply'];
export const BREAKDOWN_NAME: Readonly<Record<keyof StepBreakdownMs, string>> = {
  compute: 'Compute',
  readback: 'Readback',
  allreduce: 'All-reduce',
  apply: 'Apply',
};

export interface RankAverages {
  rank: number;
  samplesPerSec: number;
  breakdownMs: StepBreakdownMs;
  /** The breakdown's sum: the rank's time per step. */
  totalMs: number;
  /** DDP runs: bytes the rank sent per step, over its recent steps that said (left out when none did). */
  bytesPerStep?: number;
  /** --devices K > 1: the rank's devices and their mean compute per step over its recent steps. */
  devices?: { count: number; meanMs: number };
  self: boolean;
  lost: boolean;
}

/** Each rank's averages over its recent steps, in rank order (non-finite figures are skipped). */
export function rankAverages(s: DashboardState): RankAverages[] {
  return [...s.recent.keys()]
    .sort((a, b) => a - b)
    .map((rank) => {
      const list = s.recent.get(rank)!;
      const breakdownMs = { compute: 0, readback: 0, allreduce: 0, apply: 0 };
      for (const p of BREAKDOWN_PARTS) breakdownMs[p] = mean(list.map((m) => m.breakdownMs[p]));
      const sent = mean(list.map((m) => m.commBytes ?? NaN));
      const withDevices = list.filter((m) => m.devices && m.devices.count > 1);
      return {
        rank,
        samplesPerSec: mean(list.map((m) => m.samplesPerSec)),
        breakdownMs,
        totalMs: BREAKDOWN_PARTS.reduce((sum, p) => sum + breakdownMs[p], 0),
        ...(Number.isFinite(sent) ? { bytesPerStep: sent } : {}),
        ...(withDevices.length > 0
          ? { devices: { count: withDevices.at(-1)!.devices!.count, meanMs: mean(withDevices.map((m) => m.devices!.meanMs)) } }
          : {}),
        self: rank === s.self,
        lost: s.lost.includes(rank),
      };
    });
}

/** The performance card's line about a DDP run's communication: the hook, bytes per step, and the ratio to the float32 all-reduce. */
export interface CommFigures {
  hook: string;
  /** Mean over the ranks' recent steps (null: no step said). */
  bytesPerStep: number | null;
  /** Recent bytes sent over what the float32 all-reduce would have sent (null: unknown, or a world of one). */
  ratio: number | null;
  text: string;
}

/**
 * The hook in use and what it sends, over the ranks' recent steps: null for a run that is not
 * plain DDP (pipelines and parameter servers have no hook) or before the job's config is known.
 */
export function commFigures(s: DashboardState): CommFigures | null {
  const c = s.config;
  if (!c || c.pp > 1 || c.strategy !== 'ddp') return null;
  const hook = describeCommHook(c.commHook ?? { kind: 'none' });
  const steps = [...s.recent.values()].flat().filter((m) => typeof m.commBytes === 'number' && Number.isFinite(m.commBytes));
  const bytesPerStep = steps.length > 0 ? mean(steps.map((m) => m.commBytes!)) : null;
  const dense = steps.reduce((sum, m) => sum + (m.commDenseBytes ?? NaN), 0);
  const ratio = steps.length > 0 && dense > 0 ? steps.reduce((sum, m) => sum + m.commBytes!, 0) / dense : null;
  const parts = [`Gradients: ${hook}`];
  if (bytesPerStep !== null) parts.push(`${fmtBytes(bytesPerStep)} sent per rank per step`);
  if (ratio !== null) parts.push(`${fmtNumber(ratio, ratio < 0.1 ? 3 : 2)}× the float32 all-reduce’s bytes`);
  return { hook, bytesPerStep, ratio, text: parts.join(' · ') };
}
