/**
 * The options a process group is made with (`LinkOptions`, what the rendezvous adds in
 * `GroupInit`) and their defaults; `AllReduceOptions`, how one all-reduce moves its values.
 * Internal: users import them from process_group.ts (or the package's index).
 */
import { DEFAULT_LATENCY_THRESHOLD_BYTES, type AllReduceAlgorithm, type CollectiveAlgorithm } from './latency_collectives.ts';
import type { RankStalledError } from '../wire/errors.ts';
import { DEFAULT_FRAME_BYTES, MAX_FRAME_BYTES } from '../wire/framing.ts';
import type { WireDtype } from '../wire/half.ts';
import { DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_MAX_SEQ_AHEAD } from '../transport/mailbox.ts';
import type { PeerLinkFactory } from '../transport/peer_link.ts';
import { DEFAULT_HIGH_WATER_MARK, DEFAULT_WINDOW_BYTES } from '../transport/flow_control.ts';
import type { SignalEvent } from '../wire/protocol.ts';
import type { StoreClient } from './store.ts';

/** See `LinkOptions.stallTimeoutMs`. */
export const DEFAULT_STALL_TIMEOUT_MS = 10_000;

/** LinkOptions.peerTimeoutMs's default. */
export const DEFAULT_PEER_TIMEOUT_MS = 120_000;

/** LinkOptions.linkTimeoutMs's default. */
const DEFAULT_LINK_TIMEOUT_MS = 30_000;

/** How `allReduce` moves its values. */
export interface AllReduceOptions {
  /**
   * What the values travel as (default float32). `float16` or `bfloat16` halve the bytes: each
   * hop of the reduce-scatter sends its partial sums as 16-bit values and the receiver adds them
   * in float32; each segment's owner encodes its final float32 reduction once and the all-gather
   * carries those 16-bit values, so the result is rounded to the wire's precision and every
   * rank ends with the same bits (on a world of one too: the values are rounded, as the wire
   * would). Every rank must pass the same wire: a mismatch is a CollectiveMismatchError.
   */
  wire?: WireDtype;
  /**
   * The algorithm: 'ring' (bandwidth-optimal), 'doubling' (recursive doubling: latency-optimal),
   * 'tree' (up a binomial tree to rank 0 and back down: the fewest messages, for tabs that share
   * a machine's cores) or 'auto' (default: by size and world, see `latencyThresholdBytes`). Every
   * rank must pass the same: a mismatch is a CollectiveMismatchError.
   */
  algorithm?: AllReduceAlgorithm | 'auto';
}

/** How allGather and broadcast run: 'doubling' here is Bruck's all-gather and a binomial-tree broadcast. */
export interface CollectiveOptions {
  algorithm?: CollectiveAlgorithm | 'auto';
}

/** How a group's links behave: the options every way of making a group takes. */
export interface LinkOptions {
  /**
   * ICE servers for WebRTC. Default: the ones the server hands out with `hello` (a TURN relay it
   * mints credentials for, see docs/deployment.md, “Across machines”), else none: host candidates only.
   */
  iceServers?: RTCIceServer[];
  /**
   * How long a live peer (its liveness frames arrive) may send nothing of a message a collective
   * or a receive waits for. Default 120 s: a slow device compiling kernels for a new batch shape
   * (a phone, a software GPU), or a pipeline stage waiting for a whole pass, is silent that long.
   * A closed, frozen or paused peer is found by `stallTimeoutMs` instead.
   */
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
  /** Bytes of frames one peer may have waiting for receives this rank has not posted yet, in each group (a subgroup has a bound of its own). Default 256 MiB. */
  maxBufferedBytes?: number;
  /**
   * Collectives of fewer bytes per rank than this run the latency-optimal algorithms (recursive
   * doubling, Bruck's all-gather, a binomial-tree broadcast: about log2 N hops one after the
   * other), larger ones the ring (2(N-1) hops, each byte sent about twice whatever N). Default
   * DEFAULT_LATENCY_THRESHOLD_BYTES; 0: always the ring. Every rank must use the same value: a
   * rank that chose another algorithm is a CollectiveMismatchError.
   */
  latencyThresholdBytes?: number;
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

/** `LinkOptions` with their defaults filled in (`linkFactory` stays optional: SharedLinks has its own default). */
export type ResolvedLinkOptions = Required<Omit<LinkOptions, 'linkFactory'>>;

/**
 * `options` with every default filled in and the bounds checked: a RangeError names the first
 * bad one (maxSeqAhead, stallTimeoutMs, maxBufferedBytes, latencyThresholdBytes, in that order). `maxFrameBytes` is
 * capped at MAX_FRAME_BYTES.
 */
export function resolveLinkOptions(options: LinkOptions): ResolvedLinkOptions {
  return {
    iceServers: options.iceServers ?? [],
    peerTimeoutMs: options.peerTimeoutMs ?? DEFAULT_PEER_TIMEOUT_MS,
    linkTimeoutMs: options.linkTimeoutMs ?? DEFAULT_LINK_TIMEOUT_MS,
    maxFrameBytes: Math.min(options.maxFrameBytes ?? DEFAULT_FRAME_BYTES, MAX_FRAME_BYTES),
    highWaterMark: options.highWaterMark ?? DEFAULT_HIGH_WATER_MARK,
    linkWindowBytes: options.linkWindowBytes ?? DEFAULT_WINDOW_BYTES,
    // Checked in this order (the object's properties are evaluated in order).
    maxSeqAhead: positiveInt(options.maxSeqAhead ?? DEFAULT_MAX_SEQ_AHEAD, 'maxSeqAhead'),
    stallTimeoutMs: positiveInt(options.stallTimeoutMs ?? DEFAULT_STALL_TIMEOUT_MS, 'stallTimeoutMs'),
    maxBufferedBytes: positiveInt(options.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES, 'maxBufferedBytes'),
    latencyThresholdBytes: nonNegativeInt(options.latencyThresholdBytes ?? DEFAULT_LATENCY_THRESHOLD_BYTES, 'latencyThresholdBytes'),
  };
}

function nonNegativeInt(v: number, name: string): number {
  if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`${name} must be a non-negative integer, got ${v}`);
  return v;
}

function positiveInt(v: number, name: string): number {
  if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`${name} must be a positive integer, got ${v}`);
  return v;
}
