/**
 * A rank that balanced batches give no samples in a step has no loss and no accuracy for it: the
 * step event says null (not 0) and why (its measured cost, the step it is measured again); its
 * chart line has a gap there; the group's headline figures weigh each rank by its samples and
 * leave it out. The page's own path from the library's event (dashboardEvents) to the dashboard's
 * pure models; the library's side (the vote, the split's reasons) is in balance.test.ts.
 */
import { describe, expect, it } from 'vitest';
import type { ElasticEvent } from '../src/parallel/events.ts';
import { dashboardEvents } from '../client/train/harness.ts';
import type { TrainEvent } from '../client/train/events.ts';
import { sampleWeighted } from '../client/ui/sample_weighted.ts';
import { initialDashboardState, reduceDashboard, type DashboardState } from '../client/ui/dashboard_state.ts';
import { statCards } from '../client/ui/dashboard_cards.ts';
import { fleetRows, idleNote } from '../client/ui/dashboard_fleet.ts';
import { StepTable } from '../client/ui/charts.ts';

const T0 = Date.UTC(2024, 0, 1, 12, 0, 0);

/** Rank r's figures as the DDP trainer reports them (a rank without samples: null loss and accuracy). */
function figures(loss: number | null, accuracy: number | null, samples: number): Record<string, number | null> {
  return {
    loss,
    accuracy,
    samples,
    samplesPerSec: samples > 0 ? 100 : 0,
    compute: 1,
    readback: 1,
    allreduce: 1,
    apply: 1,
    slowed: 0,
    comm: 0,
    hashHi: 0,
    hashLo: 0,
  };
}

/** A step of three ranks where rank 2 (a slow WebGPU tab) was given none of the 96 samples. */
function libraryStep(step: number): ElasticEvent {
  return {
    type: 'step',
    round: 'r',
    rank: 0,
    step,
    epoch: 0,
    totalSteps: 100,
    metrics: [figures(1, 0.9, 64), figures(2, 0.6, 32), figures(null, null, 0)],
    elapsedMs: step * 100,
    balance: { counts: [64, 32, 0], perSampleMs: [0.5, 1, 37.25], overheadMs: [2, 2, 120], probeAt: 64 },
  };
}

function pageEvents(steps: number[]): TrainEvent[] {
  const out: TrainEvent[] = [];
  const hear = dashboardEvents((e) => out.push(e), true);
  for (const s of steps) hear(libraryStep(s));
  return out;
}

function dashboard(events: TrainEvent[], self = 2): DashboardState {
  let s = initialDashboardState({ session: 's', at: T0 });
  let at = T0;
  at += 1000;
  s = reduceDashboard(s, { at, event: { type: 'joined', rank: self, worldSize: 3, backend: 'webgpu', adapter: null } });
  for (const event of events) {
    at += 1000;
    s = reduceDashboard(s, { at, event });
  }
  return s;
}

describe('a rank given no samples in a step', () => {
  it('reaches the page with no loss and no accuracy (null), and why: its measured cost and the step it is measured again', () => {
    const [e] = pageEvents([5]);
    const ranks = (e as Extract<TrainEvent, { type: 'step' }>).ranks;
    expect(ranks.map((m) => [m.loss, m.accuracy, m.samples])).toEqual([
      [1, 0.9, 64],
      [2, 0.6, 32],
      [null, null, 0],
    ]);
    expect(ranks[2]!.idle).toEqual({ perSampleMs: 37.25, overheadMs: 120, probeAt: 64 });
    expect(ranks[0]!.idle).toBeUndefined();
  });

  it("is left out of the group's train loss and accuracy, which weigh each rank by its samples", () => {
    const s = dashboard(pageEvents([1, 2, 3]));
    // (1 x 64 + 2 x 32) / 96 and (0.9 x 64 + 0.6 x 32) / 96; a plain mean of the three ranks would be 1 (or 1.5 without rank 2) and 50%.
    const cards = statCards(s);
    expect(cards.loss.value).toBe((128 / 96).toLocaleString('en-US', { maximumFractionDigits: 3 }));
    expect(cards.acc.value).toBe('80.0%');
    expect(sampleWeighted(s.lastStep!.ranks, 'loss')).toBeCloseTo(128 / 96, 12);
    // Jobs that do not report samples: equal shares; no figure at all: null.
    expect(
      sampleWeighted(
        [
          { loss: 1, accuracy: 0 },
          { loss: 3, accuracy: 0 },
        ],
        'loss',
      ),
    ).toBe(2);
    expect(sampleWeighted([{ loss: null, accuracy: null, samples: 0 }], 'loss')).toBeNull();
  });

  it("says so on its tab and in the group's table, with the balance figures", () => {
    const s = dashboard(pageEvents([1, 2, 3]));
    const words =
      'no samples this step: the group gave them to faster tabs (measured cost 37.3 ms/sample + 120 ms a step; measured again at step 64)';
    expect(idleNote(s, 2)).toBe(words);
    expect(idleNote(s, 0)).toBeNull();
    const rows = fleetRows(s);
    expect(rows.map((r) => r.idle)).toEqual([null, null, words]);
    expect(rows.map((r) => r.share)).toEqual([64 / 96, 32 / 96, 0]);
  });

  it('gets a gap in its chart line: no point at that step, not a 0', () => {
    const table = new StepTable();
    for (const e of pageEvents([1, 2])) {
      if (e.type !== 'step') continue;
      for (const m of e.ranks) table.set(`loss:${m.rank}`, e.step, m.loss);
    }
    table.set('loss:2', 3, 0.7);
    expect(table.col('loss:2')).toEqual([null, null, 0.7]);
    expect(table.count('loss:2')).toBe(1);
    expect(table.col('loss:0')).toEqual([1, 1, null]);
  });

  it('a run that ends before the next measurement says so', () => {
    const events = pageEvents([5]).map((e) => (e.type === 'step' ? { ...e, totalSteps: 32 } : e));
    expect(idleNote(dashboard(events), 2)).toBe(
      'no samples this step: the group gave them to faster tabs (measured cost 37.3 ms/sample + 120 ms a step; the run ends at step 32, before its next measurement at step 64)',
    );
  });
});
