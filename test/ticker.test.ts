/** The shared tick behind heartbeats and liveness frames (Node: a plain interval under the same sharing). */
import { describe, expect, it } from 'vitest';
import { TickGap, startTicker, yieldToEventLoop } from '../src/runtime/ticker.ts';
import { waitFor } from './fixtures/wait.ts';

describe('startTicker', () => {
  it('ticks every subscriber of an interval, and stops each one alone', async () => {
    let a = 0;
    let b = 0;
    const stopA = startTicker(20, () => a++);
    const stopB = startTicker(20, () => b++);
    await waitFor('both subscribers to tick 3 times', () => a >= 3 && b >= 3);
    stopA();
    stopA(); // twice is harmless: B keeps ticking
    const [a1, b1] = [a, b];
    // Ticks of the same interval are the clock, not a sleep: after 3 more of B's, A would have ticked had it not stopped.
    await waitFor('B to tick 3 more times', () => b >= b1 + 3);
    expect(a).toBe(a1);
    let c = 0;
    const stopC = startTicker(20, () => c++);
    stopB();
    const b2 = b;
    await waitFor('C, on the same interval, to tick 3 times', () => c >= 3);
    expect(b).toBe(b2);
    stopC();
  });

  it('the same callback subscribed twice is two subscriptions', async () => {
    let n = 0;
    const tick = () => n++;
    const stop1 = startTicker(15, tick);
    const stop2 = startTicker(15, tick);
    stop1();
    const before = n;
    await waitFor('the subscription left to tick', () => n > before);
    stop2();
  });
});

describe('TickGap', () => {
  it('reports a gap between ticks longer than its bound, once, and nothing for ticks on time', () => {
    let now = 1_000;
    const gap = new TickGap(3_000, () => now);
    now += 750;
    expect(gap.tick()).toBeUndefined();
    now += 3_000; // exactly the bound: not a stall
    expect(gap.tick()).toBeUndefined();
    now += 23_000; // the page was frozen
    expect(gap.gap()).toBe(23_000); // seen by whatever runs first after it resumes...
    expect(gap.tick()).toBe(23_000); // ...and by the tick
    now += 750;
    expect(gap.tick()).toBeUndefined();
    expect(gap.gap()).toBeUndefined();
  });

  it('a clock set back is no stall', () => {
    let now = 50_000;
    const gap = new TickGap(1_000, () => now);
    now -= 20_000;
    expect(gap.tick()).toBeUndefined();
  });
});

describe('yieldToEventLoop', () => {
  it('lets tasks queued before it run (a message, as a heartbeat or the ticker sends), which a resolved promise does not', async () => {
    let delivered = 0;
    const channel = new MessageChannel();
    channel.port1.onmessage = () => delivered++;
    channel.port2.postMessage(0);
    await Promise.resolve();
    await new Promise<void>((r) => queueMicrotask(r));
    expect(delivered).toBe(0);
    await yieldToEventLoop();
    expect(delivered).toBe(1);
    channel.port1.close();
  });
});
