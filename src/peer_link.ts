/**
 * Peer links: a reliable, ordered byte pipe to one other rank. The collectives see only the
 * `PeerLink` interface (send bytes with backpressure, receive bytes, close); simple-peer and
 * RTCPeerConnection live behind `simplePeerLinkFactory` and nowhere else.
 */
import type { Instance as SimplePeerInstance, Options as SimplePeerOptions } from 'simple-peer';
import { PeerLostError } from './errors.ts';

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
  ) {}

  /** Call after queueing a message: resolves once the queue is back under the high-water mark. */
  async afterSend(): Promise<void> {
    if (this.buffered() <= this.highWaterMark) return;
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(new PeerLostError(this.peer, `its link did not take data for ${this.stallTimeoutMs} ms (${this.buffered()} bytes queued)`));
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

  /** The transport took data (its "buffered amount low" event): wake the senders. */
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
  private channel: RTCDataChannel | undefined;

  constructor(
    readonly peer: number,
    private readonly sp: SimplePeerInstance,
    options: LinkFactoryOptions,
  ) {
    this.queue = new SendQueue(peer, options.highWaterMark, options.stallTimeoutMs, () => this.channel?.bufferedAmount ?? 0);
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
      for (const h of this.messageHandlers) h(bytes);
    });
    sp.on('error', (err: Error) => {
      this.closeReason = `WebRTC error: ${err.message}`;
    });
    sp.on('close', () => this.markClosed(this.closeReason || 'the peer closed the link'));
  }

  get link(): PeerLink {
    return this;
  }

  receiveSignal(body: unknown): void {
    if (this.state !== 'closed') this.sp.signal(body as Parameters<SimplePeerInstance['signal']>[0]);
  }

  async send(bytes: Uint8Array): Promise<void> {
    const channel = this.channel;
    if (this.state !== 'open' || !channel || channel.readyState !== 'open') {
      throw new PeerLostError(this.peer, this.closeReason || `link is ${this.state}`);
    }
    channel.send(bytes as Uint8Array<ArrayBuffer>);
    this.bytesSent += bytes.byteLength;
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
