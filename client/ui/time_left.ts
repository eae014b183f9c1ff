/**
 * The run's time left, worked out in one place: the Progress panel and the TIME card both show
 * `timeLeft(s).text`, so one screen cannot give two figures (issue 52: 10 min 24 s beside 16 min
 * 44 s, each from its own draw of a jumpy rate).
 *
 * From measured step times: the mean step of the current group (same world size and round) over
 * its last STEP_CLOCK - 1 steps, leaving out each group's first WARMUP_STEPS steps (shaders
 * compile, links warm up) and the pause of a regroup, which is no step. Evaluations still to come
 * (every evalEvery steps, each epoch end, and the final one, which is part of the run) count at
 * their measured time, or, before one was timed, at a time predicted from the step time.
 */
import type { ClockEntry, DashboardState } from './dashboard_types.ts';
import { DATASET_SIZE, evalPerStepSecond } from './estimate.ts';
import { fmtDuration } from './format.ts';

/** Steps kept in the dashboard's step clock: the window of the step time. */
export const STEP_CLOCK = 41;

/** Steps of each group left out of its step time, unless they are all it has. */
export const WARMUP_STEPS = 2;

/** The clock's entry for a step, after `prev` (the clock's last entry). */
export function clockEntry(
  prev: ClockEntry | undefined,
  e: { step: number; elapsedSec: number; world: number; round: number | null; evalT: number },
): ClockEntry {
  const same = prev !== undefined && prev.world === e.world && prev.round === e.round && e.step > prev.step;
  return { step: e.step, t: e.elapsedSec, evalT: e.evalT, world: e.world, round: e.round, inGroup: same ? prev.inGroup + 1 : 1 };
}

/**
 * Seconds per training step of the current group, evaluation pauses left out; null before the
 * group's second step (a first step's elapsed time holds the page's start: a run of 32 steps
 * read "about 24 min left" from it).
 */
export function stepSeconds(s: DashboardState): number | null {
  const c = s.stepClock;
  const last = c.at(-1);
  if (!last) return null;
  const settled = { steps: 0, seconds: 0 };
  const warmup = { steps: 0, seconds: 0 };
  for (let i = c.length - 1; i > 0; i--) {
    const b = c[i]!;
    const a = c[i - 1]!;
    // Only the current group, and never the pause between two groups (b would be its first step).
    if (b.inGroup === 1 || b.world !== last.world || b.round !== last.round) break;
    const seconds = b.t - a.t - (b.evalT - a.evalT);
    if (!(seconds >= 0)) continue;
    const into = b.inGroup <= 1 + WARMUP_STEPS ? warmup : settled;
    into.steps += b.step - a.step;
    into.seconds += seconds;
  }
  const use = settled.steps > 0 ? settled : warmup;
  return use.steps > 0 ? use.seconds / use.steps : null;
}

/** Mean seconds of one evaluation so far, or null before one was timed. */
export function evalSeconds(s: DashboardState): number | null {
  return s.evalClock.count > 0 ? s.evalClock.seconds / s.evalClock.count : null;
}

/**
 * An evaluation's seconds before one was timed: each rank evaluates its share of the test set,
 * at the ratio of evaluation to step time measured for the model (estimate.ts).
 */
export function predictedEvalSeconds(s: DashboardState, step: number): number | null {
  const c = s.config;
  if (!c) return null;
  const full = DATASET_SIZE[c.dataset].test;
  const test = c.testSize > 0 ? Math.min(c.testSize, full) : full;
  const world = Math.max(1, s.stepClock.at(-1)?.world ?? s.worldSize ?? 1);
  return step * Math.ceil(test / world) * evalPerStepSecond(c.model, c.dataset, c.batchSize);
}

/**
 * Evaluations still to come: every `evalEvery` steps, at each epoch end, and once at the very
 * end (steps that are several of these count once), the latest step's own until it is reported.
 */
export function evalsLeft(s: DashboardState): number {
  const e = s.lastStep;
  if (!e || s.finished) return 0;
  const every = s.config?.evalEvery ?? 0;
  const epoch = s.shard?.stepsPerEpoch ?? 0;
  const evaluates = (step: number) => (every > 0 && step % every === 0) || (epoch > 0 && step % epoch === 0);
  // The job evaluates right after the step it reported, and says so with an 'eval' event.
  const pending = s.lastEval?.step !== e.step && (evaluates(e.step) || e.totalSteps <= e.step) ? 1 : 0;
  if (e.totalSteps <= e.step) return pending;
  const multiples = (k: number) => (k > 0 ? Math.floor(e.totalSteps / k) - Math.floor(e.step / k) : 0);
  const both = every > 0 && epoch > 0 ? multiples(lcm(every, epoch)) : 0;
  const counted = multiples(every) + multiples(epoch) - both;
  return pending + counted + (evaluates(e.totalSteps) ? 0 : 1);
}

export interface TimeLeft {
  seconds: number;
  /** Seconds per training step (the rate shown beside the time left is its inverse). */
  stepSeconds: number;
  /** "about 4 min 30 s left" */
  text: string;
}

/** The run's time left, or null before there is a step time (or once the run is over). */
export function timeLeft(s: DashboardState): TimeLeft | null {
  const e = s.lastStep;
  const step = stepSeconds(s);
  if (!e || step === null || s.finished) return null;
  const evals = evalsLeft(s);
  const each = evals > 0 ? (evalSeconds(s) ?? predictedEvalSeconds(s, step) ?? 0) : 0;
  const seconds = Math.max(0, Math.max(0, e.totalSteps - e.step) * step + evals * each);
  return { seconds, stepSeconds: step, text: `about ${fmtRough(seconds)} left` };
}

/**
 * A time left as precise as it is: to 5 s under a minute, to 10 s under ten minutes, to the
 * minute under an hour, then to ten minutes. The figure then holds still between steps.
 */
export function fmtRough(seconds: number): string {
  const unit = seconds < 60 ? 5 : seconds < 600 ? 10 : seconds < 3600 ? 60 : 600;
  const r = Math.max(5, Math.round(seconds / unit) * unit);
  if (r < 60) return `${r} s`;
  if (r < 600) return fmtDuration(r);
  if (r < 3600) return `${r / 60} min`;
  return fmtDuration(r);
}

function gcd(a: number, b: number): number {
  return b === 0 ? a : gcd(b, a % b);
}

function lcm(a: number, b: number): number {
  return (a / gcd(a, b)) * b;
}
