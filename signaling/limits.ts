/**
 * Bookkeeping for the server-wide limits (`Limits` in src/wire/protocol.ts): reply sizes, sockets per
 * remote address, and a log that reports each kind of refusal once and then only counts it, so
 * that a client hammering the server cannot flood the log either. Also the bounds on sending
 * files' bytes over HTTP (`FileSendLimits`): how many sends at once, and how long a reader may
 * take nothing.
 */
import type { ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { ErrorCode } from '../src/wire/protocol.ts';
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

/**
 * Bounds on the HTTP routes that send a file's bytes (the host's offered items and weights,
 * offer.ts; the page and its dataset files, static.ts). Every such send streams from disk with
 * backpressure (at most `FILE_SEND_CHUNK_BYTES` read ahead), so a reader that takes nothing pins
 * a chunk or two, never the file; the counts bound how many of them one client, one session and
 * the whole server hold at once, and the idle timeout ends the ones that stall.
 */
export interface FileSendLimits {
  /** Offer sends in progress at once to one remote address; more get 429 with Retry-After. */
  maxFileSendsPerAddress: number;
  /** Offer sends in progress at once to one session's tabs (all addresses); more get 429 with Retry-After. */
  maxFileSendsPerSession: number;
  /** Offer sends in progress at once on the whole server; more get 503 with Retry-After. */
  maxFileSends: number;
  /** A reader that has not taken a chunk (the response has not drained) for this long is cut: its socket is closed, and the server logs it. */
  fileSendIdleTimeoutMs: number;
}

/**
 * A tab loads a host's images 6 at a time, and a class behind one NAT shares one address: 64 per
 * address lets ten tabs load at once, and the refused ones retry (src/datasets/offered.ts). At
 * most ~2 chunks per send in memory: 256 sends stalled pin about 32 MiB, for 30 s.
 */
export const DEFAULT_FILE_SEND_LIMITS: FileSendLimits = {
  maxFileSendsPerAddress: 64,
  maxFileSendsPerSession: 128,
  maxFileSends: 256,
  fileSendIdleTimeoutMs: 30_000,
};

/** What a send reads from disk ahead of the reader (the read stream's high-water mark). */
export const FILE_SEND_CHUNK_BYTES = 64 * 1024;
/** Retry-After (seconds) on a send refused for a full bound: sends of a host's images end in milliseconds. */
export const FILE_SEND_RETRY_AFTER_S = 1;

/** Why a send was refused: the status, and a message naming the bound and saying to retry. */
export interface FileSendRefusal {
  /** The bound that is full. */
  bound: 'maxFileSendsPerAddress' | 'maxFileSendsPerSession' | 'maxFileSends';
  status: 429 | 503;
  error: 'too-many-requests' | 'busy';
  message: string;
}

/**
 * The sends in progress, by remote address and by session (`FileSendLimits`), and the streaming
 * of one send with the idle timeout. `note` is the server's quiet log (one line per kind, then counts).
 */
export class FileSends {
  readonly limits: FileSendLimits;
  private readonly byAddress = new Map<string, number>();
  private readonly bySession = new Map<string, number>();
  private total = 0;

  constructor(
    limits: Partial<FileSendLimits> = {},
    private readonly note: (kind: string, line: string) => void = () => {},
  ) {
    this.limits = { ...DEFAULT_FILE_SEND_LIMITS, ...limits };
    for (const [name, value] of Object.entries(this.limits)) {
      if (!Number.isSafeInteger(value) || value < 1)
        throw new RangeError(`file send limit ${name} is ${String(value)}: it must be a whole number of at least 1`);
    }
  }

  /**
   * Takes a slot for one send to `address` for `session`: a function that gives it back (call it
   * once, when the send ended however it ended), or why not.
   */
  tryStart(address: string, session: string): (() => void) | FileSendRefusal {
    const { maxFileSendsPerAddress, maxFileSendsPerSession, maxFileSends } = this.limits;
    const retry = `retry after ${FILE_SEND_RETRY_AFTER_S} s (Retry-After)`;
    let refusal: FileSendRefusal | null = null;
    if ((this.byAddress.get(address) ?? 0) >= maxFileSendsPerAddress) {
      refusal = {
        bound: 'maxFileSendsPerAddress',
        status: 429,
        error: 'too-many-requests',
        message: `this address has ${maxFileSendsPerAddress} downloads from the server in progress, the most it serves to one address at once (maxFileSendsPerAddress): read or cancel them, and ${retry}`,
      };
    } else if ((this.bySession.get(session) ?? 0) >= maxFileSendsPerSession) {
      refusal = {
        bound: 'maxFileSendsPerSession',
        status: 429,
        error: 'too-many-requests',
        message: `session "${session}" has ${maxFileSendsPerSession} downloads of the host's files in progress, the most the server serves to one session at once (maxFileSendsPerSession): ${retry}`,
      };
    } else if (this.total >= maxFileSends) {
      refusal = {
        bound: 'maxFileSends',
        status: 503,
        error: 'busy',
        message: `the server has ${maxFileSends} downloads in progress, the most it serves at once (maxFileSends): ${retry}`,
      };
    }
    if (refusal) {
      this.note(
        `file send refused: ${refusal.bound}`,
        `[server] refused a download to ${address} (session "${session}"): ${refusal.message}`,
      );
      return refusal;
    }
    const bump = (m: Map<string, number>, key: string, by: number) => {
      const n = (m.get(key) ?? 0) + by;
      if (n > 0) m.set(key, n);
      else m.delete(key);
    };
    bump(this.byAddress, address, 1);
    bump(this.bySession, session, 1);
    this.total++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      bump(this.byAddress, address, -1);
      bump(this.bySession, session, -1);
      this.total--;
    };
  }

  /**
   * Streams `body` into `res` (whose head the caller has written) with backpressure: the body is
   * read only as the reader drains the response. A reader that takes nothing for
   * `fileSendIdleTimeoutMs` is cut (the socket closed) and logged as `what`. Resolves when the
   * send ended: 'sent', 'stalled' (cut), or 'failed' (the reader went away, or the body broke).
   */
  async stream(res: ServerResponse, body: Readable, what: string): Promise<'sent' | 'stalled' | 'failed'> {
    const idleMs = this.limits.fileSendIdleTimeoutMs;
    let sent = 0;
    let stalled = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        stalled = true;
        const address = res.req.socket.remoteAddress ?? 'an unknown address';
        this.note(
          'file send stalled',
          `[server] cut a slow reader: ${what} to ${address} took no bytes for ${idleMs} ms after ${sent} bytes (fileSendIdleTimeoutMs); its socket is closed`,
        );
        res.destroy();
      }, idleMs);
    };
    arm();
    // pipe() is in place once pipeline() returns, and flowing starts on the next tick: this
    // listener sees every chunk the response takes. A chunk read and every drain of the response
    // show the reader is reading; a reader that reads nothing pauses the body (backpressure).
    const done = pipeline(body, res);
    const onData = (chunk: Buffer) => {
      sent += chunk.length;
      arm();
    };
    const onDrain = () => arm();
    body.on('data', onData);
    res.on('drain', onDrain);
    try {
      await done;
      return 'sent';
    } catch {
      return stalled ? 'stalled' : 'failed';
    } finally {
      clearTimeout(timer);
      body.off('data', onData);
      res.off('drain', onDrain);
    }
  }
}

/** An in-memory buffer as a stream of views of it (no copies), for `FileSends.stream`. */
export function bufferStream(bytes: Uint8Array): Readable {
  function* chunks(): Generator<Uint8Array> {
    for (let at = 0; at < bytes.byteLength; at += FILE_SEND_CHUNK_BYTES) yield bytes.subarray(at, at + FILE_SEND_CHUNK_BYTES);
  }
  return Readable.from(chunks(), { objectMode: false, highWaterMark: FILE_SEND_CHUNK_BYTES });
}
