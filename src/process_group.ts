/**
 * The process group: the collectives over WebRTC peer links (what NCCL or Gloo is to
 * torch.distributed). Groups are made by rendezvous (`initProcessGroup`, `RendezvousHandler` in
 * rendezvous.ts); this module runs collectives in one.
 *
 * Contract, as in c10d: a group is a fixed set of ranks. When a member is lost, every pending and
 * later collective fails with an error naming it; recovering means making a new group (a new
 * rendezvous round).
 *
 * Collectives are matched across ranks by sequence number: each call takes the next number, and
 * every frame carries it with the collective's descriptor (kind, op, element count, root), so
 * ranks that issue different collectives get a CollectiveMismatchError instead of a hang. The
 * pieces: `GroupLinks` (the peer links), `Mailbox` (frames to receives), ring.ts (the
 * algorithms), framing.ts (the frames).
 */
import { ConnectionClosedError, DistTimeoutError, FramingError, GroupClosedError, PeerLostError, RankStalledError, StoreTimeoutError } from './errors.ts';
import { Collective, DEFAULT_FRAME_BYTES, FrameKind, MAX_FRAME_BYTES, ReduceOp, checkFloat32Chunk, describeCollective, encodeAlive, frames, readHeader, type Descriptor, type ReduceOpName } from './framing.ts';
import { GroupLinks, type LinkDetails, type LinkStats } from './group_links.ts';
import { DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_MAX_SEQ_AHEAD, Mailbox, decodeAbortNotice, encodeAbortNotice } from './mailbox.ts';
import { DEFAULT_HIGH_WATER_MARK, DEFAULT_WINDOW_BYTES, simplePeerLinkFactory, type LinkState, type PeerLinkFactory } from './peer_link.ts';
import type { SignalEvent } from './protocol.ts';
import { asBytes, copyInto, reducer, ringAllGather, ringBroadcast, ringReduceScatter, segments, type RingTransport } from './ring.ts';
import { PrefixStore, type Store, type StoreClient } from './store.ts';
import { TickGap, startTicker } from './ticker.ts';
import { onPageHide } from './page_lifecycle.ts';

/** How often each rank tells each peer it is alive (more often when the stall bound is short). */
const ALIVE_EVERY_MS = 1_000;
/** See `LinkOptions.stallTimeoutMs`. */
export const DEFAULT_STALL_TIMEOUT_MS = 10_000;

export type { ReduceOpName } from './framing.ts';
export type { LinkDetails, LinkPath, LinkStats } from './group_links.ts';

/** How a group's links behave: the options every way of making a group takes. */
export interface LinkOptions {
  /**
   * ICE servers for WebRTC. Default: the ones the server hands out with `hello` (a TURN relay it
   * mints credentials for, see the README's “Across machines”), else none: host candidates only.
   */
  iceServers?: RTCIceServer[];
  /** How long a peer may stay silent while a collective waits on it. Default 30 s. */
peerTimeoutMs?: number;
  /**
   * A peer whose link is open but that sends nothing at all, not even the liveness frame every
   * rank sends each link every second, for this long while a collective waits on it, is lost
   * (PeerLostError, "stalled"): a paused or frozen page is found in seconds, while a busy one is
   * only bounded by `peerTimeoutMs`. The same bound applies to this rank itself: when its own page
   * did not run for longer (frozen, asleep, paused in a debugger, a script blocking it), its
   * peers have given up on it, so its group fails with RankStalledError as soon as it runs again.
   * Default 10 s.
   */
  stallTimeoutMs?: number;
  /** How long opening a WebRTC link may take. Default 30 s. */
  linkTimeoutMs?: number;
  /** Largest data-channel message, header included. Default 32 KiB; at most 256 KiB (Chromium's limit). */
  maxFrameBytes?: number;
  /** Send-queue high-water mark per link. Default 4 MiB. */
  highWaterMark?: number;
  /**
   * Credit window per link: bytes a rank may have sent on a link that the peer's page has not
   * acknowledged taking (see `CreditWindow`). Keeps the network's queues short, so that both
   * directions of a link run at its rate; caps one link at `linkWindowBytes` per round trip.
   * Default 128 KiB; 0 turns flow control off.
   */
  linkWindowBytes?: number;
  /**
   * How many sequence numbers past the last one this rank issued a peer's frame may be, and still
   * be kept for later; a frame further ahead fails the group with a FramingError. Default 64
   * (DDP keeps one all-reduce per bucket in flight; a broadcast's source or a sender runs ahead).
   */
  maxSeqAhead?: number;
  /** Bytes of frames one peer may have waiting for receives this rank has not posted yet. Default 256 MiB. */
  maxBufferedBytes?: number;
  /** Replace the WebRTC link (tests, other transports). */
  linkFactory?: PeerLinkFactory;
}

