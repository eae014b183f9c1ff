/**
 * Peer links: a reliable, ordered byte pipe to one other rank. The collectives see only the
 * `PeerLink` interface (send bytes with backpressure, receive bytes, close); simple-peer and
 * RTCPeerConnection live behind `simplePeerLinkFactory` and nowhere else.
 */
import type { Instance as SimplePeerInstance, Options as SimplePeerOptions } from 'simple-peer';
import { PeerLostError } from '../errors.ts';

export type LinkState = 'connecting' | 'open' | 'closed';

export interface PeerLink {
  /** The rank at the other end. */
  readonly peer: number;
  readonly state: LinkState;
  /**
   * Queues one message (at most the channel's message limit). Resolves once the send queue is
   * back under the high-water mark, so a sender that awaits each call never overflows it.
   */
  send(bytes: Uint8Array): Promise<void>;
  onMessage(handler: (bytes: Uint8Array) => void): void;
  onClose(handler: (reason: string) => void): void;
  close(): void;
  readonly bytesSent: number;
  readonly bytesReceived: number;
  /**
   * The network path under the link now (WebRTC's selected ICE candidate pair), for dashboards and
   * summaries. Optional: a transport without one (an in-memory test link) leaves it out.
   */
  path?(): Promise<PathSample | undefined>;
}

/** ICE candidate types: a host's own address, its address as a STUN server saw it, as the peer saw it, or a TURN relay's. */
export type CandidateType = 'host' | 'srflx' | 'prflx' | 'relay';

/** One reading of a link's network path, as `RTCPeerConnection.getStats()` reports it. */
export interface PathSample {
  /** This end's candidate of the selected pair; null when the browser did not say. */
  local: CandidateType | null;
  /** The peer's candidate of the selected pair. */
  remote: CandidateType | null;
  /** "udp" or "tcp" (the local candidate's), or null. */
  protocol: string | null;
  /** The pair's current round-trip time (from ICE consent checks), or null before one was measured. */
  rttMs: number | null;
  /** The transport's byte counters (everything the connection carried, DTLS and SCTP framing included). */
  bytesSent: number;
  bytesReceived: number;
  /** When the stats were taken, in ms since the epoch (the counters' clock). */
  at: number;
}

export interface LinkFactoryOptions {
  peer: number;
  /** Names the link: the same at both of its ends, different for every group and pair of ranks. */
  channel: string;
  /** Exactly one side of each pair initiates (the lower rank). */
  initiator: boolean;
  /** Sends a signaling payload to the peer (through the server). */
  sendSignal(body: unknown): void;
  iceServers: RTCIceServer[];
  /** Send-queue high-water mark in bytes. */
  highWaterMark: number;
  /** How long a full send queue may go without draining before the peer counts as lost. */
  stallTimeoutMs: number;
  /** Credit window in bytes (see `CreditWindow`); 0 turns it off. */
  windowBytes: number;
}

export interface PendingLink {
  link: PeerLink;
  /** Feeds a signaling payload that arrived from the peer. */
  receiveSignal(body: unknown): void;
  /** Resolves when the link can carry data; rejects if it closes first. */
  opened: Promise<void>;
}

export type PeerLinkFactory = (options: LinkFactoryOptions) => PendingLink;

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
    /** Sends a credit message to the peer. */
    private readonly sendCredit: (message: Uint8Array) => void,
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
    if (this.windowBytes > 0 && this.taken - this.acknowledged >= this.windowBytes / 4) {
      this.acknowledged = this.taken;
      this.sendCredit(encodeCredit(this.taken));
    }
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
    while (!window.open) await this.wait(() => `its page acknowledged nothing for ${this.stallTimeoutMs} ms (${window.outstanding} bytes unacknowledged)`);
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

const CANDIDATE_TYPES: ReadonlySet<string> = new Set(['host', 'srflx', 'prflx', 'relay']);
/** A peer connection's stats hold a few entries per candidate; more than this is not a stats report we understand. */
const MAX_STATS_ENTRIES = 2_000;

/**
 * The selected candidate pair out of a `getStats()` report's entries: the transport's
 * `selectedCandidatePairId` (the standard, Chromium), else a pair marked `selected` (Firefox),
 * else the nominated, succeeded pair that carried the most. Undefined when no pair is selected yet.
 * Reads defensively: every field is checked, nothing is trusted to be there.
 */
