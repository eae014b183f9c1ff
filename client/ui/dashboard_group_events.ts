/**
 * The dashboard's reducer (dashboard_state.ts) for the events about this tab's group: joining,
 * the tabs waiting, the links to peers, the ranks lost, and the group's tabs (fleet).
 */
import type { FleetMember, TrainEvent } from '../train/events.ts';
import type { DashboardEvent, DashboardState, Phase, WaitingEvent } from './dashboard_types.ts';
import { plural } from './dashboard_format.ts';
import { pathWords } from './dashboard_ring.ts';
import { NO_FLEET, NO_PIPELINE_RANKS, NO_RANKS, isOver, logAt, withLog, withRank } from './dashboard_reducer_util.ts';

/** This tab has a rank: a second 'joined' is a new group (generation). */
export function onJoined(state: DashboardState, event: Extract<DashboardEvent, { type: 'joined' }>, at: number): DashboardState {
  const log = logAt(at);
  // A second 'joined' is a new group (generation): ranks are renumbered, so what this tab
  // knew about the old group's ranks and links no longer applies.
  const regroup = state.self !== null;
  // The layout and the timeline stay until the new round's own replace them.
  const group: DashboardState = regroup
    ? {
        ...state,
        joined: NO_RANKS,
        lost: NO_RANKS,
        links: new Map(),
        recent: new Map(),
        pipelineRanks: NO_PIPELINE_RANKS,
        ringProven: false,
        fleet: NO_FLEET,
        contributions: null,
      }
    : state;
  const next: DashboardState = {
    ...group,
    self: event.rank,
    round: event.round ?? null,
    worldSize: event.worldSize,
    joined: withRank(group.joined, event.rank),
    backend: {
      name: event.backend,
      adapter: event.adapter,
      fallbackReason: event.fallbackReason,
      ...(event.probe ? { probe: event.probe } : {}),
    },
    phase: state.phase === 'connecting' || state.phase === 'waiting' || state.phase === 'full' ? 'starting' : state.phase,
    // A rank of its own: this tab no longer watches from the side.
    role: state.role.spectator ? { ...state.role, spectator: false } : state.role,
  };
  if (regroup) return log(next, 'info', `New group: this tab is rank ${event.rank} of ${event.worldSize}.`);
  const how = event.fallbackReason
    ? `, a fallback from ${state.config?.backend ?? 'the requested backend'}`
    : event.adapter
      ? `, ${event.adapter}`
      : '';
  return log(
    next,
    event.fallbackReason ? 'warn' : 'info',
    `This tab joined as rank ${event.rank} of ${event.worldSize} (backend ${event.backend}${how}).`,
  );
}

/** How many tabs are in the session, and whether the group is paused below its minimum. */
export function onWaiting(state: DashboardState, event: Extract<DashboardEvent, { type: 'waiting' }>, at: number): DashboardState {
  const log = logAt(at);
  const { type: _type, ...counts } = event;
  const prev = state.waiting;
  let next: DashboardState = { ...state, waiting: counts, phase: phaseAfterWaiting(state, event) };
  if (event.paused && !prev?.paused) {
    next = log(
      next,
      'warn',
      `Paused: only ${plural(event.arrived, 'tab')} ${event.arrived === 1 ? 'is' : 'are'} left, below the minimum of ${event.min}. Training resumes when more tabs join.`,
    );
  } else if (prev?.arrived !== event.arrived) {
    next = log(next, 'info', `${tabsInSession(counts)}.`);
  }
  return next;
}

