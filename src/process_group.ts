/**
 * The process group: `initProcessGroup` (rendezvous through the store) and `ProcessGroup`, the
 * collectives over WebRTC peer links (what NCCL or Gloo is to torch.distributed).
 *
 * Contract, as in c10d: a group is a fixed set of ranks. When a member is lost, every pending and
 * later collective fails with an error naming it; recovering means making a new group.
 *
 * Collectives are matched across ranks by sequence number: each call takes the next number, and
 * every frame carries it with the collective's descriptor (kind, op, element count, root), so
 * ranks that issue different collectives get a CollectiveMismatchError instead of a hang.
 */
import {
  CollectiveMismatchError,
  DistTimeoutError,
  FramingError,
  PeerLostError,
  StoreTimeoutError,
} from './errors.ts';
import {
  Collective,
  FrameKind,
  HEADER_BYTES,
  MAX_FRAME_BYTES,
  ReduceOp,
  Reassembler,
  describeCollective,
  frames,
  readHeader,
  sameDescriptor,
  writeHeader,
  type Descriptor,
  type FrameHeader,
  type ReduceOpName,
} from './framing.ts';
import {
  DEFAULT_HIGH_WATER_MARK,
  loadSimplePeer,
  simplePeerLinkFactory,
  type LinkState,
  type PeerLink,
  type PeerLinkFactory,
  type PendingLink,
} from './peer_link.ts';
import { allGatherStep, leftOf, reduceScatterStep, rightOf, segments, type Segment } from './ring.ts';
import { StoreClient } from './store.ts';
import type { MembersEvent, SignalEvent } from './protocol.ts';

export type { ReduceOpName } from './framing.ts';

export interface InitProcessGroupOptions {
  /** The server: http://host:port/ (the page's origin) or ws://host:port/ws. */
  url: string;
  session: string;
  worldSize: number;
  /** Explicit rank; omitted, the server assigns the lowest free one in join order. */
  rank?: number;
  /** How long rendezvous may take, and the default for blocking store calls. Default 300 s. */
  timeoutMs?: number;
  /** ICE servers for WebRTC. Default none: host candidates only, nothing leaves the network. */
  iceServers?: RTCIceServer[];
  /** How long a peer may stay silent while a collective waits on it. Default 30 s. */
  peerTimeoutMs?: number;
  /** How long opening a WebRTC link may take. Default 30 s. */
  linkTimeoutMs?: number;
  /** Largest data-channel message, header included. Default 256 KiB (Chromium's limit). */
  maxFrameBytes?: number;
  /** Send-queue high-water mark per link. Default 4 MiB. */
  highWaterMark?: number;
  /** Reuse an open store connection instead of opening one. */
  store?: StoreClient;
  /** Replace the WebRTC link (tests, other transports). */
  linkFactory?: PeerLinkFactory;
  /**
   * Names this group's links and store keys apart from other groups of the same session (an
   * elastic group's generations). Default "static".
   */
  groupKey?: string;
}

/** Joins the session's group and resolves once `worldSize` ranks have joined. */
export async function initProcessGroup(options: InitProcessGroupOptions): Promise<ProcessGroup> {
  const { worldSize } = options;
  if (!Number.isInteger(worldSize) || worldSize < 1) {
    throw new RangeError(`worldSize must be a positive integer, got ${worldSize}`);
  }
  const timeoutMs = options.timeoutMs ?? 300_000;
  const store = options.store ?? (await StoreClient.connect(options.url, { session: options.session, timeoutMs }));
  // Listen before joining: peers may signal as soon as the group is complete.
  const early: SignalEvent[] = [];
  const stopBuffering = store.on('signal', (e) => early.push(e));
  let members: number[] = [];
  let onMembers: (() => void) | undefined;
  const stopMembers = store.on('members', (e: MembersEvent) => {
    members = e.ranks;
    onMembers?.();
  });
  try {
    const { rank } = await store.join(worldSize, options.rank);
    await new Promise<void>((resolve, reject) => {
      const finish = (err?: Error) => {
        clearTimeout(timer);
        stopClose();
        onMembers = undefined;
        if (err) reject(err);
        else resolve();
      };
      const timer = setTimeout(() => {
        const missing = Array.from({ length: worldSize }, (_, r) => r).filter((r) => !members.includes(r));
        finish(
          new DistTimeoutError(
            `rank${missing.length > 1 ? 's' : ''} ${missing.join(', ')} to join session "${options.session}" (${members.length} of ${worldSize} joined)`,
            timeoutMs,
          ),
        );
      }, timeoutMs);
      const stopClose = store.on('close', (e) => finish(new Error(`the store connection closed during rendezvous (${e.code} ${e.reason})`)));
      onMembers = () => {
        if (members.length === worldSize) finish();
      };
      onMembers();
    });
    if (options.linkFactory === undefined && typeof RTCPeerConnection !== 'undefined') await loadSimplePeer();
    return new ProcessGroup(store, rank, worldSize, options, early);
  } finally {
    stopBuffering();
    stopMembers();
  }
}