export function selectedPath(stats: Iterable<unknown>, now = Date.now()): PathSample | undefined {
  const byId = new Map<string, Record<string, unknown>>();
  const transports: Array<Record<string, unknown>> = [];
  const pairs: Array<Record<string, unknown>> = [];
  let count = 0;
  for (const s of stats) {
    if (++count > MAX_STATS_ENTRIES) break;
    if (typeof s !== 'object' || s === null) continue;
    const entry = s as Record<string, unknown>;
    if (typeof entry.id === 'string') byId.set(entry.id, entry);
    if (entry.type === 'transport') transports.push(entry);
    else if (entry.type === 'candidate-pair') pairs.push(entry);
  }
  const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : null);
  let pair: Record<string, unknown> | undefined;
  let transport: Record<string, unknown> | undefined;
  for (const t of transports) {
    const id = t.selectedCandidatePairId;
    const p = typeof id === 'string' ? byId.get(id) : undefined;
    if (p?.type === 'candidate-pair') {
      pair = p;
      transport = t;
      break;
    }
  }
  pair ??= pairs.find((p) => p.selected === true);
  pair ??= pairs.filter((p) => p.nominated === true && p.state === 'succeeded').sort((a, b) => (num(b.bytesSent) ?? 0) - (num(a.bytesSent) ?? 0))[0];
  if (!pair) return undefined;
  transport ??= transports.find((t) => t.id === pair.transportId);
  const candidate = (id: unknown): Record<string, unknown> | undefined => (typeof id === 'string' ? byId.get(id) : undefined);
  const local = candidate(pair.localCandidateId);
  const remote = candidate(pair.remoteCandidateId);
  const type = (c: Record<string, unknown> | undefined): CandidateType | null =>
    typeof c?.candidateType === 'string' && CANDIDATE_TYPES.has(c.candidateType) ? (c.candidateType as CandidateType) : null;
  const rtt = num(pair.currentRoundTripTime);
  // The transport's counters survive a change of the selected pair (the pair's restart at zero).
  const counters = transport && num(transport.bytesSent) !== null ? transport : pair;
  return {
    local: type(local),
    remote: type(remote),
    protocol: typeof local?.protocol === 'string' && /^(udp|tcp)$/.test(local.protocol) ? local.protocol : null,
    rttMs: rtt === null ? null : Math.round(rtt * 1e4) / 10,
    bytesSent: num(counters.bytesSent) ?? 0,
    bytesReceived: num(counters.bytesReceived) ?? 0,
    at: num(pair.timestamp) ?? now,
  };
}

type SimplePeerCtor = new (opts: SimplePeerOptions) => SimplePeerInstance;
let simplePeerCtor: SimplePeerCtor | undefined;

/** Loads simple-peer's prebuilt bundle (it carries its own Node polyfills). */
export async function loadSimplePeer(): Promise<SimplePeerCtor> {
  if (!simplePeerCtor) {
    const mod = (await import('simple-peer/simplepeer.min.js')) as { default: SimplePeerCtor };
    simplePeerCtor = mod.default;
  }
  return simplePeerCtor;
}

/**
 * A PeerLink over a simple-peer data channel. Call `loadSimplePeer()` once before using it.
 * `wrtc` lets Node supply a WebRTC implementation; browsers have their own.
 */
export function simplePeerLinkFactory(wrtc?: SimplePeerOptions['wrtc']): PeerLinkFactory {
  return (options) => {
    const SimplePeer = simplePeerCtor;
    if (!SimplePeer) throw new Error('simple-peer is not loaded: await loadSimplePeer() first');
    if (!wrtc && typeof RTCPeerConnection === 'undefined') {
      throw new Error('WebRTC is not available here (no RTCPeerConnection); run in a browser or pass a wrtc implementation');
    }
    const peer = new SimplePeer({
      initiator: options.initiator,
      trickle: true,
      // Never a public STUN server by default: ICE servers are the caller's configuration.
      config: { iceServers: options.iceServers },
      channelConfig: { ordered: true },
      wrtc,
    });
    return new SimplePeerLink(options.peer, peer, options);
  };
}

