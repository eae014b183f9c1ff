/**
 * When the dashboard may draw again. Drawing runs on the main thread that also carries the
 * training's messages; on a machine whose cores many tabs share, or on a phone, a chart redraw
 * four times a second is time the step's all-reduce waits for. So a redraw waits at least
 * MIN_REDRAW_MS after the last, and at least the last one's duration / REDRAW_BUDGET: drawing
 * takes at most that share of the page's time however slow it gets.
 */
export const MIN_REDRAW_MS = 250;
export const REDRAW_BUDGET = 0.02;

/** Milliseconds to wait before the next redraw: at once when `soon` (the run's end). */
export function redrawDelay(o: { now: number; lastRender: number; lastRenderMs: number; soon: boolean }): number {
  if (o.soon) return 0;
  const gap = Math.max(MIN_REDRAW_MS, o.lastRenderMs / REDRAW_BUDGET);
  return Math.max(0, o.lastRender + gap - o.now);
}