/** What the rendezvous hands a new group. */
export interface GroupInit extends LinkOptions {
  client: StoreClient;
  rank: number;
  worldSize: number;
  /** The rendezvous round this group is (peer-left events of other rounds are not about it). */
  round: number;
  /** Names this group's links and store keys apart from every other group's. */
  groupKey: string;
  /** Default timeout of barriers. */
  timeoutMs: number;
  /** Signals for this group that arrived before it existed. */
  early?: SignalEvent[];
  /** This rank found its own page was paused past the stall bound (the group has failed with `err`). */
  onStalled?(err: RankStalledError): void;
}

export type ProcessGroupEvent = { type: 'link'; peer: number; state: LinkState } | { type: 'peer-lost'; rank: number; reason: string };

export class ProcessGroup {
  readonly rank: number;
  readonly worldSize: number;
  readonly round: number;
  /** The server instance the group was formed on (it changes when the server restarts; round numbers start again). */
  readonly instance: string;
  /** The session's store, with keys scoped to this group (torch gives each group a PrefixStore). */
  readonly store: Store;
  private readonly client: StoreClient;
  private seq = 0;
  private barrierCount = 0;
  private readonly sendSeq = new Map<number, number>();
  private readonly recvSeq = new Map<number, number>();
  private readonly abortedSeqs = new Map<number, Error>();
  private readonly links: GroupLinks;
  private readonly mailbox: Mailbox;
  private broken: Error | undefined;
  /** Rejects with the reason once the group breaks; lets store waits fail fast too. */
  private readonly whenBroken: Promise<never>;
  private rejectBroken!: (err: Error) => void;
  private readonly listeners = new Set<(e: ProcessGroupEvent) => void>();
  private readonly unsubscribe: Array<() => void> = [];
  private readonly maxFrameBytes: number;
  private readonly maxSeqAhead: number;
  private readonly timeoutMs: number;
  /** Gaps in this page's own ticks: this rank was paused. */
  private readonly gap: TickGap;
  private readonly onStalled: ((err: RankStalledError) => void) | undefined;
  /** What this rank is waiting for now (collectives, transfers, barriers), oldest first. */
  private readonly doing = new Map<number, string>();
  private activities = 0;

