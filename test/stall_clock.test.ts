/**
 * A peer's silence is judged on the time this page ran: a rank whose own page did not run for
 * seconds (32 tabs on two cores) heard nothing meanwhile, though its peer may have sent, and must
 * not take that peer for stalled; a peer silent while this page ran is still found.
 */
import { describe, expect, it } from 'vitest';
import { TickGap } from '../src/runtime/ticker.ts';
import { Mailbox } from '../src/transport/mailbox.ts';
import { Collective, FrameKind } from '../src/wire/framing.ts';

describe('TickGap.running', () => {
  it('is wall time less what ticks came later than lateMs by', () => {
    let now = 0;
    const gap = new TickGap(10_000, () => now, 2_000);
    for (let i = 0; i < 4; i++) {
      now += 1_000;
      gap.tick();
    }
    expect(gap.running()).toBe(4_000);
    now += 5_000; // the page did not run: 3 s past the 2 s a tick may take
    gap.tick();
    expect(gap.running()).toBe(9_000 - 3_000);
    now += 1_000;
    gap.tick();
    expect(gap.running()).toBe(10_000 - 3_000);
  });

  it('without lateMs, is wall time', () => {
    let now = 0;
    const gap = new TickGap(10_000, () => now);
    now += 9_000;
    gap.tick();
    expect(gap.running()).toBe(9_000);
  });
});

describe('a silent peer, judged on the time this page ran', () => {
  /** A receive from peer 0 that never comes; ticks at `tickTimes` (wall ms); the wall times at which peer 0 was found stalled. */
  function run(tickTimes: number[]): number[] {
    let now = 0;
    const gap = new TickGap(10_000, () => now, 2_000);
    const found: number[] = [];
    const mb = new Mailbox(
      1,
      600_000,
      () => found.push(now),
      { maxSeqAhead: 4, maxStep: 2, maxBufferedBytes: 1 << 16 },
      () => 0,
      '',
      new Map(),
      () => gap.running(),
    );
    mb.heard(0); // its link opened at 0
    const d = { collective: Collective.allReduce, reduceOp: 0, numel: 4, root: 0 } as const;
    void mb.receive(0, FrameKind.collective, 1, 0, d, 16, () => {}, Promise.resolve()).catch(() => {});
    for (const t of tickTimes) {
      now = t;
      gap.tick();
      mb.checkStalls(10_000);
    }
    mb.failAll(new Error('test over'));
    return found;
  }
  const every = (from: number, to: number) => Array.from({ length: (to - from) / 1_000 + 1 }, (_, i) => from + i * 1_000);

  it('a page that ran throughout finds it past the bound', () => {
    expect(run(every(1_000, 14_000))[0]).toBe(11_000);
  });

  it('a page that did not run for 5 s finds it only once it has run for the bound', () => {
    // Ticks on time to 4 s, then none until 9 s (3 s lost), then on time again.
    const found = run([...every(1_000, 4_000), ...every(9_000, 16_000)]);
    expect(found[0]).toBe(14_000);
  });
});
