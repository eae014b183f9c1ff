/**
 * Flow control for a PeerLink, whatever carries its bytes: the credit window (how much may be
 * on the way unacknowledged), the credit messages that acknowledge, and the send queue's
 * backpressure (wait while the transport holds more than the high-water mark).
 */
import { PeerLostError } from '../wire/errors.ts';

/** Defaults for the send queue: Chromium's queue holds 16 MiB; stay well below it. */
export const DEFAULT_HIGH_WATER_MARK = 4 << 20;
/** Default credit window: windows of 64-192 KiB in 16-32 KiB frames measured alike under --lan, larger ones worse (bench/README.md). */
export const DEFAULT_WINDOW_BYTES = 128 << 10;

/**
 * Messages this small never wait for the credit window: liveness frames and abort or leave notices
 * must go at once (a peer must not take a busy link for a stalled one), and they add nothing to a queue.
 */
export const WINDOW_EXEMPT_BYTES = 4096;

/** First byte of a credit message. Frames start with 0xD7 (framing.ts), so the two never mix. */
export const CREDIT_MAGIC = 0xc3;
const CREDIT_BYTES = 12;

/** A credit message: "my page has taken `taken` bytes off this link so far" (float64, exact to 2^53). */
export function encodeCredit(taken: number): Uint8Array {
  const msg = new Uint8Array(CREDIT_BYTES);
  msg[0] = CREDIT_MAGIC;
  new DataView(msg.buffer).setFloat64(4, taken, true);
  return msg;
}

/** The count a credit message carries, or undefined when `bytes` is not a credit message. */
export function readCredit(bytes: Uint8Array): number | undefined {
  if (bytes.length !== CREDIT_BYTES || bytes[0] !== CREDIT_MAGIC) return undefined;
  return new DataView(bytes.buffer, bytes.byteOffset, CREDIT_BYTES).getFloat64(4, true);
}

/**
 * Credit-based flow control for one link, as HTTP/2 and QUIC do it per stream: a sender may have
 * at most `windowBytes` on the way that the peer's page has not acknowledged taking, and the
 * receiver acknowledges (a credit message) every quarter window.
 *
 * Why: SCTP's congestion control fills whatever queue the network has. Every ring link carries
 * data both ways, and one direction's acknowledgements wait in the queue behind the other
 * direction's data; the side that got ahead keeps a long queue and the other starves (measured
 * under --lan: one direction at the shaped rate, the other at a fifth to two fifths of it, 0.6
 * of one-way each way on average). A window keeps each queue at most about one window long, so
 * neither direction starves (0.8-0.9 of one-way, bench/results/lan.md), and a liveness frame
 * never waits behind megabytes. The price: one link moves at most `windowBytes` per round trip.
 */
export class CreditWindow {
  private sent = 0;
  private credited = 0;
  private taken = 0;
  private acknowledged = 0;

  constructor(
    private readonly windowBytes: number,
    /**
     * Sends a credit message to the peer; false when it cannot go yet (the link's channel is not
     * open from this side): the count is then sent by the next acknowledgement or by `flush`.
     */
    private readonly sendCredit: (message: Uint8Array) => boolean,
  ) {}

  /** Whether another message may go now (a whole message goes while any window is left). */
  get open(): boolean {
    return this.windowBytes <= 0 || this.sent - this.credited < this.windowBytes;
  }

  /** Bytes sent but not yet credited. */
  get outstanding(): number {
    return this.sent - this.credited;
  }

  sentBytes(n: number): void {
    this.sent += n;
  }

  /** A credit from the peer (untrusted: a count that goes backwards or past what was sent moves nothing). Returns whether the window opened. */
  credit(taken: number): boolean {
    if (!Number.isFinite(taken) || taken <= this.credited) return false;
    this.credited = Math.min(taken, this.sent);
    return true;
  }

  /** The page took `n` bytes off the link: acknowledge once a quarter window has built up. */
  took(n: number): void {
    this.taken += n;
    if (this.windowBytes > 0 && this.taken - this.acknowledged >= this.windowBytes / 4) this.acknowledge();
  }

  /**
   * Acknowledges whatever was taken and not yet acknowledged (the link calls it once it can send).
   * A credit that could not go must go later: the sender waits for it, and sends nothing that
   * would make this side acknowledge again (a 2-rank all-reduce stalled for its whole 120 s bound
   * when the first window arrived before simple-peer's 'connect' and every credit was dropped).
   */
  flush(): void {
    if (this.windowBytes > 0 && this.taken > this.acknowledged) this.acknowledge();
  }

  private acknowledge(): void {
    if (this.sendCredit(encodeCredit(this.taken))) this.acknowledged = this.taken;
  }
}

/**
 * Backpressure for one link's send queue, whatever carries the bytes: a sender that queued
 * more than the high-water mark waits until the queue drains, and a queue that does not drain
 * for `stallTimeoutMs` fails the send with PeerLostError (the peer stopped taking data).
 */
export class SendQueue {
  private waiters: Array<{ resolve(): void; reject(e: Error): void }> = [];

  constructor(
    private readonly peer: number,
    private readonly highWaterMark: number,
    private readonly stallTimeoutMs: number,
    /** Bytes queued and not yet taken by the transport. */
    private readonly buffered: () => number,
    /** The link's credit window, if it has one. */
    private readonly window?: CreditWindow,
  ) {}

  /** Call before sending a message: resolves once the credit window has room. */
  async beforeSend(): Promise<void> {
    const window = this.window;
    if (!window) return;
    while (!window.open)
      await this.wait(() => `its page acknowledged nothing for ${this.stallTimeoutMs} ms (${window.outstanding} bytes unacknowledged)`);
  }

  /** Call after queueing a message: resolves once the queue is back under the high-water mark. */
  async afterSend(): Promise<void> {
    if (this.buffered() <= this.highWaterMark) return;
    await this.wait(() => `its link did not take data for ${this.stallTimeoutMs} ms (${this.buffered()} bytes queued)`);
  }

  private wait(stalled: () => string): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(new PeerLostError(this.peer, stalled()));
      }, this.stallTimeoutMs);
      const waiter = {
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
        reject: (e: Error) => {
          clearTimeout(timer);
          reject(e);
        },
      };
      this.waiters.push(waiter);
    });
  }

  /** The transport took data (its "buffered amount low" event), or a credit came: wake the senders. */
  drained(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w.resolve();
  }

  /** The link closed: every waiting sender fails with `err`. */
  fail(err: Error): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w.reject(err);
  }
}