/** A link to a peer opened, closed, measured its throughput, or moved to another path. */
export function onLink(state: DashboardState, event: Extract<DashboardEvent, { type: 'link' }>, at: number): DashboardState {
  const log = logAt(at);
  const prev = state.links.get(event.peer);
  const links = new Map(state.links);
  // A throughput figure and a path stay while the link stays open; an update without them keeps them.
  const path = event.path ?? (event.state === 'open' ? prev?.path : undefined);
  links.set(event.peer, {
    state: event.state,
    throughputMBps: event.throughputMBps ?? (event.state === 'open' ? prev?.throughputMBps : undefined),
    ...(path ? { path } : {}),
  });
  let next: DashboardState = { ...state, links };
  // The path's kind is news when first known or when it changes (ICE moved to another pair).
  if (event.path && (event.path.local !== prev?.path?.local || event.path.remote !== prev?.path?.remote)) {
    next = log(next, 'info', `Link to rank ${event.peer} goes ${pathWords(event.path)}.`);
  }
  const duringTraining = state.phase === 'training';
  if (prev?.state !== event.state) {
    const tp = event.throughputMBps !== undefined ? ` (${event.throughputMBps.toFixed(1)} MB/s)` : '';
    next = log(next, event.state === 'closed' && duringTraining ? 'warn' : 'info', `Link to rank ${event.peer}: ${event.state}${tp}.`);
  } else if (event.throughputMBps !== undefined && prev.throughputMBps === undefined) {
    next = log(next, 'info', `Link to rank ${event.peer}: measured ${event.throughputMBps.toFixed(1)} MB/s.`);
  }
  // A closed link is not a lost rank: links close when a group regroups (a tab joining) too.
  // The group itself says when a rank is lost ('rank-lost'), and why.
  return next;
}

/** A rank of this tab's group was lost. */
export function onRankLost(state: DashboardState, event: Extract<DashboardEvent, { type: 'rank-lost' }>, at: number): DashboardState {
  const log = logAt(at);
  // After 'done' the group is finished with; a rank closing its tab then is no loss. Each
  // rank is lost once per group (the group renumbers its ranks when it forms again). The
  // faults are not counted here, from what this tab saw, but by the server ('faults').
  if (state.finished || state.lost.includes(event.rank)) return log(state, 'info', `Lost rank ${event.rank}: ${event.reason}.`);
  const next = log(state, 'error', `Lost rank ${event.rank}: ${event.reason}.`);
  return { ...next, lost: withRank(next.lost, event.rank) };
}

export function onFleet(state: DashboardState, e: Extract<TrainEvent, { type: 'fleet' }>, at: number): DashboardState {
  // A late event of a group this tab has left (another size) is not about the current one.
  if (state.self !== null && state.worldSize !== null && e.worldSize !== state.worldSize) return state;
  const byRank = new Map<number, FleetMember>();
  for (const m of e.members) if (Number.isSafeInteger(m.rank) && m.rank >= 0 && m.rank < e.worldSize) byRank.set(m.rank, m);
  const fleet = [...byRank.values()].sort((a, b) => a.rank - b.rank);
  const next: DashboardState = { ...state, fleet };
  // Said once per group, when every rank is known.
  if (e.worldSize > 1 && fleet.length === e.worldSize && state.fleet.length < e.worldSize) {
    return withLog(next, at, 'info', `The group's tabs: ${fleet.map((m) => `rank ${m.rank} on ${fleetWords(m)}`).join('; ')}.`);
  }
  return next;
}

/** "Chromium 156 (Android phone), cpu" */
export function fleetWords(m: FleetMember): string {
  return `${m.browser}${m.platform ? ` (${m.platform})` : ''}, ${m.backend}${m.fallback ? ' (a fallback)' : ''}`;
}

function phaseAfterWaiting(state: DashboardState, e: WaitingEvent): Phase {
  if (isOver(state.phase)) return state.phase;
  if (e.paused) return 'waiting';
  // Tabs arriving during training join the group at its next step; the run goes on meanwhile.
  if (state.phase === 'training') return 'training';
  // This tab's group has formed already: the count is about tabs that will join a later one.
  if (state.phase === 'starting' && state.self !== null) return 'starting';
  return e.arrived >= e.min ? 'starting' : 'waiting';
}

/** "2 of 3 tabs in the session" (fixed size) or "2 tabs in the session (needs 2, up to 4)". */
function tabsInSession(w: { arrived: number; min: number; max: number }): string {
  return w.min === w.max
    ? `${w.arrived} of ${plural(w.max, 'tab')} in the session`
    : `${plural(w.arrived, 'tab')} in the session (needs ${w.min}, up to ${w.max})`;
}
