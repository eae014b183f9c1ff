/**
 * The figures of a run at class scale: the launcher's fault timings (detection, new round,
 * regroup) from the ranks' events, --churn's schedule, the step timeline of an elastic run, and
 * the launcher's timeline summary across ranks.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { FaultTimes } from '../launcher/fault_times.ts';
import { Churn, type ChurnFault } from '../launcher/churn.ts';
import { timelineSummary } from '../launcher/summary_timeline.ts';
import { TimelineRecorder } from '../src/elastic/timeline.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';

const round = (key: string, rank: number, worldSize: number): ElasticEvent => ({
  type: 'round',
  round: key,
  rank,
  worldSize,
  step: 0,
  epoch: 0,
  position: 0,
  datasetLength: 64,
  shuffle: true,
  seed: 0,
  dropLast: false,
  source: 'replica',
  from: 0,
  redone: false,
});
const batch = (key: string, rank: number): ElasticEvent => ({
  type: 'batch',
  round: key,
  rank,
  step: 1,
  epoch: 0,
  indices: [],
  padding: 0,
});

describe('FaultTimes', () => {
  it("times a kill from the fault to its detection, the new round and the new round's first step", () => {
    const t = new FaultTimes();
    t.onEvent(0, round('i:1', 0, 4), 0);
    t.add({ fault: 'kill rank 2 at step 5', kind: 'kill', atStep: 5 }, 1000);
    t.onEvent(1, { type: 'peer-lost', round: 'i:1', rank: 1, peer: 2, reason: 'closed' }, 1100);
    // A late batch of the old round is not the regroup's end.
    t.onEvent(3, batch('i:1', 3), 1200);
    t.onEvent(0, round('i:2', 0, 3), 1500);
    t.onEvent(0, batch('i:2', 0), 1700);
    t.onEvent(1, batch('i:2', 1), 1800);
    expect(t.report()).toEqual([
      { fault: 'kill rank 2 at step 5', atStep: 5, worldSize: 4, detectedAfterMs: 100, recoveredAfterMs: 400, regroupMs: 600 },
    ]);
  });

  it('detects a join at the vote that regroups, and leaves a fault nobody noticed without figures', () => {
    const t = new FaultTimes();
    t.onEvent(0, round('i:1', 0, 2), 0);
    t.add({ fault: 'open 1 more rank(s) at step 9', kind: 'join', atStep: 9, pages: [2] }, 2000);
    t.add({ fault: 'freeze rank 1 at step 9', kind: 'freeze', atStep: 9 }, 2100);
    t.onEvent(0, { type: 'regroup', round: 'i:1', rank: 0, step: 10, waiting: 1 }, 6000);
    t.onEvent(0, round('i:2', 0, 3), 6500);
    t.onEvent(2, round('i:2', 2, 3), 6600);
    t.onEvent(2, batch('i:2', 2), 6800);
    const [join, freeze] = t.report();
    expect(join).toMatchObject({ detectedAfterMs: 4000, recoveredAfterMs: 500, regroupMs: 800, admittedAfterMs: 4600 });
    expect(freeze).toEqual({ fault: 'freeze rank 1 at step 9', atStep: 9, worldSize: 2 });
  });

  it('counts a joiner admitted by the round a kill made as admitted, not as waiting for a later regroup', () => {
    const t = new FaultTimes();
    t.onEvent(0, round('i:1', 0, 3), 0);
    t.add({ fault: 'open 1 more rank(s) at step 4', kind: 'join', atStep: 4, pages: [3] }, 1000);
    t.add({ fault: 'kill rank 2 at step 5', kind: 'kill', atStep: 5 }, 2000);
    t.onEvent(0, { type: 'peer-lost', round: 'i:1', rank: 0, peer: 2, reason: 'closed' }, 2050);
    t.onEvent(3, round('i:2', 2, 3), 2600);
    t.onEvent(3, batch('i:2', 2), 2700);
    // A later join's regroup is that join's, not the first one's.
    t.add({ fault: 'open 1 more rank(s) at step 9', kind: 'join', atStep: 9, pages: [4] }, 5000);
    t.onEvent(0, { type: 'regroup', round: 'i:2', rank: 0, step: 10, waiting: 1 }, 9000);
    const [first, kill, second] = t.report();
    expect(first).toEqual({ fault: 'open 1 more rank(s) at step 4', atStep: 4, worldSize: 3, admittedAfterMs: 1600 });
    expect(kill).toMatchObject({ detectedAfterMs: 50, recoveredAfterMs: 550, regroupMs: 650 });
    expect(second).toMatchObject({ detectedAfterMs: 4000 });
  });

  it('times a lost device on its own page: detection at its failed step, rejoin at its next round', () => {
    const t = new FaultTimes();
    t.add({ fault: 'lose the device of rank 1 at step 3', kind: 'lose-device', atStep: 3, page: 1 }, 0);
    t.onEvent(0, { type: 'failure', round: 'i:1', rank: 0, step: 3, inFlight: 4, error: 'x', recoverable: true }, 50);
    t.onEvent(1, { type: 'failure', round: 'i:1', rank: 1, step: 3, inFlight: 4, error: 'x', recoverable: true }, 80);
    t.onEvent(1, round('i:2', 1, 2), 900);
    expect(t.report()[0]).toMatchObject({ detectedAfterMs: 80, rejoinedAfterMs: 900 });
  });
});

describe('Churn', () => {
  afterEach(() => vi.useRealTimers());

  it('kills, joins, freezes and joins in turn, spread over the ranks, and joins instead below the minimum', async () => {
    vi.useFakeTimers();
    const got: ChurnFault[] = [];
    let ranks = [0, 1, 2, 3];
    const churn = new Churn(
      1000,
      2,
      () => [...ranks],
      async (f) => void got.push(f),
    );
    churn.start();
    churn.start(); // a second start does not double the rate
    await vi.advanceTimersByTimeAsync(4000);
    expect(got.map((f) => f.kind)).toEqual(['kill', 'join', 'freeze', 'join']);
    expect(got[0]).toEqual({ kind: 'kill', rank: 1 });
    expect(got[2]).toEqual({ kind: 'freeze', rank: 3 });
    ranks = [0, 1];
    await vi.advanceTimersByTimeAsync(1000);
    expect(got.at(-1)).toEqual({ kind: 'join', count: 1 });
    churn.stop();
    await vi.advanceTimersByTimeAsync(5000);
    expect(got).toHaveLength(5);
    expect(churn.injected).toBe(5);
  });

  it('skips a tick while the last fault is still being injected, instead of piling faults up', async () => {
    vi.useFakeTimers();
    const got: ChurnFault[] = [];
    let done: () => void = () => {};
    const churn = new Churn(
      1000,
      1,
      () => [0, 1, 2],
      (f) => {
        got.push(f);
        return new Promise<void>((r) => (done = r));
      },
    );
    churn.start();
    vi.advanceTimersByTime(3000);
    expect(got).toHaveLength(1);
    expect(churn.skipped).toBe(2);
    done();
    await vi.advanceTimersByTimeAsync(1000);
    expect(got.map((f) => f.kind)).toEqual(['kill', 'join']);
    churn.stop();
  });
});

describe('TimelineRecorder', () => {
  afterEach(() => vi.restoreAllMocks());

  it('splits each timed step into its phases, the rest as other, and leaves warm-up steps out', () => {
    let now = 0;
    vi.spyOn(performance, 'now').mockImplementation(() => now);
    const t = new TimelineRecorder();
    const step = (timed: boolean, ms: { other: number; step: number; vote: number; page: number }) => {
      t.begin(timed);
      now += ms.other;
      t.lap('other');
      now += ms.step;
      t.lap('step');
      now += ms.vote;
      t.lap('vote');
      now += ms.page;
      t.lap('page');
      t.end();
    };
    step(false, { other: 100, step: 1000, vote: 100, page: 100 });
    step(true, { other: 2, step: 10, vote: 4, page: 1 });
    step(true, { other: 4, step: 20, vote: 6, page: 3 });
    expect(t.read()).toEqual({ steps: 2, step: 15, average: 0, vote: 5, page: 2, other: 3, total: 25 });
  });

  it('reads zeros before any timed step', () => {
    expect(new TimelineRecorder().read()).toEqual({ steps: 0, step: 0, average: 0, vote: 0, page: 0, other: 0, total: 0 });
  });
});

describe('timelineSummary', () => {
  it('averages each phase over the ranks and holds the communication against the bare all-reduce', () => {
    const s = timelineSummary([
      { rank: 0, timelineMs: { compute: 10, waitSlowest: 0, wire: 4, vote: 2 }, bareAllReduceMs: 2 },
      { rank: 1, timelineMs: { compute: 20, waitSlowest: 8, wire: 4, vote: 4 }, bareAllReduceMs: 3 },
    ]);
    expect(s).toEqual({
      timelineMs: { compute: 15, waitSlowest: 4, wire: 4, vote: 3 },
      bareAllReduceMs: 3,
      commOverBare: 3.67,
      wireOverBare: 1.33,
    });
  });

  it('says nothing for ranks without a timeline (a pipeline, a parameter server)', () => {
    expect(timelineSummary([{ rank: 0 }])).toEqual({});
  });
});
