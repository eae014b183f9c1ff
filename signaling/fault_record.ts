/**
 * The group's fault history, kept by the server's rendezvous: every rank lost from a running
 * round (and why) and every member that got a rank after the first round, as the server itself
 * saw them. It is the one record every tab shows: each member gets it whenever it changes and as
 * it arrives (FaultsEvent), so a tab that joins late shows what happened before it came. Nothing
 * in it is a member's word about another member. Bounded: the counts cover the whole run, the
 * list keeps the latest MAX_FAULT_ENTRIES.
 */
import {
  CloseCode,
  describeMemberClose,
  FAULT_KINDS,
  MAX_FAULT_ENTRIES,
  MAX_FAULT_REASON,
  type FaultEntry,
  type FaultKind,
  type FaultsEvent,
} from '../src/wire/protocol.ts';

/**
 * What a loss was, from the server's own words for it (Rendezvous.remove's `why`: a socket's
 * close, described by describeMemberClose; the heartbeat watchdog's eviction; the host's removal).
 * These strings are the server's, never a member's.
 */
export function lossKind(why: string): Exclude<FaultKind, 'joined'> {
  if (why === describeMemberClose(CloseCode.LEFT)) return 'left';
  // A page paused past its stall bound, or silent past the heartbeat timeout (the watchdog's "was evicted: ...").
  if (why === describeMemberClose(CloseCode.STALLED) || why.startsWith('was evicted')) return 'froze';
  if (why === describeMemberClose(CloseCode.REMOVED)) return 'removed';
  return 'failed';
}

export class FaultRecord {
  private readonly counts = Object.fromEntries(FAULT_KINDS.map((k) => [k, 0])) as Record<FaultKind, number>;
  private entries: FaultEntry[] = [];
  /** Member ids that held a rank in the latest running round: a member with a rank in the next one that is not here joined. */
  private ranked: ReadonlySet<number> | undefined;

  /** Rank `rank` of running round `round` was lost, for the server's reason `why`. */
  lost(round: number, rank: number, why: string): void {
    this.add({ kind: lossKind(why), round, rank, reason: why.slice(0, MAX_FAULT_REASON) });
  }

  /**
   * Round `round` formed with these member ids at ranks 0..n-1 (none when paused). Members with a
   * rank in it that held none in the last running round joined the running group, unless this is
   * the first round (everyone starts together). Returns whether any did.
   */
  formed(round: number, ranks: readonly number[]): boolean {
    if (ranks.length === 0) return false;
    const before = this.ranked;
    this.ranked = new Set(ranks);
    if (!before) return false;
    let joined = false;
    ranks.forEach((id, rank) => {
      if (before.has(id)) return;
      this.add({ kind: 'joined', round, rank, reason: '' });
      joined = true;
    });
    return joined;
  }

  /** The record as every member gets it. */
  event(): FaultsEvent {
    return { type: 'faults', counts: { ...this.counts }, entries: [...this.entries] };
  }

  private add(entry: FaultEntry): void {
    this.counts[entry.kind]++;
    this.entries.push(entry);
    if (this.entries.length > MAX_FAULT_ENTRIES) this.entries = this.entries.slice(-MAX_FAULT_ENTRIES);
  }
}
