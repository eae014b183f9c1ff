/**
 * What all the process groups of one rank share: the top-level group's peer links (a subgroup
 * opens no links of its own), the liveness ticker, the server's events about the round, and the
 * routing of each incoming frame, by the group id in its header, to that group's mailbox.
 *
 * Failure is all-or-nothing, as torchrun restarts every worker: the first failure in any group
 * of the rank (a lost peer, a mismatch, a bad frame, this page stalled, the server gone, the
 * top-level group aborted or destroyed) fails every group with the same error. Only destroying a
 * subgroup is local: it is detached, and frames still arriving for it are dropped.
 *
 * Ranks here are the top-level group's: a link's peer, a lost rank. Internal to
 * process_group.ts, which gives each group a `RoutedGroup`.
 */
import { ConnectionClosedError, FramingError, GroupClosedError, PeerLostError, RankStalledError } from '../wire/errors.ts';
import { FrameKind, MAX_FRAME_BYTES, checkChunk, encodeAlive, encodeBye, readHeader, type FrameHeader } from '../wire/framing.ts';
import { GroupLinks } from './group_links.ts';
import { encodeAbortNotice } from './mailbox.ts';
import { onPageHide } from '../runtime/page_lifecycle.ts';
import type { LinkState, PeerLink, PeerLinkFactory } from './peer_link.ts';
import { simplePeerLinkFactory } from './webrtc_link.ts';
import { VOUCH_WINDOW_MS, type PeerLeftEvent, type SignalEvent, type SignalPayload } from '../wire/protocol.ts';
import { TickGap, startTicker } from '../runtime/ticker.ts';

/** How often each rank tells each peer it is alive (more often when the stall bound is short). */
const ALIVE_EVERY_MS = 1_000;

/** The liveness tick's interval: several ticks fit in the bound, so one late tick is never taken for a stall. */
function tickInterval(stallTimeoutMs: number): number {
  return Math.min(ALIVE_EVERY_MS, stallTimeoutMs / 4);
}

/** destroy(): the longest it waits for its peers to answer its bye, and how often it looks. */
const BYE_BOUND_MS = 2_000;
const BYE_POLL_MS = 5;

/** Peers in events are top-level ranks, in every group. */
export type ProcessGroupEvent = { type: 'link'; peer: number; state: LinkState } | { type: 'peer-lost'; rank: number; reason: string };

/** Where a rank's RPC frames go (c10d/message_channel.ts): the top-level group's links carry them. */
export interface MessageSink {
  /** An RPC frame from `from` (any rank of the round). Throws FramingError. */
  deliver(from: number, frame: Uint8Array, h: FrameHeader): void;
  /** The rank's groups failed with `err`: nothing more arrives or leaves. */
  broke(err: Error): void;
}

/** One process group as the shared links see it. */
export interface RoutedGroup {
  /** 0 for the top-level group; 1, 2, ... for subgroups. */
  readonly id: number;
  /** The members' top-level ranks, in group-rank order. */
  readonly ranks: readonly number[];
  /** Whether top-level rank `rank` is a member. */
  has(rank: number): boolean;
  /** A collective, point-to-point or abort frame for this group from member `from`. Throws FramingError. */
  deliver(from: number, frame: Uint8Array, h: FrameHeader): void;
  /** A sign of life from member `from`: any frame, its link opening. */
  heard(from: number): void;
  /** Fails a receive whose peer showed no sign of life for `stallMs` (see Mailbox.checkStalls). */
  checkStalls(stallMs: number): void;
  /** Every group of the rank failed with `err`: reject everything pending, and every later call. */
  broke(err: Error): void;
  emit(e: ProcessGroupEvent): void;
  /** The last collective sequence number this rank issued in the group (an abort notice must be within the window). */
  lastSeq(): number;
}

/**
 * What the links need of the rank's connection to the server (c10d's StoreClient is one): the
 * signaling relay, the heartbeat's word on the peers heard, and the events that end a link. Named
 * here, not imported, because transport sits below c10d.
 */
export interface SignalingClient {
  /** Relays a signaling payload to the member with rank `to`. */
  signal(to: number, data: SignalPayload): Promise<void>;
  /** Sets what each heartbeat says of the peers heard lately; returns what unsets it. */
  reportHeardPeers(provider: () => { round: number; ranks: number[] } | undefined): () => void;
  on(type: 'signal', handler: (e: SignalEvent) => void): () => void;
  on(type: 'peer-left', handler: (e: PeerLeftEvent) => void): () => void;
  on(type: 'close', handler: (e: { code: number; reason: string }) => void): () => void;
  close(): void;
}

