/**
 * `ProcessGroup.gatherRows`'s exchange: per-rank rows gathered through the server (the store's
 * `gather`), which places each row at the rank of the member that sent it, so row r says what
 * rank r sent (server-attested), unlike a collective over the peer links that others forward.
 */
import { GroupClosedError, StoreError } from '../wire/errors.ts';
import { ErrorCode } from '../wire/protocol.ts';
import type { StoreClient } from './store.ts';

/** What one gather is: round `round`'s rows named `tag`, for a group of `worldSize`. */
export interface RowsGather {
  client: StoreClient;
  round: number;
  tag: string;
  worldSize: number;
  timeoutMs: number;
  /** Rejects once the group breaks: the gather stops waiting then. */
  broken: Promise<never>;
}

/** Every rank's row, in rank order; GroupClosedError when the round ended under the gather. */
export async function gatherRowsThroughServer(g: RowsGather, row: readonly number[]): Promise<number[][]> {
  const rows = await Promise.race([
    g.client.gather(g.round, g.tag, [...row], g.timeoutMs).catch((err: unknown) => {
      // The round ended under it (a rank left, a new round formed): the next round goes on, as after a lost peer.
      if (err instanceof StoreError && err.code === ErrorCode.GATHER_ABORTED) throw new GroupClosedError(err.message);
      throw err;
    }),
    g.broken,
  ]);
  if (rows.length !== g.worldSize)
    throw new Error(`gather "${g.tag}" of round ${g.round} came back with ${rows.length} rows for a group of ${g.worldSize}`);
  return rows;
}
