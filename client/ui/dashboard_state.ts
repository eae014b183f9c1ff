/**
 * What the training dashboard knows and says, as a pure reducer: the page's TrainEvents
 * (client/train/events.ts) and the few things the page itself reports (a stop request, an error,
 * a failed run) go in; a new DashboardState comes out, and every text and figure the views draw
 * is derived from that state by one model module per panel beside this one (dashboard_*.ts). No
 * DOM and no clock: each action carries its time (`at`), and step rates come from the steps' own
 * `elapsedSec`, so replaying the same actions gives the same page, in a test as in a tab.
 *
 * Updates are immutable, and a part that did not change keeps its identity (`joined`, `links`,
 * `recent`, `log`, ...), so a view can skip redrawing it. The per-step chart series are the one
 * thing not kept here: they grow with every step and copying them on each event would make a run
 * quadratic, so the charts' own StepTable (charts.ts) takes the same step and eval events.
 *
 * Events only have to arrive in roughly the right order (e.g. a 'step' before 'joined' counts).
 */
import type { DashboardAction, DashboardState, FaultHistory } from './dashboard_types.ts';
import { describeJob } from './dashboard_job.ts';
import { summaryLine } from './dashboard_report.ts';
import { tallyContributions } from '../../src/parallel/ddp/contributions.ts';
import { NO_FLEET, NO_PIPELINE_RANKS, NO_RANKS, NO_ROLE, isOver, logAt, withLog } from './dashboard_reducer_util.ts';
import { onJoined, onLink, onRankLost, onFleet, onWaiting } from './dashboard_group_events.ts';
import { onDevices, onEval, onEvaluating, onPipeline, onPs, onShard, onStep } from './dashboard_run_events.ts';
import { reducePageEvent } from './dashboard_page_events.ts';
import { onLocal } from './dashboard_local.ts';

// ---------------------------------------------------------------- actions and state

// Their types are dashboard_types.ts's (the panel models read them there), exported here as well,
// and so are the reducers' shared figures and isOver (dashboard_reducer_util.ts).
export { RECENT, MAX_LOG, isOver } from './dashboard_reducer_util.ts';
export type {
  Role,
  ControlAction,
  PageEvent,
  DashboardEvent,
  DashboardAction,
  Phase,
  LogLevel,
  PsStatus,
  PipelineLayout,
  PipelineTimeline,
  RankPipelineMetrics,
  LogEntry,
  ErrorMessage,
  DashboardState,
  FaultKind,
  FaultEntry,
  FaultHistory,
} from './dashboard_types.ts';

const NO_FAULTS: FaultHistory = { counts: { left: 0, froze: 0, removed: 0, failed: 0, joined: 0 }, entries: [], stepsRedone: 0 };

export function initialDashboardState(options: { session: string; at: number }): DashboardState {
  const state: DashboardState = {
    session: options.session,
    phase: 'connecting',
    config: null,
    self: null,
    round: null,
    worldSize: null,
    backend: null,
    waiting: null,
    joined: NO_RANKS,
    lost: NO_RANKS,
    links: new Map(),
    ringProven: false,
    shard: null,
    lastStep: null,
    stepClock: [],
    lastStepAt: null,
    evalClock: { count: 0, seconds: 0 },
    recent: new Map(),
    lastEval: null,
    bestEval: null,
    lastSample: null,
    stopRequested: false,
    stoppedBy: null,
    finalEval: null,
    summary: null,
    finished: false,
    endedWithoutRank: null,
    storeUnavailable: null,
    failure: null,
    error: null,
    epochBase: null,
    log: [],
    nextLogId: 0,
    role: NO_ROLE,
    downloadable: null,
    canContinue: false,
    fullRanks: null,
    stoppedByHost: false,
    faults: NO_FAULTS,
    minRequested: null,
    pipeline: null,
    timeline: null,
    ps: null,
    pipelineRanks: NO_PIPELINE_RANKS,
    devices: null,
    fleet: NO_FLEET,
    contributions: null,
    local: null,
  };
  return withLog(state, options.at, 'info', `Opened session “${options.session}”.`);
}

// ---------------------------------------------------------------- reducer

export function reduceDashboard(state: DashboardState, action: DashboardAction): DashboardState {
  const { at, event } = action;
  const log = logAt(at);
  switch (event.type) {
    case 'config':
      return log({ ...state, config: event.config }, 'info', `Job: ${describeJob(event.config)}.`);

    case 'joined':
      return onJoined(state, event, at);

    case 'waiting':
      return onWaiting(state, event, at);

    case 'shard':
      return onShard(state, event, at);

    case 'link':
      return onLink(state, event, at);

    case 'step':
      return onStep(state, event, at);

    case 'aggregation': {
      // The round's tally (a new round's ranks are other tabs: its tally starts afresh).
      const { type: _type, ...judged } = event;
      return { ...state, contributions: tallyContributions(state.contributions, judged) };
    }

    case 'pipeline':
      return onPipeline(state, event, at);

    case 'timeline': {
      const { type: _type, ...timeline } = event;
      return { ...state, timeline };
    }

    case 'devices':
      return onDevices(state, event, at);

    case 'ps':
      return onPs(state, event, at);

    case 'eval':
      return onEval(state, event, at);

    case 'local-eval':
    case 'local-counts':
      return onLocal(state, event, at);

    case 'sample':
      return log(
        { ...state, lastSample: event },
        'info',
        `At step ${event.step} the model writes: ${JSON.stringify(event.prompt + event.text)}`,
      );

    case 'log':
      return log(state, event.level, event.message);

    case 'fleet':
      return onFleet(state, event, at);

    case 'rank-lost':
      return onRankLost(state, event, at);

    case 'steps-redone':
      return event.steps === state.faults.stepsRedone ? state : { ...state, faults: { ...state.faults, stepsRedone: event.steps } };

    case 'stopped':
      return log(
        {
          ...state,
          stoppedBy: { by: event.by, atStep: event.atStep },
          phase: !state.finished && !isOver(state.phase) ? 'stopped' : state.phase,
        },
        'warn',
        state.stoppedByHost
          ? `Training stopped at step ${event.atStep} by the host.`
          : `Training stopped by rank ${event.by}${event.by === state.self ? ' (this tab)' : ''} at step ${event.atStep}.`,
      );

    case 'store':
      // Said once as it goes and once as it comes back; the status line says it meanwhile.
      if ((event.unavailable === null) === (state.storeUnavailable === null)) return { ...state, storeUnavailable: event.unavailable };
      return event.unavailable === null
        ? log({ ...state, storeUnavailable: null }, 'info', "The session's store answers again.")
        : log({ ...state, storeUnavailable: event.unavailable }, 'warn', `The session's store is unavailable: ${event.unavailable}`);

    case 'evaluating':
      return onEvaluating(state, event, at);

    case 'done': {
      // A stopped run still ends with 'done'; keep saying who stopped it.
      const phase = state.phase === 'stopped' || state.phase === 'failed' || state.phase === 'ended' ? state.phase : 'done';
      const next: DashboardState = { ...state, summary: event.summary, finished: true, phase };
      return log(next, 'info', `${phase === 'stopped' ? 'Finished after the stop' : 'Done'}. ${summaryLine(next)}`);
    }

    default:
      // The page's own events (a stop asked, an error shown, ...): dashboard_page_events.ts.
      return reducePageEvent(state, event, at);
  }
}
