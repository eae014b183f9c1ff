/**
 * Rendezvous on the server (the state torch's c10d rendezvous handler keeps in its store): the
 * members of a session's group arrive and leave, and the group moves through rounds. Each round
 * is a fixed set of ranks 0..n-1; a change of membership makes a new round, never a changed one.
 * A fixed world size N is the range N..N: the same code, with ranks that may be asked for.
 *
 * - The first round forms once `max` members have arrived, or `min` have and no one else
 *   arrived for `settleMs`.
 * - A member lost (socket closed, or silent past the heartbeat timeout) makes a new round from
 *   the rest; with fewer than `min` it is paused until enough arrive again. The running round's
 *   ranks are told at once ('peer-left'); the round forms `LOSS_GATHER_MS` later, and at most one
 *   per `lossIntervalMs`: losses meanwhile join it. Tabs of a class are often lost together (a
 *   machine that stalls, a wifi that drops), and a round per loss fails on the next loss, each
 *   one making every rank open links and move state for nothing.
 * - A member arriving while a round runs waits; the running members are told (num nodes
 *   waiting), finish their step, and ask to `regroup`, which admits it. Past `max` members,
 *   arrivals are refused, unless they ask to `spectate`: then up to `maxSpectators` of them wait
 *   beyond the maximum (rank -1 in each round) and fill ranks that come free, in arrival order.
 *   Only members that a regroup could admit count as waiting for the running ranks, so a full
 *   group with spectators does not regroup for nothing.
 * - The session's host may change the minimum (`setMin`): a running group below it pauses, a
 *   paused one that has enough forms. Arrivals still name the range the first member set.
 * - A rank whose round failed while every member is still here (a link between two live tabs
 *   broke: nobody left, so nothing else would form a round) asks to regroup with `failed`: the
 *   same members start a new round, as torch's agents re-rendezvous after a worker group fails.
 * - Only members with a rank in the running round may ask for a regroup, and regroups form at
 *   most one round per `regroupIntervalMs`: one asked for sooner is deferred to the end
 *   of the interval and answered then, with the round it formed (the ranks wait at their barrier
 *   anyway, so a deferred answer costs them that wait and nothing else).
 * Ranks a member asked for are kept; everyone else keeps their order (survivors first, then
 * arrivals), so ranks stay contiguous and rank 0 stays rank 0 when it survives. A lost rank's
 * place goes to the last rank, so every other survivor keeps its rank.
 * - The ranks of the running round close the rendezvous when the run ends (`closeGroup`,
 *   torch's set_closed): a rank's close says that it is done, and speaks for no one else; once
 *   every live rank of the round is done, no round forms after it, the members without a rank
 *   are told so, and the session refuses arrivals from then on (Session.join). A rank done
 *   leaves no hole a new round must fill: the others finish their last step. Should a round
 *   have to form anyway (a rank that is not done failed its round, or was lost), the run ended
 *   where more than half of the round's ranks are done, or too few are left to go on: the
 *   rendezvous closes; otherwise the ranks done leave and the rest go on. So one member cannot
 *   end the run for the others. Ranks that leave afterwards are still reported to the others
 *   ('peer-left'), so that their last collectives fail at once.
 * - Each rank lost from a running round, and each member given a rank after the first round, goes
 *   in the group's fault history (fault_record.ts), which every member gets, a late one included.
 */
import { ErrorCode, type RequestFields, type RoundEvent } from '../src/wire/protocol.ts';
import { StoreRefusal } from './store.ts';
import { RoundGathers } from './round_gather.ts';
import { FaultRecord } from './fault_record.ts';
import { refuseArrival } from './rendezvous_admission.ts';
import { assignRanks, describeLosses, fillPlaces } from './rank_places.ts';
import { countFailedRegroup, type RegroupHistory } from './regroup_budget.ts';
import { RegroupPacing } from './regroup_pacing.ts';
import { roundEventFor, waitingEventFor } from './rendezvous_events.ts';
import { LOSS_GATHER_MS, type Participant, type RendezvousOptions } from './rendezvous_options.ts';

// The contract lives beside it (rendezvous_options.ts); session.ts reads it from here.
export type { Participant, RendezvousOptions } from './rendezvous_options.ts';

interface Member extends RegroupHistory {
  participant: Participant;
  /** The rank this member asked for (fixed world sizes only). */
  rank?: number;
}

