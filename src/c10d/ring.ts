/**
 * Ring algorithms: the schedule (which segment each rank sends and receives at each step of a
 * ring reduce-scatter and all-gather, pure arithmetic, tested exhaustively) and the reduce-
 * scatter, all-gather and pipelined broadcast written against a small `RingTransport`, so they
 * never see a link, a frame or a sequence number.
 *
 * The buffer is cut into `worldSize` segments whose lengths differ by at most one. Rank r sends
 * to r+1 and receives from r-1. After the reduce-scatter, rank r holds the fully reduced
 * segment r (the layout torch's reduce_scatter gives); the all-gather then passes each owner's
 * segment around the ring. Each segment is reduced once, on its owner, in one fixed order, and
 * then copied: every rank ends with bit-identical values.
 *
 * A 16-bit wire (`wire`: float16 or bfloat16, half.ts) halves the bytes and keeps that promise:
 * in the reduce-scatter each hop sends its partial sums encoded as 16-bit values and the receiver
 * accumulates their decoded values in float32; the owner of each segment encodes its final
 * float32 reduction once, keeps the decoded values itself, and the all-gather passes those
 * 16-bit values on unchanged, so every rank decodes the same bits. The int8 wire (int8_wire.ts)
 * does the same with whole segments of scaled 8-bit blocks.
 */

import type { ReduceOpName } from '../wire/framing.ts';
import { decode16, encode16, wireBytes, type HalfDtype, type WireDtype } from '../wire/half.ts';
import { decodeInt8, encodeInt8, int8Bytes } from '../wire/int8_wire.ts';

export interface Segment {
  start: number;
  end: number;
}

/** Cuts `length` elements into `parts` contiguous segments; the first `length % parts` get one more. */
export function segments(length: number, parts: number): Segment[] {
  const base = Math.floor(length / parts);
  const extra = length % parts;
  const out: Segment[] = [];
  let start = 0;
  for (let i = 0; i < parts; i++) {
    const size = base + (i < extra ? 1 : 0);
    out.push({ start, end: start + size });
    start += size;
  }
  return out;
}

const mod = (a: number, n: number) => ((a % n) + n) % n;

export function rightOf(rank: number, worldSize: number): number {
  return mod(rank + 1, worldSize);
}

export function leftOf(rank: number, worldSize: number): number {
  return mod(rank - 1, worldSize);
}

export interface RingStep {
  /** Segment index this rank sends to its right neighbour. */
  send: number;
  /** Segment index this rank receives from its left neighbour. */
  recv: number;
}

/** Reduce-scatter, step s of n-1: send segment r-s-1, receive (and reduce into) segment r-s-2. */
export function reduceScatterStep(rank: number, worldSize: number, step: number): RingStep {
  return { send: mod(rank - step - 1, worldSize), recv: mod(rank - step - 2, worldSize) };
}

/** All-gather, step s of n-1: send segment r-s, receive (and copy) segment r-s-1. */
export function allGatherStep(rank: number, worldSize: number, step: number): RingStep {
  return { send: mod(rank - step, worldSize), recv: mod(rank - step - 1, worldSize) };
}

/** The whole schedule for one rank, for tests and for reading. */
export function ringSchedule(rank: number, worldSize: number): { reduceScatter: RingStep[]; allGather: RingStep[] } {
  const steps = Array.from({ length: Math.max(0, worldSize - 1) }, (_, s) => s);
  return {
    reduceScatter: steps.map((s) => reduceScatterStep(rank, worldSize, s)),
    allGather: steps.map((s) => allGatherStep(rank, worldSize, s)),
  };
}

// ---------------------------------------------------------------------------------------------
// The algorithms

/** One collective's view of the network: messages to and from ranks, numbered by step. */
export interface RingTransport {
  readonly rank: number;
  readonly worldSize: number;
  /** Sends message `step` of this collective to `peer`. */
  send(peer: number, step: number, bytes: Uint8Array): Promise<void>;
  /**
   * Receives message `step` of this collective from `peer` (exactly `bytes` long), chunk by
   * chunk as it arrives; `frame` is the chunk as it travelled, to forward it unchanged.
   */
  recv(peer: number, step: number, bytes: number, onChunk: (payload: Uint8Array, offset: number, frame: Uint8Array) => void): Promise<void>;
  /** Passes a received frame on to `peer` as is (a broadcast's pipelining). */
  forward(peer: number): Promise<(frame: Uint8Array) => Promise<void>>;
  /**
   * Resolves once the link to `peer` is open. The latency-optimal algorithms open all of theirs
   * before exchanging anything: a rank that fails the collective (a mismatch) then has an open
   * link to every partner to tell it by, as the ring's ranks do after its first step.
   */
  connect(peer: number): Promise<void>;
}

/**
 * Ring reduce-scatter over `segs` of `buf`, in place: afterwards rank r holds the reduction of
 * segment r (divided by n for avg), in float32. Each chunk is reduced as it arrives. With a
 * 16-bit `wire`, the partial sums travel as 16-bit values and are accumulated in float32.
 */
