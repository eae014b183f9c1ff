/**
 * A session: one namespace of the store plus one group of ranks (rendezvous). Nothing in one
 * session can read or change another's keys or reach its members.
 */
import { ErrorCode } from '../src/protocol.ts';
import { KeyValueStore, StoreRefusal, type StoreQuota } from './store.ts';
import { ElasticGroup } from './elastic.ts';

/** What the session needs from a member's connection: a way to send it an event. */
export interface Member {
  send(message: object): void;
}

export class Session {
  readonly store: KeyValueStore;
  /** The group's world size, fixed by the first join and forgotten when the last member leaves. */
  worldSize: number | undefined;
  readonly members = new Map<number, Member>();
  /** Set once the first member uses elastic rendezvous; a session is either fixed or elastic. */
  elastic: ElasticGroup | undefined;
  /** Sockets attached to this session (members or store-only clients). */
  connections = 0;
  idleSince = Date.now();

  constructor(
    readonly name: string,
    quota: StoreQuota,
  ) {
    this.store = new KeyValueStore(quota);
  }

  /**
   * Rendezvous: admits a member with an explicit rank or the lowest free one. Refusals say which
   * rule was broken: world size mismatch, rank out of range, duplicate rank, full session.
   * The caller replies to the joiner and then calls `broadcastMembers`.
   */
  join(member: Member, worldSize: number, rank: number | undefined): number {
    if (this.elastic) {
      throw new StoreRefusal(
        ErrorCode.ELASTIC_MISMATCH,
        `session "${this.name}" is elastic (${this.elastic.options.min}..${this.elastic.options.max} ranks); join it with min and max, not a fixed world size`,
      );
    }
    if (this.worldSize !== undefined && this.worldSize !== worldSize) {
      throw new StoreRefusal(
        ErrorCode.WORLD_SIZE_MISMATCH,
        `session "${this.name}" has world size ${this.worldSize}, but this rank asked for ${worldSize}`,
        { sessionWorldSize: this.worldSize, requested: worldSize },
      );
    }
    if (rank !== undefined && (rank < 0 || rank >= worldSize)) {
      throw new StoreRefusal(
        ErrorCode.RANK_OUT_OF_RANGE,
        `rank ${rank} is outside 0..${worldSize - 1} for world size ${worldSize}`,
        { rank, worldSize },
      );
    }
    if (this.members.size >= worldSize) {
      throw new StoreRefusal(
        ErrorCode.SESSION_FULL,
        `session "${this.name}" is full: all ${worldSize} ranks have joined`,
        { worldSize },
      );
    }
    if (rank !== undefined && this.members.has(rank)) {
      throw new StoreRefusal(ErrorCode.DUPLICATE_RANK, `rank ${rank} has already joined session "${this.name}"`, {
        rank,
      });
    }
    let assigned = rank;
    if (assigned === undefined) {
      assigned = 0;
      while (this.members.has(assigned)) assigned++;
    }
    this.worldSize = worldSize;
    this.members.set(assigned, member);
    return assigned;
  }

  /** A member's socket closed: tell the rest, and forget the world size once nobody is left. */
  leave(rank: number): void {
    if (!this.members.delete(rank)) return;
    for (const m of this.members.values()) m.send({ type: 'peer-left', rank });
    if (this.members.size === 0) this.worldSize = undefined;
    else this.broadcastMembers();
  }

  memberAt(rank: number): Member | undefined {
    return this.elastic ? this.elastic.memberAtRank(rank) : this.members.get(rank);
  }

  /** Elastic rendezvous: the first caller fixes min and max for the session. */
  rendezvous(member: Member, min: number, max: number, settleMs: number, log: (line: string) => void): number {
    if (this.worldSize !== undefined) {
      throw new StoreRefusal(ErrorCode.ELASTIC_MISMATCH, `session "${this.name}" has a fixed world size of ${this.worldSize}; it cannot be joined elastically`);
    }
    if (!this.elastic || this.elastic.size === 0) {
      this.elastic?.close();
      this.elastic = new ElasticGroup({ min, max, settleMs }, this.name, log);
    }
    return this.elastic.admit(member, min, max);
  }

  /** Tells every member who is in the group (after the joiner has had its reply). */
  broadcastMembers(): void {
    const ranks = [...this.members.keys()].sort((a, b) => a - b);
    const event = { type: 'members', worldSize: this.worldSize, ranks };
    for (const m of this.members.values()) m.send(event);
  }
}