  constructor(init: GroupInit) {
    this.rank = init.rank;
    this.worldSize = init.worldSize;
    this.round = init.round;
    this.instance = init.client.instance;
    this.client = init.client;
    this.store = new PrefixStore(`pg/${init.groupKey}`, init.client);
    this.timeoutMs = init.timeoutMs;
    this.maxFrameBytes = Math.min(init.maxFrameBytes ?? DEFAULT_FRAME_BYTES, MAX_FRAME_BYTES);
    this.whenBroken = new Promise<never>((_, reject) => (this.rejectBroken = reject));
    this.whenBroken.catch(() => {});
    const peerTimeoutMs = init.peerTimeoutMs ?? 30_000;
    this.maxSeqAhead = positiveInt(init.maxSeqAhead ?? DEFAULT_MAX_SEQ_AHEAD, 'maxSeqAhead');
    this.mailbox = new Mailbox(
      this.rank,
      peerTimeoutMs,
      (peer, reason) => this.markLost(peer, reason),
      {
        maxSeqAhead: this.maxSeqAhead,
        // An all-reduce numbers its messages 0 .. 2(n-1)-1; other collectives use 0 only.
        maxStep: Math.max(1, 2 * (this.worldSize - 1)),
        maxBufferedBytes: positiveInt(init.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES, 'maxBufferedBytes'),
      },
      (peer, kind) => (kind === FrameKind.p2p ? (this.recvSeq.get(peer) ?? 0) : this.seq),
    );
    const stallTimeoutMs = positiveInt(init.stallTimeoutMs ?? DEFAULT_STALL_TIMEOUT_MS, 'stallTimeoutMs');
    this.gap = new TickGap(stallTimeoutMs);
    this.onStalled = init.onStalled;
    this.links = new GroupLinks({
      rank: this.rank,
      groupKey: init.groupKey,
      factory: init.linkFactory ?? (typeof RTCPeerConnection !== 'undefined' ? simplePeerLinkFactory() : undefined),
      sendSignal: (peer, data) => this.client.signal(peer, data),
      iceServers: init.iceServers ?? [],
      highWaterMark: init.highWaterMark ?? DEFAULT_HIGH_WATER_MARK,
      windowBytes: init.linkWindowBytes ?? DEFAULT_WINDOW_BYTES,
      stallTimeoutMs: peerTimeoutMs,
      linkTimeoutMs: init.linkTimeoutMs ?? 30_000,
      onMessage: (peer, bytes) => this.onFrame(peer, bytes),
      onState: (peer, state) => {
        if (state === 'open') this.mailbox.heard(peer);
        this.emit({ type: 'link', peer, state });
      },
      onLost: (peer, reason) => this.markLost(peer, reason),
    });
    // Liveness, on a tick a background tab keeps: tell every peer this rank is alive, and find
    // the peers that are not. A send still queued is not doubled: data is flowing then anyway.
    const aliveFrame = encodeAlive();
    const sending = new Set<number>();
    // Several ticks fit in the bound, so one late tick is never taken for a stall.
    const stopTicker = startTicker(Math.min(ALIVE_EVERY_MS, stallTimeoutMs / 4), () => {
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
      this.mailbox.checkStalls(stallTimeoutMs);
    });
    this.unsubscribe.push(
      stopTicker,
      init.client.on('signal', (e) => this.links.onSignal(e)),
      init.client.on('peer-left', (e) => {
        if (e.round === this.round) this.markLost(e.rank, e.reason);
      }),
      init.client.on('close', (e) => this.fail(new ConnectionClosedError(`the connection to the server closed (${e.code} ${e.reason})`, e.code, e.reason))),
      onPageHide(() => this.leave()),
    );
    for (const e of init.early ?? []) this.links.onSignal(e);
  }