export async function ringReduceScatter(
  t: RingTransport,
  buf: Float32Array,
  segs: Segment[],
  op: ReduceOpName,
  wire: WireDtype = 'float32',
): Promise<void> {
  const n = t.worldSize;
  const right = rightOf(t.rank, n);
  const left = leftOf(t.rank, n);
  const reduce = reducer(op);
  if (wire === 'int8') return int8ReduceScatter(t, buf, segs, op);
  const size = wireBytes(wire);
  // Decoded chunks of a 16-bit wire, reused: at most one segment long.
  const scratch = wire === 'float32' ? undefined : new Float32Array(Math.max(0, ...segs.map((g) => g.end - g.start)));
  for (let s = 0; s < n - 1; s++) {
    const { send, recv } = reduceScatterStep(t.rank, n, s);
    const into = segs[recv]!;
    await Promise.all([
      t.send(right, s, wire === 'float32' ? asBytes(buf, segs[send]!) : encodeSegment(wire, buf, segs[send]!)),
      t.recv(left, s, (into.end - into.start) * size, (payload, offset) => {
        if (wire === 'float32') {
          const incoming = asFloats(payload);
          reduce(buf, incoming, into.start + offset / 4, incoming.length, 0);
          return;
        }
        const incoming = asHalves(payload);
        decode16(wire, incoming, scratch!, 0, incoming.length);
        reduce(buf, scratch!, into.start + offset / 2, incoming.length, 0);
      }),
    ]);
  }
  if (op === 'avg') {
    const own = segs[t.rank]!;
    for (let i = own.start; i < own.end; i++) buf[i]! /= n;
  }
}

/**
 * Ring all-gather over `segs` of `buf`, in place: rank r starts owning segment r and ends with
 * all of them. `stepBase` keeps message numbers apart from a reduce-scatter in the same collective.
 *
 * With a 16-bit `wire`, rank r encodes its segment once and replaces it with the decoded values
 * (it is rounded to the wire's precision); the 16-bit values then travel unchanged around the
 * ring and every rank decodes them: all ranks end with the same bits.
 */
export async function ringAllGather(
  t: RingTransport,
  buf: Float32Array,
  segs: Segment[],
  stepBase = 0,
  wire: WireDtype = 'float32',
): Promise<void> {
  const n = t.worldSize;
  const right = rightOf(t.rank, n);
  const left = leftOf(t.rank, n);
  if (wire === 'int8') return int8AllGather(t, buf, segs, stepBase);
  if (wire === 'float32') {
    for (let s = 0; s < n - 1; s++) {
      const { send, recv } = allGatherStep(t.rank, n, s);
      const into = segs[recv]!;
      await Promise.all([
        t.send(right, stepBase + s, asBytes(buf, segs[send]!)),
        t.recv(left, stepBase + s, (into.end - into.start) * 4, copyInto(buf, into.start)),
      ]);
    }
    return;
  }
  // The 16-bit values of the whole buffer as they travel: this rank's own segment encoded here,
  // the others as received (and forwarded as received, never encoded again).
  const bits = new Uint16Array(buf.length);
  const own = segs[t.rank]!;
  encode16(wire, buf.subarray(own.start, own.end), bits.subarray(own.start, own.end));
  decode16(wire, bits, buf, own.start, own.end - own.start, own.start);
  const wireBuf = new Uint8Array(bits.buffer);
  for (let s = 0; s < n - 1; s++) {
    const { send, recv } = allGatherStep(t.rank, n, s);
    const into = segs[recv]!;
    const from = segs[send]!;
    await Promise.all([
      t.send(right, stepBase + s, wireBuf.subarray(from.start * 2, from.end * 2)),
      t.recv(left, stepBase + s, (into.end - into.start) * 2, (payload, offset) => {
        wireBuf.set(payload, into.start * 2 + offset);
        decode16(wire, bits, buf, into.start + offset / 2, payload.length / 2, into.start + offset / 2);
      }),
    ]);
  }
}

/** One segment of `buf` as 16-bit values (a fresh array: the partial sums of a reduce-scatter hop). */
function encodeSegment(wire: HalfDtype, buf: Float32Array, seg: Segment): Uint8Array {
  const bits = new Uint16Array(seg.end - seg.start);
  encode16(wire, buf.subarray(seg.start, seg.end), bits);
  return new Uint8Array(bits.buffer);
}

/** Receives a message of `bytes` bytes whole (int8 blocks are decoded once they are all there). */
function receiveWhole(t: RingTransport, peer: number, step: number, bytes: number): Promise<Uint8Array> {
  const whole = new Uint8Array(bytes);
  return t.recv(peer, step, bytes, (payload, offset) => whole.set(payload, offset)).then(() => whole);
}

