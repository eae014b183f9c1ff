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
 * ranks that issue different collectives get a CollectiveMismatchError instead of a hang.
 *
 * Subgroups (`newGroup`, torch's `dist.new_group`) run over the top-level group's links: each
 * frame carries its group's id, and each group has its own mailbox, sequence numbers and store
 * prefix, so the top-level group and its subgroups run collectives at the same time without
 * mixing. Failure is all-or-nothing: whatever fails one group of a rank fails all of them.
 *
 * The pieces: `SharedLinks` (links, liveness, routing), `GroupLinks`, `Mailbox`, ring.ts, framing.ts;
 * beside this module, one file per part (options, identity, transport, descriptors, exchanges, break,
 * subgroups, p2p, abort notices, store barrier, attested rows, the RPC agent's message channel).
 */
import { GroupClosedError } from '../wire/errors.ts';
import { Collective, FrameKind, describeCollective, type Descriptor, type ReduceOpName } from '../wire/framing.ts';
import type { LinkDetails, LinkStats } from '../transport/group_links.ts';
import type { Mailbox } from '../transport/mailbox.ts';
import { checkWireDtype, roundToWire, wirePayloadBytes } from '../wire/half.ts';
import { asBytes, copyInto, type RingTransport } from './ring.ts';
import type { ProcessGroupEvent, SharedLinks } from '../transport/shared_links.ts';
import { PrefixStore, type Store } from './store_interface.ts';
import { resolveLinkOptions, type AllReduceOptions, type CollectiveOptions, type GroupInit } from './group_options.ts';
import { chooseAlgorithm, type AllReduceAlgorithm } from './latency_collectives.ts';
import {
  allGatherDescriptor,
  allReduceDescriptor,
  broadcastDescriptor,
  checkAlgorithm,
  reduceDescriptor,
} from './collective_descriptors.ts';
import { allGatherExchange, allReduceExchange, broadcastExchange, meshReduceExchange, reduceScatterExchange } from './exchanges.ts';
import { groupMailbox, groupTransport, routedGroup, type GroupWires } from './group_transport.ts';
import { groupIdentity } from './group_identity.ts';
import { subgroupRanks, type GroupMembers, type SubgroupSpec } from './subgroups.ts';
import { P2PSequences, p2pDescriptor } from './p2p.ts';
import { AbortNotices } from './abort_notices.ts';
import { barrierWait, meetNewGroup, type BarrierGroup } from './store_barrier.ts';
import { meshExchange } from './mesh_gather.ts';
import { GroupBreak } from './group_break.ts';
import { gatherRowsThroughServer } from './attested_rows.ts';
import { MessageChannel } from './message_channel.ts';

export type { ReduceOpName } from '../wire/framing.ts';
export type { WireDtype } from '../wire/half.ts';
export type { LinkDetails, LinkPath, LinkStats } from '../transport/group_links.ts';
export type { ProcessGroupEvent } from '../transport/shared_links.ts';
export {
  DEFAULT_PEER_TIMEOUT_MS,
  DEFAULT_STALL_TIMEOUT_MS,
  type AllReduceOptions,
  type CollectiveOptions,
  type GroupInit,
  type LinkOptions,
} from './group_options.ts';
export {
  DEFAULT_LATENCY_THRESHOLD_BYTES,
  chooseAlgorithm,
  type AllReduceAlgorithm,
  type CollectiveAlgorithm,
} from './latency_collectives.ts';
export { subgroupRanks, type SubgroupSpec } from './subgroups.ts';

export class ProcessGroup {
  /** This rank in this group (in a subgroup: its index in `ranks`). */
  readonly rank: number;
  readonly worldSize: number;
  readonly round: number;
  /** The server instance the group was formed on (it changes when the server restarts; round numbers start again). */
  readonly instance: string;
  /** The session's store, with keys scoped to this group (torch gives each group a PrefixStore; a subgroup's is under its parent's). */
  readonly store: Store;
  /**
   * The members' ranks in the top-level group (the rendezvous round's ranks), in the order of
   * their ranks in this group: this group's rank i is top-level rank `ranks[i]`. For the
   * top-level group, [0, 1, ..., worldSize - 1].
   */
  readonly ranks: readonly number[];
  /** 0 for the top-level group; subgroups are numbered 1, 2, ... in the order `newGroup` made them. */
  readonly groupId: number;
  /** The links, liveness and frame routing every group of this rank shares. */
  private readonly shared: SharedLinks;
  /** The options this group was made with; its subgroups take the same. */
  private readonly init: GroupInit;
  /** The members as top-level ranks, and their names in messages. */
  private readonly members: GroupMembers;
  /** " in subgroup 1 [1, 3]", for messages; empty for the top-level group. */
  private readonly label: string;
  private seq = 0;
  /** Gathers through the server so far (`gatherRows`): every rank counts the same. */
  private attestedSeq = 0;
  private barrierCount = 0;
  private readonly p2p = new P2PSequences();
  private readonly aborts: AbortNotices;
  private readonly mailbox: Mailbox;
  /** Why the group broke, and a promise that rejects with it (lets store waits fail fast too). */
  private readonly breakage = new GroupBreak();
  private readonly listeners = new Set<(e: ProcessGroupEvent) => void>();
  private readonly maxFrameBytes: number;
  private readonly latencyThresholdBytes: number;
  /** Bytes of this group's collective and point-to-point frames this rank sent (see `bytesSent`). */
  private sentBytes = 0;
  private readonly timeoutMs: number;

  /** Whole messages to any rank of the round, for an RPC agent (src/rpc/): top-level group, one per rank. */
  openMessageChannel(maxMessageBytes?: number): MessageChannel {
    if (this.groupId !== 0) throw new Error(`open the message channel on the top-level group, not ${this.members.describe()}`);
    return new MessageChannel(this.shared, { maxFrameBytes: this.maxFrameBytes, ...(maxMessageBytes ? { maxMessageBytes } : {}) });
  }

  /** Made by the rendezvous (`initProcessGroup`); subgroups by `newGroup` (`sub` is internal). */
  constructor(init: GroupInit, sub?: SubgroupSpec) {
    this.init = { ...init, early: undefined };
    this.round = init.round;
    this.instance = init.client.instance;
    this.timeoutMs = init.timeoutMs;
    const options = resolveLinkOptions(init);
    this.maxFrameBytes = options.maxFrameBytes;
    this.latencyThresholdBytes = options.latencyThresholdBytes;
    const who = groupIdentity(init, options, sub);
    this.shared = who.shared;
    this.members = who.members;
    this.rank = who.rank;
    this.store = who.store;
    this.worldSize = this.members.ranks.length;
    this.groupId = this.members.groupId;
    this.ranks = this.members.ranks;
    this.label = this.members.label;
    const issued = (peer: number, kind: FrameKind): number => (kind === FrameKind.p2p ? this.p2p.lastRecv(peer) : this.seq);
    this.mailbox = groupMailbox({ shared: this.shared, worldSize: this.worldSize, label: this.label, issued }, options);
    this.aborts = new AbortNotices({
      rank: this.shared.rank,
      groupId: this.groupId,
      label: this.label,
      maxSeqAhead: options.maxSeqAhead,
      lastSeq: () => this.seq,
      links: () => this.shared.open((r) => this.members.has(r)),
      markLost: (rank, reason) => this.shared.markLost(rank, reason),
      fail: (err) => this.fail(err),
    });
    this.shared.register(routedGroup(this.wires()));
  }

  /**
   * Link states and lost peers, for dashboards and logs. Peers are named by their top-level
   * ranks; a subgroup tells of its members' links, and of any lost rank (that fails every group).
   */
  on(listener: (e: ProcessGroupEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** The open or opening links (to this group's members), with their byte counters. */
  linkStats(): LinkStats[] {
    return this.shared.links.stats().filter((s) => this.members.has(s.peer));
  }

  /**
   * `linkStats()` plus each open link's network path: the selected ICE candidate pair's types
   * (host, srflx, prflx, relay), its round-trip time and the bytes per second on the wire since
   * the previous call (from `RTCPeerConnection.getStats()`). Asynchronous and not free: poll it
   * every second or two, not per step. A link whose stats take longer than `timeoutMs` gets `path: null`.
   */
  async linkDetails(timeoutMs = 2_000): Promise<LinkDetails[]> {
    return (await this.shared.links.details(timeoutMs)).filter((d) => this.members.has(d.peer));
  }

  /**
   * Bytes this rank has sent for this group's collectives and point-to-point messages since the
   * group was made: every frame, its 36-byte header included, counted as it is handed to the
   * link. Not counted: the links' own traffic (liveness frames, flow-control credits), abort
   * notices, and other groups' frames (a subgroup counts its own). A difference of two readings
   * is what the collectives in between sent (DDP's `commBytes`).
   */
  bytesSent(): number {
    return this.sentBytes;
  }

  /** Why the group can no longer run collectives, if it cannot. */
  get error(): Error | undefined {
    return this.breakage.error;
  }

  /** Resolves like `p`, or rejects as soon as the group breaks (for store waits on other ranks). */
  failFast<T>(p: Promise<T>): Promise<T> {
    return this.breakage.race(p);
  }

  // --- Subgroups -----------------------------------------------------------------------------------

  /**
   * Makes a subgroup of the members `ranks` (ranks of this group, in any order), as torch's
   * `dist.new_group(ranks)`. Every rank of this group must call it for every subgroup, members
   * or not, in the same order: each call takes the next subgroup id, so ids agree without
   * messages. The id is taken when newGroup is called, so several calls may also be started
   * together (`Promise.all`), in the same order everywhere. A member gets the subgroup once every
   * member has made it (a barrier through the store, bounded by this group's timeout); a
   * non-member gets null at once.
   *
   * In the subgroup, `rank` is this rank's index in the sorted `ranks` and `worldSize` their
   * count; every collective, send/recv and barrier takes group ranks (src, dst, root), as torch's
   * group-local ranks do. It runs over this group's links (no new connections), with its own
   * sequence numbers and store prefix, at the same time as this group and other subgroups.
   * Whatever fails one group of a rank fails all of them with the same error; destroying a
   * subgroup only detaches it.
   *
   * Throws RangeError for an empty list, duplicates, non-integers or ranks outside 0..worldSize-1;
   * DistTimeoutError (and breaks the groups) when a member does not make the subgroup in time.
   * Only the top-level group makes subgroups.
   */
  async newGroup(ranks: readonly number[]): Promise<ProcessGroup | null> {
    if (this.groupId !== 0) {
      throw new Error(
        `newGroup was called on subgroup ${this.groupId} [${this.ranks.join(', ')}]: subgroups of subgroups are not supported; call newGroup on the top-level group, with top-level ranks`,
      );
    }
    const members = subgroupRanks(ranks, this.worldSize);
    this.breakage.throwIfBroken();
    const id = this.shared.takeGroupId();
    if (!members.includes(this.rank)) return null;
    const sub = new ProcessGroup(this.init, { shared: this.shared, store: new PrefixStore(`sub${id}`, this.store), id, ranks: members });
    await sub.created();
    return sub;
  }

  /** The top-level rank of this group's rank `groupRank` (torch's `get_global_rank`). */
  globalRank(groupRank: number): number {
    return this.members.globalRank(groupRank);
  }

  /** This group's rank of top-level rank `globalRank` (torch's `get_group_rank`); RangeError if it is not a member. */
  groupRank(globalRank: number): number {
    return this.members.groupRank(globalRank);
  }

  /** A new subgroup's members meet in the store, so that none sends it frames before all have made it. */
  private async created(): Promise<void> {
    try {
      await meetNewGroup(this.barrierGroup(), this.timeoutMs, this.members.describe(), (body) => this.track('newGroup', body));
    } catch (err) {
      const error = err instanceof Error ? err : new Error(String(err));
      this.fail(error);
      throw this.breakage.error ?? error;
    }
  }

  // --- Collectives ------------------------------------------------------------------------------

  /**
   * Reduces `buf` across all ranks in place and returns it: a ring reduce-scatter + all-gather, or
   * below `latencyThresholdBytes` recursive doubling (`options.algorithm` forces one). Either way
   * every rank ends with the same bits. `options.wire` sends 16-bit values instead of float32
   * (see `AllReduceOptions`).
   */
  async allReduce(buf: Float32Array, op: ReduceOpName = 'sum', options: AllReduceOptions = {}): Promise<Float32Array> {
    const wire = checkWireDtype(options.wire ?? 'float32');
    const algorithm = this.algorithmFor(wirePayloadBytes(wire, buf.length), options.algorithm, true);
    const d = allReduceDescriptor(algorithm, buf.length, op, wire);
    const out = await this.run(d, buf, (t) => allReduceExchange(t, buf, op, wire, algorithm));
    // A world of one exchanges nothing; its values are rounded as a wire would have rounded them.
    if (this.worldSize === 1) roundToWire(wire, buf);
    return out;
  }

  /**
   * The algorithm a collective of `bytes` per rank runs in this group (with `forced`, the
   * per-call option): every rank computes the same from the same inputs.
   */
  algorithmFor(bytes: number, forced?: AllReduceAlgorithm | 'auto', allReduce = false): AllReduceAlgorithm {
    checkAlgorithm(forced, allReduce);
    return chooseAlgorithm(bytes, this.worldSize, this.latencyThresholdBytes, forced);
  }

  /**
   * Every rank's `row`, in rank order, gathered through the server (the store's `gather`), which
   * places each row at the rank of the member that sent it: unlike any collective over the peer
   * links (a sum any member can add into, an all-gather whose blocks others forward), what row r
   * says comes from rank r, and every rank gets the same rows. For small per-rank facts (votes,
   * step figures, work times), not tensors. Top-level groups only (the server knows its ranks).
   */
  async gatherRows(row: readonly number[], timeoutMs = this.timeoutMs): Promise<number[][]> {
    if (this.groupId !== 0)
      throw new Error(`gatherRows needs the top-level group: the server knows the ranks of round ${this.round}, not those${this.label}`);
    const tag = `rows:${this.attestedSeq++}`;
    const gather = {
      client: this.init.client,
      round: this.round,
      tag,
      worldSize: this.worldSize,
      timeoutMs,
      broken: this.breakage.promise,
    };
    return gatherRowsThroughServer(gather, row);
  }

  /**
   * The same reduction as a full-mesh exchange (every rank sends its whole buffer to every
   * other, as DISCO does). For comparison in benchmarks; the ring is the one to use.
   */
  async meshAllReduce(buf: Float32Array, op: ReduceOpName = 'sum'): Promise<Float32Array> {
    return this.run(reduceDescriptor(Collective.meshAllReduce, buf.length, op), buf, (t) => meshReduceExchange(t, buf, op));
  }

  /**
   * Every rank's `input` (same length everywhere), each sent by its own rank straight to every
   * other over their own link (no forwarding: no rank can alter another's block on the way, as
   * a ring's relays could). Returns the blocks in rank order (this rank's a copy). Sends
   * (N-1) x the input per rank, where a ring all-reduce sends 2(N-1)/N x (robust/exchange.ts).
   */
  async meshAllGather(input: Float32Array): Promise<Float32Array[]> {
    const d: Descriptor = { collective: Collective.meshAllGather, reduceOp: 0, numel: input.length, root: 0 };
    return this.run(d, [input.slice()], (t) => meshExchange(t, input));
  }

  /**
   * Copies `src`'s buffer into `buf` on every rank (`src` is a rank of this group): pipelined along
   * the ring, or below `latencyThresholdBytes` down a binomial tree.
   */
  async broadcast(buf: Float32Array, src: number, options: CollectiveOptions = {}): Promise<Float32Array> {
    this.members.checkRank(src, 'src');
    const algorithm = this.algorithmFor(buf.byteLength, options.algorithm);
    return this.run(broadcastDescriptor(algorithm, buf.length, src), buf, (t) => broadcastExchange(t, buf, src, algorithm));
  }

  /**
   * Gathers every rank's `input` (same length everywhere) into one buffer, in rank order: around
   * the ring, or below `latencyThresholdBytes` (of the whole result) with Bruck's algorithm.
   */
  async allGather(input: Float32Array, options: CollectiveOptions = {}): Promise<Float32Array> {
    const n = this.worldSize;
    const out = new Float32Array(input.length * n);
    out.set(input, this.rank * input.length);
    const algorithm = this.algorithmFor(out.byteLength, options.algorithm);
    return this.run(allGatherDescriptor(algorithm, input.length), out, (t) => allGatherExchange(t, out, input.length, algorithm));
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
    const single = work.subarray(this.rank * k, (this.rank + 1) * k);
    return this.run(reduceDescriptor(Collective.reduceScatter, input.length, op), single, (t) => reduceScatterExchange(t, work, k, op));
  }

  /** Point-to-point: sends `buf` to `dst` (a rank of this group), matched with `dst`'s `recv(_, thisRank)` in order. */
  async send(buf: Float32Array, dst: number): Promise<void> {
    this.members.checkPeer(dst, this.rank, 'dst');
    this.breakage.throwIfBroken();
    const t = this.transport(FrameKind.p2p, this.p2p.nextSend(this.ranks[dst]!), p2pDescriptor(buf.length));
    await this.track(`send #${t.seq} to ${this.members.who(dst)}`, () => this.guard(t.seq, () => t.send(dst, 0, asBytes(buf)), false));
  }

  /** Point-to-point: fills `buf` with the next message from `src` (a rank of this group); lengths must agree. */
  async recv(buf: Float32Array, src: number): Promise<Float32Array> {
    this.members.checkPeer(src, this.rank, 'src');
    this.breakage.throwIfBroken();
    const t = this.transport(FrameKind.p2p, this.p2p.nextRecv(this.ranks[src]!), p2pDescriptor(buf.length));
    await this.track(`recv #${t.seq} from ${this.members.who(src)}`, () =>
      this.guard(t.seq, () => t.recv(src, 0, buf.length * 4, copyInto(buf, 0)), false),
    );
    return buf;
  }

  /**
   * Blocks until every rank has called barrier() the same number of times (through the store).
   * Fails at once, naming the rank, if a member is lost while waiting.
   */
  async barrier(timeoutMs = this.timeoutMs): Promise<void> {
    this.breakage.throwIfBroken();
    const n = ++this.barrierCount;
    return this.track(`barrier #${n}`, () => barrierWait(this.barrierGroup(), n, timeoutMs, this.label));
  }

  /** This group as its store barriers see it. */
  private barrierGroup(): BarrierGroup {
    return { store: this.store, worldSize: this.worldSize, broken: this.breakage.promise };
  }

  /**
   * Breaks the group from outside (e.g. a new round replaced it): pending calls reject with `err`.
   * As any failure, it breaks every group of this rank: the top-level group and its subgroups.
   */
  abort(err: Error): void {
    this.fail(err);
  }

  /**
   * Tells every peer that this rank leaves (their collectives with it fail at once, naming it)
   * and fails this rank's groups: what closing the tab does (its pagehide). For a caller that must
   * close the links under the group itself afterwards (the rendezvous's kept links).
   */
  leave(): void {
    this.shared.leave();
  }

  /**
   * Closes every peer link and, if `closeStore`, the store connection (torch's
   * destroy_process_group); the subgroups fail with the same error at once. What this rank's
   * last collectives sent and its links still queue goes out first (the links close once it has
   * left this end, within 2 s): the promise resolves when they are closed. A subgroup's destroy
   * only detaches it: its pending calls reject with GroupClosedError, the links and the store
   * connection (which it shares with the top-level group) stay open, and `closeStore` is ignored.
   */
  destroy(closeStore = true): Promise<void> {
    if (this.groupId === 0) return this.shared.destroy(closeStore);
    this.breakWith(new GroupClosedError(`${this.members.describe()} was destroyed`));
    this.shared.retire(this.groupId);
    return Promise.resolve();
  }

  // --- Running a collective ----------------------------------------------------------------------

  /** Takes the next sequence number and runs `body`, except on a world of one. */
  private async run<T>(d: Descriptor, single: T, body: (t: RingTransport) => Promise<T>): Promise<T> {
    this.breakage.throwIfBroken();
    const seq = ++this.seq;
    // One rank: nothing to exchange. avg of one value is the value.
    if (this.worldSize === 1) return single;
    const t = this.transport(FrameKind.collective, seq, d);
    return this.track(`${describeCollective(d)} #${seq}`, () => this.guard(seq, () => body(t), true));
  }

  /**
   * Messages of one collective (or one point-to-point transfer), for the ring algorithms. The
   * algorithms see this group's ranks; the links and the mailbox, top-level ranks.
   */
  private transport(kind: FrameKind, seq: number, d: Descriptor): RingTransport & { seq: number } {
    return groupTransport(this.wires(), kind, seq, d);
  }

  /** This group as its transports and the shared links' routing see it. */
  private wires(): GroupWires {
    return {
      rank: this.rank,
      worldSize: this.worldSize,
      groupId: this.groupId,
      members: this.members,
      shared: this.shared,
      mailbox: this.mailbox,
      aborts: this.aborts,
      breakage: this.breakage,
      maxFrameBytes: this.maxFrameBytes,
      listeners: this.listeners,
      sent: (bytes) => (this.sentBytes += bytes),
      lastSeq: () => this.seq,
      breakWith: (err) => this.breakWith(err),
    };
  }

  /** Runs one collective's exchange; on failure tells the other ranks so none waits forever. */
  private async guard<T>(seq: number, body: () => Promise<T>, collective: boolean): Promise<T> {
    const early = collective ? this.aborts.reason(seq) : undefined;
    if (early) throw early;
    try {
      return await body();
    } catch (err) {
      const error = err instanceof Error ? err : new Error(String(err));
      if (collective) this.aborts.send(seq, error);
      this.fail(error);
      // Once broken, every pending and later call fails with the first reason (the lost rank),
      // not with what closing the group did to its links afterwards.
      throw this.breakage.error ?? error;
    }
  }

  // --- Failure -------------------------------------------------------------------------------------

  /** A failure in this group fails every group of the rank (see SharedLinks.fail); a destroyed subgroup's do not. */
  private fail(err: Error): void {
    if (this.breakage.error) return;
    this.shared.fail(err);
  }

  /** Every pending receive rejects with `err`, and so does every later call. */
  private breakWith(err: Error): void {
    if (this.breakage.set(err)) this.mailbox.failAll(err);
  }

  /** Runs `body`, noting what this rank waits for meanwhile (for RankStalledError). */
  private track<T>(what: string, body: () => Promise<T>): Promise<T> {
    return this.shared.track(`${what}${this.label}`, body);
  }
}
