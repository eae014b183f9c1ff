/**
 * The WebRTC PeerLink: a simple-peer data channel with the credit window and send queue of
 * flow_control.ts. The one module that touches simple-peer and RTCPeerConnection.
 */
import type { Instance as SimplePeerInstance, Options as SimplePeerOptions } from 'simple-peer';
import { PeerLostError } from '../wire/errors.ts';
import { CreditWindow, SendQueue, WINDOW_EXEMPT_BYTES, readCredit } from './flow_control.ts';
import { selectedPath } from './link_stats.ts';
import type { LinkFactoryOptions, LinkState, PathSample, PeerLink, PeerLinkFactory, PendingLink } from './peer_link.ts';

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

/** simple-peer keeps its data channel private (undefined until it has one). */
function channelOf(sp: SimplePeerInstance): RTCDataChannel | undefined {
  return (sp as unknown as { _channel?: RTCDataChannel | null })._channel ?? undefined;
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
      // Data arrives as soon as the channel opens, before simple-peer says 'connect' (it first
      // polls the connection's stats for the selected path, 100 ms at a time): credit on that channel.
      const channel = this.channel ?? channelOf(sp);
      if (channel?.readyState !== 'open') return false;
      channel.send(credit as Uint8Array<ArrayBuffer>);
      this.bytesSent += credit.byteLength;
      return true;
    });
    this.queue = new SendQueue(peer, options.highWaterMark, options.stallTimeoutMs, () => this.channel?.bufferedAmount ?? 0, this.window);
    this.opened = new Promise<void>((resolve, reject) => {
      sp.on('connect', () => {
        this.state = 'open';
        // Backpressure needs the channel's bufferedAmount.
        this.channel = channelOf(sp)!;
        this.channel.bufferedAmountLowThreshold = Math.floor(options.highWaterMark / 4);
        this.channel.addEventListener('bufferedamountlow', () => this.queue.drained());
        // What arrived before a credit could go (the peer waits for it before it sends more): none
        // while simple-peer exposes its channel as above, all of the first window if it ever did not.
        this.window.flush();
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
    // Checked again after each wait: one credit wakes every waiting sender, and only those that
    // still find the window open (the check and sentBytes below are one synchronous step) may go.
    while (bytes.byteLength > WINDOW_EXEMPT_BYTES && !this.window.open) await this.queue.beforeSend();
    const channel = this.channel;
    if (this.state !== 'open' || !channel || channel.readyState !== 'open') {
      // The channel can close a moment before simple-peer says so: name what is known then.
      const what =
        this.state === 'open'
          ? `its data channel is ${channel?.readyState ?? 'gone'} (the peer closed it or the connection dropped)`
          : `link is ${this.state}`;
      throw new PeerLostError(this.peer, this.closeReason || what);
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
