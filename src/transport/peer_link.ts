/**
 * Peer links: a reliable, ordered byte pipe to one other rank. The collectives see only the
 * `PeerLink` interface (send bytes with backpressure, receive bytes, close); simple-peer and
 * RTCPeerConnection live behind `simplePeerLinkFactory` (webrtc_link.ts) and nowhere else.
 * Flow control is in flow_control.ts, the stats reading in link_stats.ts. This file holds only
 * the types, so that those (and every transport) import it and it imports none of them.
 */

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
