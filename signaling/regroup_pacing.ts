/**
 * The pace of regroups (rendezvous.ts): at most one round per `regroupIntervalMs` forms by
 * regroup; one asked for sooner is deferred to the end of the interval, and every request
 * waiting for it is answered with the round that formed then. Kept apart from the rendezvous'
 * membership state: it only times and answers.
 */
export class RegroupPacing {
  /** When a regroup last formed a round. */
  private lastAt = Number.NEGATIVE_INFINITY;
  /** A regroup asked for inside the interval: its timer, the requests waiting for their answer, and the rank whose round failed, if one did. */
  private deferred: { timer: ReturnType<typeof setTimeout>; answers: Array<(round: number) => void>; failedBy?: number } | undefined;

  /** The rendezvous' options, read at each regroup. */
  constructor(private readonly options: { regroupIntervalMs: number }) {}

  /** How long until a regroup may form a round (0 or less: now). */
  waitMs(): number {
    return this.lastAt + this.options.regroupIntervalMs - Date.now();
  }

  /** A regroup forms a round now. */
  formed(): void {
    this.lastAt = Date.now();
  }

  /**
   * Defers a regroup by `wait` ms (joining one deferred already): `fire` runs then with the
   * first failed rank any request named; resolves with the round it is answered with.
   */
  defer(wait: number, failedBy: number | undefined, fire: (failedBy: number | undefined) => void): Promise<number> {
    this.deferred ??= { answers: [], timer: setTimeout(() => fire(deferred.failedBy), wait) };
    const deferred = this.deferred;
    deferred.failedBy ??= failedBy;
    return new Promise<number>((resolve) => deferred.answers.push(resolve));
  }

  /** Answers deferred regroups with the latest round (whatever formed it). */
  answer(round: number): void {
    const deferred = this.deferred;
    if (!deferred) return;
    this.deferred = undefined;
    clearTimeout(deferred.timer);
    for (const answer of deferred.answers) answer(round);
  }
}
