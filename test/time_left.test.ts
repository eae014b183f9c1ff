/**
 * The dashboard's time left (client/ui/time_left.ts): one estimator, which the Progress panel and
 * the TIME card both show, checked on a step-time series recorded from a real run.
 */
import { describe, expect, it } from 'vitest';
import { initialDashboardState, reduceDashboard, type DashboardEvent, type DashboardState } from '../client/ui/dashboard_state.ts';
import { progressFigures } from '../client/ui/dashboard_progress.ts';
import { statCards, timeCard } from '../client/ui/dashboard_cards.ts';
import { fmtRough, stepSeconds, timeLeft } from '../client/ui/time_left.ts';
import { parseTrainConfig } from '../src/jobs/train_config.ts';
import type { RankStepMetrics } from '../client/train/events.ts';

/**
 * Rank 0's console of `npm run launch -- --nproc 3 --job train --model mlp --dataset mnist
 * --steps 40 --evalEvery 20 --logEvery 1` on the 2-core machine (2026-11-28): seconds since the
 * launch at which each step (1..40) was reported; the test-set evaluations after steps 20 and 40
 * were reported at 76.45 s and 132.29 s, the end of the run.
 */
const RECORDED = [
  24.36, 25.81, 26.53, 27.43, 28.54, 29.98, 31.26, 32.32, 33.38, 34.62, 35.55, 37.14, 38.05, 39.12, 40.75, 42.37, 43.36, 44.25, 45.16,
  45.21, 78.83, 79.86, 81.33, 82.45, 83.28, 84.99, 86.39, 87.5, 89.65, 90.07, 91.37, 92.23, 93.29, 94.33, 96.02, 97.2, 98.84, 99.7, 101.81,
  101.89,
];
const EVALS: Readonly<Record<number, number>> = { 20: 76.45, 40: 132.29 };
const END = 132.29;
/** The launch's seconds when training started (elapsedSec counts from there). */
const STARTED = 20;
const T0 = Date.UTC(2026, 10, 28, 20, 47);

function config(options: Record<string, string>) {
  return parseTrainConfig((name) => options[name] ?? null);
}

function metrics(rank: number): RankStepMetrics {
  return { rank, loss: 0.5, accuracy: 0.8, samplesPerSec: 50, breakdownMs: { compute: 900, readback: 10, allreduce: 80, apply: 5 } };
}

function act(s: DashboardState, atSec: number, event: DashboardEvent): DashboardState {
  return reduceDashboard(s, { at: T0 + Math.round(atSec * 1000), event });
}

function stepEvent(step: number, total: number, t: number, world = 3): DashboardEvent {
  return {
    type: 'step',
    epoch: 1,
    step,
    totalSteps: total,
    ranks: Array.from({ length: world }, (_, r) => metrics(r)),
    elapsedSec: t - STARTED,
  };
}

/** The recorded run replayed: the state after each step's event (before its evaluation, if any). */
function recordedRun(): Array<{ step: number; t: number; state: DashboardState }> {
  let s = initialDashboardState({ session: 'recorded', at: T0 });
  s = act(s, 1, { type: 'config', config: config({ world: '3', model: 'mlp', dataset: 'mnist', steps: '40', evalEvery: '20' }) });
  s = act(s, 10, { type: 'joined', rank: 0, worldSize: 3, round: 1, backend: 'webgpu', adapter: 'google swiftshader' });
  s = act(s, 10.5, { type: 'shard', epoch: 1, samples: 20_000, datasetSize: 60_000, stepsPerEpoch: 313 });
  const out: Array<{ step: number; t: number; state: DashboardState }> = [];
  RECORDED.forEach((t, i) => {
    const step = i + 1;
    s = act(s, t, stepEvent(step, 40, t));
    out.push({ step, t, state: s });
    const evalAt = EVALS[step];
    if (evalAt !== undefined) s = act(s, evalAt, { type: 'eval', epoch: 1, step, testAccuracy: 0.88, testLoss: 0.4 });
  });
  return out;
}

describe('the time left', () => {
  it('is one figure: the Progress panel and the TIME card show the same text at every step', () => {
    for (const { step, state } of recordedRun()) {
      const left = timeLeft(state);
      if (step === 1) {
        // One step is no step time: both say they are still estimating.
        expect(left).toBeNull();
        expect(progressFigures(state).text).toMatch(/ · estimating time left…$/);
        expect(timeCard(state).sub).toBe('elapsed');
        continue;
      }
      expect(left, `step ${step}`).not.toBeNull();
      expect(progressFigures(state).text).toContain(` · ${left!.text}`);
      expect(progressFigures(state).text.match(/about [^·]+ left/g)).toEqual([left!.text]);
      expect(timeCard(state)).toEqual(statCards(state).time);
      expect(timeCard(state).sub).toBe(`elapsed · ${left!.text}`);
    }
  });

  it('is right on the recorded run: within 15% of the time it really took, the final evaluation included', () => {
    for (const { step, t, state } of recordedRun()) {
      // From the fifth step on (the first are too few to time) to the last, whose time
      // left is the final evaluation alone.
      if (step < 5) continue;
      const actual = END - t;
      const estimate = timeLeft(state)!.seconds;
      expect(estimate / actual, `step ${step}: estimated ${estimate.toFixed(1)} s, took ${actual.toFixed(1)} s`).toBeGreaterThan(0.85);
      expect(estimate / actual, `step ${step}: estimated ${estimate.toFixed(1)} s, took ${actual.toFixed(1)} s`).toBeLessThan(1.15);
    }
  });

  it('leaves out warm-up steps and the pause of a regroup, and times the new group alone', () => {
    let s = initialDashboardState({ session: 'regroup', at: T0 });
    s = act(s, 1, { type: 'joined', rank: 0, worldSize: 3, round: 1, backend: 'webgpu', adapter: null });
    // Three tabs: a 5 s first step, a 3 s second one, then 1 s steps.
    const times = [5, 8, 9, 10, 11, 12, 13];
    times.forEach((t, i) => {
      s = act(s, t, stepEvent(i + 1, 100, t + STARTED));
    });
    expect(stepSeconds(s)).toBe(1);
    // A tab leaves: 20 s to regroup, then two tabs at 2 s a step, of 150 steps in all now.
    s = act(s, 34, { type: 'joined', rank: 0, worldSize: 2, round: 2, backend: 'webgpu', adapter: null });
    const after = [33, 38, 40, 42, 44];
    after.forEach((t, i) => {
      s = act(s, t, stepEvent(8 + i, 150, t + STARTED, 2));
    });
    expect(stepSeconds(s)).toBe(2);
    expect(timeLeft(s)!.seconds).toBe((150 - 12) * 2);
  });

  it('is said as precisely as it is known', () => {
    expect(fmtRough(1)).toBe('5 s');
    expect(fmtRough(43)).toBe('45 s');
    expect(fmtRough(624)).toBe('10 min');
    expect(fmtRough(271)).toBe('4 min 30 s');
    expect(fmtRough(1004)).toBe('17 min');
    expect(fmtRough(5000)).toBe('1 h 20 min');
  });
});
