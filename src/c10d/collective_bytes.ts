/**
 * What a collective sends, computed: the bytes rank `rank` of `worldSize` puts on its links for
 * an all-reduce of `elements` values follow from the algorithm the tuner picks, the world, the
 * rank, the wire and the frame size alone (each message cut into frames by framing.ts's `frames`,
 * a HEADER_BYTES header each). A trainer reports them as the baseline of its compression ratio;
 * test/comm_bytes.test.ts checks them against `pg.bytesSent()` exactly.
 */
import { DEFAULT_FRAME_BYTES, HEADER_BYTES } from '../wire/framing.ts';
import { allGatherStep, reduceScatterStep, segments } from './ring.ts';
import { chooseAlgorithm, DEFAULT_LATENCY_THRESHOLD_BYTES, treeChildren, type AllReduceAlgorithm } from './latency_collectives.ts';
import { wirePayloadBytes, type WireDtype } from '../wire/half.ts';

export interface CollectiveBytesOptions {
  /** The group's `maxFrameBytes` (default framing.ts's DEFAULT_FRAME_BYTES). */
  frameBytes?: number;
  /** The group's `latencyThresholdBytes` (default DEFAULT_LATENCY_THRESHOLD_BYTES). */
  thresholdBytes?: number;
  wire?: WireDtype;
  algorithm?: AllReduceAlgorithm | 'auto';
}

/** Bytes on the wire for one message of `payload` bytes: the payload plus a header per frame (an empty message is one header-only frame). */
export function messageBytes(payload: number, frameBytes = DEFAULT_FRAME_BYTES): number {
  const chunk = Math.floor((frameBytes - HEADER_BYTES) / 4) * 4;
  return payload + HEADER_BYTES * Math.max(1, Math.ceil(payload / chunk));
}

/** Bytes rank `rank` sends in an all-reduce of `elements` values, by the algorithm the tuner picks. 0 for a world of one. */
export function allReduceBytes(elements: number, rank: number, worldSize: number, o: CollectiveBytesOptions = {}): number {
  if (worldSize <= 1) return 0;
  const wire = o.wire ?? 'float32';
  const frameBytes = o.frameBytes ?? DEFAULT_FRAME_BYTES;
  const algorithm = chooseAlgorithm(
    wirePayloadBytes(wire, elements),
    worldSize,
    o.thresholdBytes ?? DEFAULT_LATENCY_THRESHOLD_BYTES,
    o.algorithm,
  );
  if (algorithm === 'tree') {
    // One message up to its parent (not rank 0) and one down to each child.
    return messageBytes(wirePayloadBytes(wire, elements), frameBytes) * (treeChildren(rank, worldSize).length + (rank === 0 ? 0 : 1));
  }
  if (algorithm === 'doubling') {
    const p = 2 ** Math.floor(Math.log2(worldSize));
    const extra = worldSize - p;
    const whole = messageBytes(wirePayloadBytes(wire, elements), frameBytes);
    // A folded rank sends its values once; its partner also sends it the result; the rest, one message per doubling step.
    if (rank < 2 * extra && rank % 2 === 0) return whole;
    return whole * (Math.log2(p) + (rank < 2 * extra ? 1 : 0));
  }
  // The ring: n - 1 reduce-scatter and n - 1 all-gather messages of one segment each, about 2(n-1)/n of the buffer.
  const segs = segments(elements, worldSize);
  const sent = (index: number) => messageBytes(wirePayloadBytes(wire, segs[index]!.end - segs[index]!.start), frameBytes);
  let bytes = 0;
  for (let s = 0; s < worldSize - 1; s++) {
    bytes += sent(reduceScatterStep(rank, worldSize, s).send);
    bytes += sent(allGatherStep(rank, worldSize, s).send);
  }
  return bytes;
}

/**
 * Bytes each rank sends in `pg.meshAllGather` of `elements` values (robust aggregation's
 * exchange): its whole block to each of the N-1 others, (N-1) x (4 x elements + headers), where
 * the ring all-reduce of the same values sends about 2(N-1)/N x 4 x elements: N/2 times less.
 * The price of every rank holding every rank's own block, unaltered by relays. 0 for a world of one.
 */
export function meshAllGatherBytes(elements: number, worldSize: number, o: Pick<CollectiveBytesOptions, 'frameBytes'> = {}): number {
  if (worldSize <= 1) return 0;
  return (worldSize - 1) * messageBytes(4 * elements, o.frameBytes ?? DEFAULT_FRAME_BYTES);
}