export class Rendezvous {
  /** The latest round's number. Numbers go on across the rendezvous a session has over time. */
  round: number;
  /** The minimum in force: `options.min` until the host changes it. */
  min: number;
  /** The first round has formed. */
  private started = false;
  /** The rendezvous closed: the last round and the rank that was done first. */
  closedBy: { round: number; rank: number } | undefined;
  /** Ranks of the running round done with the run (they asked to close): by member id, and the first one's rank. */
  private done: { round: number; ids: Set<number>; firstRank: number } | undefined;
  /** The running round's server-attested gathers (votes). */
  private readonly gathers: RoundGathers;
  /** The group's fault history (fault_record.ts): every member gets it when it changes, and as it arrives. */
  private readonly faults = new FaultRecord();
  /** Member ids in rank order in the current round (its members in order, when paused). */
  private active: number[] = [];
  /** Member ids waiting for the next round, in arrival order. */
  private waiting: number[] = [];
  private paused = false;
  private nextId = 1;
  private readonly members = new Map<number, Member>();
  private settleTimer: ReturnType<typeof setTimeout> | undefined;
  /** When any round last formed. */
  private lastFormedAt = Number.NEGATIVE_INFINITY;
  /** Ranks of the running round lost since it formed (their places are -1 in `active` until the next round): the timer that forms it, and why. */
  private losses: { timer: ReturnType<typeof setTimeout>; why: string[] } | undefined;
  /** When regroups may form rounds, and the ones deferred until then (regroup_pacing.ts). */
  private readonly pacing: RegroupPacing;

  constructor(
    readonly options: RendezvousOptions,
    private readonly sessionName: string,
    private readonly log: (line: string) => void,
    /** The round before this rendezvous' first one: round numbers (and so group keys) never repeat in a session. */
    previousRound = 0,
    /** The first member id to hand out: ids go on across a session's rendezvous too, so an id names one member for as long as the server runs. */
    firstMemberId = 1,
  ) {
    this.round = previousRound;
    this.nextId = firstMemberId;
    this.gathers = new RoundGathers(sessionName);
    this.pacing = new RegroupPacing(options);
    this.min = options.min;
  }

  get size(): number {
    return this.members.size;
  }

  /** The id the next member will get. */
  get nextMemberId(): number {
    return this.nextId;
  }

  /** Member `id` is in the group (ranked, waiting or spectating). */
  isMember(id: number): boolean {
    return this.members.has(id);
  }

  /** A round with ranks is running (not before the first, not paused). */
  get running(): boolean {
    return this.started && !this.paused;
  }

  /**
   * Admits a member, or refuses it saying which rule it broke. The round that includes it is
   * announced by event, possibly before the caller replies.
   */
  admit(participant: Participant, request: RequestFields['rendezvous']): number {
    const { min, max, maxSpectators } = this.options;
    const askedRanks = [...this.members.values()].map((m) => m.rank);
    refuseArrival(
      {
        sessionName: this.sessionName,
        min,
        max,
        maxSpectators,
        closedBy: this.closedBy,
        members: this.members.size,
        askedRanks,
        nextId: this.nextId,
      },
      request,
    );
    const id = this.nextId++;
    this.members.set(id, { participant, rank: request.rank });
    this.waiting.push(id);
    participant.send(this.faults.event());
    if (!this.started && this.members.size >= max) this.form('all ranks arrived');
    else if (this.paused && this.members.size >= this.min) this.form(`enough ranks again (${this.members.size})`);
    else {
      if (!this.started && this.members.size >= this.min) this.settleSoon();
      // A spectator learns at once that it waits beyond a running round (and how big it is).
      // (Not while lost ranks' places are open: the round that fills them comes in a moment.)
      if (this.running && !this.losses && this.waiting.length > this.room) participant.send(this.roundEvent(-1));
      this.announceWaiting();
    }
    return id;
  }

  /**
   * The host changed the minimum (1..max, checked by the caller). A running group now below it
   * pauses (a new round); a paused one, or one not yet formed, that has enough forms; otherwise
   * the members are just told the new minimum.
   */
  setMin(min: number, why: string): void {
    this.min = min;
    if (this.closedBy) return; // the run is over: no round forms again
    if ((this.running && this.liveRanks < min) || (this.started && this.paused && this.members.size >= min)) {
      this.form(why);
      return;
    }
    if (!this.started) {
      if (this.members.size >= min && this.members.size > 0) this.settleSoon();
      else this.cancelSettle();
    }
    this.announceWaiting();
  }

