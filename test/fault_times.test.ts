/**
 * The launcher's fault timings (launcher/fault_times.ts): a loss a rank reports is the fault on
 * the page that held that rank, not simply the oldest fault nobody noticed yet.
 */
import { describe, expect, it } from 'vitest';
import { FaultTimes } from '../launcher/fault_times.ts';
import type { ElasticEvent } from '../src/elastic/events.ts';

const round = (key: string, rank: number, worldSize: number): ElasticEvent => ({ type: 'round', round: key, rank, worldSize, step: 0, epoch: 0, position: 0 }) as ElasticEvent;

describe('FaultTimes', () => {
  it("a frozen page dropped by a join's regroup does not take a later kill's detection", () => {
    const t = new FaultTimes();
    for (let page = 0; page < 4; page++) t.onEvent(page, round('A', page, 4), 0);
    const freeze = t.add({ fault: 'freeze rank 3', kind: 'freeze', atStep: 5, page: 3 }, 1000);
    const join = t.add({ fault: 'open 1 more rank(s)', kind: 'join', atStep: 6, pages: [4] }, 2000);
    t.onEvent(0, { type: 'regroup', round: 'A', rank: 0, step: 6, waiting: 1 }, 3000);
    // Round B: the server evicted the frozen page; the joiner took its place.
    for (const [page, rank] of [[0, 0], [1, 1], [2, 2], [4, 3]] as const) t.onEvent(page, round('B', rank, 4), 4000);
    const kill = t.add({ fault: 'kill rank 1', kind: 'kill', atStep: 9, page: 1 }, 50_000);
    t.onEvent(0, { type: 'peer-lost', round: 'B', rank: 0, peer: 1, reason: 'its tab closed' }, 50_400);
    expect(kill.detectedAfterMs).toBe(400);
    expect(freeze.detectedAfterMs).toBeUndefined();
    expect(join.detectedAfterMs).toBe(1000);
    expect(join.admittedAfterMs).toBe(2000);
  });

  it("a kill's recovery is split as the first rank of the new round saw it: the rendezvous, then its links and the state", () => {
    const t = new FaultTimes();
    for (let page = 0; page < 3; page++) t.onEvent(page, round('A', page, 3), 0);
    const kill = t.add({ fault: 'kill rank 2', kind: 'kill', atStep: 4, page: 2 }, 10_000);
    t.onEvent(0, { type: 'peer-lost', round: 'A', rank: 0, peer: 2, reason: 'its tab closed' }, 10_100);
    t.onEvent(1, { ...round('B', 1, 2), phasesMs: { rendezvous: 240.4, state: 1510.6 } } as ElasticEvent, 11_900);
    // A later rank's figures do not replace the first one's.
    t.onEvent(0, { ...round('B', 0, 2), phasesMs: { rendezvous: 900, state: 3000 } } as ElasticEvent, 13_000);
    expect(kill).toMatchObject({ detectedAfterMs: 100, recoveredAfterMs: 1800, rendezvousMs: 240, stateMs: 1511 });
    t.onEvent(0, { type: 'batch', round: 'B', rank: 0, step: 5, epoch: 0, indices: [], padding: 0 }, 14_000);
    expect(kill.regroupMs).toBe(3900);
  });

  it('a loss whose page is not known goes to the oldest kill or freeze not noticed yet', () => {
    const t = new FaultTimes();
    const kill = t.add({ fault: 'kill rank 2', kind: 'kill', atStep: 3 }, 1000);
    t.onEvent(0, { type: 'peer-lost', round: 'A', rank: 0, peer: 2, reason: 'its tab closed' }, 1250);
    expect(kill.detectedAfterMs).toBe(250);
  });

  it('a freeze no rank noticed is marked endedFirst only if its page was in the last round', () => {
    const t = new FaultTimes();
    for (let page = 0; page < 3; page++) t.onEvent(page, round('A', page, 3), 0);
    // Dropped by a later round without a loss of its own: not in the last round, so not endedFirst.
    const early = t.add({ fault: 'freeze rank 2', kind: 'freeze', atStep: 5, page: 2 }, 1000);
    for (let page = 0; page < 2; page++) t.onEvent(page, round('B', page, 2), 2000);
    // Frozen after its last step: the others finished with it in their round, and nobody lost it.
    const late = t.add({ fault: 'freeze rank 0', kind: 'freeze', atStep: 90, page: 0 }, 9000);
    const kill = t.add({ fault: 'kill rank 1', kind: 'kill', atStep: 91, page: 1 }, 9100);
    t.onEvent(0, { type: 'peer-lost', round: 'B', rank: 0, peer: 1, reason: 'its tab closed' }, 9200);
    // A slow page's event for round A, read after round B's: B stays the last round.
    t.onEvent(2, round('A', 2, 3), 9300);
    // A freeze that took hold only after the page had sent its result cost nothing.
    expect(new FaultTimes().report()).toEqual([]);
    expect(t.report((page) => page === 0).find((f) => f.fault === late.fault)!.endedFirst).toBeUndefined();
    const report = t.report();
    expect(report.find((f) => f.fault === late.fault)!.endedFirst).toBe(true);
    expect(report.find((f) => f.fault === early.fault)!.endedFirst).toBeUndefined();
    expect(report.find((f) => f.fault === kill.fault)!.endedFirst).toBeUndefined();
  });
});
