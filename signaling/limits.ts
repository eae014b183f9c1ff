/**
 * Bookkeeping for the server-wide limits (`Limits` in src/c10d/protocol.ts): reply sizes, sockets per
 * remote address, and a log that reports each kind of refusal once and then only counts it, so
 * that a client hammering the server cannot flood the log either.
 */
import { ErrorCode } from '../src/c10d/protocol.ts';
import { StoreRefusal } from './store.ts';

/** Characters of the base64 text of `n` bytes. */
export function base64Length(n: number): number {
  return 4 * Math.ceil(n / 3);
}

/** The JSON envelope of a reply ({"type":"reply","id":...,"result":...}), generously. */
const REPLY_ENVELOPE = 64;

/**
 * Refuses a reply of these values that would be larger than `limit`, before any of it is
 * built: the size follows from the values' lengths (base64, 4/3), plus quotes and commas.
 */
export function checkReplySize(values: readonly Uint8Array[], limit: number): void {
  let bytes = REPLY_ENVELOPE;
  for (const v of values) bytes += base64Length(v.length) + 3;
  if (bytes <= limit) return;
  const what = values.length === 1 ? 'the value' : `the ${values.length} values`;
  throw new StoreRefusal(
    ErrorCode.REPLY_TOO_LARGE,
    `the reply would be ${bytes} bytes (${what}, as base64); the limit is ${limit}. Ask for fewer keys at once, or store smaller values.`,
    { bytes, limit, keys: values.length },
  );
}

/** Open sockets per remote address (`maxConnectionsPerAddress`). */
export class AddressCounts {
  private readonly counts = new Map<string, number>();

  /** Counts one more socket from `address`, unless it has `max` already. */
  tryAdd(address: string, max: number): boolean {
    const n = this.counts.get(address) ?? 0;
    if (n >= max) return false;
    this.counts.set(address, n + 1);
    return true;
  }

  release(address: string): void {
    const n = (this.counts.get(address) ?? 0) - 1;
    if (n > 0) this.counts.set(address, n);
    else this.counts.delete(address);
  }

  count(address: string): number {
    return this.counts.get(address) ?? 0;
  }
}

/**
 * A log that writes the first line of each kind (with the stack, when there is one) and only
 * counts the rest; `flush` writes one summary line per kind that repeated. The server flushes
 * it every `summaryMs` and when it closes.
 */
export class QuietLog {
  private readonly repeats = new Map<string, number>();
  private readonly seen = new Set<string>();
  private readonly timer: ReturnType<typeof setInterval>;

  constructor(
    private readonly log: (line: string) => void,
    summaryMs = 60_000,
  ) {
    this.timer = setInterval(() => this.flush(), summaryMs);
    this.timer.unref();
  }

  /** `kind` groups the lines (a refusal's code, a close's reason); `line` says this one. */
  note(kind: string, line: string, stack?: string): void {
    if (!this.seen.has(kind)) {
      // Kinds are few (codes, request types); the bound only guards against a bug making many.
      if (this.seen.size < 1_000) this.seen.add(kind);
      this.log(stack ? `${line}\n${stack}` : line);
      return;
    }
    this.repeats.set(kind, (this.repeats.get(kind) ?? 0) + 1);
  }

  flush(): void {
    for (const [kind, n] of this.repeats) this.log(`[server] ${n} more of: ${kind} (not logged one by one)`);
    this.repeats.clear();
  }

  close(): void {
    clearInterval(this.timer);
    this.flush();
  }
}
