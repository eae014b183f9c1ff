/**
 * The host removes a tab, as the dashboard says it (its pure reducer, no DOM): the host's group
 * table offers "Remove" on the other tabs once it knows their round; a tab that stays is told the
 * link changed; the removed tab ends as 'removed' (not a failure), keeps its replica to download,
 * and a later "connection closed" does not turn it into a failure; survivors count the removal.
 */
import { describe, expect, it } from 'vitest';
import { initialDashboardState, reduceDashboard, type DashboardEvent, type DashboardState } from '../client/ui/dashboard_state.ts';
import { controls, removeConfirm } from '../client/ui/dashboard_controls.ts';
import { phaseLabel, statusText } from '../client/ui/dashboard_status.ts';
import { runReport } from '../client/ui/dashboard_report.ts';
import { linkWithToken } from '../client/page_token.ts';

function replay(events: DashboardEvent[], from: DashboardState = initialDashboardState({ session: 's', at: 0 })): DashboardState {
  let s = from;
  for (const [i, event] of events.entries()) s = reduceDashboard(s, { at: 1000 * (i + 1), event });
  return s;
}

const joined = (rank: number, round?: number): DashboardEvent => ({
  type: 'joined',
  rank,
  worldSize: 3,
  backend: 'cpu',
  adapter: null,
  ...(round === undefined ? {} : { round }),
});

describe('removing a tab on the dashboard', () => {
  it("offers Remove to the host only, once the group's round is known, and not after the run", () => {
    const host = replay([{ type: 'role', host: true, hasHost: true, spectator: false }, joined(0, 4)]);
    expect(host.round).toBe(4);
    expect(controls(host).remove.visible).toBe(true);
    expect(controls(replay([{ type: 'role', host: true, hasHost: true, spectator: false }, joined(0)])).remove.visible).toBe(false);
    expect(controls(replay([{ type: 'role', host: false, hasHost: true, spectator: false }, joined(1, 4)])).remove.visible).toBe(false);
    expect(controls(replay([{ type: 'control', action: 'end' }], host)).remove.visible).toBe(false);
    expect(removeConfirm(2).title).toBe('Remove rank 2 from the session?');
    expect(removeConfirm(2).body).toContain("The session's link changes");
  });

  it("tells the tabs that stay that the link changed, and shows the removal among the faults (the server's record)", () => {
    const host = replay([
      { type: 'role', host: true, hasHost: true, spectator: false },
      joined(0, 4),
      { type: 'remove-requested', rank: 2 },
      { type: 'link-changed', reason: 'the host removed rank 2 of round 4 from the session' },
      { type: 'rank-lost', rank: 2, reason: 'was removed by the host' },
      {
        type: 'faults',
        counts: { left: 0, froze: 0, removed: 1, failed: 0, joined: 0 },
        entries: [{ kind: 'removed', round: 4, rank: 2, reason: 'was removed by the host' }],
      },
    ]);
    expect(host.log[2]!.message).toContain('Removing rank 2');
    expect(host.log[1]!.message).toBe(
      "The host removed rank 2 of round 4 from the session, so the session's link changed. Share the new link below: the old one no longer opens the session.",
    );
    expect(host.phase).not.toBe('removed');
    const done = replay([{ type: 'done', summary: {} }], host);
    expect(runReport(done)?.main.find((e) => e.key === 'faults')?.value).toBe('1 tab removed by the host');
    const student = replay([
      { type: 'role', host: false, hasHost: true, spectator: false },
      joined(1, 4),
      { type: 'link-changed', reason: 'the host removed rank 2 of round 4 from the session' },
    ]);
    expect(student.log[0]!.message).toContain("the link below is the session's new one");
  });

  it('ends the removed tab as removed, not failed, with its replica to download', () => {
    const s = replay([
      joined(1, 4),
      { type: 'removed' },
      { type: 'downloadable', available: true },
      { type: 'failed', title: 'Server unreachable', detail: 'connection closed' },
    ]);
    expect(s.phase).toBe('removed');
    expect(phaseLabel(s)).toBe('Removed by the host');
    expect(statusText(s)).toBe(
      "The host removed this tab from the session: it stopped training, and its link no longer opens the session. This tab's replica, from its last committed step, can still be downloaded.",
    );
    expect(controls(s).downloadEnabled).toBe(true);
    expect(s.error).toBeNull();
    expect(s.failure).toBeNull();
  });

  it("keeps the host's secret and the rest of the link when the token changes", () => {
    expect(linkWithToken('http://h:8080/?session=s&world=3#token=old&host=H', 'NEW')).toBe(
      'http://h:8080/?session=s&world=3#token=NEW&host=H',
    );
    expect(linkWithToken('http://h:8080/?session=s#token=old', 'NEW')).toBe('http://h:8080/?session=s#token=NEW');
  });
});
