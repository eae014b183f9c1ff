/**
 * Subgroups (`ProcessGroup.newGroup`, torch's `dist.new_group`): which ranks a new one may have,
 * and a group's members, its ranks as ranks of the top-level group, named in messages so that a
 * subgroup's rank is never mistaken for a top-level one.
 */
import type { SharedLinks } from '../transport/shared_links.ts';
import type { Store } from './store_interface.ts';

/**
 * How `newGroup` makes a subgroup. Internal: users call `newGroup`. It carries what the subgroup
 * takes from its parent, not the parent itself, so this module does not import the process group.
 */
export interface SubgroupSpec {
  /** The parent's links, liveness and frame routing, which the subgroup runs over. */
  shared: SharedLinks;
  /** The subgroup's store: a prefix under its parent's. */
  store: Store;
  id: number;
  /** The members' top-level ranks, sorted. */
  ranks: readonly number[];
}

/**
 * The members of a new subgroup, sorted. Throws a RangeError saying what is wrong with `ranks`
 * and what is allowed: an empty list, a non-integer, a rank outside 0..worldSize-1, a duplicate.
 */
export function subgroupRanks(ranks: readonly number[], worldSize: number): number[] {
  const allowed = `ranks of the group, integers in 0..${worldSize - 1}, each at most once`;
  if (!Array.isArray(ranks)) throw new RangeError(`newGroup takes an array of ${allowed}; got ${String(ranks)}`);
  if (ranks.length === 0) throw new RangeError(`newGroup needs at least one rank; the list is empty (allowed: ${allowed})`);
  for (const [i, r] of ranks.entries()) {
    if (!Number.isInteger(r))
      throw new RangeError(`newGroup got ${JSON.stringify(r) ?? String(r)} at index ${i}, not an integer (allowed: ${allowed})`);
    if (r < 0 || r >= worldSize)
      throw new RangeError(`newGroup got rank ${r} at index ${i}, outside 0..${worldSize - 1} (allowed: ${allowed})`);
  }
  const sorted = [...ranks].sort((a, b) => a - b);
  for (let i = 1; i < sorted.length; i++) {
    if (sorted[i] === sorted[i - 1])
      throw new RangeError(`newGroup got rank ${sorted[i]} more than once in [${ranks.join(', ')}] (allowed: ${allowed})`);
  }
  return sorted;
}

/** A group's members: group rank i is top-level rank `ranks[i]`. */
export class GroupMembers {
  /** The members' top-level ranks, in group-rank order (frozen). */
  readonly ranks: readonly number[];
  /** " in subgroup 1 [1, 3]", for messages; empty for the top-level group. */
  readonly label: string;
  private readonly set: ReadonlySet<number>;

  /** `groupId` 0 is the top-level group, whose ranks are 0, 1, ..., worldSize - 1. */
  constructor(
    readonly groupId: number,
    ranks: readonly number[],
  ) {
    this.ranks = Object.freeze([...ranks]);
    this.set = new Set(this.ranks);
    this.label = groupId === 0 ? '' : ` in subgroup ${groupId} [${this.ranks.join(', ')}]`;
  }

  /** Whether top-level rank `rank` is a member. */
  has(rank: number): boolean {
    return this.set.has(rank);
  }

  describe(): string {
    return this.groupId === 0 ? 'the top-level group' : `subgroup ${this.groupId} [${this.ranks.join(', ')}]`;
  }

  /** Group rank `r` in words: "rank 3 (rank 1 of subgroup 2 [1, 3])" in a subgroup. */
  who(r: number): string {
    return this.groupId === 0 ? `rank ${r}` : `rank ${this.ranks[r]} (rank ${r} of ${this.describe()})`;
  }

  /** Throws a RangeError unless `r` is a group rank (`what` names the argument). */
  checkRank(r: number, what: string): void {
    const worldSize = this.ranks.length;
    if (!Number.isInteger(r) || r < 0 || r >= worldSize) {
      const of = this.groupId === 0 ? '' : ` of ${this.describe()} (group ranks, not top-level ranks)`;
      throw new RangeError(`${what} must be a rank${of} in 0..${worldSize - 1}, got ${r}`);
    }
  }

  /** The top-level rank of group rank `groupRank`; RangeError if it is not one. */
  globalRank(groupRank: number): number {
    this.checkRank(groupRank, 'groupRank');
    return this.ranks[groupRank]!;
  }

  /** The group rank of top-level rank `globalRank`; RangeError if it is not a member. */
  groupRank(globalRank: number): number {
    const r = this.ranks.indexOf(globalRank);
    if (r < 0)
      throw new RangeError(`rank ${globalRank} is not a member of ${this.describe()}; its top-level ranks are [${this.ranks.join(', ')}]`);
    return r;
  }

  /** `checkRank`, and `r` must not be `self` (this rank's group rank). */
  checkPeer(r: number, self: number, what: string): void {
    this.checkRank(r, what);
    if (r === self) throw new RangeError(`${what} must be another rank, got this rank's own (${r})`);
  }
}
