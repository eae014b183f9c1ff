/**
 * Elastic rendezvous on the server (torchrun's c10d rendezvous handler): members come and go,
 * and the group moves through generations. Each generation is a fixed set of ranks 0..n-1; a
 * change of membership makes a new generation, never a changed one.
 *
 * - The first generation forms once `max` members have arrived, or `min` have and no one else
 *   arrived for `settleMs`.
 * - A member lost (socket closed, or no frame for the heartbeat timeout) makes a new generation
 *   at once from the rest; with fewer than `min` it is paused.
 * - A member arriving while a generation runs waits; the running members are told, finish their
 *   step, and ask to `regroup`, which admits it. Past `max` members, arrivals are refused.
 * Survivors keep their order, so ranks stay contiguous and rank 0 stays rank 0 when it survives.
 */
import { ErrorCode, type GenerationEvent } from '../src/protocol.ts';
import { StoreRefusal } from './store.ts';
import type { Member } from './session.ts';

export interface ElasticOptions {
  min: number;
  max: number;
  /** Wait this long for more members once `min` are there, before the first generation. */
  settleMs: number;
}

export class ElasticGroup {
  gen = 0;
  /** Member ids in rank order in the current generation. */
  active: number[] = [];
  /** Member ids waiting for the next generation, in arrival order. */
  waiting: number[] = [];
  paused = false;
  private nextId = 1;
  private readonly members = new Map<number, Member>();
  private settleTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    readonly options: ElasticOptions,
    private readonly sessionName: string,
    private readonly log: (line: string) => void,
  ) {}

  get size(): number {
    return this.members.size;
  }

  /** Admits a member; the generation that includes it is announced by event. */
  admit(member: Member, min: number, max: number): number {
    if (min !== this.options.min || max !== this.options.max) {
      throw new StoreRefusal(
        ErrorCode.ELASTIC_MISMATCH,
        `session "${this.sessionName}" is elastic with ${this.options.min}..${this.options.max} ranks, but this tab asked for ${min}..${max}`,
        { min: this.options.min, max: this.options.max },
      );
    }
    if (this.members.size >= max) {
      throw new StoreRefusal(ErrorCode.SESSION_FULL, `session "${this.sessionName}" is full: it already has its maximum of ${max} ranks`, { max });
    }
    const id = this.nextId++;
    this.members.set(id, member);
    this.waiting.push(id);
    if (this.gen === 0) {
      if (this.members.size >= max) this.form('all ranks arrived');
      else if (this.members.size >= min) this.settleSoon();
    } else if (this.paused) {
      if (this.members.size >= min) this.form(`enough ranks again (${this.members.size})`);
    } else {
      for (const m of this.activeMembers()) m.send({ type: 'join-pending', gen: this.gen, waiting: this.waiting.length });
    }
    return id;
  }

  /** A member left (its socket closed, or it was evicted). */
  remove(id: number, why: string): void {
    if (!this.members.delete(id)) return;
    const rank = this.active.indexOf(id);
    this.waiting = this.waiting.filter((w) => w !== id);
    if (rank < 0) return;
    this.active = this.active.filter((a) => a !== id);
    // Tell the running generation whom it lost (by rank) before announcing the next one.
    if (!this.paused) for (const m of this.activeMembers()) m.send({ type: 'peer-left', rank, reason: why });
    this.form(`rank ${rank} ${why}`);
  }

  /** A running generation's members ask to admit the waiting ones at a step boundary. */
  regroup(fromGen: number): number {
    if (fromGen === this.gen && this.waiting.length > 0 && !this.paused) this.form('admitting waiting ranks');
    return this.gen;
  }

  /** The rank of a member in the current generation, if it has one. */
  rankOf(id: number): number | undefined {
    const r = this.active.indexOf(id);
    return r < 0 ? undefined : r;
  }

  memberAtRank(rank: number): Member | undefined {
    const id = this.active[rank];
    return id === undefined ? undefined : this.members.get(id);
  }

  close(): void {
    if (this.settleTimer) clearTimeout(this.settleTimer);
  }

  private activeMembers(): Member[] {
    return this.active.map((id) => this.members.get(id)).filter((m): m is Member => m !== undefined);
  }

  private settleSoon(): void {
    if (this.settleTimer) clearTimeout(this.settleTimer);
    this.settleTimer = setTimeout(() => {
      this.settleTimer = undefined;
      if (this.gen === 0 && this.members.size >= this.options.min) this.form(`${this.members.size} ranks arrived and ${this.options.settleMs} ms passed`);
    }, this.options.settleMs);
  }

  /** Makes the next generation from the survivors (in order) and then the waiting members. */
  private form(why: string): void {
    if (this.settleTimer) {
      clearTimeout(this.settleTimer);
      this.settleTimer = undefined;
    }
    const everyone = [...this.active, ...this.waiting].filter((id) => this.members.has(id));
    this.gen++;
    this.paused = everyone.length < this.options.min;
    this.active = this.paused ? everyone : everyone.slice(0, this.options.max);
    this.waiting = this.paused ? [] : everyone.slice(this.options.max);
    const worldSize = this.active.length;
    this.log(
      `[server] session "${this.sessionName}": generation ${this.gen}, ${worldSize} rank(s)${this.paused ? `, paused below the minimum of ${this.options.min}` : ''} (${why})`,
    );
    for (const [id, m] of this.members) {
      const event: GenerationEvent = {
        type: 'generation',
        gen: this.gen,
        rank: this.paused ? -1 : this.active.indexOf(id),
        worldSize: this.paused ? 0 : worldSize,
        members: this.paused ? [] : this.active,
        paused: this.paused,
        min: this.options.min,
        max: this.options.max,
      };
      m.send(event);
    }
  }
}