  /** Link states and lost peers, for dashboards and logs. */
  on(listener: (e: ProcessGroupEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** The open or opening links, with their byte counters. */
  linkStats(): LinkStats[] {
    return this.links.stats();
  }

  /**
   * `linkStats()` plus each open link's network path: the selected ICE candidate pair's types
   * (host, srflx, prflx, relay), its round-trip time and the bytes per second on the wire since
   * the previous call (from `RTCPeerConnection.getStats()`). Asynchronous and not free: poll it
   * every second or two, not per step. A link whose stats take longer than `timeoutMs` gets `path: null`.
   */
  linkDetails(timeoutMs = 2_000): Promise<LinkDetails[]> {
    return this.links.details(timeoutMs);
  }

  /** Why the group can no longer run collectives, if it cannot. */
  get error(): Error | undefined {
    return this.broken;
  }

  /** Resolves like `p`, or rejects as soon as the group breaks (for store waits on other ranks). */
  failFast<T>(p: Promise<T>): Promise<T> {
    return Promise.race([p, this.whenBroken]);
  }

  // --- Collectives ------------------------------------------------------------------------------

  /** Reduces `buf` across all ranks in place (ring reduce-scatter + all-gather) and returns it. */
  async allReduce(buf: Float32Array, op: ReduceOpName = 'sum'): Promise<Float32Array> {
    return this.run(this.descriptor(Collective.allReduce, buf.length, op), buf, async (t) => {
      const segs = segments(buf.length, this.worldSize);
      await ringReduceScatter(t, buf, segs, op);
      await ringAllGather(t, buf, segs, this.worldSize - 1);
      return buf;
    });
  }

  /**
   * The same reduction as a full-mesh exchange (every rank sends its whole buffer to every
   * other, as DISCO does). For comparison in benchmarks; the ring is the one to use.
   */
  async meshAllReduce(buf: Float32Array, op: ReduceOpName = 'sum'): Promise<Float32Array> {
    return this.run(this.descriptor(Collective.meshAllReduce, buf.length, op), buf, async (t) => {
      const n = this.worldSize;
      const parts: Float32Array[] = new Array(n);
      parts[this.rank] = buf.slice();
      const peers = Array.from({ length: n }, (_, r) => r).filter((r) => r !== this.rank);
      await Promise.all([
        ...peers.map((p) => t.send(p, 0, asBytes(buf))),
        ...peers.map((p) => t.recv(p, 0, buf.length * 4, copyInto((parts[p] = new Float32Array(buf.length)), 0))),
      ]);
      // The same order (rank 0, 1, ...) on every rank gives bit-identical results.
      buf.set(parts[0]!);
      const reduce = reducer(op);
      for (let r = 1; r < n; r++) reduce(buf, parts[r]!, 0, buf.length, 0);
      if (op === 'avg') for (let i = 0; i < buf.length; i++) buf[i]! /= n;
      return buf;
    });
  }

  /** Copies `src`'s buffer into `buf` on every rank (pipelined along the ring). */
  async broadcast(buf: Float32Array, src: number): Promise<Float32Array> {
    this.checkRank(src, 'src');
    const d: Descriptor = { collective: Collective.broadcast, reduceOp: 0, numel: buf.length, root: src };
    return this.run(d, buf, async (t) => {
      await ringBroadcast(t, asBytes(buf), src);
      return buf;
    });
  }

  /** Gathers every rank's `input` (same length everywhere) into one buffer, in rank order. */
  async allGather(input: Float32Array): Promise<Float32Array> {
    const n = this.worldSize;
    const out = new Float32Array(input.length * n);
    out.set(input, this.rank * input.length);
    const d: Descriptor = { collective: Collective.allGather, reduceOp: 0, numel: input.length, root: 0 };
    return this.run(d, out, async (t) => {
      const blocks = Array.from({ length: n }, (_, i) => ({ start: i * input.length, end: (i + 1) * input.length }));
      // Rank r starts owning block r: the all-gather half of the ring does the rest.
      await ringAllGather(t, out, blocks);
      return out;
    });
  }

  /**
   * Reduces `input` (length worldSize * k) across ranks and returns this rank's block of k
   * elements (torch's reduce_scatter_tensor). `input` is not modified.
   */
  async reduceScatter(input: Float32Array, op: ReduceOpName = 'sum'): Promise<Float32Array> {
    const n = this.worldSize;
    if (input.length % n !== 0) {
      throw new RangeError(`reduceScatter needs a length divisible by the world size ${n}, got ${input.length}`);
    }
    const k = input.length / n;
    const work = input.slice();
    return this.run(this.descriptor(Collective.reduceScatter, input.length, op), work.subarray(this.rank * k, (this.rank + 1) * k), async (t) => {
      const blocks = Array.from({ length: n }, (_, i) => ({ start: i * k, end: (i + 1) * k }));
      await ringReduceScatter(t, work, blocks, op);
      return work.slice(this.rank * k, (this.rank + 1) * k);
    });
  }

  /** Point-to-point: sends `buf` to `dst`, matched with `dst`'s `recv(_, thisRank)` in order. */
  async send(buf: Float32Array, dst: number): Promise<void> {
    this.checkPeer(dst, 'dst');
    this.throwIfBroken();
    const t = this.transport(FrameKind.p2p, next(this.sendSeq, dst), p2pDescriptor(buf.length));
    await this.track(`send #${t.seq} to rank ${dst}`, () => this.guard(t.seq, () => t.send(dst, 0, asBytes(buf)), false));
  }

  /** Point-to-point: fills `buf` with the next message from `src`; lengths must agree. */
  async recv(buf: Float32Array, src: number): Promise<Float32Array> {
    this.checkPeer(src, 'src');
    this.throwIfBroken();
    const t = this.transport(FrameKind.p2p, next(this.recvSeq, src), p2pDescriptor(buf.length));
    await this.track(`recv #${t.seq} from rank ${src}`, () => this.guard(t.seq, () => t.recv(src, 0, buf.length * 4, copyInto(buf, 0)), false));
    return buf;
  }

  /**
   * Blocks until every rank has called barrier() the same number of times (through the store).
   * Fails at once, naming the rank, if a member is lost while waiting.
   */
  async barrier(timeoutMs = this.timeoutMs): Promise<void> {
    this.throwIfBroken();
    const n = ++this.barrierCount;
    return this.track(`barrier #${n}`, () => this.barrierWait(n, timeoutMs));
  }

  private async barrierWait(n: number, timeoutMs: number): Promise<void> {
    const key = `barrier/${n}`;
    const arrived = await this.store.add(key, 1);
    if (arrived === this.worldSize) await this.store.set(`${key}/done`, '1');
    try {
      await Promise.race([
        this.store.wait([`${key}/done`], timeoutMs),
        // A member lost after everyone arrived (e.g. one that passed first and left) is fine.
        this.whenBroken.catch(async (err: Error) => {
          if (!(await this.store.check([`${key}/done`]))) throw err;
        }),
      ]);
    } catch (err) {
      if (!(err instanceof StoreTimeoutError)) throw err;
      const count = await this.store.add(key, 0);
      throw new DistTimeoutError(`all ${this.worldSize} ranks to reach barrier #${n} (${count} arrived)`, timeoutMs);
    }
  }

  /** Breaks the group from outside (e.g. a new round replaced it): pending calls reject with `err`. */
  abort(err: Error): void {
    this.fail(err);
  }

  /** Closes every peer link and, if `closeStore`, the store connection (torch's destroy_process_group). */
  destroy(closeStore = true): void {
    const reason = new GroupClosedError('the process group was destroyed');
    this.fail(reason);
    for (const off of this.unsubscribe) off();
    this.links.closeAll(reason);
    if (closeStore) this.client.close();
  }

  // --- Running a collective ----------------------------------------------------------------------

  private descriptor(collective: Collective, numel: number, op: ReduceOpName): Descriptor {
    if (!(op in ReduceOp)) throw new RangeError(`unknown reduce op ${JSON.stringify(op)}; use sum, avg, max or min`);
    return { collective, reduceOp: ReduceOp[op], numel, root: 0 };
  }

  /** Takes the next sequence number and runs `body`, except on a world of one. */
  private async run<T>(d: Descriptor, single: T, body: (t: RingTransport) => Promise<T>): Promise<T> {
    this.throwIfBroken();
    const seq = ++this.seq;
    // One rank: nothing to exchange. avg of one value is the value.
    if (this.worldSize === 1) return single;
    const t = this.transport(FrameKind.collective, seq, d);
    return this.track(`${describeCollective(d)} #${seq}`, () => this.guard(seq, () => body(t), true));
  }

  /** Messages of one collective (or one point-to-point transfer), for the ring algorithms. */
  private transport(kind: FrameKind, seq: number, d: Descriptor): RingTransport & { seq: number } {
    return {
      seq,
      rank: this.rank,
      worldSize: this.worldSize,
      send: async (peer, step, bytes) => {
        const link = await this.links.get(peer);
        for (const frame of frames(bytes, { kind, seq, step, ...d }, this.maxFrameBytes)) {
          this.throwIfBroken();
          // A send waiting for the queue to drain stops as soon as the group breaks.
          await this.failFast(link.send(frame));
        }
      },
      // Make sure the link exists while waiting: the other side may be the one to open it.
      recv: (peer, step, bytes, onChunk) => this.mailbox.receive(peer, kind, seq, step, d, bytes, onChunk, this.links.get(peer)),
      forward: async (peer) => {
        const link = await this.links.get(peer);
        return (frame) => link.send(frame);
      },
    };
  }

  /** Runs one collective's exchange; on failure tells the other ranks so none waits forever. */
  private async guard<T>(seq: number, body: () => Promise<T>, collective: boolean): Promise<T> {
    const early = collective ? this.abortedSeqs.get(seq) : undefined;
    if (early) throw early;
    try {
      return await body();
    } catch (err) {
      const error = err instanceof Error ? err : new Error(String(err));
      if (collective) this.abortCollective(seq, error);
      this.fail(error);
      // Once broken, every pending and later call fails with the first reason (the lost rank),
      // not with what closing the group did to its links afterwards.
      throw this.broken ?? error;
    }
  }

  private abortCollective(seq: number, err: Error): void {
    if (this.abortedSeqs.has(seq)) return;
    this.abortedSeqs.set(seq, err);
    const frame = encodeAbortNotice(seq, err, this.rank);
    for (const link of this.links.open()) link.send(frame).catch(() => {});
  }

  private onFrame(from: number, frame: Uint8Array): void {
    try {
      if (frame.length > MAX_FRAME_BYTES) throw new FramingError(`frame of ${frame.length} bytes is over the ${MAX_FRAME_BYTES}-byte limit`, from, 'length');
      const h = readHeader(frame);
      checkFloat32Chunk(h);
      if (h.kind === FrameKind.alive) {
        this.mailbox.heard(from);
        return;
      }
      if (h.kind !== FrameKind.abort) {
        // A broken group posts no more receives: data arriving now could only pile up.
        if (!this.broken) this.mailbox.put(from, frame, h);
        return;
      }
      if (this.abortedSeqs.has(h.seq)) return;
      // Only collectives this rank issued, or a peer could have issued ahead of it, can be
      // aborted: the window bounds the notices kept and forwarded.
      if (h.seq < 1 || h.seq > this.seq + this.maxSeqAhead) {
        throw new FramingError(`abort notice for collective #${h.seq} is outside the window of ${this.maxSeqAhead} past #${this.seq}, the last this rank issued`, from, 'seq');
      }
      const err = decodeAbortNotice(from, h, frame);
      // Forward, so ranks that are not neighbours of the origin hear of it too.
      this.abortCollective(h.seq, err);
      // A lost rank told by a peer (or by itself, leaving) is a lost rank here too.
      if (err instanceof PeerLostError) this.markLost(err.rank, err.reason);
      else this.fail(err);
    } catch (err) {
      this.fail(err instanceof FramingError ? new FramingError(`bad frame from rank ${from}: ${err.message}`, from, err.field) : (err as Error));
    }
  }

  // --- Failure -------------------------------------------------------------------------------------

  private markLost(rank: number, reason: string): void {
    if (this.broken) return;
    // Resuming after a pause, the peers' closed links are news of this rank's stall, not theirs.
    if (this.gap.gap() === undefined) this.emit({ type: 'peer-lost', rank, reason });
    this.fail(new PeerLostError(rank, reason));
  }

  /**
   * Breaks the group: every pending receive rejects with `err`, and so does every later call.
   * Whatever breaks it first after this page was paused past the bound (a peer's link closing,
   * the server's eviction, a new round) is a consequence: the group fails with RankStalledError.
   */
  private fail(err: Error): void {
    if (this.broken) return;
    const stalled = err instanceof RankStalledError ? undefined : this.gap.gap();
    if (stalled !== undefined) err = this.stalledError(stalled, err);
    this.broken = err;
    this.rejectBroken(err);
    this.links.stop(err);
    this.mailbox.failAll(err);
    if (err instanceof RankStalledError) this.onStalled?.(err);
  }

  private stalledError(stalledMs: number, after?: Error): RankStalledError {
    const first = this.doing.values().next();
    return new RankStalledError(this.rank, stalledMs, first.done ? 'between collectives' : `waiting for ${first.value}`, after);
  }

  /** Runs `body`, noting what this rank waits for meanwhile (for RankStalledError). */
  private async track<T>(what: string, body: () => Promise<T>): Promise<T> {
    const id = ++this.activities;
    this.doing.set(id, what);
    try {
      return await body();
    } finally {
      this.doing.delete(id);
    }
  }

  /**
   * The page is going away (closed, navigated from, or into the back/forward cache): tell every
   * peer, so that they fail at once naming this rank and why instead of waiting for a link to
   * break or a stall bound, then close the links. Best effort: a notice queued behind a full send
   * queue goes down with its link, and the server's 'peer-left' says the same.
   */
  private leave(): void {
    if (!this.broken) {
      const notice = encodeAbortNotice(Math.max(1, this.seq), new PeerLostError(this.rank, 'its tab closed'), this.rank);
      for (const link of this.links.open()) link.send(notice).catch(() => {});
    }
    const reason = new GroupClosedError(`this tab is closing (or going into the back/forward cache): rank ${this.rank} left the group`);
    this.fail(reason);
    this.links.closeAll(reason);
  }

  private throwIfBroken(): void {
    if (this.broken) throw this.broken;
  }

  private emit(e: ProcessGroupEvent): void {
    for (const l of this.listeners) l(e);
  }

  private checkRank(r: number, what: string): void {
    if (!Number.isInteger(r) || r < 0 || r >= this.worldSize) {
      throw new RangeError(`${what} must be a rank in 0..${this.worldSize - 1}, got ${r}`);
    }
  }

  private checkPeer(r: number, what: string): void {
    this.checkRank(r, what);
    if (r === this.rank) throw new RangeError(`${what} must be another rank, got this rank's own (${r})`);
  }
}

function positiveInt(v: number, name: string): number {
  if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`${name} must be a positive integer, got ${v}`);
  return v;
}

function p2pDescriptor(numel: number): Descriptor {
  return { collective: Collective.p2p, reduceOp: 0, numel, root: 0 };
}

function next(counters: Map<number, number>, peer: number): number {
  const n = (counters.get(peer) ?? 0) + 1;
  counters.set(peer, n);
  return n;
}