  /** A member left (its socket closed, or it was evicted). */
  remove(id: number, why: string): void {
    if (!this.members.delete(id)) return;
    const rank = this.active.indexOf(id);
    this.waiting = this.waiting.filter((w) => w !== id);
    if (rank >= 0 && this.closedBy) {
      // The run is over: no next round, but the others' last collectives (their exit barrier)
      // learn at once that this rank is gone. Ranks are not renumbered: they name the last round.
      this.active[rank] = -1;
      for (const m of this.activeMembers()) m.send({ type: 'peer-left', round: this.round, rank, reason: why });
      return;
    }
    if (this.closedBy) return;
    if (rank >= 0 && this.running) this.gathers.abort(`rank ${rank} ${why}`);
    if (rank >= 0 && this.running && this.done?.round === this.round && this.done.ids.has(id)) {
      // A rank done with the run left: the others are finishing theirs; no round to form.
      this.active[rank] = -1;
      for (const m of this.activeMembers()) m.send({ type: 'peer-left', round: this.round, rank, reason: why });
      this.closeIfAllDone();
      return;
    }
    if (rank >= 0 && this.running) {
      // Tell the running round whom it lost (by rank) before announcing the next one. The place
      // stays open until then: the round's ranks keep naming the same tabs (signals, vouches).
      this.active[rank] = -1;
      for (const m of this.activeMembers()) m.send({ type: 'peer-left', round: this.round, rank, reason: why });
      this.faults.lost(this.round, rank, why);
      this.announceFaults();
      this.formAfterLoss(`rank ${rank} ${why}`);
      return;
    }
    // The last rank takes the lost one's place and every other rank keeps its own (see rank_places.ts).
    if (rank >= 0) {
      const last = this.active.pop()!;
      if (rank < this.active.length) this.active[rank] = last;
    }
    if (!this.started && this.members.size < this.min) this.cancelSettle();
    this.announceWaiting();
  }

  /**
   * A member of the running round asks to admit the waiting ones at a step boundary; resolves
   * with the latest round (the same one when nobody waits any more). With `failed`, the round
   * failed on that member: a new round of the same members forms even with nobody waiting.
   * Asking about an older round just answers the latest, whoever asks: ranks that lost a race
   * with a new round (or fell out of it) learn nothing they were not sent already.
   */
  regroup(id: number, fromRound: number, failed = false): Promise<number> {
    if (fromRound !== this.round || this.closedBy) return Promise.resolve(this.round);
    if (this.rankOf(id) === undefined) {
      throw new StoreRefusal(
        ErrorCode.NOT_JOINED,
        `only a member with a rank in the running round ${this.round} of session "${this.sessionName}" may ask for a regroup; this one ${
          this.running ? 'is waiting to be admitted' : 'waits for the paused group to resume'
        }`,
        { round: this.round },
      );
    }
    // One member alone cannot keep the group regrouping: past its budget, RATE_LIMITED.
    const member = this.members.get(id);
    if (failed && member) countFailedRegroup(member, this.options.maxFailedRegroupsPerMember ?? Infinity);
    const failedBy = failed ? this.rankOf(id) : undefined;
    // Spectators alone (no free rank) are no reason for a new round.
    if (this.admittable === 0 && failedBy === undefined) return Promise.resolve(this.round);
    const wait = this.pacing.waitMs();
    if (wait <= 0) {
      this.formByRegroup(failedBy);
      return Promise.resolve(this.round);
    }
    // Too soon after the last one: form it when the interval ends, and answer then.
    return this.pacing.defer(wait, failedBy, (deferredFailedBy) => {
      if (this.running && (this.admittable > 0 || deferredFailedBy !== undefined)) this.formByRegroup(deferredFailedBy);
      else this.pacing.answer(this.round); // the waiting members left meanwhile
    });
  }

  /** The rank of a member in the running round, if it has one. */
  rankOf(id: number): number | undefined {
    if (!this.running) return undefined;
    const r = this.active.indexOf(id);
    return r < 0 ? undefined : r;
  }

  /** The member id of `rank` in the running round, if there is one. */
  memberAt(rank: number): number | undefined {
    const id = this.running ? this.active[rank] : undefined;
    return id === undefined || id < 0 ? undefined : id;
  }

  participantAt(rank: number): Participant | undefined {
    if (!this.running) return undefined;
    const id = this.active[rank];
    return id === undefined ? undefined : this.members.get(id)?.participant;
  }