export interface SharedLinksInit {
  client: SignalingClient;
  /** This rank in the top-level group. */
  rank: number;
  round: number;
  groupKey: string;
  linkFactory: PeerLinkFactory | undefined;
  iceServers: RTCIceServer[];
  highWaterMark: number;
  windowBytes: number;
  peerTimeoutMs: number;
  stallTimeoutMs: number;
  linkTimeoutMs: number;
  early: SignalEvent[] | undefined;
  onStalled: ((err: RankStalledError) => void) | undefined;
}

export class SharedLinks {
  readonly rank: number;
  readonly client: SignalingClient;
  readonly links: GroupLinks;
  private readonly groups = new Map<number, RoutedGroup>();
  /** Bytes buffered for each peer by all of this rank's groups together (MailboxLimits.maxBufferedBytes is per peer, not per group). */
  readonly heldBytes = new Map<number, number>();
  /** Ids of subgroups destroyed on this rank: frames still arriving for them are dropped. */
  private readonly retired = new Set<number>();
  /** When each peer was last heard over its link (any frame), for the heartbeats' `heard`. */
  private readonly lastHeard = new Map<number, number>();
  /** Peers that answered this rank's bye (destroy). */
  private readonly byeAnswered = new Set<number>();
  private nextId = 1;
  private broken: Error | undefined;
  /** The rank's RPC agent's channel, once it opened one. */
  private messages: MessageSink | undefined;
  /** Gaps in this page's own ticks: this rank was paused. */
  private readonly gap: TickGap;
  private readonly onStalled: ((err: RankStalledError) => void) | undefined;
  private readonly unsubscribe: Array<() => void> = [];
  /** What this rank is waiting for now, in any group (collectives, transfers, barriers), oldest first. */
  private readonly doing = new Map<number, string>();
  private activities = 0;

  constructor(init: SharedLinksInit) {
    this.rank = init.rank;
    this.client = init.client;
    // A tick over twice its interval late: the page did not run for the excess (TickGap.running).
    this.gap = new TickGap(init.stallTimeoutMs, Date.now, 2 * tickInterval(init.stallTimeoutMs));
    this.onStalled = init.onStalled;
    this.links = new GroupLinks({
      rank: this.rank,
      groupKey: init.groupKey,
      factory: init.linkFactory ?? (typeof RTCPeerConnection !== 'undefined' ? simplePeerLinkFactory() : undefined),
      sendSignal: (peer, data) => this.client.signal(peer, data),
      iceServers: init.iceServers,
      highWaterMark: init.highWaterMark,
      windowBytes: init.windowBytes,
      stallTimeoutMs: init.peerTimeoutMs,
      linkTimeoutMs: init.linkTimeoutMs,
      onMessage: (peer, bytes) => this.onFrame(peer, bytes),
      onState: (peer, state) => {
        if (state === 'open') this.heard(peer);
        this.emit({ type: 'link', peer, state });
      },
      onLost: (peer, reason) => this.markLost(peer, reason),
    });
    // Liveness, on a tick a background tab keeps: tell every peer this rank is alive, and find
    // the peers that are not. A send still queued is not doubled: data is flowing then anyway.
    const aliveFrame = encodeAlive();
    const sending = new Set<number>();
    const stallTimeoutMs = init.stallTimeoutMs;
    const stopTicker = startTicker(tickInterval(stallTimeoutMs), () => {
      // A tick after a gap longer than the bound: this page was paused, and its peers counted it
      // as lost meanwhile. Failing now says so, before the links they closed say something vaguer.
      const stalled = this.gap.tick();
      if (this.broken) return;
      if (stalled !== undefined) return this.fail(this.stalledError(stalled));
      for (const link of this.links.open()) {
        if (sending.has(link.peer)) continue;
        sending.add(link.peer);
        link.send(aliveFrame).then(
          () => sending.delete(link.peer),
          () => sending.delete(link.peer),
        );
      }
      for (const g of [...this.groups.values()]) {
        if (this.broken) return;
        g.checkStalls(stallTimeoutMs);
      }
    });
    // Each heartbeat to the server names the peers heard lately: a peer whose own socket is held
    // up behind a saturated link stays in the group while its links show it alive.
    const stopReporting = init.client.reportHeardPeers(() => {
      if (this.broken) return undefined;
      const now = Date.now();
      const ranks = [...this.lastHeard].filter(([, at]) => now - at <= VOUCH_WINDOW_MS).map(([peer]) => peer);
      return { round: init.round, ranks };
    });
    this.unsubscribe.push(
      stopReporting,
      stopTicker,
      init.client.on('signal', (e) => this.links.onSignal(e)),
      init.client.on('peer-left', (e) => {
        if (e.round === init.round) this.markLost(e.rank, e.reason);
      }),
      init.client.on('close', (e) =>
        this.fail(new ConnectionClosedError(`the connection to the server closed (${e.code} ${e.reason})`, e.code, e.reason)),
      ),
      onPageHide(() => this.leave()),
    );
    for (const e of init.early ?? []) this.links.onSignal(e);
  }

