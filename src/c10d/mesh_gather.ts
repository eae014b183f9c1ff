/**
 * The direct all-gather (`ProcessGroup.meshAllGather`): every rank sends its own block straight
 * to every other rank over their own link, and receives each other rank's block from that rank.
 * No block passes through a third rank, so none can be altered on the way (a ring all-gather
 * forwards every block through N-2 relays). The price is bandwidth: (N-1) x the block sent per
 * rank, against 2(N-1)/N x for a ring all-reduce (collective_bytes.ts's meshAllGatherBytes).
 */
import { asBytes, copyInto, type RingTransport } from './ring.ts';

/** Sends `input` to every peer and receives each peer's block: the blocks in rank order (this rank's a copy). */
export async function meshExchange(t: RingTransport, input: Float32Array): Promise<Float32Array[]> {
  const n = t.worldSize;
  const blocks: Float32Array[] = Array.from({ length: n }, (_, r) => (r === t.rank ? input.slice() : new Float32Array(input.length)));
  const peers = Array.from({ length: n }, (_, r) => r).filter((r) => r !== t.rank);
  const bytes = asBytes(input);
  await Promise.all([
    ...peers.map((p) => t.send(p, 0, bytes)),
    ...peers.map((p) => t.recv(p, 0, input.length * 4, copyInto(blocks[p]!, 0))),
  ]);
  return blocks;
}
