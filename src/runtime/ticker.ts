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
    clock = {
      listeners,
      stop: startClock(ms, () =>
        [...listeners].forEach((l) => {
          l();
        }),
      ),
    };
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

/**
 * Notices that this page itself stopped running: the wall time since its last tick is far longer
 * than ticks are apart. Wall time (Date.now) goes on while a page is frozen, paused in a
 * debugger, blocked by a long script or asleep with its computer; the ticks do not. The tick
 * comes from a Worker (`startTicker`), so a throttled background tab still ticks and is not
 * taken for a stopped one. `now` is injectable for tests.
 */
export class TickGap {
  private last: number;
  /** Time this page did not run, as far as its ticks tell (see `running`). */
  private lost = 0;

  constructor(
    /** A gap longer than this counts (the caller's stall bound). */
    readonly boundMs: number,
    private readonly now: () => number = Date.now,
    /** A tick later than this after the last one: the page did not run for the excess. */
    private readonly lateMs = Infinity,
  ) {
    this.last = now();
  }

  /** Call on every tick: the gap that ended with this tick, when longer than the bound. */
  tick(): number | undefined {
    const gap = this.gap();
    const now = this.now();
    if (now - this.last > this.lateMs) this.lost += now - this.last - this.lateMs;
    this.last = now;
    return gap;
  }

  /**
   * Wall time less the time this page did not run (by how much its ticks came later than
   * `lateMs`): the clock to judge a peer's silence on. A page that did not run heard nothing
   * meanwhile, though its peers may have sent: their frames wait in its queue behind the tick. On
   * a machine whose cores 32 tabs share, a rank whose own page had stopped for seconds took a
   * peer whose page had not stopped for as long as the bound for stalled.
   */
  running(): number {
    return this.now() - this.lost;
  }

  /**
   * The time since the last tick, when longer than the bound: for whatever runs first when a
   * page resumes (a closed link, a socket's close), which may come before the tick does.
   */
  gap(): number | undefined {
    const ms = this.now() - this.last;
    return ms > this.boundMs ? ms : undefined;
  }
}

/**
 * Lets the page's other tasks run (the ticker's messages, heartbeats, WebRTC and socket events)
 * before the caller goes on: for a long computation done in parts, such as evaluating a test set
 * on the cpu backend, whose kernels run on the main thread and would otherwise hold it for many
 * seconds, long enough for the server to evict a page that is only busy. A MessageChannel task,
 * not a timer: a background tab throttles timers to one a second, not messages.
 */
export function yieldToEventLoop(): Promise<void> {
  if (typeof MessageChannel === 'undefined') return new Promise((resolve) => setTimeout(resolve, 0));
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = () => {
      channel.port1.close();
      resolve();
    };
    channel.port2.postMessage(0);
  });
}
