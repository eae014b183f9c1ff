/**
 * A session: one namespace of the store plus one group of ranks (its rendezvous). Nothing in one
 * session can read or change another's keys or reach its members.
 */
import { ErrorCode, MAX_CLAIMS_PER_MEMBER, MAX_CLAIMS_PER_SESSION, type RequestFields } from '../src/wire/protocol.ts';
import { KeyValueStore, StoreRefusal, type StoreQuota } from './store.ts';
import type { SessionStore } from './session_store.ts';
import { Rendezvous, type Participant, type RendezvousOptions } from './rendezvous.ts';

export class Session {
  /** In memory (the default) or on the shared engine (`--store`; engine_store.ts). */
  readonly store: SessionStore;
  /**
   * The group; its size range is fixed by the first member and forgotten when the last leaves,
   * unless a rank closed it (the run ended): then it refuses arrivals until the session is dropped.
   */
  rendezvous: Rendezvous | undefined;
  /** Sockets attached to this session (members or store-only clients). */
  connections = 0;
  idleSince = Date.now();
  /** The host ended the session: every request to it is refused (SESSION_ENDED) until it is dropped. */
  ended = false;
  /** The minimum the host set (`control` 'min'): kept for the next group when this one empties. */
  minOverride: number | undefined;
  /** Places held by members (`claim`): key -> member id. A holder no longer in the group frees its place. */
  private readonly claims = new Map<string, number>();
  /** When another member of the round last heard each member over its peer links (heartbeat `heard`). */
  private readonly vouched = new Map<number, number>();

  constructor(
    readonly name: string,
    quota: StoreQuota,
    store?: SessionStore,
  ) {
    this.store = store ?? new KeyValueStore(quota);
  }

  /** Admits a member to the group (see Rendezvous.admit for the refusals); returns its member id. */
  join(
    participant: Participant,
    request: RequestFields['rendezvous'],
    timing: Omit<RendezvousOptions, 'min' | 'max'>,
    log: (line: string) => void,
  ): number {
    // A closed rendezvous stays, empty or not: it refuses every arrival (the run is over).
    if (!this.rendezvous || (this.rendezvous.size === 0 && !this.rendezvous.closedBy)) {
      this.rendezvous?.close();
      this.rendezvous = new Rendezvous(
        { min: request.min, max: request.max, ...timing },
        this.name,
        log,
        this.rendezvous?.round ?? 0,
        this.rendezvous?.nextMemberId ?? 1,
      );
      // The host's choice outlives a group that emptied (every tab reloading), where it still fits.
      if (this.minOverride !== undefined && this.minOverride <= request.max) this.rendezvous.min = this.minOverride;
    }
    return this.rendezvous.admit(participant, request);
  }

  /**
   * Member `voucher`, ranked in round `round`, heard `ranks` of that round over its peer links
   * just now: they count as alive at `now` (see `lastVouched`). Anything about another round, or
   * from a member without a rank in it, is ignored: only the round's members speak for each other.
   */
  vouch(voucher: number, round: number, ranks: readonly number[], now: number): void {
    const rv = this.rendezvous;
    if (!rv || round !== rv.round || rv.rankOf(voucher) === undefined) return;
    for (const rank of ranks) {
      const id = rv.memberAt(rank);
      if (id !== undefined && id !== voucher) this.vouched.set(id, now);
    }
    // Bounded by the round's size: members that left are forgotten.
    if (this.vouched.size > 2 * rv.size + 8) for (const id of this.vouched.keys()) if (!rv.isMember(id)) this.vouched.delete(id);
  }

  /** When member `id` was last heard by another member of its round, if ever. */
  lastVouched(id: number): number | undefined {
    return this.vouched.get(id);
  }

  /**
   * Each key's live holder (-1: vacant); with `take`, member `memberId` first takes the first
   * vacant key, unless it holds one of them already. Only the server writes places, so a member
   * can neither take a held one nor say it holds one it does not.
   */
  claim(memberId: number, keys: readonly string[], take: boolean): number[] {
    const live = (id: number | undefined): id is number => id !== undefined && this.rendezvous?.isMember(id) === true;
    const holders = keys.map((k) => {
      const id = this.claims.get(k);
      return live(id) ? id : -1;
    });
    if (take && !holders.includes(memberId)) {
      const vacant = holders.indexOf(-1);
      if (vacant >= 0) {
        const key = keys[vacant]!;
        const held = [...this.claims.values()].filter((id) => id === memberId).length;
        if (held >= MAX_CLAIMS_PER_MEMBER) {
          throw new StoreRefusal(
            ErrorCode.QUOTA_KEYS,
            `this member holds ${held} places of session "${this.name}", the most one member may (${MAX_CLAIMS_PER_MEMBER})`,
            { max: MAX_CLAIMS_PER_MEMBER },
          );
        }
        if (!this.claims.has(key) && this.claims.size >= MAX_CLAIMS_PER_SESSION) {
          // Places of members gone are free: forget them before refusing.
          for (const [k, id] of this.claims) if (!live(id)) this.claims.delete(k);
          if (this.claims.size >= MAX_CLAIMS_PER_SESSION) {
            throw new StoreRefusal(
              ErrorCode.QUOTA_KEYS,
              `session "${this.name}" holds ${MAX_CLAIMS_PER_SESSION} places of live members, the most it may`,
              { max: MAX_CLAIMS_PER_SESSION },
            );
          }
        }
        this.claims.set(key, memberId);
        holders[vacant] = memberId;
      }
    }
    return holders;
  }

  /** The host ends the session: its group stops at once and its keys are dropped. */
  end(): void {
    this.ended = true;
    this.rendezvous?.close();
    // No more rounds or peer-left events while its sockets close.
    this.rendezvous = undefined;
    void Promise.resolve(this.store.clear()).catch(() => {});
  }

  /** The session is dropped: its bytes go back to the server's budget. */
  close(): void {
    this.rendezvous?.close();
    this.store.close();
  }
}
