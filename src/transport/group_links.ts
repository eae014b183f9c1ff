/**
 * A process group's peer links: one `PeerLink` per other rank, opened on first use (the lower
 * rank of a pair initiates) and signaled through the server. Links are named by the group and
 * the pair, so signals of another group or an earlier round never reach them.
 */
import { DistTimeoutError } from '../wire/errors.ts';
import type { CandidateType, LinkState, PathSample, PeerLink, PeerLinkFactory, PendingLink } from './peer_link.ts';
import type { SignalEvent, SignalPayload } from '../wire/protocol.ts';

export interface GroupLinksOptions {
  rank: number;
  /** Names this group's links apart from every other group's. */
  groupKey: string;
  /** Undefined where there is no WebRTC: every link then fails, saying so. */
  factory: PeerLinkFactory | undefined;
  sendSignal(peer: number, data: SignalPayload): Promise<void>;
  iceServers: RTCIceServer[];
  highWaterMark: number;
  windowBytes: number;
  /** How long a full send queue may go without draining before the peer counts as lost. */
  stallTimeoutMs: number;
  /** How long opening a link may take. */
  linkTimeoutMs: number;
  onMessage(peer: number, bytes: Uint8Array): void;
  onState(peer: number, state: LinkState): void;
  /** A link closed or could not be signaled: the peer is lost. */
  onLost(peer: number, reason: string): void;
}

/** A link's byte counters (the data channel's payload bytes, both ways). */
export interface LinkStats {
  peer: number;
  state: LinkState;
  bytesSent: number;
  bytesReceived: number;
}

/** Where a link's bytes go: the selected ICE candidate pair, its round-trip time and its rates. */
export interface LinkPath {
  /** This end's candidate type: "host" (direct), "srflx"/"prflx" (through a NAT), "relay" (through TURN); null when unknown. */
  local: CandidateType | null;
  /** The peer's end. */
  remote: CandidateType | null;
  /** "udp" or "tcp", or null. */
  protocol: string | null;
  rttMs: number | null;
  /** Bytes per second on the wire since the previous reading (null on the first). */
  sentBytesPerSec: number | null;
  receivedBytesPerSec: number | null;
}

export interface LinkDetails extends LinkStats {
  /** Null where the transport has no path to report (not open, in-memory links) or did not answer in time. */
  path: LinkPath | null;
}

/** Readings closer together than this keep the previous rates: two pollers must not make noise of each other. */
const MIN_RATE_WINDOW_MS = 500;

/**
 * The next reading of one link: `cur` with rates over the interval since `prev.sample`, or the
 * previous rates when the interval is too short (the previous sample is then kept as the base).
 */
export function nextPathReading(
  prev: { sample: PathSample; path: LinkPath } | undefined,
  cur: PathSample,
): { sample: PathSample; path: LinkPath } {
  const base = { local: cur.local, remote: cur.remote, protocol: cur.protocol, rttMs: cur.rttMs };
  if (!prev) return { sample: cur, path: { ...base, sentBytesPerSec: null, receivedBytesPerSec: null } };
  const dt = (cur.at - prev.sample.at) / 1000;
  if (!(dt * 1000 >= MIN_RATE_WINDOW_MS)) {
    return {
      sample: prev.sample,
      path: { ...base, sentBytesPerSec: prev.path.sentBytesPerSec, receivedBytesPerSec: prev.path.receivedBytesPerSec },
    };
  }
  // Counters that went backwards (a new transport) give no rate rather than a negative one.
  const rate = (a: number, b: number) => (b >= a ? Math.round((b - a) / dt) : null);
  return {
    sample: cur,
    path: {
      ...base,
      sentBytesPerSec: rate(prev.sample.bytesSent, cur.bytesSent),
      receivedBytesPerSec: rate(prev.sample.bytesReceived, cur.bytesReceived),
    },
  };
}

export class GroupLinks {
  private readonly links = new Map<number, PendingLink>();
  private readonly readings = new Map<number, { sample: PathSample; path: LinkPath }>();
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
      const timer = setTimeout(
        () => reject(new DistTimeoutError(`a WebRTC link to rank ${peer} to open (${this.noPathHint()})`, this.o.linkTimeoutMs)),
        this.o.linkTimeoutMs,
      );
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

  stats(): LinkStats[] {
    return [...this.links.values()].map(({ link }) => ({
      peer: link.peer,
      state: link.state,
      bytesSent: link.bytesSent,
      bytesReceived: link.bytesReceived,
    }));
  }

  /** `stats()` with each open link's network path, read from the transport; a link that does not answer within `timeoutMs` gets `path: null`. */
  async details(timeoutMs: number): Promise<LinkDetails[]> {
    return Promise.all(
      [...this.links.values()].map(async ({ link }): Promise<LinkDetails> => {
        const stats = { peer: link.peer, state: link.state, bytesSent: link.bytesSent, bytesReceived: link.bytesReceived };
        const sample = link.state === 'open' && link.path ? await withinTime(link.path(), timeoutMs) : undefined;
        if (!sample) return { ...stats, path: null };
        const reading = nextPathReading(this.readings.get(link.peer), sample);
        this.readings.set(link.peer, reading);
        return { ...stats, path: reading.path };
      }),
    );
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
      throw new Error(
        `rank ${this.o.rank} needs a peer link to rank ${peer}, but WebRTC is not available here: run in a browser or pass linkFactory`,
      );
    }
    const channel = this.channel(peer);
    const pending = this.o.factory({
      peer,
      channel,
      initiator: this.o.rank < peer,
      iceServers: this.o.iceServers,
      highWaterMark: this.o.highWaterMark,
      windowBytes: this.o.windowBytes,
      stallTimeoutMs: this.o.stallTimeoutMs,
      sendSignal: (body) => {
        this.o.sendSignal(peer, { channel, body }).catch((err: Error) => this.o.onLost(peer, `signaling failed: ${err.message}`));
      },
    });
    this.links.set(peer, pending);
    this.readings.delete(peer);
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

  /** What a link that never opened says about the network: most often the ranks cannot reach each other. */
  private noPathHint(): string {
    return this.o.iceServers.length === 0
      ? 'no STUN or TURN server is configured, so only direct paths were tried; ranks on networks that cannot reach each other need a TURN relay: TURN_SECRET and TURN_URLS on the server'
      : 'no path worked, not even through the configured ICE servers: check that every rank reaches the TURN server and that its credentials are valid';
  }

  /** Both ends of a pair name their link the same way, within this group only. */
  private channel(peer: number): string {
    return `pg:${this.o.groupKey}:${Math.min(this.o.rank, peer)}-${Math.max(this.o.rank, peer)}`;
  }
}

/** `p`'s value, or undefined if it fails or takes longer than `ms` (stats are for display: never worth a wait or an error). */
function withinTime<T>(p: Promise<T>, ms: number): Promise<T | undefined> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(undefined), ms);
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      () => {
        clearTimeout(timer);
        resolve(undefined);
      },
    );
  });
}
