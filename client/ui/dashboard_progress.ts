/**
 * The run's progress and time: its step rate, the evaluations to come, the time taken and left,
 * and the progress bar's figures.
 */
import type { DashboardState } from './dashboard_types.ts';
import { epochOf } from './dashboard_format.ts';
import { fmtDuration, fmtInt } from './format.ts';

/** Seconds the run took: the job's own total once it is done, else the latest step's elapsed time. */
export function runSeconds(s: DashboardState): number | null {
  const total = s.summary?.seconds;
  if (s.finished && typeof total === 'number' && Number.isFinite(total)) return total;
  return s.lastStep?.elapsedSec ?? null;
}

/**
 * Training steps per second over the recent window, or over the whole run before there is a
 * window; time spent evaluating in the window is not step time.
 */
export function stepRate(s: DashboardState): number | null {
  const c = s.stepClock;
  if (c.length >= 2) {
    const a = c[0]!;
    const b = c[c.length - 1]!;
    const t = b.t - a.t - (b.evalT - a.evalT);
    if (t > 0 && b.step > a.step) return (b.step - a.step) / t;
  }
  const e = s.lastStep;
  const t = e ? e.elapsedSec - s.evalClock.seconds : 0;
  return e && t > 0 ? e.step / t : null;
}

/** Mean seconds of one evaluation so far, or null before one was timed. */
export function evalSeconds(s: DashboardState): number | null {
  return s.evalClock.count > 0 ? s.evalClock.seconds / s.evalClock.count : null;
}

/**
 * Evaluations still to come after the latest step: every `evalEvery` steps, at each epoch end,
 * and once at the very end (steps that are several of these count once).
 */
export function evalsLeft(s: DashboardState): number {
  const e = s.lastStep;
  if (!e || e.totalSteps <= e.step) return 0;
  const every = s.config?.evalEvery ?? 0;
  const epoch = s.shard?.stepsPerEpoch ?? 0;
  const multiples = (k: number) => (k > 0 ? Math.floor(e.totalSteps / k) - Math.floor(e.step / k) : 0);
  const both = every > 0 && epoch > 0 ? multiples(lcm(every, epoch)) : 0;
  const counted = multiples(every) + multiples(epoch) - both;
  const lastCounted = (every > 0 && e.totalSteps % every === 0) || (epoch > 0 && e.totalSteps % epoch === 0);
  return counted + (lastCounted ? 0 : 1);
}

/** Seconds left: the steps to go at the recent rate, plus the evaluations to go at their measured time. */
export function etaSeconds(s: DashboardState): number | null {
  const e = s.lastStep;
  const rate = stepRate(s);
  if (!e || !rate) return null;
  return Math.max(0, (e.totalSteps - e.step) / rate + evalsLeft(s) * (evalSeconds(s) ?? 0));
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
  const figures = { step, total, max: Math.max(total, 1), value: s.phase === 'done' && total > 0 ? total : Math.min(step, total || 1), done: s.finished };
  if (!e) return { ...figures, text: 'No steps yet.' };
  const pct = e.totalSteps > 0 ? Math.floor((100 * e.step) / e.totalSteps) : 0;
  const parts = [`Epoch ${epochOf(s, e.epoch)}`, `step ${fmtInt(e.step)} / ${fmtInt(e.totalSteps)} (${pct}%)`];
  const took = runSeconds(s) ?? e.elapsedSec;
  if (s.phase === 'done') parts.push(`finished in ${fmtDuration(took)}`);
  else if (s.phase === 'stopped') parts.push(`stopped after ${fmtDuration(took)}`);
  else if (s.phase === 'failed') parts.push(`failed after ${fmtDuration(took)}`);
  else if (s.phase === 'ended') parts.push(`ended after ${fmtDuration(took)}`);
  else if (s.phase === 'removed') parts.push(`removed after ${fmtDuration(took)}`);
  else {
    const rate = stepRate(s);
    const eta = etaSeconds(s);
    if (rate) parts.push(`${rate >= 10 ? rate.toFixed(0) : rate.toFixed(1)} steps/s`);
    parts.push(eta === null ? 'estimating time left…' : `about ${fmtDuration(eta)} left`);
  }
  return { ...figures, text: parts.join(' · ') };
}

function gcd(a: number, b: number): number {
  return b === 0 ? a : gcd(b, a % b);
}

function lcm(a: number, b: number): number {
  return (a / gcd(a, b)) * b;
}
