/**
 * Collectives for small buffers, where a step costs its hops and not its bytes: the ring needs
 * 2(N-1) hops one after the other for an all-reduce of any size, these need about log2(N).
 * NCCL's tuner and gloo switch to such algorithms below a size threshold for the same reason.
 *
 * - all-reduce: recursive doubling. At step k each rank swaps its whole buffer with the rank
 *   whose number differs in bit k and both reduce. The two always hold each other's values
 *   swapped and a + b == b + a exactly (also for max and min), so both end a step with the same
 *   bits, and after the last step every rank holds the same bits. A world that is not a power of
 *   two folds its extra ranks in first (the even rank of each of the first 2 x extra pairs hands
 *   its values to the odd one and gets the result back at the end: Rabenseifner's fold).
 * - all-reduce, on request ({ algorithm: 'tree' }): up a binomial tree to rank 0 and back down,
 *   the fewest messages (2(N-1)); every rank ends with rank 0's bits.
 * - all-gather: Bruck's algorithm, ceil(log2 N) steps for any N (copies only).
 * - broadcast: a binomial tree from the root, ceil(log2 N) rounds (copies only).
 *
 * With a 16-bit or int8 wire every value a rank sends is first rounded to the wire in place, on both
 * sides of every exchange, so that partners add the same rounded values; the result is rounded
 * to the wire once more at the end, as the ring's is. The same algorithm must run on every rank:
 * its choice depends only on what every rank passes alike (size, world, options), and each has
 * its own collective code on the wire, so a rank that chose otherwise is a CollectiveMismatchError.
 */
import type { ReduceOpName } from '../wire/framing.ts';
import { asBytes, asHalves, copyInto, reducer, type RingTransport } from './ring.ts';
import { decode16, encode16, type HalfDtype, type WireDtype } from '../wire/half.ts';
import { decodeInt8, encodeInt8, int8Bytes, roundToInt8 } from '../wire/int8_wire.ts';

/** The algorithms a collective can run: the bandwidth-optimal ring, or the latency-optimal one. */
export type CollectiveAlgorithm = 'ring' | 'doubling';
/** An all-reduce can also run 'tree': the fewest messages (see treeAllReduce). */
export type AllReduceAlgorithm = CollectiveAlgorithm | 'tree';

/**
 * Below this many bytes per rank a collective runs the latency-optimal algorithm (recursive
 * doubling, Bruck, a binomial tree), at or above it the ring. Measured with `npm run
 * bench:algorithms` on loopback (bench/results/collective_algorithms.md, 4 to 16 tabs on 2
 * cores): doubling wins 1.4-4.4x at 1 and 4 KiB, the two are even at 16 KiB, the ring wins from
 * 64 KiB. Override per group with `latencyThresholdBytes` or per call with `{ algorithm }`.
 */
export const DEFAULT_LATENCY_THRESHOLD_BYTES = 16 << 10;

/** The algorithm of a collective of `bytes` per rank in a world of `worldSize`: the tuner. */
export function chooseAlgorithm(
  bytes: number,
  worldSize: number,
  thresholdBytes: number,
  forced?: AllReduceAlgorithm | 'auto',
): AllReduceAlgorithm {
  if (forced !== undefined && forced !== 'auto') return forced;
  // Two ranks: both algorithms are one exchange; the ring's halves move half the bytes each way.
  if (worldSize <= 2) return 'ring';
  return bytes < thresholdBytes ? 'doubling' : 'ring';
}

const largestPowerOfTwo = (n: number): number => 2 ** Math.floor(Math.log2(n));

/** 1, 2, 4, ... below `p`: the bits recursive doubling exchanges along. */
const masks = (p: number): number[] => Array.from({ length: Math.log2(p) }, (_, i) => 1 << i);

/**
 * How an all-reduce of the latency-optimal kind puts `buf` on the wire: `round` rounds it in
 * place to what the wire carries (so what a rank sends is exactly what it keeps), `outgoing`
 * rounds it and gives the bytes to send, `receive` takes a peer's values into `into` (float32).
 */
