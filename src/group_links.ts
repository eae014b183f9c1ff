/**
 * A process group's peer links: one `PeerLink` per other rank, opened on first use (the lower
 * rank of a pair initiates) and signaled through the server. Links are named by the group and
 * the pair, so signals of another group or an earlier round never reach them.
 */
import { DistTimeoutError } from './errors.ts';
import type { LinkState, PeerLink, PeerLinkFactory, PendingLink } from './peer_link.ts';
import type { SignalEvent, SignalPayload } from './protocol.ts';

export interface GroupLinksOptions {
  rank: number;
  /** Names this group's links apart from every other group's. */
  groupKey: string;
  /** Undefined where there is no WebRTC: every link then fails, saying so. */
  factory: PeerLinkFactory | undefined;
  sendSignal(peer: number, data: SignalPayload): Promise<void>;
  iceServers: RTCIceServer[];
  highWaterMark: number;
  /** How long a full send queue may go without draining before the peer counts as lost. */
  stallTimeoutMs: number;
  /** How long opening a link may take. */
  linkTimeoutMs: number;
  onMessage(peer: number, bytes: Uint8Array): void;
  onState(peer: number, state: LinkState): void;
  /** A link closed or could not be signaled: the peer is lost. */
  onLost(peer: number, reason: string): void;
}

export class GroupLinks {
  private readonly links = new Map<number, PendingLink>();
  private closed: Error | undefined;

  constructor(private readonly o: GroupLinksOptions) {}

  /** The open link to `peer`, opening it if needed. */
  get(peer: number): Promise<PeerLink> {
    if (this.closed) return Promise.reject(this.closed);
    let pending: PendingLink;
    try {
      pending = this.links.get(peer) ?? this.create(peer);
    } catch (err) {
      return Promise.reject(err as Error);
    }
    if (pending.link.state === 'open') return Promise.resolve(pending.link);
    return new Promise<PeerLink>((resolve, reject) => {
      const timer = setTimeout(() => reject(new DistTimeoutError(`a WebRTC link to rank ${peer} to open`, this.o.linkTimeoutMs)), this.o.linkTimeoutMs);
      pending.opened.then(
        () => {
          clearTimeout(timer);
          resolve(pending.link);
        },
        (err: Error) => {
          clearTimeout(timer);
          reject(err);
        },
      );
    });
  }

  /** A signal relayed by the server; ignored unless it is for one of this group's links. */
  onSignal(e: SignalEvent): void {
    if (e.data.channel !== this.channel(e.from) || e.from === this.o.rank) return;
    let pending = this.links.get(e.from);
    if (!pending && !this.closed) {
      try {
        pending = this.create(e.from);
      } catch (err) {
        console.error(`[pg] rank ${this.o.rank}: ${(err as Error).message}`);
      }
    }
    pending?.receiveSignal(e.data.body);
  }

  /** Links that can carry data now. */
  open(): PeerLink[] {
    return [...this.links.values()].map((p) => p.link).filter((l) => l.state === 'open');
  }

  stats(): Array<{ peer: number; state: LinkState; bytesSent: number; bytesReceived: number }> {
    return [...this.links.values()].map(({ link }) => ({ peer: link.peer, state: link.state, bytesSent: link.bytesSent, bytesReceived: link.bytesReceived }));
  }

  /** No new links from now on; later `get` calls reject with `reason`. */
  stop(reason: Error): void {
    this.closed ??= reason;
  }

  closeAll(reason: Error): void {
    this.stop(reason);
    for (const { link } of this.links.values()) link.close();
  }

  private create(peer: number): PendingLink {
    if (!this.o.factory) {
      throw new Error(`rank ${this.o.rank} needs a peer link to rank ${peer}, but WebRTC is not available here: run in a browser or pass linkFactory`);
    }
    const channel = this.channel(peer);
    const pending = this.o.factory({
      peer,
      channel,
      initiator: this.o.rank < peer,
      iceServers: this.o.iceServers,
      highWaterMark: this.o.highWaterMark,
      stallTimeoutMs: this.o.stallTimeoutMs,
      sendSignal: (body) => {
        this.o.sendSignal(peer, { channel, body }).catch((err: Error) => this.o.onLost(peer, `signaling failed: ${err.message}`));
      },
    });
    this.links.set(peer, pending);
    this.o.onState(peer, 'connecting');
    pending.opened.then(
      () => this.o.onState(peer, 'open'),
      () => {},
    );
    pending.link.onMessage((bytes) => this.o.onMessage(peer, bytes));
    pending.link.onClose((reason) => {
      this.o.onState(peer, 'closed');
      this.o.onLost(peer, `its WebRTC link closed (${reason})`);
    });
    return pending;
  }

  /** Both ends of a pair name their link the same way, within this group only. */
  private channel(peer: number): string {
    return `pg:${this.o.groupKey}:${Math.min(this.o.rank, peer)}-${Math.max(this.o.rank, peer)}`;
  }
}
