/**
 * A periodic tick that a hidden page does not lose. Browsers throttle a background tab's timers
 * (to one wake-up a second, then, after minutes hidden, to one a minute), which would make a
 * member of a group look frozen to the server although it is only in the background. A dedicated
 * Worker's timers are not throttled that way, and its messages reach the page as ordinary tasks;
 * a page whose JavaScript is really frozen still stops ticking, which is what heartbeats detect.
 * Outside a browser (Node), a plain interval. Callers with the same interval share one Worker.
 */
interface Clock {
  listeners: Set<() => void>;
  stop(): void;
}

const clocks = new Map<number, Clock>();

export function startTicker(intervalMs: number, tick: () => void): () => void {
  const ms = Math.max(1, Math.floor(intervalMs));
  let clock = clocks.get(ms);
  if (!clock) {
    const listeners = new Set<() => void>();
    clock = { listeners, stop: startClock(ms, () => [...listeners].forEach((l) => l())) };
    clocks.set(ms, clock);
  }
  const mine = clock;
  // Each caller its own function, so that one callback registered twice still unsubscribes once.
  const listener = () => tick();
  mine.listeners.add(listener);
  return () => {
    if (!mine.listeners.delete(listener) || mine.listeners.size > 0) return;
    mine.stop();
    if (clocks.get(ms) === mine) clocks.delete(ms);
  };
}

function startClock(ms: number, tick: () => void): () => void {
  const WorkerCtor = (globalThis as { Worker?: typeof Worker }).Worker;
  if (WorkerCtor !== undefined && typeof Blob !== 'undefined' && typeof URL.createObjectURL === 'function') {
    try {
      const url = URL.createObjectURL(new Blob([`setInterval(() => postMessage(0), ${ms});`], { type: 'text/javascript' }));
      const worker = new WorkerCtor(url);
      URL.revokeObjectURL(url);
      worker.onmessage = tick;
      return () => worker.terminate();
    } catch {
      // A page that may not start workers (a strict CSP) falls back to the page's own timer.
    }
  }
  const timer = setInterval(tick, ms);
  return () => clearInterval(timer);
}