function wireCodec(
  t: RingTransport,
  buf: Float32Array,
  wire: WireDtype,
): {
  incoming: Float32Array;
  round(): void;
  outgoing(): Uint8Array;
  receive(peer: number, step: number, into?: Float32Array): Promise<void>;
} {
  const incoming = new Float32Array(buf.length);
  const half = wire === 'float16' || wire === 'bfloat16' ? wire : undefined;
  const bits = half ? new Uint16Array(buf.length) : undefined;
  // int8's rounding is idempotent too: a rounded buffer encodes to the same blocks again.
  const round = (): void => {
    if (wire === 'int8') roundToInt8(buf);
    if (!half || !bits) return;
    encode16(half, buf, bits);
    decode16(half, bits, buf, 0, buf.length);
  };
  // A copy of the 16-bit values: `bits` is reused while a send may still read it.
  const outgoing = (): Uint8Array => {
    round();
    if (wire === 'int8') return encodeInt8(buf);
    return bits ? new Uint8Array(bits.buffer.slice(0)) : asBytes(buf);
  };
  const receive = (peer: number, step: number, into: Float32Array = incoming): Promise<void> => {
    if (wire === 'int8') {
      // Blocks are decoded whole, once all their bytes are here.
      const whole = new Uint8Array(int8Bytes(buf.length));
      return t
        .recv(peer, step, whole.length, (payload, offset) => whole.set(payload, offset))
        .then(() => decodeInt8(whole, into, 0, buf.length));
    }
    return t.recv(peer, step, half ? buf.length * 2 : buf.length * 4, half ? decodeInto(half, into) : copyInto(into, 0));
  };
  return { incoming, round, outgoing, receive };
}

/** Recursive doubling all-reduce of `buf` in place (see the top of this file). */
export async function doublingAllReduce(t: RingTransport, buf: Float32Array, op: ReduceOpName, wire: WireDtype = 'float32'): Promise<void> {
  const n = t.worldSize;
  const r = t.rank;
  const p = largestPowerOfTwo(n);
  const extra = n - p;
  const reduce = reducer(op);
  const { incoming, round, outgoing, receive } = wireCodec(t, buf, wire);
  const unfoldStep = 1 + Math.log2(p);

  const virtual = r < 2 * extra ? r >> 1 : r - extra;
  const real = (v: number): number => (v < extra ? 2 * v + 1 : v + extra);
  const folded = r < 2 * extra && r % 2 === 0;
  const partners = folded ? [r + 1] : [...(r < 2 * extra ? [r - 1] : []), ...masks(p).map((mask) => real(virtual ^ mask))];
  await Promise.all(partners.map((peer) => t.connect(peer)));

  // Fold: of the first 2 x extra ranks, the even ones hand their values to the odd ones and wait.
  if (folded) {
    await t.send(r + 1, 0, outgoing());
    await receive(r + 1, unfoldStep, buf);
    return;
  }
  if (r < 2 * extra) {
    round(); // as its partner's values were
    await receive(r - 1, 0);
    reduce(buf, incoming, 0, buf.length, 0);
  }
  for (let mask = 1, step = 1; mask < p; mask <<= 1, step++) {
    const partner = real(virtual ^ mask);
    await Promise.all([t.send(partner, step, outgoing()), receive(partner, step)]);
    reduce(buf, incoming, 0, buf.length, 0);
  }
  if (op === 'avg') for (let i = 0; i < buf.length; i++) buf[i]! /= n;
  // Unfold: the result, exactly (rounded to the wire already: its 16-bit values say it all), to the rank that handed its values in.
  const result = outgoing();
  if (r < 2 * extra) await t.send(r - 1, unfoldStep, result);
}

/** A rank's children in the binomial tree rooted at rank 0, the nearest (smallest subtree) first. */
export function treeChildren(rank: number, worldSize: number): number[] {
  const lowest = rank & -rank; // rank 0: 0, the root
  return masks(2 ** Math.ceil(Math.log2(worldSize)))
    .filter((m) => (rank === 0 || m < lowest) && rank + m < worldSize)
    .map((m) => rank + m);
}

