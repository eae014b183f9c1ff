/**
 * Each member's budget of regroups after a failure (rendezvous.ts): one member whose links keep
 * failing cannot keep the whole group regrouping.
 */
import { ErrorCode } from '../src/wire/protocol.ts';
import { StoreRefusal } from './store.ts';

/** The window `maxFailedRegroupsPerMember` counts over. */
export const FAILED_REGROUP_WINDOW_MS = 10 * 60_000;

/** What a member keeps of its past regroups after failures. */
export interface RegroupHistory {
  /** When it asked for regroups after a failure, within the last window. */
  failedRegroups?: number[];
}

/** Counts one regroup after a failure, or refuses it (RATE_LIMITED) past `limit` in the window. */
export function countFailedRegroup(member: RegroupHistory, limit: number): void {
  if (!Number.isFinite(limit)) return;
  const now = Date.now();
  const recent = (member.failedRegroups ?? []).filter((t) => now - t < FAILED_REGROUP_WINDOW_MS);
  if (recent.length >= limit) {
    member.failedRegroups = recent;
    throw new StoreRefusal(
      ErrorCode.RATE_LIMITED,
      `this member asked for ${recent.length} regroups after failures in ${FAILED_REGROUP_WINDOW_MS / 60_000} minutes, the most one member may (maxFailedRegroupsPerMember): its links keep failing; reload the tab, or check its network`,
      { limit },
    );
  }
  recent.push(now);
  member.failedRegroups = recent;
}
