/**
 * The RPC group's workers by name (torch's WorkerInfo): each worker says its own name to every
 * other at start, over its own link, so a name always comes from the worker it names.
 */
import type { WorkerInfo } from './rref.ts';

export class WorkerNames {
  private readonly names: Array<string | undefined>;

  constructor(
    readonly rank: number,
    readonly worldSize: number,
    name: string,
  ) {
    this.names = Array.from({ length: worldSize }, (_, r) => (r === rank ? name : undefined));
  }

  /** Rank `from` said its name; only its first word counts. */
  heard(from: number, name: string): void {
    if (this.names[from] === undefined) this.names[from] = name;
  }

  get complete(): boolean {
    return this.names.every((n) => n !== undefined);
  }

  /** The ranks whose names are still unknown. */
  missing(): number[] {
    return this.names.flatMap((n, r) => (n === undefined ? [r] : []));
  }

  /** Throws if two workers took one name. */
  checkUnique(): void {
    const seen = new Map<string, number>();
    for (const [rank, name] of this.names.entries()) {
      if (seen.has(name!))
        throw new RangeError(`workers ${seen.get(name!)} and ${rank} are both named "${name}": give each worker its own name`);
      seen.set(name!, rank);
    }
  }

  all(): WorkerInfo[] {
    return this.names.map((name, id) => ({ name: name ?? `rank ${id}`, id }));
  }

  byName(name: string): WorkerInfo {
    const id = this.names.indexOf(name);
    if (id < 0) throw new RangeError(`no RPC worker is named "${name}" (workers: ${this.names.join(', ')})`);
    return { name, id };
  }

  byRank(rank: number): WorkerInfo {
    return { name: this.names[rank] ?? `rank ${rank}`, id: rank };
  }

  /** A worker given by name, rank or WorkerInfo, as its rank; throws if it is not in the group. */
  rankOf(to: string | number | WorkerInfo): number {
    const rank = typeof to === 'number' ? to : typeof to === 'string' ? this.byName(to).id : to.id;
    if (!Number.isInteger(rank) || rank < 0 || rank >= this.worldSize)
      throw new RangeError(`RPC worker ${String(rank)} is outside the group of ${this.worldSize} workers`);
    return rank;
  }
}
