/**
 * What each collective of `ProcessGroup` exchanges over a transport, once the group has chosen
 * its algorithm and taken its sequence number: the algorithms themselves are in ring.ts,
 * latency_collectives.ts and mesh_gather.ts; this module picks among them per collective and
 * lays out the blocks. Every rank runs the same code on the same inputs, so all end with the
 * same bits.
 */
import type { ReduceOpName } from '../wire/framing.ts';
import type { WireDtype } from '../wire/half.ts';
import { asBytes, reducer, ringAllGather, ringBroadcast, ringReduceScatter, segments, type RingTransport } from './ring.ts';
import { bruckAllGather, doublingAllReduce, treeAllReduce, treeBroadcast, type AllReduceAlgorithm } from './latency_collectives.ts';
import { meshExchange } from './mesh_gather.ts';

/** Blocks of `k` elements, one per rank, in rank order. */
function rankBlocks(n: number, k: number): { start: number; end: number }[] {
  return Array.from({ length: n }, (_, i) => ({ start: i * k, end: (i + 1) * k }));
}

/** All-reduce of `buf` in place: a ring reduce-scatter + all-gather, a tree, or recursive doubling. */
export async function allReduceExchange(
  t: RingTransport,
  buf: Float32Array,
  op: ReduceOpName,
  wire: WireDtype,
  algorithm: AllReduceAlgorithm,
): Promise<Float32Array> {
  if (algorithm !== 'ring') {
    await (algorithm === 'tree' ? treeAllReduce : doublingAllReduce)(t, buf, op, wire);
    return buf;
  }
  const segs = segments(buf.length, t.worldSize);
  await ringReduceScatter(t, buf, segs, op, wire);
  await ringAllGather(t, buf, segs, t.worldSize - 1, wire);
  return buf;
}

/** The full-mesh reduction: every rank's whole buffer to every other, reduced in rank order. */
export async function meshReduceExchange(t: RingTransport, buf: Float32Array, op: ReduceOpName): Promise<Float32Array> {
  const n = t.worldSize;
  const parts = await meshExchange(t, buf);
  // The same order (rank 0, 1, ...) on every rank gives bit-identical results.
  buf.set(parts[0]!);
  const reduce = reducer(op);
  for (let r = 1; r < n; r++) reduce(buf, parts[r]!, 0, buf.length, 0);
  if (op === 'avg') for (let i = 0; i < buf.length; i++) buf[i]! /= n;
  return buf;
}

/** `src`'s `buf` to every rank: pipelined along the ring, or down a binomial tree. */
export async function broadcastExchange(
  t: RingTransport,
  buf: Float32Array,
  src: number,
  algorithm: AllReduceAlgorithm,
): Promise<Float32Array> {
  await (algorithm === 'ring' ? ringBroadcast(t, asBytes(buf), src) : treeBroadcast(t, asBytes(buf), src));
  return buf;
}

/** Fills `out` (this rank's block already in place) with every rank's block: around the ring, or Bruck's. */
export async function allGatherExchange(
  t: RingTransport,
  out: Float32Array,
  blockLength: number,
  algorithm: AllReduceAlgorithm,
): Promise<Float32Array> {
  if (algorithm === 'doubling') {
    await bruckAllGather(t, out, blockLength);
    return out;
  }
  // Rank r starts owning block r: the all-gather half of the ring does the rest.
  await ringAllGather(t, out, rankBlocks(t.worldSize, blockLength));
  return out;
}

/** Reduces `work` (worldSize blocks of `k`) across ranks around the ring; returns a copy of this rank's block. */
export async function reduceScatterExchange(t: RingTransport, work: Float32Array, k: number, op: ReduceOpName): Promise<Float32Array> {
  await ringReduceScatter(t, work, rankBlocks(t.worldSize, k), op);
  return work.slice(t.rank * k, (t.rank + 1) * k);
}
