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
 * own word about itself, which is all it can hurt.
 *
 * A rank could still send different blocks to different peers (equivocate), and the ranks would
 * then aggregate different inputs and drift apart. So each rank also publishes the digest of the
 * block it sends (hash.ts's digest48) through the server (`pg.gatherRows`, which places each row
 * at its sender's rank and gives every rank the same rows), at the same time as the exchange: a
 * block whose digest is not its sender's published one fails the step with
 * ContributionMismatchError, naming the sender. Every rank that completes the step aggregated
 * the very blocks their senders published. Cost: one round trip to the server, overlapping the
 * exchange (top-level groups only; the server knows no subgroup's ranks).
 */
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { ContributionMismatchError } from '../../wire/errors.ts';
import { digest48 } from '../../wire/hash.ts';

export interface GatheredContributions {
  /** Each rank's contribution, in rank order; null where the rank sent none (its flag was 0). */
  blocks: Array<Float32Array | null>;
  /** digest48 of each rank's whole block (values and flag) as this rank holds it; this rank's own included. */
  digests: Array<readonly [number, number]>;
}

/**
 * Collective: gathers every rank's `values` of `numel` values (null: this rank contributes none
 * this step), each checked against the digest its sender published. `step` names the step in errors.
 */
export async function gatherContributions(
  pg: ProcessGroup,
  values: Float32Array | null,
  numel: number,
  step = -1,
): Promise<GatheredContributions> {
  if (values !== null && values.length !== numel)
    throw new RangeError(`gatherContributions: ${values.length} values, the contribution has ${numel}`);
  const block = new Float32Array(numel + 1);
  if (values !== null) {
    block.set(values);
    block[numel] = 1;
  }
  const digestOf = (b: Float32Array) => digest48([new Uint8Array(b.buffer, b.byteOffset, b.byteLength)]);
  const published = pg.groupId === 0 ? pg.gatherRows(digestOf(block)) : null;
  published?.catch(() => {});
  const received = await pg.meshAllGather(block);
  const digests = received.map(digestOf);
  if (published) {
    const rows = await published;
    for (let r = 0; r < digests.length; r++) {
      const row = rows[r]!;
      if (row.length === 2 && row[0] === digests[r]![0] && row[1] === digests[r]![1]) continue;
      throw new ContributionMismatchError(
        `rank ${r}'s contribution to step ${step} as rank ${pg.rank} received it is not the one rank ${r} published through the server: it sent different values to different ranks (or its link altered them). The step fails here rather than leave this replica different from the others'; the host can remove rank ${r}'s tab`,
        r,
        step,
      );
    }
  }
  const blocks = received.map((b) => (b[numel] === 0 ? null : b.subarray(0, numel)));
  return { blocks, digests };
}
