/**
 * A group's broken state (for `ProcessGroup`): the first reason it broke, kept so that every
 * pending and later call fails with it (the lost rank), not with what closing the links did
 * afterwards; and a promise that rejects with it, so that waits on the store or on a link's
 * queue stop as soon as the group breaks.
 */
export class GroupBreak {
  private reason: Error | undefined;
  /** Rejects with the reason once the group breaks (never resolves). */
  readonly promise: Promise<never>;
  private reject!: (err: Error) => void;

  constructor() {
    this.promise = new Promise<never>((_, reject) => (this.reject = reject));
    // Nobody need wait on it: an unobserved break is not an unhandled rejection.
    this.promise.catch(() => {});
  }

  /** Why the group broke, if it has. */
  get error(): Error | undefined {
    return this.reason;
  }

  /** Breaks with `err` unless already broken; true when this call broke it. */
  set(err: Error): boolean {
    if (this.reason) return false;
    this.reason = err;
    this.reject(err);
    return true;
  }

  throwIfBroken(): void {
    if (this.reason) throw this.reason;
  }

  /** Resolves like `p`, or rejects as soon as the group breaks. */
  race<T>(p: Promise<T>): Promise<T> {
    return Promise.race([p, this.promise]);
  }
}