/** The ring reduce-scatter with each hop's partial sums as int8 blocks, accumulated in float32. */
async function int8ReduceScatter(t: RingTransport, buf: Float32Array, segs: Segment[], op: ReduceOpName): Promise<void> {
  const n = t.worldSize;
  const reduce = reducer(op);
  const scratch = new Float32Array(Math.max(0, ...segs.map((g) => g.end - g.start)));
  for (let s = 0; s < n - 1; s++) {
    const { send, recv } = reduceScatterStep(t.rank, n, s);
    const into = segs[recv]!;
    const count = into.end - into.start;
    const [, incoming] = await Promise.all([
      t.send(rightOf(t.rank, n), s, encodeInt8(buf.subarray(segs[send]!.start, segs[send]!.end))),
      receiveWhole(t, leftOf(t.rank, n), s, int8Bytes(count)),
    ]);
    decodeInt8(incoming, scratch, 0, count);
    reduce(buf, scratch, into.start, count, 0);
  }
  if (op === 'avg') {
    const own = segs[t.rank]!;
    for (let i = own.start; i < own.end; i++) buf[i]! /= n;
  }
}

/**
 * The ring all-gather on the int8 wire: each owner encodes its segment once and keeps the decoded
 * values; the blocks then travel unchanged (forwarded as received), and every rank decodes the same.
 */
async function int8AllGather(t: RingTransport, buf: Float32Array, segs: Segment[], stepBase: number): Promise<void> {
  const n = t.worldSize;
  const blocks: Uint8Array[] = new Array<Uint8Array>(n);
  const own = segs[t.rank]!;
  blocks[t.rank] = encodeInt8(buf.subarray(own.start, own.end));
  decodeInt8(blocks[t.rank]!, buf, own.start, own.end - own.start);
  for (let s = 0; s < n - 1; s++) {
    const { send, recv } = allGatherStep(t.rank, n, s);
    const into = segs[recv]!;
    const [, incoming] = await Promise.all([
      t.send(rightOf(t.rank, n), stepBase + s, blocks[send]!),
      receiveWhole(t, leftOf(t.rank, n), stepBase + s, int8Bytes(into.end - into.start)),
    ]);
    blocks[recv] = incoming;
    decodeInt8(incoming, buf, into.start, into.end - into.start);
  }
}

/** Copies `src`'s bytes into everyone's `bytes`, passing each chunk on along the ring as it arrives. */
export async function ringBroadcast(t: RingTransport, bytes: Uint8Array, src: number): Promise<void> {
  const right = rightOf(t.rank, t.worldSize);
  if (t.rank === src) return t.send(right, 0, bytes);
  const forward = right === src ? undefined : await t.forward(right);
  let chain = Promise.resolve();
  await t.recv(leftOf(t.rank, t.worldSize), 0, bytes.length, (payload, offset, frame) => {
    bytes.set(payload, offset);
    if (forward) chain = chain.then(() => forward(frame));
  });
  await chain;
}

type Reduce = (acc: Float32Array, incoming: Float32Array, at: number, count: number, from: number) => void;

/** acc[at + i] = op(acc[at + i], incoming[from + i]) for i in [0, count). */
export function reducer(op: ReduceOpName): Reduce {
  switch (op) {
    case 'sum':
    case 'avg':
      return (acc, inc, at, count, from) => {
        for (let i = 0; i < count; i++) acc[at + i]! += inc[from + i]!;
      };
    case 'max':
      return (acc, inc, at, count, from) => {
        for (let i = 0; i < count; i++) acc[at + i] = Math.max(acc[at + i]!, inc[from + i]!);
      };
    case 'min':
      return (acc, inc, at, count, from) => {
        for (let i = 0; i < count; i++) acc[at + i] = Math.min(acc[at + i]!, inc[from + i]!);
      };
    default: {
      const unknown: never = op;
      throw new RangeError(`unknown reduce op ${String(unknown)}`);
    }
  }
}

/** The bytes of `buf` (or of one segment of it), without a copy. */
export function asBytes(buf: Float32Array, seg?: Segment): Uint8Array {
  const start = seg ? seg.start : 0;
  const end = seg ? seg.end : buf.length;
  return new Uint8Array(buf.buffer, buf.byteOffset + start * 4, (end - start) * 4);
}

/** A Float32 view of a payload; copies only when the payload is not 4-byte aligned. */
function asFloats(payload: Uint8Array): Float32Array {
  if (payload.byteOffset % 4 === 0) return new Float32Array(payload.buffer, payload.byteOffset, payload.length / 4);
  return new Float32Array(payload.slice().buffer);
}

/** A Uint16 view of a payload; copies only when the payload is not 2-byte aligned. */
export function asHalves(payload: Uint8Array): Uint16Array {
  if (payload.byteOffset % 2 === 0) return new Uint16Array(payload.buffer, payload.byteOffset, payload.length / 2);
  return new Uint16Array(payload.slice().buffer);
}

/** A chunk handler that copies each chunk into `target` from element `startElement` on. */
export function copyInto(target: Float32Array, startElement: number): (payload: Uint8Array, offset: number) => void {
  const bytes = new Uint8Array(target.buffer, target.byteOffset, target.byteLength);
  return (payload, offset) => bytes.set(payload, startElement * 4 + offset);
}
