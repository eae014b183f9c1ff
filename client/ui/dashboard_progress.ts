/**
 * The run's progress: the time taken, the progress bar's figures, and beside them the step rate
 * and the time left, both from time_left.ts (the TIME card shows the same figure).
 */
import type { DashboardState } from './dashboard_types.ts';
import { epochOf } from './dashboard_format.ts';
import { fmtDuration, fmtInt } from './format.ts';
import { timeLeft } from './time_left.ts';

/** Seconds the run took: the job's own total once it is done, else the latest step's elapsed time. */
export function runSeconds(s: DashboardState): number | null {
  const total = s.summary?.seconds;
  if (s.finished && typeof total === 'number' && Number.isFinite(total)) return total;
  return s.lastStep?.elapsedSec ?? null;
}

export interface ProgressFigures {
  step: number;
  total: number;
  /** The progress element's value and max (never 0, so an empty bar is not indeterminate). */
  value: number;
  max: number;
  /** The run finished ('done' arrived, also after a stop). */
  done: boolean;
  text: string;
}

export function progressFigures(s: DashboardState): ProgressFigures {
  const e = s.lastStep;
  const total = e?.totalSteps ?? 0;
  const step = e?.step ?? 0;
  const figures = {
    step,
    total,
    max: Math.max(total, 1),
    value: s.phase === 'done' && total > 0 ? total : Math.min(step, total || 1),
    done: s.finished,
  };
  if (!e) return { ...figures, text: 'No steps yet.' };
  const pct = e.totalSteps > 0 ? Math.floor((100 * e.step) / e.totalSteps) : 0;
  const parts = [`Epoch ${epochOf(s, e.epoch)}`, `step ${fmtInt(e.step)} / ${fmtInt(e.totalSteps)} (${pct}%)`];
  const took = runSeconds(s) ?? e.elapsedSec;
  if (s.phase === 'done') parts.push(`finished in ${fmtDuration(took)}`);
  // Training stopped at the last step; a finished run's total also holds the evaluation after it (the TIME card says both).
  else if (s.phase === 'stopped') parts.push(`stopped after ${fmtDuration(e.elapsedSec)}`);
  else if (s.phase === 'failed') parts.push(`failed after ${fmtDuration(took)}`);
  else if (s.phase === 'ended') parts.push(`ended after ${fmtDuration(took)}`);
  else if (s.phase === 'removed') parts.push(`removed after ${fmtDuration(took)}`);
  else {
    const left = timeLeft(s);
    const rate = left && left.stepSeconds > 0 ? 1 / left.stepSeconds : null;
    if (rate) parts.push(`${rate >= 10 ? rate.toFixed(0) : rate.toFixed(1)} steps/s`);
    parts.push(left?.text ?? 'estimating time left…');
  }
  return { ...figures, text: parts.join(' · ') };
}