/**
 * Tree all-reduce of `buf` in place: up a binomial tree to rank 0, which reduces and sends the
 * result back down the same tree. 2(N-1) messages in all where recursive doubling sends
 * N log2 N, over twice the rounds (2 ceil(log2 N)). So it is the one for tabs that share a
 * machine's cores, where a round costs the work of all its messages rather than a network's
 * latency; across devices doubling's fewer rounds win. Every rank ends with rank 0's bits.
 */
export async function treeAllReduce(t: RingTransport, buf: Float32Array, op: ReduceOpName, wire: WireDtype = 'float32'): Promise<void> {
  const n = t.worldSize;
  const r = t.rank;
  const reduce = reducer(op);
  const { incoming, outgoing, receive } = wireCodec(t, buf, wire);
  const parent = r === 0 ? undefined : r - (r & -r);
  const children = treeChildren(r, n);
  await Promise.all([...(parent === undefined ? [] : [parent]), ...children].map((peer) => t.connect(peer)));
  for (const child of children) {
    await receive(child, 0);
    reduce(buf, incoming, 0, buf.length, 0);
  }
  if (parent !== undefined) {
    await t.send(parent, 0, outgoing());
    await receive(parent, 1, buf);
  } else if (op === 'avg') for (let i = 0; i < buf.length; i++) buf[i]! /= n;
  // Down: the farthest child first (the largest subtree has the most left to pass on). The
  // result is rounded to the wire already, so encoding it again gives the bytes that came.
  const result = outgoing();
  for (const child of children.reverse()) await t.send(child, 1, result);
}

/** A chunk handler that decodes 16-bit values into `target`. */
function decodeInto(wire: HalfDtype, target: Float32Array): (payload: Uint8Array, offset: number) => void {
  return (payload, offset) => {
    const halves = asHalves(payload);
    decode16(wire, halves, target, offset / 2, halves.length, 0);
  };
}

/**
 * Bruck's all-gather: `out` holds N blocks of `k` elements, this rank's own at block `rank`; at
 * step j each rank sends the blocks it has gathered (up to 2^j of them) to rank - 2^j and
 * receives as many from rank + 2^j. Afterwards every rank has every block, in rank order.
 */
export async function bruckAllGather(t: RingTransport, out: Float32Array, k: number): Promise<void> {
  const n = t.worldSize;
  const r = t.rank;
  // gathered[i] is the block of rank (r + i) mod n.
  const gathered = new Float32Array(n * k);
  gathered.set(out.subarray(r * k, (r + 1) * k), 0);
  const steps = masks(2 ** Math.ceil(Math.log2(n)));
  await Promise.all(steps.flatMap((dist) => [t.connect((r - dist + n) % n), t.connect((r + dist) % n)]));
  for (let dist = 1, step = 0; dist < n; dist <<= 1, step++) {
    const count = Math.min(dist, n - dist);
    const to = (r - dist + n) % n;
    const from = (r + dist) % n;
    await Promise.all([
      t.send(to, step, asBytes(gathered, { start: 0, end: count * k })),
      t.recv(from, step, count * k * 4, copyInto(gathered, dist * k)),
    ]);
  }
  for (let i = 0; i < n; i++) out.set(gathered.subarray(i * k, (i + 1) * k), ((r + i) % n) * k);
}

/** A binomial-tree broadcast of `bytes` from `src`: each rank receives once and sends on to its subtree. */
export async function treeBroadcast(t: RingTransport, bytes: Uint8Array, src: number): Promise<void> {
  const n = t.worldSize;
  const v = (t.rank - src + n) % n;
  const real = (w: number) => (w + src) % n;
  const parent = v === 0 ? [] : [real(v - (v & -v))];
  const children = masks(2 ** Math.ceil(Math.log2(n)))
    .filter((m) => m < (v === 0 ? n : v & -v) && v + m < n)
    .map((m) => real(v + m));
  await Promise.all([...parent, ...children].map((peer) => t.connect(peer)));
  let mask = 1;
  while (mask < n) {
    if (v & mask) {
      await t.recv(real(v - mask), 0, bytes.length, (payload, offset) => bytes.set(payload, offset));
      break;
    }
    mask <<= 1;
  }
  // The child with the largest subtree first: it has the most left to pass on.
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) await t.send(real(v + mask), 0, bytes);
  }
}
