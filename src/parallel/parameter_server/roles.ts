/**
 * Who serves which parameter shard and who works, in a round (pure: the runner reads the places
 * from the server, and exchanges `RoleClaim`s in one all-gather). A server place is held on the
 * server for a member (`StoreClient.claim`), so a tab cannot serve a place it does not hold; a
 * worker is its member id, as the server tells every rank.
 */

/** What a rank says at the start of a round: it has no place (new, or back with a new member id), and the place it served before (-1: none). */
export interface RoleClaim {
  isNew: boolean;
  wasServer: number;
}

/**
 * The places' holders the ranks agree on: the holders read from the server (`before`, member
 * ids, -1 vacant) with each vacant place given to a new rank: a server back from a lost
 * connection to its own place first, then the others in rank order. The ranks then take the
 * places they were given and check that the server holds exactly this.
 */
export function assignPlaces(before: readonly number[], claims: readonly RoleClaim[], members: readonly number[]): number[] {
  const intended = [...before];
  const placed = new Set<number>();
  const newRanks = claims.flatMap((c, r) => (c.isNew ? [r] : []));
  const give = (k: number, r: number | undefined) => {
    if (r === undefined || intended[k] !== -1) return;
    intended[k] = members[r]!;
    placed.add(r);
  };
  for (let k = 0; k < intended.length; k++)
    give(
      k,
      newRanks.find((r) => !placed.has(r) && claims[r]!.wasServer === k),
    );
  for (let k = 0; k < intended.length; k++)
    give(
      k,
      newRanks.find((r) => !placed.has(r)),
    );
  return intended;
}

/**
 * The round's roles from the places' holders: each place's rank (-1: its holder is not in this
 * round, or nobody holds it) and the workers (every other rank), by worker id.
 */
export function rolesOf(
  holders: readonly number[],
  members: readonly number[],
): { serverRank: number[]; workers: Array<{ workerId: number; rank: number }> } {
  const rankOf = new Map(members.map((m, r) => [m, r]));
  const serverRank = holders.map((h) => rankOf.get(h) ?? -1);
  const serving = new Set(serverRank);
  const workers = members.flatMap((workerId, rank) => (serving.has(rank) ? [] : [{ workerId, rank }]));
  workers.sort((a, b) => a.workerId - b.workerId);
  return { serverRank, workers };
}

/** RoleClaims as one float32 row per rank (for the all-gather), and back. Anything malformed reads as "not new". */
export function encodeClaim(c: RoleClaim): Float32Array {
  return Float32Array.of(c.isNew ? 1 : 0, c.wasServer);
}

export function decodeClaims(all: Float32Array, worldSize: number): RoleClaim[] {
  return Array.from({ length: worldSize }, (_, r) => {
    const wasServer = all[2 * r + 1]!;
    return { isNew: all[2 * r] === 1, wasServer: Number.isSafeInteger(wasServer) && wasServer >= 0 ? wasServer : -1 };
  });
}

/** What a tab is in a round: parameter server `index`, or a worker. */
export type Role = { kind: 'server'; index: number } | { kind: 'worker' };
