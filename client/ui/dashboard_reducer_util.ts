/**
 * What the dashboard's reducers (dashboard_state.ts and the dashboard_*_events.ts beside it) share:
 * the log, the epoch base, the set of ranks, and whether the run is over.
 */
import type { DashboardState, LogEntry, LogLevel, Phase, RankPipelineMetrics, Role } from './dashboard_types.ts';
import type { FleetMember } from '../train/events.ts';

/** Recent steps kept per rank for averages (throughput, time breakdown, stat cards). */
export const RECENT = 20;
export const MAX_LOG = 400;

export const NO_ROLE: Role = { host: false, hasHost: false, spectator: false };

export const NO_RANKS: readonly number[] = [];
export const NO_FLEET: readonly FleetMember[] = [];
export const NO_PIPELINE_RANKS: ReadonlyMap<number, RankPipelineMetrics> = new Map();
/** A reducer's log: an entry at the action's time. */
export type Log = (s: DashboardState, level: LogLevel, message: string) => DashboardState;

export function logAt(at: number): Log {
  return (s, level, message) => withLog(s, at, level, message);
}

export function noteEpoch(state: DashboardState, epoch: number): DashboardState {
  return state.epochBase === null ? { ...state, epochBase: epoch === 0 ? 0 : 1 } : state;
}

export function withLog(state: DashboardState, at: number, level: LogLevel, message: string): DashboardState {
  const entry: LogEntry = { id: state.nextLogId, at, level, message };
  const log = [entry, ...state.log];
  if (log.length > MAX_LOG) log.length = MAX_LOG;
  return { ...state, log, nextLogId: state.nextLogId + 1 };
}

/** `ranks` with `rank` added in order; the same array when it is there already. */
export function withRank(ranks: readonly number[], rank: number): readonly number[] {
  if (ranks.includes(rank)) return ranks;
  return [...ranks, rank].sort((a, b) => a - b);
}

/** The run is over (for better or worse): nothing but 'done' changes its phase any more. */
export function isOver(phase: Phase): boolean {
  return phase === 'done' || phase === 'stopped' || phase === 'failed' || phase === 'ended' || phase === 'removed';
}
