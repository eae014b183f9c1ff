/**
 * --churn SEC: tabs come and go while the run trains, as in a class (and at the rate torchft
 * trains through): every SEC seconds from the first step, a tab is killed, one joins, one is
 * frozen, one joins, and so on, so that the world size stays about where it started. A kill or a
 * freeze that would leave fewer than the run's minimum is a join instead. Each fault's detection,
 * rendezvous and regroup times are in the summary's `faults` (see fault_times.ts).
 */

export type ChurnFault = { kind: 'kill' | 'freeze'; rank: number } | { kind: 'join'; count: 1 };

const CYCLE = ['kill', 'join', 'freeze', 'join'] as const;

export class Churn {
  private timer: ReturnType<typeof setInterval> | undefined;
  private count = 0;
  private stopped = false;
  /** A fault still being injected (a killed page's last reports drained, a page frozen; a joining page loads on its own): ticks meanwhile are skipped, not queued. */
  private pending = false;
  /** Ticks skipped because the last fault was still being injected. */
  skipped = 0;

  /**
   * `ranks()`: the ranks of the tabs running now; `min`: the fewest the run may have; `inject`:
   * injects a fault, settling once it is done (the launcher's faults run one at a time).
   */
  constructor(
    private readonly everyMs: number,
    private readonly min: number,
    private readonly ranks: () => number[],
    private readonly inject: (f: ChurnFault) => Promise<void>,
  ) {}

  /** From the first step on (again: nothing). */
  start(): void {
    if (this.timer !== undefined || this.stopped) return;
    this.timer = setInterval(() => this.next(), this.everyMs);
  }

  stop(): void {
    this.stopped = true;
    clearInterval(this.timer);
  }

  /** Faults injected so far. */
  get injected(): number {
    return this.count;
  }

  private next(): void {
    if (this.stopped) return;
    if (this.pending) {
      this.skipped++;
      return;
    }
    const kind = CYCLE[this.count % CYCLE.length]!;
    const running = this.ranks().sort((a, b) => a - b);
    // Spread over the ranks by a multiplicative hash of the count (any fixed stride repeats for
    // some world sizes), rank 0 included: no tab is special.
    const pick = Math.imul(this.count + 1, 0x9e3779b1) >>> 0;
    const fault: ChurnFault =
      kind === 'join' || running.length <= this.min ? { kind: 'join', count: 1 } : { kind, rank: running[pick % running.length]! };
    this.count++;
    this.pending = true;
    void this.inject(fault).finally(() => (this.pending = false));
  }
}
