/** The dashboard's redraw budget (client/ui/redraw.ts): drawing takes at most 2% of the page's time. */
import { describe, expect, it } from 'vitest';
import { MIN_REDRAW_MS, redrawDelay } from '../client/ui/redraw.ts';

describe('redrawDelay', () => {
  it('waits MIN_REDRAW_MS after a cheap redraw, 50x its duration after a costly one', () => {
    expect(redrawDelay({ now: 1000, lastRender: 1000, lastRenderMs: 2, soon: false })).toBe(MIN_REDRAW_MS);
    expect(redrawDelay({ now: 1000, lastRender: 1000, lastRenderMs: 40, soon: false })).toBe(2000);
    // Time already waited counts.
    expect(redrawDelay({ now: 2500, lastRender: 1000, lastRenderMs: 40, soon: false })).toBe(500);
    expect(redrawDelay({ now: 9000, lastRender: 1000, lastRenderMs: 40, soon: false })).toBe(0);
  });

  it('draws at once when asked soon (the run ended), whatever the last redraw cost', () => {
    expect(redrawDelay({ now: 1000, lastRender: 1000, lastRenderMs: 400, soon: true })).toBe(0);
  });
});
