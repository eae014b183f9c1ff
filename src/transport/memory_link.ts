/**
 * An in-memory PeerLink for fast, deterministic tests of the collectives in Node: the same
 * interface as the WebRTC link, messages delivered asynchronously and in order, and the same
 * backpressure (a send queue with a high-water mark that drains as messages are delivered).
 */
import { SendQueue } from './flow_control.ts';
import type { LinkFactoryOptions, LinkState, PeerLink, PeerLinkFactory, PendingLink } from './peer_link.ts';
import { PeerLostError } from '../wire/errors.ts';

class MemoryLink implements PeerLink, PendingLink {
  state: LinkState = 'connecting';
  bytesSent = 0;
  bytesReceived = 0;
  other: MemoryLink | undefined;
  opened: Promise<void>;
  private open!: () => void;
  private readonly messageHandlers: Array<(b: Uint8Array) => void> = [];
  private readonly closeHandlers: Array<(reason: string) => void> = [];
  /** Tests can tamper with frames on the way out. */
  intercept: ((bytes: Uint8Array) => Uint8Array[]) | undefined;
  /** Bytes sent and not yet delivered. */
  buffered = 0;
  private stalled = false;
  private readonly queue: SendQueue;
  private readonly lowWaterMark: number;

  constructor(
    readonly peer: number,
    options: LinkFactoryOptions,
  ) {
    this.opened = new Promise((r) => (this.open = r));
    this.queue = new SendQueue(peer, options.highWaterMark, options.stallTimeoutMs, () => this.buffered);
    this.lowWaterMark = Math.floor(options.highWaterMark / 4);
  }

  /** From now on the link delivers nothing: its send queue stops draining, as a dead peer's does. */
  stall(): void {
    this.stalled = true;
  }
  get link(): PeerLink {
    return this;
  }
  connect(other: MemoryLink): void {
    this.other = other;
    this.state = 'open';
    this.open();
  }
  receiveSignal(): void {}
  async send(bytes: Uint8Array): Promise<void> {
    if (this.state !== 'open' || !this.other) throw new PeerLostError(this.peer, 'link closed');
    const other = this.other;
    const out = this.intercept ? this.intercept(bytes) : [bytes];
    for (const frame of out) {
      const copy = frame.slice();
      this.bytesSent += copy.length;
      this.buffered += copy.length;
      setImmediate(() => {
        if (this.stalled || other.state !== 'open') return;
        this.buffered -= copy.length;
        if (this.buffered <= this.lowWaterMark) this.queue.drained();
        other.bytesReceived += copy.length;
        for (const h of other.messageHandlers) h(copy);
      });
    }
    await this.queue.afterSend();
  }
  onMessage(h: (b: Uint8Array) => void): void {
    this.messageHandlers.push(h);
  }
  onClose(h: (reason: string) => void): void {
    this.closeHandlers.push(h);
  }
  close(reason = 'closed locally'): void {
    if (this.state === 'closed') return;
    this.state = 'closed';
    this.queue.fail(new PeerLostError(this.peer, reason));
    for (const h of this.closeHandlers) h(reason);
    const other = this.other;
    setImmediate(() => other?.close('the peer closed the link'));
  }
}

/**
 * One network of in-memory links. `factoryFor(id)` is what one member uses; the two ends of a
 * link find each other by its channel name, so members can change rank from round to round.
 */
export class MemoryNetwork {
  private readonly unpaired = new Map<string, MemoryLink>();
  private readonly ends = new Map<string, MemoryLink>();
  readonly links: MemoryLink[] = [];

  factoryFor(id: number): PeerLinkFactory {
    return (o: LinkFactoryOptions) => {
      const link = new MemoryLink(o.peer, o);
      this.links.push(link);
      this.ends.set(`${id}->${o.peer}`, link);
      const other = this.unpaired.get(o.channel);
      if (other) {
        this.unpaired.delete(o.channel);
        link.connect(other);
        other.connect(link);
      } else {
        this.unpaired.set(o.channel, link);
      }
      return link;
    };
  }

  /** The latest link member `from` opened to rank `to`. */
  end(from: number, to: number): MemoryLink | undefined {
    return this.ends.get(`${from}->${to}`);
  }
}