export type ProcessGroupEvent =
  | { type: 'link'; peer: number; state: LinkState }
  | { type: 'peer-lost'; rank: number; reason: string };

interface Receiver {
  peer: number;
  descriptor: Descriptor;
  expectedBytes: number;
  reassembler: Reassembler | undefined;
  onChunk(payload: Uint8Array, offset: number, frame: Uint8Array): void;
  resolve(): void;
  reject(err: Error): void;
  timer: ReturnType<typeof setTimeout> | undefined;
  what: string;
}

interface InboxEntry {
  buffered: Array<{ frame: Uint8Array; header: FrameHeader }>;
  receiver?: Receiver;
}

/** Serialised form of an abort, sent to the other ranks so none is left waiting. */
interface AbortNotice {
  name: string;
  message: string;
  origin: number;
  lostRank?: number;
}

export class ProcessGroup {
  readonly rank: number;
  readonly worldSize: number;
  readonly store: StoreClient;
  private seq = 0;
  private barrierCount = 0;
  private readonly sendSeq = new Map<number, number>();
  private readonly recvSeq = new Map<number, number>();
  private readonly links = new Map<number, PendingLink>();
  private readonly inbox = new Map<string, InboxEntry>();
  private readonly completed = new Set<string>();
  private readonly receivers = new Set<Receiver>();
  private readonly abortedSeqs = new Map<number, Error>();
  private broken: Error | undefined;
  /** Rejects with the reason once the group breaks; lets store waits fail fast too. */
  private readonly whenBroken: Promise<never>;
  private rejectBroken!: (err: Error) => void;
  private readonly listeners = new Set<(e: ProcessGroupEvent) => void>();
  private readonly unsubscribe: Array<() => void> = [];
  private readonly linkFactory: PeerLinkFactory | undefined;
  private readonly peerTimeoutMs: number;
  private readonly linkTimeoutMs: number;
  private readonly maxFrameBytes: number;
  private readonly highWaterMark: number;
  private readonly iceServers: RTCIceServer[];
  private readonly timeoutMs: number;
  private readonly groupKey: string;

  constructor(store: StoreClient, rank: number, worldSize: number, options: InitProcessGroupOptions, early: SignalEvent[] = []) {
    this.store = store;
    this.whenBroken = new Promise<never>((_, reject) => (this.rejectBroken = reject));
    this.whenBroken.catch(() => {});
    this.rank = rank;
    this.worldSize = worldSize;
    this.timeoutMs = options.timeoutMs ?? 300_000;
    this.groupKey = options.groupKey ?? 'static';
    this.peerTimeoutMs = options.peerTimeoutMs ?? 30_000;
    this.linkTimeoutMs = options.linkTimeoutMs ?? 30_000;
    this.maxFrameBytes = Math.min(options.maxFrameBytes ?? MAX_FRAME_BYTES, MAX_FRAME_BYTES);
    this.highWaterMark = options.highWaterMark ?? DEFAULT_HIGH_WATER_MARK;
    this.iceServers = options.iceServers ?? [];
    this.linkFactory =
      options.linkFactory ?? (typeof RTCPeerConnection !== 'undefined' ? simplePeerLinkFactory() : undefined);
    this.unsubscribe.push(
      store.on('signal', (e) => this.onSignal(e)),
      store.on('peer-left', (e) => this.markLost(e.rank, e.reason ?? 'its connection to the server closed')),
      store.on('close', (e) => this.fail(new Error(`the connection to the server closed (${e.code} ${e.reason})`))),
    );
    for (const e of early) this.onSignal(e);
  }

