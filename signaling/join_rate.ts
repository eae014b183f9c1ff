/**
 * How fast one address may join one session's group (`rendezvous`): a token bucket per (address,
 * session). A tab stuck in a reconnect loop, or a client that joins on purpose again and again,
 * would otherwise make the server admit, announce and drop members as fast as it can send, each
 * one a new member id and a round event to every member. A class behind one NAT shares an
 * address, so the burst lets a whole class (re)join at once; past it, joins are refused with
 * RATE_LIMITED (the library's reconnect loop retries with backoff). Keyed by session too, so that
 * tests and launchers that make many sessions from loopback do not share one budget.
 */
import { ErrorCode } from '../src/wire/protocol.ts';
import { StoreRefusal } from './store.ts';

export interface JoinRateOptions {
  /** Joins one address may make into one session at once. Default JOIN_BURST. */
  burst?: number;
  /** Joins it earns back per second. Default JOIN_REFILL_PER_SECOND. */
  perSecond?: number;
}

/** Two of the largest classes' tabs all rejoining at once (a wifi that dropped), several times over. */
export const JOIN_BURST = 256;
/** A loop is slowed to this; a class losing and rejoining tabs one by one never comes near it. */
export const JOIN_REFILL_PER_SECOND = 4;
/** Buckets kept; full ones are dropped first (a full bucket is the same as none). */
const MAX_BUCKETS = 16_384;

interface Bucket {
  tokens: number;
  at: number;
}

export class JoinRate {
  readonly burst: number;
  readonly perSecond: number;
  private readonly buckets = new Map<string, Bucket>();

  constructor(options: JoinRateOptions = {}) {
    this.burst = options.burst ?? JOIN_BURST;
    this.perSecond = options.perSecond ?? JOIN_REFILL_PER_SECOND;
    if (!Number.isSafeInteger(this.burst) || this.burst < 1)
      throw new RangeError(`joinRate.burst must be a positive integer, got ${this.burst}`);
    if (!(Number.isFinite(this.perSecond) && this.perSecond > 0))
      throw new RangeError(`joinRate.perSecond must be a positive number, got ${this.perSecond}`);
  }

  /** Counts one join of `session` from `address`, or refuses it (RATE_LIMITED) saying when to try again. */
  take(address: string, session: string, now = Date.now()): void {
    const key = `${address} ${session}`;
    const b = this.buckets.get(key);
    const tokens = b ? Math.min(this.burst, b.tokens + ((now - b.at) / 1000) * this.perSecond) : this.burst;
    if (tokens < 1) {
      const retryAfterMs = Math.ceil(((1 - tokens) / this.perSecond) * 1000);
      throw new StoreRefusal(
        ErrorCode.RATE_LIMITED,
        `too many joins of session "${session}" from ${address}: ${this.burst} at once, then ${this.perSecond} a second; join again in ${retryAfterMs} ms (a tab that keeps rejoining: look for why it keeps leaving)`,
        { retryAfterMs, burst: this.burst, perSecond: this.perSecond },
      );
    }
    if (!b && this.buckets.size >= MAX_BUCKETS) this.evict(now);
    this.buckets.delete(key); // re-inserted last: the map's order is least recently used first
    this.buckets.set(key, { tokens: tokens - 1, at: now });
  }

  /** Buckets held now (for tests). */
  get size(): number {
    return this.buckets.size;
  }

  /** Drops the buckets that are full again; if none is, the least recently used one (it starts full again: a little lenience, bounded memory). */
  private evict(now: number): void {
    for (const [key, b] of this.buckets) if (b.tokens + ((now - b.at) / 1000) * this.perSecond >= this.burst) this.buckets.delete(key);
    if (this.buckets.size >= MAX_BUCKETS) {
      const oldest = this.buckets.keys().next();
      if (!oldest.done) this.buckets.delete(oldest.value);
    }
  }
}