  /**
   * The rank of member `id` in the running round is done with the run. It speaks for itself
   * only: the rendezvous closes once every live rank of the round is done (then the members
   * holding no rank, waiting or spectating, are told, since no round will ever admit them, and
   * so are the round's other ranks). Asking again changes nothing.
   */
  closeGroup(id: number): void {
    if (this.closedBy) return;
    const rank = this.rankOf(id);
    if (rank === undefined) {
      throw new StoreRefusal(
        ErrorCode.NOT_JOINED,
        `only a member with a rank in the running round ${this.round} of session "${this.sessionName}" may close its rendezvous (the run's end); this one ${
          this.running ? 'is waiting to be admitted' : this.started ? 'waits for the paused group to resume' : 'waits for the first round'
        }`,
        { round: this.round },
      );
    }
    if (this.done?.round !== this.round) this.done = { round: this.round, ids: new Set(), firstRank: rank };
    this.done.ids.add(id);
    if (!this.closeIfAllDone()) {
      this.log(
        `[server] session "${this.sessionName}": rank ${rank} of round ${this.round} is done with the run (${this.done.ids.size} of ${this.active.length} ranks)`,
      );
    }
  }

  /** Closes the rendezvous when every live rank of the running round is done; whether it did. */
  private closeIfAllDone(): boolean {
    const done = this.done;
    if (!done || done.round !== this.round) return false;
    const live = this.active.filter((m) => m >= 0 && this.members.has(m));
    if (!live.every((m) => done.ids.has(m))) return false;
    this.finish(done.firstRank, 'every rank of the round is done');
    return true;
  }

  /** The rendezvous closes: no round forms again; everyone still here without the news is told. */
  private finish(rank: number, why: string): void {
    this.closedBy = { round: this.round, rank };
    this.cancelSettle();
    this.cancelLosses();
    this.pacing.answer(this.round);
    this.gathers.reset(this.round, 'the rendezvous closed');
    const unranked = this.waiting.filter((w) => this.members.has(w));
    this.log(
      `[server] session "${this.sessionName}": the rendezvous closed after round ${this.round} (the run ended: ${why}; rank ${rank} was done first)${unranked.length > 0 ? `; ${unranked.length} member(s) without a rank told` : ''}`,
    );
    // The round's ranks too: a collective can complete on some ranks and fail on another,
    // and a rank whose last step failed as the others finished waits for a round that never forms.
    const doneIds = this.done?.round === this.round ? this.done.ids : new Set<number>();
    const told = [...unranked, ...this.active.filter((m) => m >= 0 && !doneIds.has(m))];
    for (const w of told) this.members.get(w)?.participant.send({ type: 'rendezvous-closed', round: this.round, by: rank });
  }

  /**
   * A round must form while some ranks of the running one are done: the run ended if more than
   * half of its ranks are done or too few others are left to go on (then the rendezvous closes,
   * and true); otherwise the ranks done leave the group and the rest go on.
   */
  private endedBeforeForming(): boolean {
    const done = this.done;
    if (!done || done.round !== this.round || done.ids.size === 0) return false;
    const others = this.active.filter((m) => m >= 0 && this.members.has(m) && !done.ids.has(m)).length + this.waiting.length;
    if (done.ids.size * 2 > this.active.length || others < this.min) {
      this.finish(
        done.firstRank,
        `${done.ids.size} of the ${this.active.length} ranks of round ${this.round} were done when a new round had to form`,
      );
      return true;
    }
    for (const id of done.ids) this.members.delete(id);
    this.log(
      `[server] session "${this.sessionName}": ${done.ids.size} rank(s) of round ${this.round} done with the run leave; the other ${others} go on`,
    );
    this.done = undefined;
    return false;
  }

  /**
   * Rank `rank`'s row of gather `tag` in round `round` (server-attested: see RoundGathers);
   * resolves with every rank's row, in rank order.
   */
  gather(id: number, round: number, tag: string, values: number[], timeoutMs: number): Promise<number[][]> {
    const rank = this.rankOf(id);
    if (rank === undefined || round !== this.round || this.closedBy) {
      throw new StoreRefusal(
        ErrorCode.GATHER_ABORTED,
        `only a rank of the running round may give a row to a gather: this member ${rank === undefined ? 'has no rank in' : `asked about round ${round}, not`} the running round ${this.round} of session "${this.sessionName}"`,
        { round: this.round, tag },
        false,
      );
    }
    return this.gathers.give(rank, this.active.length, tag, values, timeoutMs);
  }

  close(): void {
    this.cancelSettle();
    this.cancelLosses();
    this.pacing.answer(this.round);
  }

  /** Ranks of the running round still here (lost ones leave a hole until the next round). */
  private get liveRanks(): number {
    return this.active.filter((id) => id >= 0 && this.members.has(id)).length;
  }

