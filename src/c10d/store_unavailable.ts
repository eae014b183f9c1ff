/**
 * A store whose server's shared engine does not answer (several servers on one Redis,
 * docs/deployment.md) refuses requests with STORE_UNAVAILABLE while the server reconnects to it.
 * The store client tries such a request again, with backoff, for a bounded time, and says so as it
 * goes (a `store` event: unavailable, then available again), so that a page shows a clear state
 * and a run rides out a Redis restart instead of failing on its first refused request.
 *
 * Only requests that may be repeated safely are tried again: a refused request may still have
 * been applied (the engine went away after it wrote, before it replied). A second `set`,
 * `multiSet`, read or wait changes nothing, nor does a second `compareSet` (it finds its own
 * value and returns it, as a success does); a second `add`, `append` or `deleteKey` would count,
 * append or report twice, so those fail at once with the server's STORE_UNAVAILABLE.
 */
import { ErrorCode, type RequestType } from '../wire/protocol.ts';
import { StoreError } from '../wire/errors.ts';

/** How long a request is tried again while the store is unavailable, by default. */
export const DEFAULT_STORE_UNAVAILABLE_RETRY_MS = 30_000;
const FIRST_WAIT_MS = 250;
const MOST_WAIT_MS = 2_000;

/** The store as a client sees it: refusing requests with STORE_UNAVAILABLE (and when it tries next), or answering again. */
export type StoreAvailabilityEvent = { available: false; message: string; retryInMs: number } | { available: true };

const REPEATABLE = new Set<RequestType>(['set', 'get', 'compareSet', 'wait', 'check', 'numKeys', 'multiGet', 'multiSet']);
/** The store's own requests: those the engine serves (the rest are the server's, in its memory). */
export const STORE_REQUESTS: ReadonlySet<RequestType> = new Set<RequestType>([...REPEATABLE, 'add', 'append', 'deleteKey']);

export function isStoreUnavailable(err: unknown): err is StoreError {
  return err instanceof StoreError && err.code === ErrorCode.STORE_UNAVAILABLE;
}

/** One client's view of its store's availability: tries repeatable requests again and reports the changes. */
export class StoreAvailability {
  private down = false;
  private probing = false;

  constructor(
    /** 0: never try again (each refusal is the caller's). */
    private readonly boundMs: number,
    private readonly report: (e: StoreAvailabilityEvent) => void,
    /**
     * A cheap request the engine serves, sent while the store is down until it answers: so that
     * "available" is heard even when no request of the caller's is left to find out (an `add`
     * refused, a retry given up). It stops once it rejects with anything but STORE_UNAVAILABLE (the
     * socket closed, say).
     */
    private readonly probe: () => Promise<unknown>,
  ) {
    if (!(boundMs >= 0)) throw new RangeError(`storeUnavailableRetryMs must be 0 or more milliseconds, got ${boundMs}`);
  }

  private wentDown(message: string, retryInMs: number): void {
    if (this.down) return;
    this.down = true;
    this.report({ available: false, message, retryInMs });
    void this.probeUntilUp();
  }

  private async probeUntilUp(): Promise<void> {
    if (this.probing) return;
    this.probing = true;
    try {
      for (let waitMs = FIRST_WAIT_MS * 4; this.down; waitMs = Math.min(MOST_WAIT_MS, waitMs * 2)) {
        // Unref'd: a client left open does not keep a Node process alive by probing.
        await new Promise((r) => (setTimeout(r, waitMs) as { unref?: () => void }).unref?.());
        if (!this.down) return;
        try {
          await this.probe();
          this.answered();
        } catch (err) {
          if (isStoreUnavailable(err)) continue;
          if (err instanceof StoreError) this.answered();
          return;
        }
      }
    } finally {
      this.probing = false;
    }
  }

  /** The store answered a request: it is available (again). */
  answered(): void {
    if (!this.down) return;
    this.down = false;
    this.report({ available: true });
  }

  /**
   * Sends a request with `send(remainingMs)` (a blocking one waits at most what is left of its own
   * timeout, `timeoutMs`) until it is not refused with STORE_UNAVAILABLE, the bound passes, or
   * `closed()`; then its refusal is the caller's, saying how long it was tried.
   */
  async run<T>(
    type: RequestType,
    timeoutMs: number | undefined,
    send: (remainingMs: number | undefined) => Promise<T>,
    closed: () => boolean,
  ): Promise<T> {
    const start = Date.now();
    for (let attempt = 0; ; attempt++) {
      const elapsed = Date.now() - start;
      const remaining = timeoutMs === undefined ? undefined : Math.max(0, timeoutMs - elapsed);
      try {
        const result = await send(remaining);
        this.answered();
        return result;
      } catch (err) {
        if (!isStoreUnavailable(err)) {
          // Any other reply is the store answering (a timeout, a refusal); a closed socket says nothing of it.
          if (err instanceof StoreError) this.answered();
          throw err;
        }
        const waitMs = Math.min(MOST_WAIT_MS, FIRST_WAIT_MS * 2 ** attempt);
        const spent = Date.now() - start;
        const last = !REPEATABLE.has(type) || closed() || spent + waitMs > this.boundMs || (remaining !== undefined && remaining <= waitMs);
        // Said once as it goes (and once as it comes back: `answered`), not at every try.
        this.wentDown(err.message, last ? 0 : waitMs);
        if (last) throw REPEATABLE.has(type) && this.boundMs > 0 ? triedFor(err, spent) : err;
        await new Promise((r) => setTimeout(r, waitMs));
      }
    }
  }
}

function triedFor(err: StoreError, ms: number): StoreError {
  return new StoreError(err.code, `${err.message} (tried again for ${(ms / 1000).toFixed(1)} s)`, err.details);
}
