/**
 * The dashboard's reducer (dashboard_state.ts) for the events the page itself reports: the
 * person's requests (stop, skip, end, continue, the minimum), the host's controls relayed by the
 * server, the tab's role, and how the run ended for this tab.
 */
import type { DashboardEvent, DashboardState, LogLevel, PageEvent } from './dashboard_types.ts';
import { plural } from './dashboard_format.ts';
import { NO_RANKS, isOver, logAt } from './dashboard_reducer_util.ts';

export function reducePageEvent(state: DashboardState, event: PageEvent, at: number): DashboardState {
  const log = logAt(at);
  switch (event.type) {
    case 'faults':
      return { ...state, faults: { ...state.faults, counts: event.counts, entries: event.entries } };
    case 'skip-eval-requested':
      if (state.finalEval === null || state.finalEval.skipRequested || state.finished) return state;
      return log(
        { ...state, finalEval: { ...state.finalEval, skipRequested: true } },
        'info',
        'Skipping the evaluation, as asked by this tab.',
      );

    case 'stop-requested':
      if (state.stopRequested || isOver(state.phase)) return state;
      return log({ ...state, stopRequested: true }, 'info', `Stop requested by this tab${state.role.host ? ' (the host)' : ''}.`);

    case 'end-requested':
      if (state.phase === 'ended') return state;
      return log(state, 'info', 'Ending the session, as asked by this tab (the host).');

    case 'min-requested':
      return log({ ...state, minRequested: event.min }, 'info', `Asked to keep training with at least ${plural(event.min, 'tab')}.`);

    case 'continue-requested':
      return onContinueRequested(state, at);
    case 'role':
      return onRole(state, event, at);
    case 'downloadable':
      return state.downloadable === event.available ? state : { ...state, downloadable: event.available };

    case 'watched-end':
      return onWatchedEnd(state, event, at);
    case 'full':
      if (isOver(state.phase)) return state;
      return log(
        { ...state, phase: 'full', fullRanks: event.ranks },
        'warn',
        `The session is full${event.ranks !== null ? ` (${plural(event.ranks, 'rank')})` : ''}: this tab has no rank.`,
      );

    case 'control':
      return onControl(state, event, log);

    case 'remove-requested':
    case 'link-changed':
    case 'removed':
      return onRemoval(state, event, log);

    case 'error-shown': {
      const { type: _type, ...error } = event;
      return log({ ...state, error }, 'error', `${event.title}: ${event.detail}`);
    }

    case 'error-dismissed':
      return state.error === null ? state : { ...state, error: null };

    case 'failed':
      return onFailed(state, event, at);

    default: {
      // Exhaustive at compile time; at run time a newer event kind is ignored rather than break the page.
      const unknown: never = event;
      void unknown;
      return state;
    }
  }
}

/** This tab's role: host, and whether it watches from the side. */
function onRole(state: DashboardState, event: Extract<DashboardEvent, { type: 'role' }>, at: number): DashboardState {
  const log = logAt(at);
  const { type: _type, ...role } = event;
  if (role.host === state.role.host && role.hasHost === state.role.hasHost && role.spectator === state.role.spectator) return state;
  const next: DashboardState = { ...state, role };
  if (role.spectator && !state.role.spectator)
    return log(next, 'info', `The session is full: this tab watches and takes a rank when one frees up.`);
  if (role.host && !state.role.host)
    return log(next, 'info', 'This tab is the host: it can stop the training or end the session for everyone.');
  return next;
}

/** The run ended without this tab holding a rank at its end. */
function onWatchedEnd(state: DashboardState, event: Extract<DashboardEvent, { type: 'watched-end' }>, at: number): DashboardState {
  const log = logAt(at);
  if (isOver(state.phase)) return state;
  if (event.rank != null) {
    return log(
      { ...state, phase: 'done', finished: true, endedWithoutRank: event.rank },
      'warn',
      `The run ended without this tab: its last round failed here (rank ${event.rank}) while the other tabs finished it. The final model is theirs; this tab's replica stopped at its last committed step.`,
    );
  }
  return log(
    { ...state, phase: 'done', finished: true, role: { ...state.role, spectator: false } },
    'info',
    'The run finished before this tab got a rank: it trained without this tab.',
  );
}