  /**
   * A rank of the running round was lost: the next round forms after `LOSS_GATHER_MS`, or when
   * `lossIntervalMs` have passed since the last round if that is later; losses meanwhile join it.
   */
  private formAfterLoss(why: string): void {
    if (this.losses) {
      this.losses.why.push(why);
      return;
    }
    const wait = Math.max(LOSS_GATHER_MS, this.lastFormedAt + (this.options.lossIntervalMs ?? 0) - Date.now());
    const losses = { why: [why], timer: setTimeout(() => this.form(describeLosses(losses.why)), wait) };
    this.losses = losses;
  }

  private cancelLosses(): void {
    if (this.losses) clearTimeout(this.losses.timer);
    this.losses = undefined;
  }

  /** Free ranks of the running round: how many waiting members a regroup could admit. */
  private get room(): number {
    return Math.max(0, this.options.max - this.active.length);
  }

  /** Waiting members a regroup would admit now (0 unless a round runs). */
  private get admittable(): number {
    return this.running ? Math.min(this.waiting.length, this.room) : 0;
  }

  /** The running round as a member with `rank` sees it. */
  private roundEvent(rank: number): RoundEvent {
    return roundEventFor(this.round, rank, this.paused ? undefined : this.active, this.min, this.options.max);
  }

  private activeMembers(): Participant[] {
    return this.active
      .map((id) => (id < 0 ? undefined : this.members.get(id)?.participant))
      .filter((p): p is Participant => p !== undefined);
  }

  /** Tells every member how many wait for the next round. */
  private announceWaiting(): void {
    const event = waitingEventFor(
      this.round,
      this.running ? this.admittable : this.members.size,
      this.running ? this.waiting.length : 0,
      this,
    );
    for (const m of this.members.values()) m.participant.send(event);
  }

  private announceFaults(): void {
    const event = this.faults.event();
    for (const m of this.members.values()) m.participant.send(event);
  }

  private settleSoon(): void {
    this.cancelSettle();
    this.settleTimer = setTimeout(() => {
      this.settleTimer = undefined;
      if (!this.started && this.members.size >= this.min) {
        this.form(`${this.members.size} ranks arrived and ${this.options.settleMs} ms passed`);
      }
    }, this.options.settleMs);
  }

  private cancelSettle(): void {
    if (this.settleTimer) clearTimeout(this.settleTimer);
    this.settleTimer = undefined;
  }

  private formByRegroup(failedBy?: number): void {
    this.pacing.formed();
    const admitting = this.admittable > 0 ? 'admitting waiting ranks' : '';
    const failed = failedBy !== undefined ? `round ${this.round} failed on rank ${failedBy}` : '';
    this.form([failed, admitting].filter(Boolean).join(', '));
  }

  /**
   * Makes the next round from the survivors (in order) and then the waiting members, up to
   * `max`; the rest (spectators) keep waiting, in arrival order.
   */
  private form(why: string): void {
    if (this.endedBeforeForming()) return;
    this.cancelSettle();
    this.cancelLosses();
    this.active = fillPlaces(this.active, (id) => this.members.has(id));
    this.lastFormedAt = Date.now();
    const everyone = [...this.active, ...this.waiting].filter((id) => this.members.has(id));
    const admitted = everyone.slice(0, this.options.max);
    this.started = true;
    this.round++;
    this.gathers.reset(this.round, `round ${this.round - 1} ended (${why})`);
    this.paused = admitted.length < this.min;
    this.waiting = everyone.slice(this.options.max);
    this.active = this.paused ? admitted : assignRanks(admitted, (id) => this.members.get(id)?.rank);
    const beyond = this.waiting.length > 0 ? `, ${this.waiting.length} spectator(s) waiting` : '';
    this.log(
      `[server] session "${this.sessionName}": round ${this.round}, ${this.active.length} rank(s)${this.paused ? `, paused below the minimum of ${this.min}` : ''}${beyond} (${why})`,
    );
    for (const [id, m] of this.members) m.participant.send(this.roundEvent(this.paused ? -1 : this.active.indexOf(id)));
    if (this.faults.formed(this.round, this.paused ? [] : this.active)) this.announceFaults();
    // Paused members learn how many are here, and so how many more it takes; with spectators
    // left waiting, everyone learns how many there are now.
    if (this.paused || this.waiting.length > 0) this.announceWaiting();
    // Any new round answers regroups deferred for the old one (after its events went out).
    this.pacing.answer(this.round);
  }
}