  /** Why the rank's groups can no longer run collectives, if they cannot. */
  get error(): Error | undefined {
    return this.broken;
  }

  /** The next subgroup id: every rank takes them in the same order, so they agree without messages. */
  takeGroupId(): number {
    return this.nextId++;
  }

  /** Frames for `g.id` go to `g` from now on. A rank that is already broken breaks `g` at once. */
  register(g: RoutedGroup): void {
    this.groups.set(g.id, g);
    if (this.broken) g.broke(this.broken);
  }

  /** RPC frames go to `sink` from now on (one per rank). A rank that is already broken tells it at once. */
  attachMessages(sink: MessageSink): void {
    if (this.messages) throw new Error('this rank already has a message channel (one RPC agent per process group)');
    this.messages = sink;
    if (this.broken) sink.broke(this.broken);
  }

  /** A subgroup destroyed on this rank: its frames are dropped from now on. */
  retire(id: number): void {
    this.groups.delete(id);
    this.retired.add(id);
  }

  /** The open links to the top-level ranks `peers`. */
  open(peers: (rank: number) => boolean): PeerLink[] {
    return this.links.open().filter((l) => peers(l.peer));
  }

  /** Runs `body`, noting what this rank waits for meanwhile (for RankStalledError). */
  async track<T>(what: string, body: () => Promise<T>): Promise<T> {
    const id = ++this.activities;
    this.doing.set(id, what);
    try {
      return await body();
    } finally {
      this.doing.delete(id);
    }
  }

  markLost(rank: number, reason: string): void {
    if (this.broken) return;
    // Resuming after a pause, the peers' closed links are news of this rank's stall, not theirs.
    if (this.gap.gap() === undefined) this.emit({ type: 'peer-lost', rank, reason });
    this.fail(new PeerLostError(rank, reason));
  }

  /**
   * Breaks every group of the rank: every pending receive rejects with `err`, and so does every
   * later call. Whatever breaks it first after this page was paused past the bound (a peer's link
   * closing, the server's eviction, a new round) is a consequence: the groups fail with
   * RankStalledError.
   */
  fail(err: Error): void {
    if (this.broken) return;
    const stalled = err instanceof RankStalledError ? undefined : this.gap.gap();
    if (stalled !== undefined) err = this.stalledError(stalled, err);
    this.broken = err;
    this.links.stop(err);
    for (const g of [...this.groups.values()]) g.broke(err);
    this.messages?.broke(err);
    if (err instanceof RankStalledError) this.onStalled?.(err);
  }

  /**
   * Closes every peer link and, if `closeStore`, the store connection. A collective is done on
   * this rank once it has received its part, while what it sent last may still be on its way:
   * closing at once could drop it, and the server's notice that this rank left could fail a peer
   * still waiting for it. So, when it leaves the server too (`closeStore`), the rank first says
   * bye on every link, after its last messages, and closes once each peer has answered (it then
   * has everything sent before), its link has closed, or BYE_BOUND_MS has passed. Without
   * `closeStore` (a rendezvous round's group, whose links the next round keeps) it closes at once.
   */
  destroy(closeStore: boolean): Promise<void> {
    const reason = new GroupClosedError('the process group was destroyed');
    this.fail(reason);
    for (const off of this.unsubscribe) off();
    const close = () => {
      this.links.closeAll(reason);
      if (closeStore) this.client.close();
    };
    const open = closeStore ? this.links.open() : [];
    if (open.length === 0) {
      close();
      return Promise.resolve();
    }
    const bye = encodeBye(false);
    for (const link of open) link.send(bye).catch(() => {});
    const deadline = performance.now() + BYE_BOUND_MS;
    return new Promise<void>((resolve) => {
      const check = () => {
        const waiting = open.some((l) => l.state === 'open' && !this.byeAnswered.has(l.peer));
        if (waiting && performance.now() < deadline) return void setTimeout(check, BYE_POLL_MS);
        close();
        resolve();
      };
      setTimeout(check, BYE_POLL_MS);
    });
  }