class SimplePeerLink implements PeerLink, PendingLink {
  state: LinkState = 'connecting';
  bytesSent = 0;
  bytesReceived = 0;
  readonly opened: Promise<void>;
  private readonly messageHandlers: Array<(bytes: Uint8Array) => void> = [];
  private readonly closeHandlers: Array<(reason: string) => void> = [];
  private closeReason = '';
  private readonly queue: SendQueue;
  private readonly window: CreditWindow;
  private channel: RTCDataChannel | undefined;

  constructor(
    readonly peer: number,
    private readonly sp: SimplePeerInstance,
    options: LinkFactoryOptions,
  ) {
    this.window = new CreditWindow(options.windowBytes, (credit) => {
      if (this.channel?.readyState !== 'open') return;
      this.channel.send(credit as Uint8Array<ArrayBuffer>);
      this.bytesSent += credit.byteLength;
    });
    this.queue = new SendQueue(peer, options.highWaterMark, options.stallTimeoutMs, () => this.channel?.bufferedAmount ?? 0, this.window);
    this.opened = new Promise<void>((resolve, reject) => {
      sp.on('connect', () => {
        this.state = 'open';
        // simple-peer keeps the channel private; backpressure needs its bufferedAmount.
        this.channel = (sp as unknown as { _channel: RTCDataChannel })._channel;
        this.channel.bufferedAmountLowThreshold = Math.floor(options.highWaterMark / 4);
        this.channel.addEventListener('bufferedamountlow', () => this.queue.drained());
        resolve();
      });
      sp.once('close', () => reject(new PeerLostError(peer, this.closeReason || 'link closed before it opened')));
    });
    this.opened.catch(() => {});
    sp.on('signal', (data: unknown) => options.sendSignal(data));
    sp.on('data', (data: Uint8Array) => {
      this.bytesReceived += data.byteLength;
      // simple-peer hands out Buffers; collectives want plain views over the same memory.
      const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
      const credit = readCredit(bytes);
      if (credit !== undefined) {
        if (this.window.credit(credit)) this.queue.drained();
        return;
      }
      for (const h of this.messageHandlers) h(bytes);
      this.window.took(bytes.byteLength);
    });
    sp.on('error', (err: Error) => {
      this.closeReason = `WebRTC error: ${err.message}`;
    });
    sp.on('close', () => this.markClosed(this.closeReason || 'the peer closed the link'));
  }

  get link(): PeerLink {
    return this;
  }

  async path(): Promise<PathSample | undefined> {
    // simple-peer keeps its RTCPeerConnection private too; this is the one place that reads it.
    const pc = (this.sp as unknown as { _pc?: RTCPeerConnection | null })._pc;
    if (this.state !== 'open' || !pc) return undefined;
    const report = await pc.getStats();
    return selectedPath(report.values());
  }

  receiveSignal(body: unknown): void {
    if (this.state !== 'closed') this.sp.signal(body as Parameters<SimplePeerInstance['signal']>[0]);
  }

  async send(bytes: Uint8Array): Promise<void> {
    // Sent synchronously unless it must wait: a leave notice followed at once by close() still goes.
    if (bytes.byteLength > WINDOW_EXEMPT_BYTES && !this.window.open) await this.queue.beforeSend();
    const channel = this.channel;
    if (this.state !== 'open' || !channel || channel.readyState !== 'open') {
      throw new PeerLostError(this.peer, this.closeReason || `link is ${this.state}`);
    }
    channel.send(bytes as Uint8Array<ArrayBuffer>);
    this.bytesSent += bytes.byteLength;
    this.window.sentBytes(bytes.byteLength);
    await this.queue.afterSend();
  }

  onMessage(handler: (bytes: Uint8Array) => void): void {
    this.messageHandlers.push(handler);
  }

  onClose(handler: (reason: string) => void): void {
    if (this.state === 'closed') handler(this.closeReason);
    else this.closeHandlers.push(handler);
  }

  close(): void {
    this.closeReason ||= 'closed locally';
    this.sp.destroy();
    this.markClosed(this.closeReason);
  }

  private markClosed(reason: string): void {
    if (this.state === 'closed') return;
    this.state = 'closed';
    this.closeReason = reason;
    this.queue.fail(new PeerLostError(this.peer, reason));
    for (const h of this.closeHandlers) h(reason);
  }
}
