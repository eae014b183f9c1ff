/**
 * An in-memory PeerLink for fast, deterministic tests of the collectives in Node: the same
 * interface as the WebRTC link, messages delivered asynchronously and in order.
 */
import type { LinkFactoryOptions, LinkState, PeerLink, PeerLinkFactory, PendingLink } from '../src/peer_link.ts';
import { PeerLostError } from '../src/errors.ts';

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

  constructor(readonly peer: number) {
    this.opened = new Promise((r) => (this.open = r));
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
      setImmediate(() => {
        if (other.state !== 'open') return;
        other.bytesReceived += copy.length;
        for (const h of other.messageHandlers) h(copy);
      });
    }
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
    for (const h of this.closeHandlers) h(reason);
    const other = this.other;
    setImmediate(() => other?.close('the peer closed the link'));
  }
}

/** One network of in-memory links; `factoryFor(rank)` is what each rank's group uses. */
export class MemoryNetwork {
  private readonly ends = new Map<string, MemoryLink>();
  readonly links: MemoryLink[] = [];

  factoryFor(rank: number): PeerLinkFactory {
    return (o: LinkFactoryOptions) => {
      const link = new MemoryLink(o.peer);
      this.links.push(link);
      const mine = `${rank}->${o.peer}`;
      const theirs = `${o.peer}->${rank}`;
      this.ends.set(mine, link);
      const other = this.ends.get(theirs);
      if (other) {
        link.connect(other);
        other.connect(link);
      }
      return link;
    };
  }

  /** The link `from` uses to reach `to`. */
  end(from: number, to: number): MemoryLink | undefined {
    return this.ends.get(`${from}->${to}`);
  }
}