/** The person asked to continue after a failure. */
function onContinueRequested(state: DashboardState, at: number): DashboardState {
  const log = logAt(at);
  if (!state.canContinue) return state;
  return log(
    {
      ...state,
      phase: 'starting',
      failure: null,
      error: null,
      canContinue: false,
      finished: false,
      finalEval: null,
      endedWithoutRank: null,
      stopRequested: false,
      stoppedBy: null,
      lost: NO_RANKS,
    },
    'info',
    'Continuing the training from where it stopped.',
  );
}

/** The run failed here: what happened, and whether continuing may help. */
function onFailed(state: DashboardState, event: Extract<DashboardEvent, { type: 'failed' }>, at: number): DashboardState {
  const log = logAt(at);
  const { type: _type, canContinue, ...error } = event;
  // After the host ended the session (or removed this tab), losing the connection is what that means.
  if (state.phase === 'ended' || state.phase === 'removed') return log(state, 'info', `${event.title}: ${event.detail}`);
  return log(
    { ...state, failure: event.title, error, canContinue: canContinue === true, phase: state.finished ? state.phase : 'failed' },
    'error',
    `${event.title}: ${event.detail}`,
  );
}

function onControl(
  state: DashboardState,
  e: Extract<PageEvent, { type: 'control' }>,
  log: (s: DashboardState, level: LogLevel, message: string) => DashboardState,
): DashboardState {
  switch (e.action) {
    case 'stop':
      // A stop during the evaluation after the run skips it (train_page.ts).
      if (state.finalEval !== null && !state.finished)
        return log(
          { ...state, finalEval: { ...state.finalEval, skipRequested: true } },
          'info',
          'The host skipped the evaluation after the run.',
        );
      return log({ ...state, stoppedByHost: true }, 'warn', 'The host stopped the run: every tab stops at the same step.');
    case 'end': {
      const next: DashboardState = { ...state, phase: 'ended', stopRequested: false, error: null };
      return log(next, 'warn', 'The host ended the session: this tab is disconnected from it.');
    }
    case 'min': {
      if (e.min === undefined) return state;
      const config = state.config ? { ...state.config, min: e.min } : state.config;
      const waiting = state.waiting ? { ...state.waiting, min: e.min } : state.waiting;
      return log(
        { ...state, config, waiting, minRequested: null },
        'info',
        `The host set the minimum to ${plural(e.min, 'tab')}: training goes on while at least ${e.min} ${e.min === 1 ? 'is' : 'are'} in.`,
      );
    }
  }
}

/** The host removes a tab: its request, the link changing for the tabs that stay, and the removed tab's end. */
function onRemoval(
  state: DashboardState,
  e: Extract<PageEvent, { type: 'remove-requested' | 'link-changed' | 'removed' }>,
  log: (s: DashboardState, level: LogLevel, message: string) => DashboardState,
): DashboardState {
  switch (e.type) {
    case 'remove-requested':
      return log(state, 'info', `Removing rank ${e.rank} from the session, as asked by this tab (the host); the session's link changes.`);
    case 'link-changed': {
      const share = state.role.host
        ? 'Share the new link below: the old one no longer opens the session.'
        : "This tab trains on; the link below is the session's new one.";
      return log(state, 'warn', `${e.reason.charAt(0).toUpperCase()}${e.reason.slice(1)}, so the session's link changed. ${share}`);
    }
    case 'removed':
      if (state.phase === 'removed') return state;
      return log(
        { ...state, phase: 'removed', stopRequested: false, error: null, canContinue: false },
        'warn',
        'The host removed this tab from the session: it stopped training, and its link no longer opens the session. Its replica can still be downloaded.',
      );
  }
}
