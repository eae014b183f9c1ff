/**
 * The exchange robust aggregation needs: every rank holds every rank's own contribution, as that
 * rank sent it. `ProcessGroup.meshAllGather` sends each rank's block straight to every other over
 * their own link (c10d/mesh_gather.ts): no rank forwards another's block, so none can alter it on
 * the way, as a ring's relays could (a ring all-gather passes each block through N-2 ranks).
 *
 * Bytes per step per rank, for G values: (N-1) x (4G + 4 + headers) (the block and a presence
 * flag; `meshAllGatherBytes(G + 1, N)` in c10d/collective_bytes.ts), against a ring all-reduce's
 * 2(N-1)/N x 4G: N/2 times the ring's (2x at 4 ranks, 16x at 32). Latency: one message from each
 * peer, all at once, instead of the ring's 2(N-1) in a row.
 *
 * Each block carries a presence flag after the values: 0 says "no contribution this step" (a
 * rank that trained no samples), anything else that the values are one. The flag is the rank's
 * own word about itself, which is all it can hurt. A digest of each block as received (hash.ts's
 * digest48, two 24-bit halves, exact in float32) lets a caller compare what it received with what
 * each rank published elsewhere (an equivocating rank sends different blocks to different peers).
 */
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { digest48 } from '../../hash.ts';

export interface GatheredContributions {
  /** Each rank's contribution, in rank order; null where the rank sent none (its flag was 0). */
  blocks: Array<Float32Array | null>;
  /** digest48 of each rank's whole block (values and flag) as this rank holds it; this rank's own included. */
  digests: Array<readonly [number, number]>;
}

/** Collective: gathers every rank's `values` of `numel` values (null: this rank contributes none this step). */
export async function gatherContributions(pg: ProcessGroup, values: Float32Array | null, numel: number): Promise<GatheredContributions> {
  if (values !== null && values.length !== numel) throw new RangeError(`gatherContributions: ${values.length} values, the contribution has ${numel}`);
  const block = new Float32Array(numel + 1);
  if (values !== null) {
    block.set(values);
    block[numel] = 1;
  }
  const received = await pg.meshAllGather(block);
  const digests = received.map((b) => digest48([new Uint8Array(b.buffer, b.byteOffset, b.byteLength)]));
  const blocks = received.map((b) => (b[numel] === 0 ? null : b.subarray(0, numel)));
  return { blocks, digests };
}
