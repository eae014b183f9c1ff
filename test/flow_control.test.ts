/**
 * The link's credit-based flow control (src/transport/flow_control.ts, as PeerLink runs it): how much a sender may have
 * unacknowledged, when a receiver acknowledges, and what a hostile peer's credits can do.
 * What it buys on a shaped link is measured in bench/results/lan.md (npm run bench:lan).
 */
import { describe, expect, it } from 'vitest';
import { CREDIT_MAGIC, CreditWindow, SendQueue, encodeCredit, readCredit } from '../src/transport/flow_control.ts';
import { encodeAlive } from '../src/wire/framing.ts';
import { PeerLostError } from '../src/wire/errors.ts';
import { sleep } from './fixtures/wait.ts';

describe('credit messages', () => {
  it('carry a byte count exactly and are never taken for a frame', () => {
    for (const n of [0, 1, 65_536, 2 ** 40 + 3, Number.MAX_SAFE_INTEGER]) expect(readCredit(encodeCredit(n))).toBe(n);
    expect(encodeCredit(5)[0]).toBe(CREDIT_MAGIC);
    expect(readCredit(encodeAlive())).toBeUndefined();
    const frameSized = new Uint8Array(12);
    frameSized[0] = 0xd7;
    expect(readCredit(frameSized)).toBeUndefined();
    expect(readCredit(encodeCredit(7).subarray(0, 11))).toBeUndefined();
  });
});

describe('CreditWindow', () => {
  it('lets a sender go until a window is unacknowledged, a whole message while any is left', () => {
    const w = new CreditWindow(1000, () => true);
    expect(w.open).toBe(true);
    w.sentBytes(600);
    expect(w.open).toBe(true);
    w.sentBytes(600); // one message past the window: allowed, it started with room left
    expect(w.open).toBe(false);
    expect(w.outstanding).toBe(1200);
    expect(w.credit(300)).toBe(true);
    expect(w.open).toBe(true);
    expect(w.outstanding).toBe(900);
  });

  it('acknowledges every quarter window with the running count', () => {
    const sent: number[] = [];
    const w = new CreditWindow(1000, (m) => sent.push(readCredit(m)!) > 0);
    w.took(100);
    w.took(100);
    expect(sent).toEqual([]);
    w.took(100); // 300 >= 250
    w.took(249);
    w.took(1);
    expect(sent).toEqual([300, 550]);
  });

  it('never deadlocks: what is left unacknowledged is under a quarter window, so a sender always has room', () => {
    const sender = new CreditWindow(1000, () => true);
    const receiver = new CreditWindow(1000, (m) => {
      sender.credit(readCredit(m)!);
      return true;
    });
    for (let i = 0; i < 50; i++) {
      expect(sender.open).toBe(true);
      const size = [900, 1, 333, 1000, 70][i % 5]!;
      sender.sentBytes(size);
      receiver.took(size);
      expect(sender.outstanding).toBeLessThan(250);
    }
  });

  it('sends a credit that could not go (the link not open from this side yet) on flush, so the sender is not left waiting', () => {
    const sender = new CreditWindow(1000, () => true);
    let open = false;
    const receiver = new CreditWindow(1000, (m) => {
      if (!open) return false;
      sender.credit(readCredit(m)!);
      return true;
    });
    // The first window arrives before this side's link says it is open: every credit is held back.
    for (const size of [400, 400, 300]) {
      sender.sentBytes(size);
      receiver.took(size);
    }
    expect(sender.open).toBe(false);
    // Nothing more comes (the sender waits), so only the link's opening can send the count.
    open = true;
    receiver.flush();
    expect(sender.outstanding).toBe(0);
    expect(sender.open).toBe(true);
    receiver.flush(); // nothing new taken: no credit
    receiver.took(100);
    sender.sentBytes(100);
    expect(sender.outstanding).toBe(100); // under a quarter window: not yet acknowledged
  });

  it('takes nothing from a hostile peer: credits that go backwards, are not numbers, or exceed what was sent', () => {
    const w = new CreditWindow(1000, () => true);
    w.sentBytes(1500);
    expect(w.credit(Number.NaN)).toBe(false);
    expect(w.credit(Number.POSITIVE_INFINITY)).toBe(false);
    expect(w.credit(-5)).toBe(false);
    expect(w.credit(1e12)).toBe(true); // clamped to what was sent
    expect(w.outstanding).toBe(0);
    w.sentBytes(1500);
    expect(w.credit(1000)).toBe(false); // behind the count already credited
    expect(w.outstanding).toBe(1500);
    expect(w.open).toBe(false);
  });

  it('is always open with a window of 0 (flow control off), and then never acknowledges', () => {
    const sent: Uint8Array[] = [];
    const w = new CreditWindow(0, (m) => sent.push(m) > 0);
    w.sentBytes(1e9);
    w.took(1e9);
    expect(w.open).toBe(true);
    expect(sent).toEqual([]);
  });
});

describe('SendQueue with a credit window', () => {
  it('holds a sender until a credit opens the window', async () => {
    const w = new CreditWindow(100, () => true);
    const q = new SendQueue(3, 1 << 20, 5_000, () => 0, w);
    w.sentBytes(150);
    let went = false;
    const pending = q.beforeSend().then(() => (went = true));
    // That it did NOT go has no event to wait for: 20 ms lets a sender that wrongly went (at once or
    // on a timer) show it; not vacuous, since the same flag turns true once the credit comes.
    await sleep(20);
    expect(went).toBe(false);
    w.credit(100);
    q.drained();
    await pending;
    expect(went).toBe(true);
  });

  it('fails a sender whose peer acknowledges nothing for the stall timeout, naming the peer and the bytes', async () => {
    const w = new CreditWindow(100, () => true);
    const q = new SendQueue(3, 1 << 20, 50, () => 0, w);
    w.sentBytes(400);
    const err = await q.beforeSend().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PeerLostError);
    expect((err as PeerLostError).rank).toBe(3);
    expect((err as Error).message).toMatch(/acknowledged nothing for 50 ms \(400 bytes unacknowledged\)/);
  });
});
