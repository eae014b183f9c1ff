/**
 * A periodic tick that a hidden page does not lose. Browsers throttle a background tab's timers
 * (to one wake-up a second, then, after minutes hidden, to one a minute), which would make a
 * member of a group look frozen to the server although it is only in the background. A dedicated
 * Worker's timers are not throttled that way, and its messages reach the page as ordinary tasks;
 * a page whose JavaScript is really frozen still stops ticking, which is what heartbeats detect.
 * Outside a browser (Node), a plain interval.
 */
export function startTicker(intervalMs: number, tick: () => void): () => void {
  const WorkerCtor = (globalThis as { Worker?: typeof Worker }).Worker;
  if (WorkerCtor !== undefined && typeof Blob !== 'undefined' && typeof URL.createObjectURL === 'function') {
    try {
      const source = `setInterval(() => postMessage(0), ${Math.max(1, Math.floor(intervalMs))});`;
      const url = URL.createObjectURL(new Blob([source], { type: 'text/javascript' }));
      const worker = new WorkerCtor(url);
      URL.revokeObjectURL(url);
      worker.onmessage = () => tick();
      return () => worker.terminate();
    } catch {
      // A page that may not start workers (a strict CSP) falls back to the page's own timer.
    }
  }
  const timer = setInterval(tick, intervalMs);
  return () => clearInterval(timer);
}