  /** Link states and lost peers, for dashboards and logs. */
  on(listener: (e: ProcessGroupEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** The open or opening links, with their byte counters. */
  linkStats(): Array<{ peer: number; state: LinkState; bytesSent: number; bytesReceived: number }> {
    return [...this.links.values()].map(({ link }) => ({
      peer: link.peer,
      state: link.state,
      bytesSent: link.bytesSent,
      bytesReceived: link.bytesReceived,
    }));
  }

  /** Why the group can no longer run collectives, if it cannot. */
  get error(): Error | undefined {
    return this.broken;
  }

  // --- Collectives ------------------------------------------------------------------------------

  /** Reduces `buf` across all ranks in place (ring reduce-scatter + all-gather) and returns it. */
  async allReduce(buf: Float32Array, op: ReduceOpName = 'sum'): Promise<Float32Array> {
    const d = this.descriptor(Collective.allReduce, buf.length, op);
    return this.run(async (seq) => {
      const segs = segments(buf.length, this.worldSize);
      await this.ringReduceScatter(seq, d, buf, segs, op);
      await this.ringAllGather(seq, d, buf, segs, this.worldSize - 1);
      return buf;
    }, buf);
  }

  /**
   * The same reduction as a full-mesh exchange (every rank sends its whole buffer to every
   * other, as DISCO does). For comparison in benchmarks; the ring is the one to use.
   */
  async meshAllReduce(buf: Float32Array, op: ReduceOpName = 'sum'): Promise<Float32Array> {
    const d = this.descriptor(Collective.meshAllReduce, buf.length, op);
    return this.run(async (seq) => {
      const n = this.worldSize;
      const parts: Float32Array[] = new Array(n);
      parts[this.rank] = buf.slice();
      const bytes = asBytes(buf);
      const peers = Array.from({ length: n }, (_, r) => r).filter((r) => r !== this.rank);
      await Promise.all([
        ...peers.map((p) => this.sendMessage(p, FrameKind.collective, seq, 0, d, bytes)),
        ...peers.map((p) => {
          const part = (parts[p] = new Float32Array(buf.length));
          return this.recvMessage(p, FrameKind.collective, seq, 0, d, buf.length * 4, copyInto(part, 0));
        }),
      ]);
      // The same order (rank 0, 1, ...) on every rank gives bit-identical results.
      buf.set(parts[0]);
      const reduce = reducer(op);
      for (let r = 1; r < n; r++) reduce(buf, parts[r], 0, buf.length, 0);
      if (op === 'avg') for (let i = 0; i < buf.length; i++) buf[i] /= n;
      return buf;
    }, buf);
  }

  /** Copies `src`'s buffer into `buf` on every rank (pipelined along the ring). */
  async broadcast(buf: Float32Array, src: number): Promise<Float32Array> {
    this.checkRank(src, 'src');
    const d: Descriptor = { collective: Collective.broadcast, reduceOp: 0, numel: buf.length, root: src };
    return this.run(async (seq) => {
      const right = rightOf(this.rank, this.worldSize);
      const bytes = asBytes(buf);
      if (this.rank === src) {
        await this.sendMessage(right, FrameKind.collective, seq, 0, d, bytes);
        return buf;
      }
      const forward = right !== src;
      const rightLink = forward ? await this.link(right) : undefined;
      let chain = Promise.resolve();
      await this.recvMessage(leftOf(this.rank, this.worldSize), FrameKind.collective, seq, 0, d, bytes.length, (payload, offset, frame) => {
        bytes.set(payload, offset);
        // Pass each chunk on as it arrives, header and all: the ring pipelines.
        if (rightLink) chain = chain.then(() => rightLink.send(frame));
      });
      await chain;
      return buf;
    }, buf);
  }

  /** Gathers every rank's `input` (same length everywhere) into one buffer, in rank order. */
  async allGather(input: Float32Array): Promise<Float32Array> {
    const n = this.worldSize;
    const out = new Float32Array(input.length * n);
    out.set(input, this.rank * input.length);
    const d: Descriptor = { collective: Collective.allGather, reduceOp: 0, numel: input.length, root: 0 };
    return this.run(async (seq) => {
      const blocks = Array.from({ length: n }, (_, i) => ({ start: i * input.length, end: (i + 1) * input.length }));
      // Rank r starts owning block r: the all-gather half of the ring does the rest.
      await this.ringAllGather(seq, d, out, blocks, 0);
      return out;
    }, out);
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
    const d = this.descriptor(Collective.reduceScatter, input.length, op);
    const work = input.slice();
    return this.run(async (seq) => {
      const blocks = Array.from({ length: n }, (_, i) => ({ start: i * k, end: (i + 1) * k }));
      await this.ringReduceScatter(seq, d, work, blocks, op);
      return work.slice(this.rank * k, (this.rank + 1) * k);
    }, work.subarray(this.rank * k, (this.rank + 1) * k));
  }

  /** Point-to-point: sends `buf` to `dst`, matched with `dst`'s `recv(_, thisRank)` in order. */
  async send(buf: Float32Array, dst: number): Promise<void> {
    this.checkPeer(dst, 'dst');
    this.throwIfBroken();
    const seq = next(this.sendSeq, dst);
    const d: Descriptor = { collective: Collective.p2p, reduceOp: 0, numel: buf.length, root: 0 };
    await this.guard(seq, () => this.sendMessage(dst, FrameKind.p2p, seq, 0, d, asBytes(buf)), false);
  }

  /** Point-to-point: fills `buf` with the next message from `src`; lengths must agree. */
  async recv(buf: Float32Array, src: number): Promise<Float32Array> {
    this.checkPeer(src, 'src');
    this.throwIfBroken();
    const seq = next(this.recvSeq, src);
    const d: Descriptor = { collective: Collective.p2p, reduceOp: 0, numel: buf.length, root: 0 };
    await this.guard(seq, () => this.recvMessage(src, FrameKind.p2p, seq, 0, d, buf.length * 4, copyInto(buf, 0)), false);
    return buf;
  }

  /**
   * Blocks until every rank has called barrier() the same number of times (through the store).
   * Fails at once, naming the rank, if a member is lost while waiting.
   */
  async barrier(timeoutMs = this.timeoutMs): Promise<void> {
    this.throwIfBroken();
    const n = ++this.barrierCount;
    const key = `__pg/${this.groupKey}/barrier/${n}`;
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

  /** Breaks the group from outside (e.g. a new generation replaced it): pending calls reject with `err`. */
  abort(err: Error): void {
    this.fail(err);
  }

  /** Closes every peer link and, if `closeStore`, the store connection (torch's destroy_process_group). */
  destroy(closeStore = true): void {
    this.fail(new Error('the process group was destroyed'));
    for (const off of this.unsubscribe) off();
    for (const { link } of this.links.values()) link.close();
    if (closeStore) this.store.close();
  }

  // --- Ring halves ---------------------------------------------------------------------------------

  private async ringReduceScatter(seq: number, d: Descriptor, buf: Float32Array, segs: Segment[], op: ReduceOpName): Promise<void> {
    const n = this.worldSize;
    const right = rightOf(this.rank, n);
    const left = leftOf(this.rank, n);
    const reduce = reducer(op);
    for (let s = 0; s < n - 1; s++) {
      const { send, recv } = reduceScatterStep(this.rank, n, s);
      const into = segs[recv];
      await Promise.all([
        this.sendMessage(right, FrameKind.collective, seq, s, d, asBytes(buf, segs[send])),
        this.recvMessage(left, FrameKind.collective, seq, s, d, (into.end - into.start) * 4, (payload, offset) => {
          const incoming = asFloats(payload);
          reduce(buf, incoming, into.start + offset / 4, incoming.length, 0);
        }),
      ]);
    }
    if (op === 'avg') {
      const own = segs[this.rank];
      for (let i = own.start; i < own.end; i++) buf[i] /= n;
    }
  }

  /** Passes each owner's segment around the ring; `stepBase` keeps step numbers unique per seq. */
  private async ringAllGather(seq: number, d: Descriptor, buf: Float32Array, segs: Segment[], stepBase: number): Promise<void> {
    const n = this.worldSize;
    const right = rightOf(this.rank, n);
    const left = leftOf(this.rank, n);
    for (let s = 0; s < n - 1; s++) {
      const { send, recv } = allGatherStep(this.rank, n, s);
      const into = segs[recv];
      await Promise.all([
        this.sendMessage(right, FrameKind.collective, seq, stepBase + s, d, asBytes(buf, segs[send])),
        this.recvMessage(left, FrameKind.collective, seq, stepBase + s, d, (into.end - into.start) * 4, copyInto(buf, into.start)),
      ]);
    }
  }

  // --- Running a collective ----------------------------------------------------------------------

  private descriptor(collective: Collective, numel: number, op: ReduceOpName): Descriptor {
    if (!(op in ReduceOp)) throw new RangeError(`unknown reduce op ${JSON.stringify(op)}; use sum, avg, max or min`);
    return { collective, reduceOp: ReduceOp[op], numel, root: 0 };
  }

  /** Takes the next sequence number and runs `body`, except on a world of one. */
  private async run<T>(body: (seq: number) => Promise<T>, single: T): Promise<T> {
    this.throwIfBroken();
    const seq = ++this.seq;
    if (this.worldSize === 1) {
      // One rank: nothing to exchange. avg of one value is the value.
      return single;
    }
    return this.guard(seq, () => body(seq), true);
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
      throw error;
    }
  }

  private abortCollective(seq: number, err: Error): void {
    if (this.abortedSeqs.has(seq)) return;
    this.abortedSeqs.set(seq, err);
    const notice: AbortNotice = {
      name: err.name,
      message: err.message,
      origin: this.rank,
      lostRank: err instanceof PeerLostError ? err.rank : undefined,
    };
    const payload = new TextEncoder().encode(JSON.stringify(notice));
    const frame = new Uint8Array(HEADER_BYTES + payload.length);
    writeHeader(frame, {
      kind: FrameKind.abort,
      collective: Collective.allReduce,
      reduceOp: 0,
      seq,
      step: 0,
      numel: 0,
      root: 0,
      total: payload.length,
      offset: 0,
      length: payload.length,
    });
    frame.set(payload, HEADER_BYTES);
    for (const { link } of this.links.values()) {
      if (link.state === 'open') link.send(frame).catch(() => {});
    }
  }

  private onAbortFrame(from: number, h: FrameHeader, frame: Uint8Array): void {
    if (this.abortedSeqs.has(h.seq)) return;
    let notice: AbortNotice;
    try {
      notice = JSON.parse(new TextDecoder().decode(frame.subarray(HEADER_BYTES))) as AbortNotice;
    } catch {
      notice = { name: 'Error', message: 'unreadable abort notice', origin: from };
    }
    const err =
      notice.name === 'PeerLostError' && notice.lostRank !== undefined
        ? new PeerLostError(notice.lostRank, `reported by rank ${notice.origin}: ${notice.message}`)
        : notice.name === 'CollectiveMismatchError'
          ? new CollectiveMismatchError(`rank ${notice.origin} reported: ${notice.message}`, h.seq)
          : new Error(`rank ${notice.origin} aborted collective #${h.seq}: ${notice.message}`);
    // Forward so ranks that are not neighbours of the origin hear of it too.
    this.abortCollective(h.seq, err);
    this.fail(err);
  }

  // --- Messages ------------------------------------------------------------------------------------

  private async sendMessage(peer: number, kind: FrameKind, seq: number, step: number, d: Descriptor, payload: Uint8Array): Promise<void> {
    const link = await this.link(peer);
    for (const frame of frames(payload, { kind, seq, step, ...d }, this.maxFrameBytes)) {
      this.throwIfBroken();
      await link.send(frame);
    }
  }

  private recvMessage(
    peer: number,
    kind: FrameKind,
    seq: number,
    step: number,
    d: Descriptor,
    expectedBytes: number,
    onChunk: Receiver['onChunk'],
  ): Promise<void> {
    const key = inboxKey(peer, kind, seq, step);
    // Make sure the link exists (the other side may be the one to initiate it).
    const linkReady = this.link(peer);
    return new Promise<void>((resolve, reject) => {
      const receiver: Receiver = {
        peer,
        descriptor: d,
        expectedBytes,
        reassembler: undefined,
        onChunk,
        timer: undefined,
        what: `${describeCollective(d)} #${seq} step ${step}`,
        resolve: () => {
          this.finishReceiver(receiver, key);
          resolve();
        },
        reject: (err) => {
          this.finishReceiver(receiver, key);
          reject(err);
        },
      };
      linkReady.catch((err: Error) => receiver.reject(err));
      this.receivers.add(receiver);
      let entry = this.inbox.get(key);
      if (!entry) this.inbox.set(key, (entry = { buffered: [] }));
      entry.receiver = receiver;
      this.armTimer(receiver);
      for (const { frame, header } of entry.buffered.splice(0)) {
        this.deliver(receiver, frame, header);
        if (!this.receivers.has(receiver)) return;
      }
    });
  }

  private armTimer(r: Receiver): void {
    if (r.timer !== undefined) clearTimeout(r.timer);
    r.timer = setTimeout(() => {
      const err = new PeerLostError(r.peer, `sent nothing for ${this.peerTimeoutMs} ms while this rank waited for ${r.what}`);
      this.markLost(r.peer, err.reason);
    }, this.peerTimeoutMs);
  }

  private finishReceiver(r: Receiver, key: string): void {
    if (r.timer !== undefined) clearTimeout(r.timer);
    this.receivers.delete(r);
    const entry = this.inbox.get(key);
    if (entry?.receiver === r) this.inbox.delete(key);
  }

  private onFrame(from: number, frame: Uint8Array): void {
    let h: FrameHeader;
    try {
      h = readHeader(frame);
    } catch (err) {
      this.fail(new FramingError(`bad frame from rank ${from}: ${(err as Error).message}`));
      return;
    }
    if (h.kind === FrameKind.abort) return this.onAbortFrame(from, h, frame);
    const key = inboxKey(from, h.kind, h.seq, h.step);
    if (this.completed.has(key)) {
      this.fail(new FramingError(`rank ${from} sent a chunk (offset ${h.offset}) for a message already complete (seq ${h.seq} step ${h.step})`));
      return;
    }
    let entry = this.inbox.get(key);
    if (!entry) this.inbox.set(key, (entry = { buffered: [] }));
    if (entry.receiver) this.deliver(entry.receiver, frame, h);
    else entry.buffered.push({ frame, header: h });
  }

  private deliver(r: Receiver, frame: Uint8Array, h: FrameHeader): void {
    try {
      if (!r.reassembler) {
        if (!sameDescriptor(h, r.descriptor) || h.total !== r.expectedBytes) {
          throw new CollectiveMismatchError(
            `collective #${h.seq} does not match: rank ${r.peer} issued ${describeCollective(h)}, rank ${this.rank} issued ${describeCollective(r.descriptor)}`,
            h.seq,
          );
        }
        r.reassembler = new Reassembler(h.total, r.onChunk);
      }
      r.reassembler.push(frame, h);
      if (r.reassembler.done) {
        this.completed.add(inboxKey(r.peer, h.kind, h.seq, h.step));
        if (this.completed.size > 4096) this.completed.delete(this.completed.values().next().value!);
        r.resolve();
      } else {
        this.armTimer(r);
      }
    } catch (err) {
      r.reject(err as Error);
    }
  }

  // --- Links ---------------------------------------------------------------------------------------

  private link(peer: number): Promise<PeerLink> {
    const lost = this.broken;
    if (lost) return Promise.reject(lost);
    const pending = this.links.get(peer) ?? this.createLink(peer);
    if (pending.link.state === 'open') return Promise.resolve(pending.link);
    return new Promise<PeerLink>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new DistTimeoutError(`a WebRTC link to rank ${peer} to open`, this.linkTimeoutMs)),
        this.linkTimeoutMs,
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

  private createLink(peer: number): PendingLink {
    if (!this.linkFactory) {
      throw new Error(
        `rank ${this.rank} needs a peer link to rank ${peer}, but WebRTC is not available here: run in a browser or pass linkFactory`,
      );
    }
    const channel = this.linkChannel(peer);
    const pending = this.linkFactory({
      peer,
      initiator: this.rank < peer,
      iceServers: this.iceServers,
      highWaterMark: this.highWaterMark,
      stallTimeoutMs: this.peerTimeoutMs,
      sendSignal: (body) => {
        this.store.signal(peer, { channel, body }).catch((err: Error) => this.markLost(peer, `signaling failed: ${err.message}`));
      },
    });
    this.links.set(peer, pending);
    this.emit({ type: 'link', peer, state: 'connecting' });
    pending.opened.then(
      () => this.emit({ type: 'link', peer, state: 'open' }),
      () => {},
    );
    pending.link.onMessage((bytes) => this.onFrame(peer, bytes));
    pending.link.onClose((reason) => {
      this.emit({ type: 'link', peer, state: 'closed' });
      this.markLost(peer, `its WebRTC link closed (${reason})`);
    });
    return pending;
  }

  private onSignal(e: SignalEvent): void {
    if (e.data.channel !== this.linkChannel(e.from)) return; // another group's (or generation's) link
    const pending = this.links.get(e.from) ?? (this.broken ? undefined : this.tryCreateLink(e.from));
    pending?.receiveSignal(e.data.body);
  }

  /** Both ends of a pair name their link the same way, within this group only. */
  private linkChannel(peer: number): string {
    return `pg:${this.groupKey}:${Math.min(this.rank, peer)}-${Math.max(this.rank, peer)}`;
  }

  private tryCreateLink(peer: number): PendingLink | undefined {
    try {
      return this.createLink(peer);
    } catch (err) {
      console.error(`[pg] rank ${this.rank}: ${(err as Error).message}`);
      return undefined;
    }
  }

  // --- Failure -------------------------------------------------------------------------------------

  private markLost(rank: number, reason: string): void {
    if (this.broken) return;
    this.emit({ type: 'peer-lost', rank, reason });
    this.fail(new PeerLostError(rank, reason));
  }

  /** Breaks the group: every pending receive rejects with `err`, and so does every later call. */
  private fail(err: Error): void {
    if (this.broken) return;
    this.broken = err;
    this.rejectBroken(err);
    for (const r of [...this.receivers]) r.reject(err);
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

// --- Helpers -------------------------------------------------------------------------------------

function inboxKey(peer: number, kind: number, seq: number, step: number): string {
  return `${peer}:${kind}:${seq}:${step}`;
}


function next(counters: Map<number, number>, peer: number): number {
  const n = (counters.get(peer) ?? 0) + 1;
  counters.set(peer, n);
  return n;
}

function asBytes(buf: Float32Array, seg?: Segment): Uint8Array {
  const start = seg ? seg.start : 0;
  const end = seg ? seg.end : buf.length;
  return new Uint8Array(buf.buffer, buf.byteOffset + start * 4, (end - start) * 4);
}

/** A Float32 view of a payload; copies only when the payload is not 4-byte aligned. */
function asFloats(payload: Uint8Array): Float32Array {
  if (payload.byteOffset % 4 === 0) return new Float32Array(payload.buffer, payload.byteOffset, payload.length / 4);
  return new Float32Array(payload.slice().buffer);
}

function copyInto(target: Float32Array, startElement: number): Receiver['onChunk'] {
  const bytes = new Uint8Array(target.buffer, target.byteOffset, target.byteLength);
  return (payload, offset) => bytes.set(payload, startElement * 4 + offset);
}

type Reduce = (acc: Float32Array, incoming: Float32Array, at: number, count: number, from: number) => void;

/** acc[at + i] = op(acc[at + i], incoming[from + i]) for i in [0, count). */
export function reducer(op: ReduceOpName): Reduce {
  switch (op) {
    case 'sum':
    case 'avg':
      return (acc, inc, at, count, from) => {
        for (let i = 0; i < count; i++) acc[at + i] += inc[from + i];
      };
    case 'max':
      return (acc, inc, at, count, from) => {
        for (let i = 0; i < count; i++) acc[at + i] = Math.max(acc[at + i], inc[from + i]);
      };
    case 'min':
      return (acc, inc, at, count, from) => {
        for (let i = 0; i < count; i++) acc[at + i] = Math.min(acc[at + i], inc[from + i]);
      };
    default: {
      const unknown: never = op;
      throw new RangeError(`unknown reduce op ${String(unknown)}`);
    }
  }
}