  private onFrame(from: number, frame: Uint8Array): void {
    try {
      if (frame.length > MAX_FRAME_BYTES)
        throw new FramingError(`frame of ${frame.length} bytes is over the ${MAX_FRAME_BYTES}-byte limit`, from, 'length');
      const h = readHeader(frame);
      checkChunk(h);
      if (h.kind === FrameKind.alive) {
        if (h.group !== 0)
          throw new FramingError(`a liveness frame is about the link and carries group 0, this one group ${h.group}`, from, 'group');
        this.heard(from);
        return;
      }
      if (h.kind === FrameKind.bye) {
        if (h.group !== 0 || h.step > 1)
          throw new FramingError(`a bye frame carries group 0 and step 0 or 1, this one group ${h.group}, step ${h.step}`, from, 'group');
        this.heard(from);
        // The peer destroys its group: everything it sent came before this; answer so it can close.
        if (h.step === 0) for (const link of this.links.open()) if (link.peer === from) link.send(encodeBye(true)).catch(() => {});
        if (h.step === 1) this.byeAnswered.add(from);
        return;
      }
      if (h.kind === FrameKind.rpc) {
        if (h.group !== 0) throw new FramingError(`an RPC frame carries group 0, this one group ${h.group}`, from, 'group');
        if (!this.messages) throw new FramingError(`an RPC frame (seq ${h.seq}), but this rank runs no RPC agent`, from, 'kind');
        this.heard(from);
        this.messages.deliver(from, frame, h);
        return;
      }
      const g = this.groups.get(h.group);
      if (!g) {
        if (this.retired.has(h.group)) return;
        const why = h.group < this.nextId ? 'a subgroup this rank is not a member of' : 'a group this rank never created';
        throw new FramingError(`frame for group ${h.group}, ${why} (seq ${h.seq}); refused, not buffered`, from, 'group');
      }
      if (!g.has(from)) {
        throw new FramingError(
          `frame for subgroup ${h.group} [${g.ranks.join(', ')}], which rank ${from} is not a member of (seq ${h.seq}); refused, not buffered`,
          from,
          'group',
        );
      }
      this.heard(from);
      g.deliver(from, frame, h);
    } catch (err) {
      this.fail(
        err instanceof FramingError ? new FramingError(`bad frame from rank ${from}: ${err.message}`, from, err.field) : (err as Error),
      );
    }
  }

  /** The clock a peer's silence is judged on: the time this page ran (TickGap.running). */
  runningNow(): number {
    return this.gap.running();
  }

  /** Any frame from `peer`, or its link opening, is a sign of life in every group it is in. */
  private heard(peer: number): void {
    this.lastHeard.set(peer, Date.now());
    for (const g of this.groups.values()) if (g.has(peer)) g.heard(peer);
  }

  private emit(e: ProcessGroupEvent): void {
    for (const g of [...this.groups.values()]) g.emit(e);
  }

  private stalledError(stalledMs: number, after?: Error): RankStalledError {
    const first = this.doing.values().next();
    return new RankStalledError(this.rank, stalledMs, first.done ? 'between collectives' : `waiting for ${first.value}`, after);
  }

  /**
   * The page is going away (closed, navigated from, or into the back/forward cache): tell every
   * peer, so that they fail at once naming this rank and why instead of waiting for a link to
   * break or a stall bound, then close the links. One notice per link, in the top-level group,
   * fails every group on the peer. Best effort: a notice queued behind a full send queue goes
   * down with its link, and the server's 'peer-left' says the same.
   */
  leave(): void {
    if (!this.broken) {
      const notice = encodeAbortNotice(
        Math.max(1, this.groups.get(0)?.lastSeq() ?? 0),
        new PeerLostError(this.rank, 'its tab closed'),
        this.rank,
        0,
      );
      for (const link of this.links.open()) link.send(notice).catch(() => {});
    }
    const reason = new GroupClosedError(`this tab is closing (or going into the back/forward cache): rank ${this.rank} left the group`);
    this.fail(reason);
    this.links.closeAll(reason);
  }
}
