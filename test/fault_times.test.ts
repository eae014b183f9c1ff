/**
 * The launcher's fault timings (launcher/fault_times.ts): a loss a rank reports is the fault on
 * the page that held that rank, not simply the oldest fault nobody noticed yet.
 */
import { describe, expect, it } from 'vitest';
import { FaultTimes } from '../launcher/fault_times.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';

const round = (key: string, rank: number, worldSize: number): ElasticEvent =>
  ({ type: 'round', round: key, rank, worldSize, step: 0, epoch: 0, position: 0 }) as ElasticEvent;

describe('FaultTimes', () => {
  it("a frozen page dropped by a join's regroup does not take a later kill's detection", () => {
    const t = new FaultTimes();
    for (let page = 0; page < 4; page++) t.onEvent(page, round('A', page, 4), 0);
    const freeze = t.add({ fault: 'freeze rank 3', kind: 'freeze', atStep: 5, page: 3 }, 1000);
    const join = t.add({ fault: 'open 1 more rank(s)', kind: 'join', atStep: 6, pages: [4] }, 2000);
    t.onEvent(0, { type: 'regroup', round: 'A', rank: 0, step: 6, waiting: 1 }, 3000);
    // Round B: the server evicted the frozen page; the joiner took its place.
    for (const [page, rank] of [
      [0, 0],
      [1, 1],
      [2, 2],
      [4, 3],
    ] as const)
      t.onEvent(page, round('B', rank, 4), 4000);
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

  it("the last round is the newest one seen, with its pages and their ranks: a slow page's late event for an older round does not change it", () => {
    const t = new FaultTimes();
    expect(t.lastRound()).toBeNull();
    for (let page = 0; page < 3; page++) t.onEvent(page, round('A', page, 3), 0);
    // Page 1 was lost; pages 0, 2 and a joiner (page 3) form round B.
    for (const [page, rank] of [
      [0, 0],
      [2, 1],
      [3, 2],
    ] as const)
      t.onEvent(page, round('B', rank, 3), 2000);
    // Page 1's event for round A, read late.
    t.onEvent(1, round('A', 1, 3), 2100);
    // Pages 0 and 3 reach the end; page 2 (frozen at its last step, say) does not.
    for (const [page, rank] of [
      [0, 0],
      [3, 2],
    ] as const)
      t.onEvent(
        page,
        {
          type: 'end',
          round: 'B',
          rank,
          worldSize: 3,
          steps: 9,
          epoch: 1,
          generations: 2,
          stepsRedone: 0,
          stoppedBy: null,
          weightHash: 'ab',
        } as ElasticEvent,
        3000,
      );
    expect(t.lastRound()).toEqual({
      worldSize: 3,
      pages: [
        { page: 0, rank: 0, ended: true },
        { page: 2, rank: 1, ended: false },
        { page: 3, rank: 2, ended: true },
      ],
    });
  });
});
