/**
 * How long each injected fault took to handle, from the ranks' elastic events as they arrive:
 * `detectedAfterMs` until a rank noticed (a peer lost for a kill or a freeze, the vote's
 * 'regroup' for a join, a failed step for a lost device); from that detection,
 * `recoveredAfterMs` until a rank of a new round held the group's state (the rendezvous, the
 * round's links and the state transfer; `rendezvousMs` and `stateMs` split it as that rank saw
 * it) and `regroupMs` until a rank of the new round started its
 * next step (what the group lost to the fault); for a join, `admittedAfterMs` until its page was
 * in a round (a joiner admitted by a round that another fault made has no detection of its own);
 * for a lost device, `rejoinedAfterMs` until its page was in a round again.
 */
import type { ElasticEvent } from '../src/parallel/events.ts';

export interface InjectedFault {
  fault: string;
  kind: 'kill' | 'freeze' | 'join' | 'lose-device' | 'hide' | 'restart-server';
  atStep: number;
  at: number;
  /** The page a kill, a freeze or a lost device happened on. */
  page?: number;
  /** The pages a join opened. */
  pages?: number[];
  /** The world size when it was injected (--churn). */
  worldSize?: number;
  detectedAfterMs?: number;
  recoveredAfterMs?: number;
  /** Of recoveredAfterMs, as the first rank of the new round saw it: waiting for the server's next round, then its links and the state. */
  rendezvousMs?: number;
  stateMs?: number;
  /** Of stateMs, until that rank held every rank's claim (the round's links, one all-gather). */
  claimsMs?: number;
  regroupMs?: number;
  admittedAfterMs?: number;
  rejoinedAfterMs?: number;
}

export class FaultTimes {
  readonly injected: InjectedFault[] = [];
  /** When each fault was detected, and in which round (the round it ends). */
  private readonly detection = new Map<InjectedFault, { at: number; round: string }>();
  /** The latest round any rank trained a step in, and its size. */
  private round: { key: string; worldSize: number } | null = null;
  /** Every round seen: a slow page's late event for an older round does not make that one the latest again. */
  private readonly rounds = new Set<string>();
  /** Pages whose run reached its end (an 'end' event), in the round they ended in. */
  private readonly ended = new Map<number, string>();
  /** Each page's latest round and rank in it: which page a 'peer-lost' names. */
  private readonly rankOf = new Map<number, { round: string; rank: number }>();

  add(fault: Omit<InjectedFault, 'at' | 'worldSize'>, now = Date.now()): InjectedFault {
    const f: InjectedFault = { ...fault, at: now, ...(this.round ? { worldSize: this.round.worldSize } : {}) };
    this.injected.push(f);
    return f;
  }

  /** An event from the page numbered `page`. */
  onEvent(page: number, e: ElasticEvent, now = Date.now()): void {
    switch (e.type) {
      case 'round': {
        if (!this.rounds.has(e.round)) {
          this.rounds.add(e.round);
          this.round = { key: e.round, worldSize: e.worldSize };
        }
        this.rankOf.set(page, { round: e.round, rank: e.rank });
        for (const [f, d] of this.detection) {
          if (f.recoveredAfterMs !== undefined || d.round === e.round) continue;
          f.recoveredAfterMs = now - d.at;
          if (e.phasesMs?.rendezvous != null) f.rendezvousMs = Math.round(e.phasesMs.rendezvous);
          if (e.phasesMs) f.stateMs = Math.round(e.phasesMs.state);
          if (e.phasesMs?.claims !== undefined) f.claimsMs = Math.round(e.phasesMs.claims);
        }
        // Back in a round after losing its device: how long the rejoin took.
        const lost = this.injected.find(
          (x) => x.kind === 'lose-device' && x.page === page && x.detectedAfterMs !== undefined && x.rejoinedAfterMs === undefined,
        );
        if (lost) lost.rejoinedAfterMs = now - lost.at;
        // A joiner's first round.
        const joined = this.injected.find((x) => x.kind === 'join' && x.admittedAfterMs === undefined && x.pages?.includes(page));
        if (joined) joined.admittedAfterMs = now - joined.at;
        return;
      }
      case 'end':
        this.ended.set(page, e.round);
        return;
      case 'batch':
        for (const [f, d] of this.detection) {
          if (f.regroupMs === undefined && d.round !== e.round) {
            f.regroupMs = now - d.at;
            this.detection.delete(f);
          }
        }
        return;
      case 'failure':
      case 'device-lost':
        // The failed step is when the rank noticed; 'device-lost' follows once it has rebuilt.
        this.detect(
          this.injected.find((x) => x.kind === 'lose-device' && x.page === page && x.detectedAfterMs === undefined),
          e.type === 'failure' ? e.round : null,
          now,
        );
        return;
      case 'peer-lost': {
        // How long the survivors took to notice a killed or frozen rank: the fault on the page that
        // held the lost rank in that round (another fault's regroup may have dropped a frozen page
        // first, and a later loss must not count as its detection), else the oldest not noticed yet.
        const undetected = this.injected.filter((x) => (x.kind === 'kill' || x.kind === 'freeze') && x.detectedAfterMs === undefined);
        const onPage = undetected.find(
          (x) => x.page !== undefined && this.rankOf.get(x.page)?.round === e.round && this.rankOf.get(x.page)?.rank === e.peer,
        );
        this.detect(onPage ?? undetected.find((x) => x.page === undefined || this.rankOf.get(x.page)?.round !== e.round), e.round, now);
        return;
      }
      case 'regroup':
        // The step's vote saw a tab waiting: the group regroups to admit it (the oldest joiner not admitted yet).
        this.detect(
          this.injected.find(
            (x) => x.kind === 'join' && x.pages !== undefined && x.detectedAfterMs === undefined && x.admittedAfterMs === undefined,
          ),
          e.round,
          now,
        );
        return;
      default:
        return;
    }
  }

  private detect(f: InjectedFault | undefined, round: string | null, now: number): void {
    if (!f) return;
    f.detectedAfterMs = now - f.at;
    if (round !== null && f.kind !== 'lose-device') this.detection.set(f, { at: now, round });
  }

  /** The latest round, its size, and the pages that trained in it: their ranks, and whether each reached the run's end in it. */
  lastRound(): { worldSize: number; pages: Array<{ page: number; rank: number; ended: boolean }> } | null {
    if (!this.round) return null;
    const key = this.round.key;
    const pages = [...this.rankOf]
      .filter(([, r]) => r.round === key)
      .map(([page, r]) => ({ page, rank: r.rank, ended: this.ended.get(page) === key }));
    return { worldSize: this.round.worldSize, pages: pages.sort((a, b) => a.rank - b.rank) };
  }

  /** The faults as the summary shows them. */
  report(): Array<Omit<InjectedFault, 'at' | 'page' | 'pages' | 'kind'>> {
    return this.injected.map(({ at: _at, page: _page, pages: _pages, kind: _kind, ...rest }) => rest);
  }
}
