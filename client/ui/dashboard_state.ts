/**
 * What the training dashboard knows and says, as a pure reducer: the page's TrainEvents
 * (client/train/events.ts) and the few things the page itself reports (a stop request, an error,
 * a failed run) go in; a new DashboardState comes out, and every text and figure the views draw
 * is derived here from that state. No DOM and no clock: each action carries its time (`at`), and
 * step rates come from the steps' own `elapsedSec`, so replaying the same actions gives the same
 * page, in a test as in a tab.
 *
 * Updates are immutable, and a part that did not change keeps its identity (`joined`, `links`,
 * `recent`, `log`, ...), so a view can skip redrawing it. The per-step chart series are the one
 * thing not kept here: they grow with every step and copying them on each event would make a run
 * quadratic, so the charts' own StepTable (charts.ts) takes the same step and eval events.
 *
 * Events only have to arrive in roughly the right order (e.g. a 'step' before 'joined' counts).
 */
import type { DeviceInfo, DeviceStats } from '../../src/index.ts';
import type { BackendName, FleetMember, RankStepMetrics, StageLayer, StepBreakdownMs, TimelineEntry, TrainConfig, TrainEvent } from '../train/events.ts';
import type { CommHookSpec } from '../train/config.ts';
import type { LinkObservation, RingModel } from './ring_view.ts';
import { fmtBytes, fmtDuration, fmtInt, fmtMs, fmtNumber, fmtPercent } from './format.ts';
import { INSECURE_PAGE_REASON } from '../webgpu.ts';

// ---------------------------------------------------------------- actions

/** What this tab may do in its session (the page learns it from the link and the server). */
export interface Role {
  /** This tab holds the host's secret: it stops or ends the session for everyone. */
  host: boolean;
  /** The session has a host at all (sessions made on the page do; the launcher's do not). */
  hasHost: boolean;
  /** The session was full when this tab came: it watches, and takes a rank when one frees up. */
  spectator: boolean;
}

/** What the host did, as every tab hears it. */
export type ControlAction = 'stop' | 'end' | 'min';

/** What the page reports besides the job's events. */
export type PageEvent =
  /** The person confirmed "Stop training for everyone"; the job hears it at its next step. */
  | { type: 'stop-requested' }
  /** The host confirmed "End session". */
  | { type: 'end-requested' }
  /** The host asked for a new minimum number of tabs. */
  | { type: 'min-requested'; min: number }
  /** The person pressed "Continue training" after a failure the page can recover from. */
  | { type: 'continue-requested' }
  /** Something went wrong that the person should know about; the run may go on. */
  | { type: 'error-shown'; title: string; detail: string; action?: string }
  | { type: 'error-dismissed' }
  /** The job threw: the run cannot go on (unless `canContinue`: the page can train on from here). */
  | { type: 'failed'; title: string; detail: string; action?: string; canContinue?: boolean }
  | ({ type: 'role' } & Role)
  /** Whether the page holds a model to download (it may after a failure). */
  | { type: 'downloadable'; available: boolean }
  /** Every rank of the session is taken and this tab is not spectating: not a failure. */
  | { type: 'full'; ranks: number | null }
  /** The run ended (well) before this tab got a rank: it watched, or waited, to the end. Not a failure. */
  | { type: 'watched-end' }
  /** The host stopped the run, ended the session or changed the minimum. */
  | { type: 'control'; action: ControlAction; min?: number };

export type DashboardEvent = TrainEvent | PageEvent;

/** An event and when it happened, in ms since the epoch: the only clock the state sees. */
export interface DashboardAction {
  at: number;
  event: DashboardEvent;
}

// ---------------------------------------------------------------- state

/** `full`: every rank is taken (not a failure); `ended`: the host ended the session. */
export type Phase = 'connecting' | 'waiting' | 'starting' | 'training' | 'done' | 'stopped' | 'failed' | 'full' | 'ended';
export type LogLevel = 'info' | 'warn' | 'error';
type StepEvent = Extract<TrainEvent, { type: 'step' }>;
type EvalEvent = Extract<TrainEvent, { type: 'eval' }>;
type ShardEvent = Extract<TrainEvent, { type: 'shard' }>;
type WaitingEvent = Extract<TrainEvent, { type: 'waiting' }>;
type PipelineEvent = Extract<TrainEvent, { type: 'pipeline' }>;
type TimelineEvent = Extract<TrainEvent, { type: 'timeline' }>;
/** A parameter-server run as this tab last heard it. */
export type PsStatus = Omit<Extract<TrainEvent, { type: 'ps' }>, 'type'>;

/** A pipeline run's layout as this tab heard it: its place, and which stage holds each layer. */
export type PipelineLayout = Omit<PipelineEvent, 'type'>;
/** One step of replica 0's pipeline as it ran: each stage's passes, ms from the step's start. */
export type PipelineTimeline = Omit<TimelineEvent, 'type'>;
/** A rank's place in the pipeline and its latest idle share and waits (from the step metrics). */
export type RankPipelineMetrics = NonNullable<RankStepMetrics['pipeline']>;

export interface LogEntry {
  /** Grows by one per entry, so a view can tell which entries it has not drawn yet. */
  id: number;
  at: number;
  level: LogLevel;
  message: string;
}

export interface ErrorMessage {
  title: string;
  detail: string;
  /** What the person can do about it. */
  action?: string;
}

export interface DashboardState {
  readonly session: string;
  readonly phase: Phase;
  readonly config: TrainConfig | null;
  /** This tab's rank in the current group, from its latest 'joined'. */
  readonly self: number | null;
  /** Size of the current group (from 'joined', or the widest step seen). */
  readonly worldSize: number | null;
  readonly backend: { name: BackendName; adapter: string | null; fallbackReason?: string } | null;
  /** The session's tab count from the latest 'waiting' event. */
  readonly waiting: Omit<WaitingEvent, 'type'> | null;
  /** Ranks of the current group seen so far (this tab, and every rank that reported a step), ascending. */
  readonly joined: readonly number[];
  /** Ranks of the current group that are gone, ascending. */
  readonly lost: readonly number[];
  /** This tab's own ring links, by peer rank. */
  readonly links: ReadonlyMap<number, LinkObservation>;
  /** A step completed in the current group, so every ring link has carried data. */
  readonly ringProven: boolean;
  readonly shard: ShardEvent | null;
  readonly lastStep: StepEvent | null;
  /**
   * Step number, elapsed seconds and the evaluation seconds so far, of the last RECENT + 1 steps:
   * the step rate's window (evaluation pauses are taken out of it).
   */
  readonly stepClock: ReadonlyArray<{ step: number; t: number; evalT: number }>;
  /** When the last step was reported (the action's time), to time the evaluation after it. */
  readonly lastStepAt: number | null;
  /** Evaluations timed so far and their seconds in all. */
  readonly evalClock: { readonly count: number; readonly seconds: number };
  /** The last RECENT steps' figures of each rank of the current group. */
  readonly recent: ReadonlyMap<number, readonly RankStepMetrics[]>;
  readonly lastEval: EvalEvent | null;
  readonly bestEval: number | null;
  readonly stopRequested: boolean;
  readonly stoppedBy: { by: number; atStep: number } | null;
  readonly summary: Readonly<Record<string, unknown>> | null;
  /** 'done' arrived: the model exists (also after a stop, which the job follows with 'done'). */
  readonly finished: boolean;
  /** Title of the error that ended the run. */
  readonly failure: string | null;
  /** The banner's message, until dismissed. */
  readonly error: ErrorMessage | null;
  /** Epoch numbering of the job: torch-style 0-based or 1-based, decided by the first epoch seen. */
  readonly epochBase: 0 | 1 | null;
  /** Newest first, at most MAX_LOG entries. */
  readonly log: readonly LogEntry[];
  readonly nextLogId: number;
  readonly role: Role;
  /** The page says whether it has a model to download; null: it has one once 'done' arrived. */
  readonly downloadable: boolean | null;
  /** The failure can be trained past ("Continue training"). */
  readonly canContinue: boolean;
  /** The session's size when it was found full. */
  readonly fullRanks: number | null;
  /** The host stopped this run (rather than a rank's own button). */
  readonly stoppedByHost: boolean;
  /** Faults the run went through, over every group, each counted once by what happened (see `faultKind`), and tabs that joined a running session. */
  readonly faults: Readonly<Record<FaultKind, number>> & { readonly joined: number };
  /** This tab asked for a new minimum and has not heard it applied yet. */
  readonly minRequested: number | null;
  /** Pipeline runs: the stages and this tab's place, from the round's 'pipeline' event (null: plain data parallel). */
  readonly pipeline: PipelineLayout | null;
  /** Pipeline runs: the latest schedule as it ran, from 'timeline' (every few steps). */
  readonly timeline: PipelineTimeline | null;
  /**
   * Parameter-server runs: the layout and this tab's figures as a server or a worker, from 'ps'
   * (about once a second; null: not a PS run). Its samples, once heard, stay until newer ones come.
   */
  readonly ps: PsStatus | null;
  /** Pipeline runs: each rank's stage, replica, bubble and waits in its latest step, by rank. */
  readonly pipelineRanks: ReadonlyMap<number, RankPipelineMetrics>;
  /** --devices K > 1: this tab's devices (Workers), their backends and, once they trained, their figures (null: one device). */
  readonly devices: ReadonlyArray<DeviceInfo & Partial<DeviceStats>> | null;
  /**
   * The current group's ranks as they describe themselves (browser, backend, device), by rank,
   * from 'fleet' events: untrusted text from other tabs, cleaned and capped (client/train/fleet.ts).
   */
  readonly fleet: readonly FleetMember[];
}

/** Recent steps kept per rank for averages (throughput, time breakdown, stat cards). */
export const RECENT = 20;
export const MAX_LOG = 400;

export const BREAKDOWN_PARTS: ReadonlyArray<keyof StepBreakdownMs> = ['compute', 'readback', 'allreduce', 'apply'];
export const BREAKDOWN_NAME: Readonly<Record<keyof StepBreakdownMs, string>> = { compute: 'Compute', readback: 'Readback', allreduce: 'All-reduce', apply: 'Apply' };

const PHASE_LABEL: Readonly<Record<Phase, string>> = {
  connecting: 'Connecting',
  waiting: 'Waiting for tabs',
  starting: 'Starting',
  training: 'Training',
  done: 'Done',
  stopped: 'Stopped',
  failed: 'Failed',
  full: 'Session full',
  ended: 'Session ended',
};

const NO_ROLE: Role = { host: false, hasHost: false, spectator: false };

const NO_RANKS: readonly number[] = [];
const NO_FLEET: readonly FleetMember[] = [];
const NO_PIPELINE_RANKS: ReadonlyMap<number, RankPipelineMetrics> = new Map();

export function initialDashboardState(options: { session: string; at: number }): DashboardState {
  const state: DashboardState = {
    session: options.session,
    phase: 'connecting',
    config: null,
    self: null,
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
    stopRequested: false,
    stoppedBy: null,
    summary: null,
    finished: false,
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
    faults: { left: 0, froze: 0, evicted: 0, failed: 0, joined: 0 },
    minRequested: null,
    pipeline: null,
    timeline: null,
    ps: null,
    pipelineRanks: NO_PIPELINE_RANKS,
    devices: null,
    fleet: NO_FLEET,
  };
  return withLog(state, options.at, 'info', `Opened session “${options.session}”.`);
}

// ---------------------------------------------------------------- reducer

export function reduceDashboard(state: DashboardState, action: DashboardAction): DashboardState {
  const { at, event } = action;
  const log = (s: DashboardState, level: LogLevel, message: string) => withLog(s, at, level, message);
  switch (event.type) {
    case 'config':
      return log({ ...state, config: event.config }, 'info', `Job: ${describeJob(event.config)}.`);

    case 'joined': {
      // A second 'joined' is a new group (generation): ranks are renumbered, so what this tab
      // knew about the old group's ranks and links no longer applies.
      const regroup = state.self !== null;
      // The layout and the timeline stay until the new round's own replace them.
      const group: DashboardState = regroup
        ? { ...state, joined: NO_RANKS, lost: NO_RANKS, links: new Map(), recent: new Map(), pipelineRanks: NO_PIPELINE_RANKS, ringProven: false, fleet: NO_FLEET }
        : state;
      // A running group that grows has admitted tabs that joined mid-run.
      const grew = regroup && state.lastStep !== null && state.worldSize !== null && event.worldSize > state.worldSize ? event.worldSize - state.worldSize : 0;
      const next: DashboardState = {
        ...group,
        self: event.rank,
        worldSize: event.worldSize,
        joined: withRank(group.joined, event.rank),
        backend: { name: event.backend, adapter: event.adapter, fallbackReason: event.fallbackReason },
        phase: state.phase === 'connecting' || state.phase === 'waiting' || state.phase === 'full' ? 'starting' : state.phase,
        // A rank of its own: this tab no longer watches from the side.
        role: state.role.spectator ? { ...state.role, spectator: false } : state.role,
        faults: grew ? { ...state.faults, joined: state.faults.joined + grew } : state.faults,
      };
      if (regroup) return log(next, 'info', `New group: this tab is rank ${event.rank} of ${event.worldSize}.`);
      const how = event.fallbackReason ? `, a fallback from ${state.config?.backend ?? 'the requested backend'}` : event.adapter ? `, ${event.adapter}` : '';
      return log(next, event.fallbackReason ? 'warn' : 'info', `This tab joined as rank ${event.rank} of ${event.worldSize} (backend ${event.backend}${how}).`);
    }

    case 'waiting': {
      const { type: _type, ...counts } = event;
      const prev = state.waiting;
      let next: DashboardState = { ...state, waiting: counts, phase: phaseAfterWaiting(state, event) };
      if (event.paused && !prev?.paused) {
        next = log(next, 'warn', `Paused: only ${plural(event.arrived, 'tab')} ${event.arrived === 1 ? 'is' : 'are'} left, below the minimum of ${event.min}. Training resumes when more tabs join.`);
      } else if (prev?.arrived !== event.arrived) {
        next = log(next, 'info', `${tabsInSession(counts)}.`);
      }
      return next;
    }

    case 'shard': {
      const s = noteEpoch(state, event.epoch);
      return log(
        { ...s, shard: event, phase: s.phase === 'connecting' || s.phase === 'waiting' || s.phase === 'full' ? 'starting' : s.phase },
        'info',
        `Epoch ${epochLabel(s, event.epoch)}: this rank's shard is ${fmtInt(event.samples)} of ${fmtInt(event.datasetSize)} samples, ${fmtInt(event.stepsPerEpoch)} steps.`,
      );
    }

    case 'link': {
      const prev = state.links.get(event.peer);
      const links = new Map(state.links);
      // A throughput figure and a path stay while the link stays open; an update without them keeps them.
      const path = event.path ?? (event.state === 'open' ? prev?.path : undefined);
      links.set(event.peer, { state: event.state, throughputMBps: event.throughputMBps ?? (event.state === 'open' ? prev?.throughputMBps : undefined), ...(path ? { path } : {}) });
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

    case 'step':
      return onStep(state, event, at);

    case 'pipeline': {
      const { type: _type, ...layout } = event;
      const prev = state.pipeline;
      const next: DashboardState = { ...state, pipeline: layout };
      // Once per round: said when this tab's place or the schedule is new, not on every round.
      const same =
        prev !== null &&
        prev.stage === layout.stage &&
        prev.stages === layout.stages &&
        prev.replica === layout.replica &&
        prev.replicas === layout.replicas &&
        prev.schedule === layout.schedule &&
        prev.microBatches === layout.microBatches;
      return same ? next : log(next, 'info', pipelineLine(layout));
    }

    case 'timeline': {
      const { type: _type, ...timeline } = event;
      return { ...state, timeline };
    }

    case 'devices': {
      const next = { ...state, devices: event.devices };
      // Said when they start (again: a rebuilt model gets new ones), not on every update of their figures.
      if (event.devices.some((d) => d.steps !== undefined)) return next;
      return log(next, 'info', `This tab computes on ${plural(event.devices.length, 'device')} (Workers, each with its own copy of the model): ${event.devices.map((d) => `device ${d.device} on ${d.backend}`).join(', ')}.`);
    }

    case 'ps': {
      const { type: _type, ...heard } = event;
      const prev = state.ps;
      // The samples, once heard, stay known: an update that has not heard them keeps the last figures.
      const ps: PsStatus = heard.samples === null && prev?.samples ? { ...heard, samples: prev.samples } : heard;
      let next: DashboardState = { ...state, ps };
      // About once a second: said when this tab's role or the layout is new, not on every update.
      if (!prev || psRoleKey(prev) !== psRoleKey(ps)) next = log(next, 'info', psRoleLine(ps));
      else if (psLayoutKey(prev) !== psLayoutKey(ps)) next = log(next, 'info', psLayoutLine(ps));
      const was = prev?.samples ?? null;
      const now = ps.samples;
      if (now) {
        const lost = now.lost - (was?.lost ?? 0);
        if (lost > 0) next = log(next, 'warn', `${pluralInt(lost, 'sample')} lost with a worker that left.`);
        const refused = now.refused - (was?.refused ?? 0);
        if (refused > 0) next = log(next, 'warn', `${pluralInt(refused, 'sample')} refused by the parameter server: pushed malformed, or for a version it no longer has.`);
      }
      return next;
    }

    case 'eval': {
      const s = noteEpoch(state, event.epoch);
      // The job evaluates right after reporting the step: the gap is the evaluation's time.
      const timed = s.lastStepAt !== null && s.lastStep?.step === event.step && at >= s.lastStepAt;
      const evalClock = timed ? { count: s.evalClock.count + 1, seconds: s.evalClock.seconds + (at - s.lastStepAt!) / 1000 } : s.evalClock;
      return log(
        { ...s, lastEval: event, bestEval: Math.max(s.bestEval ?? -Infinity, event.testAccuracy), evalClock },
        'info',
        `Eval at step ${event.step} (epoch ${epochLabel(s, event.epoch)}): test accuracy ${fmtPercent(event.testAccuracy, 2)}, test loss ${fmtNumber(event.testLoss, 4)}.`,
      );
    }

    case 'log':
      return log(state, event.level, event.message);

    case 'fleet':
      return onFleet(state, event, at);

    case 'rank-lost': {
      // After 'done' the group is finished with; a rank closing its tab then is no loss. Each
      // rank is lost once per group (the group renumbers its ranks when it forms again).
      if (state.finished || state.lost.includes(event.rank)) return log(state, 'info', `Lost rank ${event.rank}: ${event.reason}.`);
      const kind = faultKind(event.reason);
      const next = log(state, 'error', `Lost rank ${event.rank}: ${event.reason}.`);
      return { ...next, lost: withRank(next.lost, event.rank), faults: { ...next.faults, [kind]: next.faults[kind] + 1 } };
    }

    case 'stopped':
      return log(
        { ...state, stoppedBy: { by: event.by, atStep: event.atStep }, phase: !state.finished && !isOver(state.phase) ? 'stopped' : state.phase },
        'warn',
        state.stoppedByHost ? `Training stopped at step ${event.atStep} by the host.` : `Training stopped by rank ${event.by}${event.by === state.self ? ' (this tab)' : ''} at step ${event.atStep}.`,
      );

    case 'done': {
      // A stopped run still ends with 'done'; keep saying who stopped it.
      const phase = state.phase === 'stopped' || state.phase === 'failed' || state.phase === 'ended' ? state.phase : 'done';
      const next: DashboardState = { ...state, summary: event.summary, finished: true, phase };
      return log(next, 'info', `${phase === 'stopped' ? 'Finished after the stop' : 'Done'}. ${summaryLine(next)}`);
    }

    case 'stop-requested':
      if (state.stopRequested || isOver(state.phase)) return state;
      return log({ ...state, stopRequested: true }, 'info', `Stop requested by this tab${state.role.host ? ' (the host)' : ''}.`);

    case 'end-requested':
      if (state.phase === 'ended') return state;
      return log(state, 'info', 'Ending the session, as asked by this tab (the host).');

    case 'min-requested':
      return log({ ...state, minRequested: event.min }, 'info', `Asked to keep training with at least ${plural(event.min, 'tab')}.`);

    case 'continue-requested':
      if (!state.canContinue) return state;
      return log(
        { ...state, phase: 'starting', failure: null, error: null, canContinue: false, finished: false, stopRequested: false, stoppedBy: null, lost: NO_RANKS },
        'info',
        'Continuing the training from where it stopped.',
      );

    case 'role': {
      const { type: _type, ...role } = event;
      if (role.host === state.role.host && role.hasHost === state.role.hasHost && role.spectator === state.role.spectator) return state;
      const next: DashboardState = { ...state, role };
      if (role.spectator && !state.role.spectator) return log(next, 'info', `The session is full: this tab watches and takes a rank when one frees up.`);
      if (role.host && !state.role.host) return log(next, 'info', 'This tab is the host: it can stop the training or end the session for everyone.');
      return next;
    }

    case 'downloadable':
      return state.downloadable === event.available ? state : { ...state, downloadable: event.available };

    case 'watched-end':
      if (isOver(state.phase)) return state;
      return log({ ...state, phase: 'done', finished: true, role: { ...state.role, spectator: false } }, 'info', 'The run finished before this tab got a rank: it trained without this tab.');

    case 'full':
      if (isOver(state.phase)) return state;
      return log({ ...state, phase: 'full', fullRanks: event.ranks }, 'warn', `The session is full${event.ranks !== null ? ` (${plural(event.ranks, 'rank')})` : ''}: this tab has no rank.`);

    case 'control':
      return onControl(state, event, log);

    case 'error-shown': {
      const { type: _type, ...error } = event;
      return log({ ...state, error }, 'error', `${event.title}: ${event.detail}`);
    }

    case 'error-dismissed':
      return state.error === null ? state : { ...state, error: null };

    case 'failed': {
      const { type: _type, canContinue, ...error } = event;
      // After the host ended the session, losing the connection is what ending means.
      if (state.phase === 'ended') return log(state, 'info', `${event.title}: ${event.detail}`);
      return log({ ...state, failure: event.title, error, canContinue: canContinue === true, phase: state.finished ? state.phase : 'failed' }, 'error', `${event.title}: ${event.detail}`);
    }

    default: {
      // Exhaustive at compile time; at run time a newer event kind is ignored rather than break the page.
      const unknown: never = event;
      void unknown;
      return state;
    }
  }
}

function onControl(state: DashboardState, e: Extract<PageEvent, { type: 'control' }>, log: (s: DashboardState, level: LogLevel, message: string) => DashboardState): DashboardState {
  switch (e.action) {
    case 'stop':
      return log({ ...state, stoppedByHost: true }, 'warn', 'The host stopped the run: every tab stops at the same step.');
    case 'end': {
      const next: DashboardState = { ...state, phase: 'ended', stopRequested: false, error: null };
      return log(next, 'warn', 'The host ended the session: this tab is disconnected from it.');
    }
    case 'min': {
      if (e.min === undefined) return state;
      const config = state.config ? { ...state.config, min: e.min } : state.config;
      const waiting = state.waiting ? { ...state.waiting, min: e.min } : state.waiting;
      return log({ ...state, config, waiting, minRequested: null }, 'info', `The host set the minimum to ${plural(e.min, 'tab')}: training goes on while at least ${e.min} ${e.min === 1 ? 'is' : 'are'} in.`);
    }
  }
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

function onStep(state: DashboardState, e: StepEvent, at: number): DashboardState {
  const s = noteEpoch(state, e.epoch);
  const firstStep = s.lastStep === null;
  const newEpoch = s.lastStep !== null && e.epoch !== s.lastStep.epoch;
  const recent = new Map(s.recent);
  let joined = s.joined;
  // Plain data-parallel steps carry no pipeline figures: the map then keeps its identity.
  let pipelineRanks: Map<number, RankPipelineMetrics> | null = null;
  for (const m of e.ranks) {
    // A rank that reports figures has plainly joined.
    joined = withRank(joined, m.rank);
    const list = [...(recent.get(m.rank) ?? []), m];
    recent.set(m.rank, list.length > RECENT ? list.slice(-RECENT) : list);
    if (m.pipeline) (pipelineRanks ??= new Map(s.pipelineRanks)).set(m.rank, m.pipeline);
  }
  const clock = [...s.stepClock, { step: e.step, t: e.elapsedSec, evalT: s.evalClock.seconds }];
  let next: DashboardState = {
    ...s,
    phase: isOver(s.phase) ? s.phase : 'training',
    worldSize: s.worldSize === null || e.ranks.length > s.worldSize ? e.ranks.length : s.worldSize,
    lastStep: e,
    joined,
    recent,
    pipelineRanks: pipelineRanks ?? s.pipelineRanks,
    ringProven: true,
    stepClock: clock.length > RECENT + 1 ? clock.slice(-(RECENT + 1)) : clock,
    lastStepAt: at,
  };
  if (firstStep) next = withLog(next, at, 'info', `Training started: first step done with ${plural(e.ranks.length, 'rank')}.`);
  if (newEpoch) next = withLog(next, at, 'info', `Epoch ${epochLabel(next, e.epoch)} started at step ${e.step}.`);
  return next;
}

function onFleet(state: DashboardState, e: Extract<TrainEvent, { type: 'fleet' }>, at: number): DashboardState {
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
function fleetWords(m: FleetMember): string {
  return `${m.browser}${m.platform ? ` (${m.platform})` : ''}, ${m.backend}${m.fallback ? ' (a fallback)' : ''}`;
}

function noteEpoch(state: DashboardState, epoch: number): DashboardState {
  return state.epochBase === null ? { ...state, epochBase: epoch === 0 ? 0 : 1 } : state;
}

function withLog(state: DashboardState, at: number, level: LogLevel, message: string): DashboardState {
  const entry: LogEntry = { id: state.nextLogId, at, level, message };
  const log = [entry, ...state.log];
  if (log.length > MAX_LOG) log.length = MAX_LOG;
  return { ...state, log, nextLogId: state.nextLogId + 1 };
}

/** `ranks` with `rank` added in order; the same array when it is there already. */
function withRank(ranks: readonly number[], rank: number): readonly number[] {
  if (ranks.includes(rank)) return ranks;
  return [...ranks, rank].sort((a, b) => a - b);
}

/** The run is over (for better or worse): nothing but 'done' changes its phase any more. */
function isOver(phase: Phase): boolean {
  return phase === 'done' || phase === 'stopped' || phase === 'failed' || phase === 'ended';
}

// ---------------------------------------------------------------- derived: words

/** What the phase pill and the page's data-phase show: a spectating tab is neither waiting nor failed. */
export function displayPhase(s: DashboardState): Phase | 'spectating' {
  return s.role.spectator && !isOver(s.phase) ? 'spectating' : s.phase;
}

export function phaseLabel(s: DashboardState): string {
  if (displayPhase(s) === 'spectating') return 'Spectating';
  return s.phase === 'waiting' && s.waiting?.paused ? 'Paused' : PHASE_LABEL[s.phase];
}

/** The session's size: from the group's events, else the job's. */
function sessionRanks(s: DashboardState): number | null {
  return s.fullRanks ?? s.waiting?.max ?? s.config?.max ?? null;
}

/** A failure title that says nothing more than "it failed" is not repeated after "Training failed". */
function failureReason(s: DashboardState): string {
  const f = s.failure?.trim().replace(/[.:]+$/, '');
  return !f || /^training failed$/i.test(f) ? 'see the message below' : f;
}

/** Seconds the run took: the job's own total once it is done, else the latest step's elapsed time. */
export function runSeconds(s: DashboardState): number | null {
  const total = s.summary?.seconds;
  if (s.finished && typeof total === 'number' && Number.isFinite(total)) return total;
  return s.lastStep?.elapsedSec ?? null;
}

/** 1-based epoch for people, whatever the job counts from. */
function epochLabel(s: DashboardState, epoch: number): string {
  return String(epoch + (s.epochBase === 0 ? 1 : 0));
}

/** "2 of 3" when the job trains whole epochs, else "2". */
function epochOf(s: DashboardState, epoch: number): string {
  const total = s.config && s.config.steps === null ? ` of ${s.config.epochs}` : '';
  return `${epochLabel(s, epoch)}${total}`;
}

/** The status line: where the run is and what the person can do. */
export function statusText(s: DashboardState): string {
  const lostNote = s.lost.length ? ` Lost: rank ${s.lost.join(', ')}.` : '';
  if (displayPhase(s) === 'spectating') {
    const n = sessionRanks(s);
    const at = s.lastStep ? ` Training is at step ${fmtInt(s.lastStep.step)}.` : '';
    return `The session is full${n !== null ? ` (${plural(n, 'rank')})` : ''}: this tab watches and takes a rank when one frees up.${at}`;
  }
  switch (s.phase) {
    case 'connecting':
      return 'Connecting to the server…';
    case 'waiting': {
      const w = s.waiting;
      if (!w) return 'Waiting for the other tabs…';
      const more = Math.max(0, w.min - Math.max(1, w.arrived));
      if (w.paused) {
        const at = s.lastStep ? ` at step ${fmtInt(s.lastStep.step)}` : '';
        return `Training is paused${at}: only ${plural(w.arrived, 'tab')} ${w.arrived === 1 ? 'is' : 'are'} left, below the minimum of ${w.min}. It resumes when ${plural(more, 'more tab')} ${more === 1 ? 'joins' : 'join'}. Share the link below.${lostNote}`;
      }
      // This tab is one of the session's members, so at least one is here whatever a count says.
      const arrived = Math.max(1, w.arrived);
      const here = w.min === w.max ? `${arrived} of ${w.max} here` : `${arrived} here; training starts with ${w.min}, up to ${w.max} can join`;
      return `Waiting for ${plural(more, 'more tab')} (${here}). Share the link below.`;
    }
    case 'starting': {
      const n = s.worldSize ?? s.waiting?.arrived;
      const max = s.waiting?.max ?? s.config?.max;
      const next = 'Connecting the ring and loading data…';
      if (n === undefined) return `Starting. ${next}`;
      if (max !== undefined && n < max) return `${plural(n, 'tab')} joined, enough to start (up to ${max} can train together). ${next}`;
      return `${n === 1 ? 'The only tab' : `All ${n} tabs`} joined. ${next}`;
    }
    case 'training': {
      const e = s.lastStep;
      const w = s.worldSize ?? 0;
      return `Training${e ? ` (epoch ${epochOf(s, e.epoch)})` : ''} on ${w || '?'} rank${w === 1 ? '' : 's'}.${lostNote}`;
    }
    case 'done': {
      if (s.self === null) return `The run finished before this tab got a rank${s.lastStep ? `, after ${fmtInt(s.lastStep.step)} steps` : ''}: it trained without this tab. To train, ask the host for a new session.`;
      const final = finalTestAccuracy(s);
      const acc = final !== null ? ` Final test accuracy ${fmtPercent(final)}.` : '';
      const took = runSeconds(s);
      const steps = s.lastStep ? ` ${fmtInt(s.lastStep.step)} steps in ${fmtDuration(took ?? s.lastStep.elapsedSec)}.` : '';
      return `Done.${steps}${acc} The model can be downloaded.`;
    }
    case 'failed': {
      const more = s.canContinue ? ' The model trained so far is kept: you can continue training.' : '';
      return `Training failed${s.lastStep ? ` at step ${fmtInt(s.lastStep.step)}` : ''}: ${failureReason(s)}.${more}`;
    }
    case 'stopped': {
      const by = s.stoppedBy;
      if (!by) return 'Stopped.';
      const who = s.stoppedByHost ? 'the host' : by.by === s.self ? `rank ${by.by} (this tab)` : `rank ${by.by}`;
      const final = finalTestAccuracy(s);
      const after = s.finished ? `${final !== null ? ` Test accuracy ${fmtPercent(final)}.` : ''} The model trained so far can be downloaded.` : '';
      return `Stopped by ${who} at step ${fmtInt(by.atStep)}.${lostNote}${after}`;
    }
    case 'full': {
      const n = s.fullRanks;
      return `The session is full${n !== null ? `: all ${plural(n, 'rank')} are taken` : ''}, so this tab is not training. Keep it for when a tab closes (reload it then), or create a new session.`;
    }
    case 'ended': {
      const at = s.lastStep ? ` at step ${fmtInt(s.lastStep.step)}` : '';
      const model = controls(s).downloadEnabled ? ' The model trained so far can still be downloaded from this tab.' : '';
      return `The host ended the session${at}: this tab is disconnected.${model}`;
    }
  }
}

/** The job in one line: "mlp on mnist · adam lr 0.003 · batch 64/rank (192 global) · 2 epochs". */
export function describeJob(c: TrainConfig): string {
  const length = c.steps !== null ? `${fmtInt(c.steps)} steps` : `${c.epochs} epoch${c.epochs === 1 ? '' : 's'}`;
  // --slow: the stragglers go with the length, so both kinds of run show them.
  const slowed = c.slow ? Object.entries(c.slow).map(([rank, f]) => `rank ${rank} ${f}× slower`) : [];
  const subset = (c.trainSize > 0 ? ` · first ${fmtInt(c.trainSize)} samples` : '') + (slowed.length > 0 ? ` · ${slowed.join(', ')}` : '');
  // --hidden: said only when it is not the model's default (older configs have no such field).
  const model = c.hidden === null || c.hidden === undefined ? c.model : c.hidden === 0 ? `${c.model} (no hidden layer)` : `${c.model} (${fmtInt(c.hidden)} hidden)`;
  if (c.pp > 1) {
    // A pipeline run is a fixed size, and its batch is per replica (every stage of a replica sees it).
    const wire = c.activationDtype === 'float32' ? '' : `, ${c.activationDtype} activations`;
    const pipeline = ` · pipeline of ${plural(c.pp, 'stage')} × ${plural(c.dp, 'replica')}, ${plural(c.microBatches, 'micro-batch', 'micro-batches')} (${c.schedule}${wire})`;
    return `${model} on ${c.dataset} · ${c.optimizer} lr ${c.lr} · batch ${c.batchSize}/replica (${c.batchSize * c.dp} global) · ${length}${subset}${pipeline}`;
  }
  const global = c.min === c.max ? `${c.batchSize * c.max} global` : `up to ${c.batchSize * c.max} global`;
  const tabs = c.min === c.max ? '' : ` · elastic, ${c.min} to ${c.max} tabs`;
  // --comm-hook: said only when the gradients travel otherwise than the plain all-reduce.
  const hook = c.commHook && c.commHook.kind !== 'none' ? ` · ${describeCommHook(c.commHook)}` : '';
  const devices = (c.devices ?? 1) > 1 ? ` · ${c.devices} devices per tab` : '';
  return `${model} on ${c.dataset} · ${c.optimizer} lr ${c.lr} · batch ${c.batchSize}/rank (${global}) · ${length}${subset}${tabs}${hook}${devices}`;
}

export type BackendFact =
  | { kind: 'running'; name: BackendName; detail: string; fallback: string | null }
  | { kind: 'requested'; name: BackendName }
  | { kind: 'unknown' };

export interface Facts {
  rank: { text: string; rank: number | null };
  /** This tab's browser and platform ("Chrome 156 · Android phone"), once its fleet info is known. */
  browser: string;
  backend: BackendFact;
  /** --devices K > 1: one line per device (backend, its share and speed), and its fallback if any; null with one device. */
  devices: Array<{ text: string; fallback: string | null }> | null;
  shard: string;
  job: string;
}

/** The facts card: this tab's rank, its backend, its data shard, the job. */
export function facts(s: DashboardState): Facts {
  const c = s.config;
  let size = '';
  if (s.worldSize !== null) size = ` · world size ${s.worldSize}`;
  else if (c) size = c.min === c.max ? ` · world size ${c.max}` : ` · ${c.min} to ${c.max} tabs`;

  let backend: BackendFact = { kind: 'unknown' };
  const b = s.backend;
  if (b) {
    const cpuOnly = b.name === 'wasm' || b.name === 'cpu';
    // On wasm and cpu a WebGPU adapter the tab has is not what it trains on.
    const detail = cpuOnly ? ' · on the CPU' : b.adapter ? ` · ${b.adapter}` : ' · adapter not reported';
    // The insecure-page reason says all itself (it is the page, not the browser, and what to do).
    const fallback = !b.fallbackReason ? null : b.fallbackReason.startsWith(INSECURE_PAGE_REASON) ? `⚠ ${b.fallbackReason}.` : `⚠ Fallback from ${c?.backend ?? 'the requested backend'}: ${b.fallbackReason}`;
    backend = { kind: 'running', name: b.name, detail, fallback };
  } else if (c) {
    backend = { kind: 'requested', name: c.backend };
  }

  const sh = s.shard;
  const mine = s.self === null ? undefined : s.fleet.find((m) => m.rank === s.self);
  return {
    rank: { text: s.self !== null ? `rank ${s.self}${size}` : s.role.spectator ? `watching, no rank yet${size}` : `joining…${size}`, rank: s.self },
    browser: mine ? [mine.browser, mine.platform].filter(Boolean).join(' · ') : '–',
    backend,
    devices: s.devices === null ? null : s.devices.map(deviceFact),
    shard: sh ? `${fmtInt(sh.samples)} of ${fmtInt(sh.datasetSize)} samples · epoch ${epochOf(s, sh.epoch)} · ${fmtInt(sh.stepsPerEpoch)} steps/epoch` : '–',
    job: c ? describeJob(c) : '–',
  };
}

/** "device 1: cpu · 1,024 samples · 12.3 ms/step", and its fallback reason. */
function deviceFact(d: DeviceInfo & Partial<DeviceStats>): { text: string; fallback: string | null } {
  const figures = d.steps ? ` · ${fmtInt(d.samples ?? 0)} samples · ${d.meanComputeMs == null ? '–' : fmtMs(d.meanComputeMs)}/step` : '';
  return { text: `device ${d.device}: ${d.backend}${figures}`, fallback: d.fallbackReason ? `⚠ ${d.fallbackReason}` : null };
}

export interface Controls {
  /** "Stop training for everyone": the host's tab, or every tab of a session without a host. */
  stop: { visible: boolean; disabled: boolean; label: string };
  /** "End session": the host's tab only. */
  end: { visible: boolean; disabled: boolean };
  /** The host's control of the minimum number of tabs (1..max). */
  min: { visible: boolean; disabled: boolean; value: number; max: number };
  /** Said instead of the buttons on tabs that are not the host's. */
  note: string | null;
  /** "Continue training" after a failure the page can train past. */
  continueVisible: boolean;
  /** The model exists once 'done' arrived, or when the page says it has one (after a failure). */
  downloadEnabled: boolean;
}

export function controls(s: DashboardState): Controls {
  const { host, hasHost, spectator } = s.role;
  let stop = { visible: (host || !hasHost) && !spectator, disabled: false, label: 'Stop training for everyone' };
  if (s.finished) stop = { ...stop, disabled: true, label: s.phase === 'stopped' ? 'Stopped' : 'Training finished' };
  else if (s.stoppedBy) stop = { ...stop, disabled: true, label: 'Stopped' };
  else if (isOver(s.phase) || s.phase === 'full') stop = { ...stop, disabled: true };
  else if (s.stopRequested) stop = { ...stop, disabled: true, label: 'Stopping…' };
  const max = s.config?.max ?? s.waiting?.max ?? 1;
  const min = s.minRequested ?? s.waiting?.min ?? s.config?.min ?? 1;
  return {
    stop,
    end: { visible: host, disabled: s.phase === 'ended' },
    min: { visible: host && max > 1, disabled: isOver(s.phase), value: Math.min(min, max), max },
    note: !host && hasHost && s.phase !== 'ended' ? "The host's tab controls this session: it can stop the training or end the session." : null,
    continueVisible: s.phase === 'failed' && s.canContinue,
    downloadEnabled: s.downloadable ?? s.finished,
  };
}

/** What the confirmation dialogs say: what happens, before it happens. */
export const CONFIRM = {
  stop: {
    title: 'Stop training for everyone?',
    body: 'Every tab of the session stops at the same step. The model trained so far is kept, and every tab can download it. Training does not start again in this session.',
    confirm: 'Stop training',
  },
  end: {
    title: 'End the session?',
    body: 'Training stops and every tab is disconnected from the session; its link no longer works. Download the model first if you want to keep it.',
    confirm: 'End session',
  },
} as const;

/** The downloaded files' name: the session and the step the model is at ("my-run-step-938"). */
export function downloadBaseName(s: DashboardState): string {
  const session = s.session.replace(/[^A-Za-z0-9_.-]/g, '_') || 'browser-ddp';
  const step = s.lastStep?.step ?? (typeof s.summary?.steps === 'number' ? s.summary.steps : 0);
  return `${session}-step-${step}`;
}

// ---------------------------------------------------------------- derived: figures

/**
 * Training steps per second over the recent window, or over the whole run before there is a
 * window; time spent evaluating in the window is not step time.
 */
export function stepRate(s: DashboardState): number | null {
  const c = s.stepClock;
  if (c.length >= 2) {
    const a = c[0]!;
    const b = c[c.length - 1]!;
    const t = b.t - a.t - (b.evalT - a.evalT);
    if (t > 0 && b.step > a.step) return (b.step - a.step) / t;
  }
  const e = s.lastStep;
  const t = e ? e.elapsedSec - s.evalClock.seconds : 0;
  return e && t > 0 ? e.step / t : null;
}

/** Mean seconds of one evaluation so far, or null before one was timed. */
export function evalSeconds(s: DashboardState): number | null {
  return s.evalClock.count > 0 ? s.evalClock.seconds / s.evalClock.count : null;
}

/**
 * Evaluations still to come after the latest step: every `evalEvery` steps, at each epoch end,
 * and once at the very end (steps that are several of these count once).
 */
export function evalsLeft(s: DashboardState): number {
  const e = s.lastStep;
  if (!e || e.totalSteps <= e.step) return 0;
  const every = s.config?.evalEvery ?? 0;
  const epoch = s.shard?.stepsPerEpoch ?? 0;
  const multiples = (k: number) => (k > 0 ? Math.floor(e.totalSteps / k) - Math.floor(e.step / k) : 0);
  const both = every > 0 && epoch > 0 ? multiples(lcm(every, epoch)) : 0;
  const counted = multiples(every) + multiples(epoch) - both;
  const lastCounted = (every > 0 && e.totalSteps % every === 0) || (epoch > 0 && e.totalSteps % epoch === 0);
  return counted + (lastCounted ? 0 : 1);
}

/** Seconds left: the steps to go at the recent rate, plus the evaluations to go at their measured time. */
export function etaSeconds(s: DashboardState): number | null {
  const e = s.lastStep;
  const rate = stepRate(s);
  if (!e || !rate) return null;
  return Math.max(0, (e.totalSteps - e.step) / rate + evalsLeft(s) * (evalSeconds(s) ?? 0));
}

export interface ProgressFigures {
  step: number;
  total: number;
  /** The progress element's value and max (never 0, so an empty bar is not indeterminate). */
  value: number;
  max: number;
  /** The run finished ('done' arrived, also after a stop). */
  done: boolean;
  text: string;
}

export function progressFigures(s: DashboardState): ProgressFigures {
  const e = s.lastStep;
  const total = e?.totalSteps ?? 0;
  const step = e?.step ?? 0;
  const figures = { step, total, max: Math.max(total, 1), value: s.phase === 'done' && total > 0 ? total : Math.min(step, total || 1), done: s.finished };
  if (!e) return { ...figures, text: 'No steps yet.' };
  const pct = e.totalSteps > 0 ? Math.floor((100 * e.step) / e.totalSteps) : 0;
  const parts = [`Epoch ${epochOf(s, e.epoch)}`, `step ${fmtInt(e.step)} / ${fmtInt(e.totalSteps)} (${pct}%)`];
  const took = runSeconds(s) ?? e.elapsedSec;
  if (s.phase === 'done') parts.push(`finished in ${fmtDuration(took)}`);
  else if (s.phase === 'stopped') parts.push(`stopped after ${fmtDuration(took)}`);
  else if (s.phase === 'failed') parts.push(`failed after ${fmtDuration(took)}`);
  else if (s.phase === 'ended') parts.push(`ended after ${fmtDuration(took)}`);
  else {
    const rate = stepRate(s);
    const eta = etaSeconds(s);
    if (rate) parts.push(`${rate >= 10 ? rate.toFixed(0) : rate.toFixed(1)} steps/s`);
    parts.push(eta === null ? 'estimating time left…' : `about ${fmtDuration(eta)} left`);
  }
  return { ...figures, text: parts.join(' · ') };
}

export interface RankAverages {
  rank: number;
  samplesPerSec: number;
  breakdownMs: StepBreakdownMs;
  /** The breakdown's sum: the rank's time per step. */
  totalMs: number;
  /** DDP runs: bytes the rank sent per step, over its recent steps that said (left out when none did). */
  bytesPerStep?: number;
  /** --devices K > 1: the rank's devices and their mean compute per step over its recent steps. */
  devices?: { count: number; meanMs: number };
  self: boolean;
  lost: boolean;
}

/** Each rank's averages over its recent steps, in rank order (non-finite figures are skipped). */
export function rankAverages(s: DashboardState): RankAverages[] {
  return [...s.recent.keys()]
    .sort((a, b) => a - b)
    .map((rank) => {
      const list = s.recent.get(rank)!;
      const breakdownMs = { compute: 0, readback: 0, allreduce: 0, apply: 0 };
      for (const p of BREAKDOWN_PARTS) breakdownMs[p] = mean(list.map((m) => m.breakdownMs[p]));
      const sent = mean(list.map((m) => m.commBytes ?? NaN));
      const withDevices = list.filter((m) => m.devices && m.devices.count > 1);
      return {
        rank,
        samplesPerSec: mean(list.map((m) => m.samplesPerSec)),
        breakdownMs,
        totalMs: BREAKDOWN_PARTS.reduce((sum, p) => sum + breakdownMs[p], 0),
        ...(Number.isFinite(sent) ? { bytesPerStep: sent } : {}),
        ...(withDevices.length > 0 ? { devices: { count: withDevices.at(-1)!.devices!.count, meanMs: mean(withDevices.map((m) => m.devices!.meanMs)) } } : {}),
        self: rank === s.self,
        lost: s.lost.includes(rank),
      };
    });
}

export interface FleetRow {
  rank: number;
  self: boolean;
  lost: boolean;
  /** "Chrome 156"; null until the rank said. */
  browser: string | null;
  /** "Android phone", "Linux". */
  platform: string | null;
  backend: BackendName | null;
  /** Why it runs on a fallback backend. */
  fallback: string | null;
  /** The adapter, the WebGL renderer or the CPU, with the device's RAM when the browser says ("Mali-G715 · 4 GB RAM"). */
  device: string | null;
  /** Mean time per step (and its compute) over the rank's recent steps. */
  stepMs: number | null;
  computeMs: number | null;
  /** The rank's share of the global batch over its recent steps, 0..1; null before a step. */
  share: number | null;
  /** True when the ranks do not report their samples and the share is the even split. */
  shareEven: boolean;
}

/**
 * Every rank of the current group: what it said about itself (browser, backend, device), its
 * time per step, and its share of the global batch, `samples / sum over ranks` over the recent
 * steps (each rank's batch may differ); a run whose steps do not report `samples` splits evenly.
 */
export function fleetRows(s: DashboardState): FleetRow[] {
  const ranks = new Set<number>(s.fleet.map((m) => m.rank));
  for (const r of s.recent.keys()) ranks.add(r);
  if (s.worldSize !== null && s.worldSize <= 4096) for (let r = 0; r < s.worldSize; r++) ranks.add(r);
  const averages = new Map(rankAverages(s).map((a) => [a.rank, a]));
  // The share: samples over the recent steps, when every rank of the latest step reported them.
  // Only data parallel ranks split a global batch: pipeline stages take the same batches, parameter-server workers their own.
  const splitsBatch = s.config === null || (s.config.pp <= 1 && s.config.strategy === 'ddp');
  const stepRanks = splitsBatch ? (s.lastStep?.ranks.map((m) => m.rank) ?? []) : [];
  const sampleSums = new Map<number, number>();
  let measured = stepRanks.length > 0;
  for (const r of stepRanks) {
    const list = s.recent.get(r) ?? [];
    if (list.length === 0 || !list.every((m) => typeof m.samples === 'number' && Number.isFinite(m.samples) && m.samples >= 0)) measured = false;
    sampleSums.set(r, list.reduce((sum, m) => sum + (m.samples ?? 0), 0));
  }
  const total = [...sampleSums.values()].reduce((a, b) => a + b, 0);
  if (!(total > 0)) measured = false;
  return [...ranks]
    .sort((a, b) => a - b)
    .map((rank) => {
      const m = s.fleet.find((f) => f.rank === rank);
      const a = averages.get(rank);
      const inStep = stepRanks.includes(rank);
      // The device's RAM as the browser reports it (navigator.deviceMemory), not the GPU's.
      const memory = m?.memoryGB != null ? `${fmtNumber(m.memoryGB, m.memoryGB < 1 ? 2 : 0)} GB RAM` : null;
      const device = [m?.device ?? null, memory].filter((x): x is string => x !== null).join(' · ');
      return {
        rank,
        self: rank === s.self,
        lost: s.lost.includes(rank),
        browser: m?.browser ?? null,
        platform: m?.platform ?? null,
        backend: m?.backend ?? (rank === s.self ? (s.backend?.name ?? null) : null),
        fallback: m?.fallback ?? null,
        device: device === '' ? null : device,
        stepMs: a && Number.isFinite(a.totalMs) ? a.totalMs : null,
        computeMs: a && Number.isFinite(a.breakdownMs.compute) ? a.breakdownMs.compute : null,
        share: !inStep ? null : measured ? sampleSums.get(rank)! / total : 1 / stepRanks.length,
        shareEven: inStep && !measured,
      };
    });
}

/** How a --comm-hook reads on the page ("PowerSGD, rank 2, after 10 plain steps"). */
export function describeCommHook(h: CommHookSpec): string {
  switch (h.kind) {
    case 'none':
      return 'float32 all-reduce';
    case 'fp16':
      return 'fp16 compression (float16 on the wire)';
    case 'bf16':
      return 'bf16 compression (bfloat16 on the wire)';
    case 'powersgd':
      return `PowerSGD, rank ${h.rank}${h.wire === 'float32' ? '' : `, ${h.wire} on the wire`}, after ${plural(h.startIter, 'plain step')}`;
    case 'localsgd':
      return `local SGD, models averaged every ${plural(h.period, 'step')} after ${plural(h.startStep, 'averaged step')}`;
  }
}

/** The performance card's line about a DDP run's communication: the hook, bytes per step, and the ratio to the float32 all-reduce. */
export interface CommFigures {
  hook: string;
  /** Mean over the ranks' recent steps (null: no step said). */
  bytesPerStep: number | null;
  /** Recent bytes sent over what the float32 all-reduce would have sent (null: unknown, or a world of one). */
  ratio: number | null;
  text: string;
}

/**
 * The hook in use and what it sends, over the ranks' recent steps: null for a run that is not
 * plain DDP (pipelines and parameter servers have no hook) or before the job's config is known.
 */
export function commFigures(s: DashboardState): CommFigures | null {
  const c = s.config;
  if (!c || c.pp > 1 || c.strategy !== 'ddp') return null;
  const hook = describeCommHook(c.commHook ?? { kind: 'none' });
  const steps = [...s.recent.values()].flat().filter((m) => typeof m.commBytes === 'number' && Number.isFinite(m.commBytes));
  const bytesPerStep = steps.length > 0 ? mean(steps.map((m) => m.commBytes!)) : null;
  const dense = steps.reduce((sum, m) => sum + (m.commDenseBytes ?? NaN), 0);
  const ratio = steps.length > 0 && dense > 0 ? steps.reduce((sum, m) => sum + m.commBytes!, 0) / dense : null;
  const parts = [`Gradients: ${hook}`];
  if (bytesPerStep !== null) parts.push(`${fmtBytes(bytesPerStep)} sent per rank per step`);
  if (ratio !== null) parts.push(`${fmtNumber(ratio, ratio < 0.1 ? 3 : 2)}× the float32 all-reduce’s bytes`);
  return { hook, bytesPerStep, ratio, text: parts.join(' · ') };
}

export type StatKey = 'loss' | 'acc' | 'test' | 'speed' | 'time';

export interface StatCard {
  value: string;
  /** Shown smaller after the value. */
  unit?: string;
  sub: string;
}

/** The five figures above the charts. */
export function statCards(s: DashboardState): Record<StatKey, StatCard> {
  const empty: StatCard = { value: '–', sub: '' };
  const cards: Record<StatKey, StatCard> = { loss: empty, acc: empty, test: empty, speed: empty, time: empty };
  const all = [...s.recent.values()].flat();
  const e = s.lastStep;
  if (e) {
    const loss = mean(all.map((m) => m.loss));
    const span = Math.min(RECENT, s.stepClock.length);
    cards.loss = { value: fmtNumber(loss, loss < 1 ? 4 : 3), sub: span === 1 ? 'all ranks, last step' : `all ranks, last ${span} steps` };
    cards.acc = { value: fmtPercent(mean(all.map((m) => m.accuracy))), sub: 'training batches, same window' };
    const ranks = rankAverages(s);
    const p = s.pipeline;
    // Every sample of a pipeline run passes through each stage: a replica counts once, at its first stage.
    const counted = p && s.pipelineRanks.size > 0 ? ranks.filter((r) => s.pipelineRanks.get(r.rank)?.stage === 0) : ranks;
    const total = counted.reduce((sum, r) => sum + (Number.isFinite(r.samplesPerSec) ? r.samplesPerSec : 0), 0);
    const replicas = p ? p.replicas : e.ranks.length;
    const who = p ? `${plural(p.replicas, 'replica')} of ${plural(p.stages, 'stage')}` : plural(ranks.length, 'rank');
    cards.speed = { value: fmtInt(total), unit: ' samples/s', sub: `${who} · global batch ${s.config ? fmtInt(s.config.batchSize * replicas) : '?'}` };
    const eta = etaSeconds(s);
    const timeSub =
      s.phase === 'done'
        ? 'total time'
        : s.phase === 'stopped'
          ? 'until stopped'
          : s.phase === 'failed'
            ? 'until it failed'
            : s.phase === 'ended'
              ? 'until the session ended'
              : eta === null
                ? 'elapsed'
                : `elapsed · about ${fmtDuration(eta)} left`;
    cards.time = { value: fmtDuration(runSeconds(s) ?? e.elapsedSec), sub: timeSub };
  }
  const final = s.summary?.testAccuracy;
  const finalLoss = s.summary?.testLoss;
  const ev = s.lastEval;
  if (s.finished && typeof final === 'number') {
    // The job evaluates once more at the end (e.g. after a stop) without an 'eval' event.
    cards.test = { value: fmtPercent(final), sub: `final${typeof finalLoss === 'number' ? `, loss ${fmtNumber(finalLoss, 3)}` : ''}` };
  } else if (ev) {
    const best = s.bestEval !== null && s.bestEval > ev.testAccuracy ? ` · best ${fmtPercent(s.bestEval)}` : '';
    cards.test = { value: fmtPercent(ev.testAccuracy), sub: `at step ${fmtInt(ev.step)}, loss ${fmtNumber(ev.testLoss, 3)}${best}` };
  } else if (e) {
    cards.test = { value: '–', sub: 'no evaluation yet' };
  }
  return cards;
}

/** How a link's bytes travel, in words: "directly (host ↔ host)", "through a TURN relay (relay ↔ relay)". */
export function pathWords(path: { local: string | null; remote: string | null; rttMs: number | null }): string {
  const pair = `${path.local ?? 'unknown'} ↔ ${path.remote ?? 'unknown'}`;
  const how =
    path.local === 'relay' || path.remote === 'relay'
      ? 'through a TURN relay'
      : path.local === 'host' && path.remote === 'host'
        ? 'directly'
        : path.local === null || path.remote === null
          ? 'by an unknown path'
          : 'directly, through NAT';
  return `${how} (${pair})${path.rttMs === null ? '' : `, round trip ${path.rttMs} ms`}`;
}

/** What the ring view draws. */
export function ringModel(s: DashboardState): RingModel {
  return {
    worldSize: s.worldSize ?? s.config?.max ?? Math.max(1, s.joined.length),
    self: s.self,
    joined: new Set(s.joined),
    lost: new Set(s.lost),
    observedLinks: s.links,
    ringProven: s.ringProven,
    active: s.phase === 'training',
  };
}

function finalTestAccuracy(s: DashboardState): number | null {
  const fromSummary = s.summary?.testAccuracy;
  if (typeof fromSummary === 'number' && Number.isFinite(fromSummary)) return fromSummary;
  return s.lastEval?.testAccuracy ?? null;
}

// ---------------------------------------------------------------- derived: the pipeline

/** The log's line for a round's 'pipeline' event (also the page's console line, in other words). */
function pipelineLine(p: PipelineLayout): string {
  const mine = p.layers.filter((l) => l.stage === p.stage);
  const params = mine.reduce((n, l) => n + l.parameters, 0);
  const replica = p.replicas > 1 ? ` (replica ${p.replica} of ${p.replicas})` : '';
  const layers = mine.length ? `layers ${mine.map((l) => `${l.index} ${l.className}`).join(', ')} (${fmtInt(params)} parameters)` : 'no layers reported';
  return `Pipeline: this tab is stage ${p.stage} of ${p.stages}${replica}, ${layers}; ${p.schedule} schedule, ${plural(p.microBatches, 'micro-batch', 'micro-batches')}, bubble ${fmtPercent(p.bubbleFormula)} by the formula.`;
}

export interface PipelineStageRow {
  stage: number;
  /** The stage's layers in model order. */
  layers: readonly StageLayer[];
  /** "2 Dense, 3 Dense" (index and class), or "–" when the layout names none. */
  layersText: string;
  parameters: number;
  /** The global ranks holding this stage, one per replica (rank = replica × stages + stage). */
  ranks: number[];
  /** This tab holds it. */
  self: boolean;
  /** Those of its ranks that are gone. */
  lost: number[];
  /** Mean idle share of its ranks in their latest step; null before one reported it. */
  bubble: number | null;
}

/** What the Pipeline panel shows (null for plain data-parallel runs). */
export interface PipelinePanel {
  stages: PipelineStageRow[];
  selfStage: number;
  selfReplica: number;
  /** "2 stages × 2 replicas · gpipe schedule · 4 micro-batches" (and the activations' dtype when not float32). */
  shape: string;
  formulaBubble: number;
  /** Mean of the stages' measured bubbles in their latest steps; null before a step reported one. */
  measuredBubble: number | null;
  /** "Bubble: 27.3% measured (latest step, mean of the stages) · 20.0% by the formula (S−1)/(M+S−1) = 1/5." */
  bubbleText: string;
}

export function pipelinePanel(s: DashboardState): PipelinePanel | null {
  const p = s.pipeline;
  if (!p) return null;
  const S = p.stages;
  // Bubbles by stage, from the ranks' own word on where they are.
  const bubbles = new Map<number, number[]>();
  for (const m of s.pipelineRanks.values()) {
    if (!Number.isFinite(m.bubble)) continue;
    bubbles.set(m.stage, [...(bubbles.get(m.stage) ?? []), m.bubble]);
  }
  const stages: PipelineStageRow[] = Array.from({ length: S }, (_, stage) => {
    const layers = p.layers.filter((l) => l.stage === stage).sort((a, b) => a.index - b.index);
    const ranks = Array.from({ length: p.replicas }, (_, replica) => replica * S + stage);
    const measured = bubbles.get(stage);
    return {
      stage,
      layers,
      layersText: layers.length ? layers.map((l) => `${l.index} ${l.className}`).join(', ') : '–',
      parameters: layers.reduce((n, l) => n + l.parameters, 0),
      ranks,
      self: stage === p.stage,
      lost: ranks.filter((r) => s.lost.includes(r)),
      bubble: measured ? mean(measured) : null,
    };
  });
  const measuredStages = stages.map((r) => r.bubble).filter((b): b is number => b !== null);
  const measuredBubble = measuredStages.length ? mean(measuredStages) : null;
  const M = p.microBatches;
  const wire = s.config && s.config.activationDtype !== 'float32' ? ` · ${s.config.activationDtype} activations` : '';
  const formula = `${fmtPercent(p.bubbleFormula)} by the formula (S−1)/(M+S−1) = ${S - 1}/${M + S - 1}`;
  return {
    stages,
    selfStage: p.stage,
    selfReplica: p.replica,
    shape: `${plural(S, 'stage')} × ${plural(p.replicas, 'replica')} · ${p.schedule} schedule · ${plural(M, 'micro-batch', 'micro-batches')}${wire}`,
    formulaBubble: p.bubbleFormula,
    measuredBubble,
    bubbleText: `Bubble: ${measuredBubble === null ? 'not measured yet' : `${fmtPercent(measuredBubble)} measured (latest step, mean of the stages)`} · ${formula}.`,
  };
}

export interface TimelineBox {
  phase: TimelineEntry['phase'];
  microBatch: number;
  startMs: number;
  endMs: number;
  /** Left edge and width as fractions of the step's span (0..1). */
  left: number;
  width: number;
  /** "stage 1: backward of micro-batch 2, 3.1-5.4 ms" */
  label: string;
}

export interface TimelineRow {
  stage: number;
  /** This tab holds this stage (in its own replica). */
  self: boolean;
  totalMs: number;
  boxes: TimelineBox[];
  /** "stage 1: 8 passes, busy 9.5 of 12.3 ms" */
  label: string;
}

/** The schedule drawing: one row per stage, a box per pass, over the step's span. */
export interface TimelineModel {
  step: number;
  spanMs: number;
  rows: TimelineRow[];
  /** Axis ticks: position (fraction of the span) and label. */
  ticks: Array<{ at: number; label: string }>;
  /** What the drawing shows, in one sentence (its accessible description). */
  caption: string;
}

const PHASE_WORD: Readonly<Record<TimelineEntry['phase'], string>> = { F: 'forward', B: 'backward' };

/** A number of ms with one decimal ("3.1"), or none from 100 up. */
function msFigure(ms: number): string {
  return ms >= 100 ? ms.toFixed(0) : ms.toFixed(1);
}

export function timelineModel(s: DashboardState): TimelineModel | null {
  const t = s.timeline;
  if (!t) return null;
  const stages = [...t.stages].filter((st) => Number.isInteger(st.stage)).sort((a, b) => a.stage - b.stage);
  const ok = (e: TimelineEntry) => Number.isFinite(e.start) && Number.isFinite(e.end) && e.start >= 0;
  let spanMs = 0;
  for (const st of stages) {
    if (Number.isFinite(st.totalMs)) spanMs = Math.max(spanMs, st.totalMs);
    for (const e of st.entries) if (ok(e)) spanMs = Math.max(spanMs, e.end);
  }
  const span = spanMs > 0 ? spanMs : 1;
  const rows: TimelineRow[] = stages.map((st) => {
    const boxes = st.entries.filter(ok).map((e): TimelineBox => {
      const end = Math.max(e.start, e.end);
      return {
        phase: e.phase,
        microBatch: e.microBatch,
        startMs: e.start,
        endMs: end,
        left: e.start / span,
        width: (end - e.start) / span,
        label: `stage ${st.stage}: ${PHASE_WORD[e.phase]} of micro-batch ${e.microBatch}, ${msFigure(e.start)}-${msFigure(end)} ms`,
      };
    });
    const busy = boxes.reduce((sum, b) => sum + (b.endMs - b.startMs), 0);
    const total = Number.isFinite(st.totalMs) ? st.totalMs : spanMs;
    return {
      stage: st.stage,
      self: s.pipeline?.stage === st.stage,
      totalMs: total,
      boxes,
      label: `stage ${st.stage}: ${plural(boxes.length, 'pass', 'passes')}, busy ${msFigure(busy)} of ${msFigure(total)} ms`,
    };
  });
  const micro = s.pipeline ? `${plural(s.pipeline.microBatches, 'micro-batch', 'micro-batches')} on ` : '';
  return {
    step: t.step,
    spanMs,
    rows,
    ticks: axisTicks(spanMs),
    caption: `Step ${fmtInt(t.step)} of replica 0's pipeline: forward (F) and backward (B) passes of ${micro}${plural(rows.length, 'stage')} over ${msFigure(spanMs)} ms; the gaps are the bubble.`,
  };
}

/** Ticks at round numbers of ms (1, 2 or 5 × 10^k apart), at most about six, from 0. */
function axisTicks(spanMs: number): Array<{ at: number; label: string }> {
  if (!(spanMs > 0)) return [];
  const raw = spanMs / 5;
  const pow = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((k) => k * pow).find((x) => x >= raw)!;
  const ticks: Array<{ at: number; label: string }> = [];
  for (let v = 0; v <= spanMs + step * 1e-9; v += step) {
    const value = Number(v.toPrecision(12));
    ticks.push({ at: value / spanMs, label: `${value.toLocaleString('en-US', { maximumFractionDigits: 3 })} ms` });
  }
  return ticks;
}

// ---------------------------------------------------------------- derived: the parameter server

/** What makes this tab's role: a change is said in the log. */
function psRoleKey(p: PsStatus): string {
  return [p.strategy, p.role, p.rank, psSelfServer(p) ?? '', psSelfWorker(p) ?? ''].join('|');
}

/** Which rank serves which parameters and which ranks work: a change is said in the log. */
function psLayoutKey(p: PsStatus): string {
  const servers = p.servers.map((s) => `${s.index}@${s.rank}:${s.parameters.join(',')}:${s.numel}`).join(';');
  const workers = p.workers.map((w) => `${w.workerId}@${w.rank}`).join(';');
  return `${servers}/${workers}`;
}

/** This tab's server index (its own figures, else the layout's server on its rank). */
function psSelfServer(p: PsStatus): number | null {
  if (p.role !== 'server') return null;
  return p.server?.index ?? p.servers.find((s) => s.rank === p.rank)?.index ?? null;
}

/** This tab's worker id (its own figures, else the layout's worker on its rank). */
function psSelfWorker(p: PsStatus): number | null {
  if (p.role !== 'worker') return null;
  return p.worker?.workerId ?? p.workers.find((w) => w.rank === p.rank)?.workerId ?? null;
}

/** "Parameter server 0 of 1 on this tab: 2 tensors, 101,770 parameters." / "Worker 3 (rank 2) of 3, pulling from 1 server." */
function psRoleLine(p: PsStatus): string {
  if (p.role === 'server') {
    const index = psSelfServer(p);
    const info = p.servers.find((s) => s.index === index);
    const holds = info ? `: ${pluralInt(info.parameters.length, 'tensor')}, ${pluralInt(info.numel, 'parameter')}` : '';
    return `Parameter server ${index ?? '?'} of ${p.servers.length} on this tab${holds}.`;
  }
  const id = psSelfWorker(p);
  return `Worker ${id ?? '?'} (rank ${p.rank}) of ${p.workers.length}, pulling from ${plural(p.servers.length, 'server')}.`;
}

/** How many places a layout line names before it says "…". */
const PS_LINE_NAMES = 6;

/** "Parameter-server layout now: 1 server (server 0 on rank 0), 2 workers (worker 1 on rank 1, worker 3 on rank 2)." */
function psLayoutLine(p: PsStatus): string {
  const names = (xs: string[]) => (xs.length > PS_LINE_NAMES ? `${xs.slice(0, PS_LINE_NAMES).join(', ')}, …` : xs.join(', '));
  const servers = names(p.servers.map((s) => `server ${s.index} on rank ${s.rank}`));
  const workers = names(p.workers.map((w) => `worker ${w.workerId} on rank ${w.rank}`));
  return `Parameter-server layout now: ${plural(p.servers.length, 'server')}${servers ? ` (${servers})` : ''}, ${plural(p.workers.length, 'worker')}${workers ? ` (${workers})` : ''}.`;
}

/** "0–3, 6, 8–9": indices as ascending runs. */
export function fmtIndices(indices: readonly number[]): string {
  const xs = [...new Set(indices)].filter(Number.isInteger).sort((a, b) => a - b);
  const runs: string[] = [];
  for (let i = 0; i < xs.length; ) {
    let j = i;
    while (j + 1 < xs.length && xs[j + 1] === xs[j]! + 1) j++;
    runs.push(j === i ? `${xs[i]}` : j === i + 1 ? `${xs[i]}, ${xs[j]}` : `${xs[i]}–${xs[j]}`);
    i = j + 1;
  }
  return runs.join(', ');
}

/** A rate per second: one decimal below 10, whole above. */
function fmtRate(x: number): string {
  if (!Number.isFinite(x)) return '–';
  return x >= 10 ? fmtInt(x) : x.toFixed(1);
}

/** One figure of a list of figures ("Applied: 1,204"). */
export interface PsFigure {
  key: string;
  label: string;
  value: string;
  /** Worth a look (samples lost or refused): drawn as a warning, with a sign, not only a colour. */
  warn?: boolean;
}

/** A row of the layout: a server and what it holds, or a worker. */
export interface PsLayoutRow {
  role: 'server' | 'worker';
  /** The server's index or the worker's id. */
  id: number;
  /** "server 0", "worker 3". */
  name: string;
  /** Its rank now. */
  rank: number;
  /** Servers: the number of parameter tensors and of elements it holds (null for workers). */
  tensors: number | null;
  numel: number | null;
  /** Servers: "tensors 0–3" (which of the model's trainable weights); "" for workers. */
  holds: string;
  /** This tab. */
  self: boolean;
}

export interface PsHistogramBar {
  /** The bucket: that staleness (the last bucket: that staleness and above). */
  staleness: number;
  /** "2", or "31+" for the last bucket. */
  label: string;
  /** The last bucket: that staleness and above. */
  tail: boolean;
  count: number;
  /** Height as a fraction of the tallest bar (0..1). */
  height: number;
  /** "staleness 2: 14 pushes" */
  ariaLabel: string;
}

export interface PsHistogram {
  bars: PsHistogramBar[];
  total: number;
  /** What the drawing shows, in one sentence (its accessible description). */
  caption: string;
}

export interface PsPushRateRow {
  workerId: number;
  /** Its rank now; null once it left. */
  rank: number | null;
  pushesPerSec: number;
  pushes: number;
  applied: number;
  /** "3.2", "12" */
  rateText: string;
}

export interface PsServerPanel {
  index: number;
  /** "tensors 0–1 (101,770 parameters)" */
  shardText: string;
  version: number;
  updatesPerSec: number;
  /** Version, updates/s, applied, stale, duplicate, refused. */
  figures: PsFigure[];
  histogram: PsHistogram;
  pushRates: PsPushRateRow[];
}

export interface PsWorkerPanel {
  workerId: number;
  /** Worker id, pulls, pushes, applied, stale, samples, last staleness. */
  figures: PsFigure[];
}

export interface PsSamplesPanel {
  target: number;
  leased: number;
  /** Leased as a fraction of the target (0..1). */
  fraction: number;
  /** "Leased 12,000 of 60,000 samples (20.0%) · virtual epoch 1 of 5" */
  leasedText: string;
  /** Applied, stale, refused, lost, virtual epoch. */
  figures: PsFigure[];
  /** Samples were lost or refused: the line is drawn as a warning. */
  warn: boolean;
}

/** What the Parameter server card shows (null when this is not a parameter-server run). */
export interface PsPanel {
  strategy: PsStatus['strategy'];
  role: PsStatus['role'];
  rank: number;
  /** "1 server · 3 workers · asynchronous: each worker pushes when it is ready · this tab: server 0 (rank 0)" */
  shape: string;
  layout: PsLayoutRow[];
  server: PsServerPanel | null;
  worker: PsWorkerPanel | null;
  samples: PsSamplesPanel | null;
}

const PS_STRATEGY: Readonly<Record<PsStatus['strategy'], string>> = {
  async: 'asynchronous: each worker pushes when it is ready',
  central: 'central, synchronous: the server averages every worker’s gradients once per step',
};

/** Staleness buckets drawn at least (when the histogram has that many), so a young run's bars keep their scale. */
const PS_MIN_BUCKETS = 8;

/** The histogram's bars: the buckets up to the last non-empty one (at least PS_MIN_BUCKETS), the last bucket "N+". */
export function psHistogram(histogram: readonly number[]): PsHistogram {
  const counts = histogram.map((c) => (Number.isFinite(c) && c > 0 ? c : 0));
  let lastFilled = -1;
  counts.forEach((c, i) => {
    if (c > 0) lastFilled = i;
  });
  const shown = Math.min(counts.length, Math.max(lastFilled + 1, PS_MIN_BUCKETS));
  const max = Math.max(0, ...counts);
  const total = counts.reduce((a, b) => a + b, 0);
  const bars = counts.slice(0, shown).map((count, staleness): PsHistogramBar => {
    const tail = staleness === counts.length - 1 && counts.length > 1;
    const label = tail ? `${staleness}+` : `${staleness}`;
    return { staleness, label, tail, count, height: max > 0 ? count / max : 0, ariaLabel: `staleness ${label}: ${pluralInt(count, 'push', 'pushes')}` };
  });
  const caption =
    total === 0
      ? 'No pushes yet.'
      : `${pluralInt(total, 'push', 'pushes')} applied or dropped as stale, by staleness: how many versions the shard had moved on since the worker pulled.`;
  return { bars, total, caption };
}

export function psPanel(s: DashboardState): PsPanel | null {
  const p = s.ps;
  if (!p) return null;
  const serverIndex = psSelfServer(p);
  const workerId = psSelfWorker(p);
  const servers = [...p.servers].sort((a, b) => a.index - b.index);
  const workers = [...p.workers].sort((a, b) => a.workerId - b.workerId);
  const layout: PsLayoutRow[] = [
    ...servers.map((sv): PsLayoutRow => ({
      role: 'server',
      id: sv.index,
      name: `server ${sv.index}`,
      rank: sv.rank,
      tensors: sv.parameters.length,
      numel: sv.numel,
      holds: sv.parameters.length ? `tensors ${fmtIndices(sv.parameters)}` : '–',
      self: p.role === 'server' && sv.index === serverIndex,
    })),
    ...workers.map((w): PsLayoutRow => ({
      role: 'worker',
      id: w.workerId,
      name: `worker ${w.workerId}`,
      rank: w.rank,
      tensors: null,
      numel: null,
      holds: '',
      self: p.role === 'worker' && w.workerId === workerId,
    })),
  ];
  const me = p.role === 'server' ? `server ${serverIndex ?? '?'}` : `worker ${workerId ?? '?'}`;
  const shape = `${plural(p.servers.length, 'server')} · ${plural(p.workers.length, 'worker')} · ${PS_STRATEGY[p.strategy]} · this tab: ${me} (rank ${p.rank})`;

  let server: PsServerPanel | null = null;
  if (p.server) {
    const sv = p.server;
    const info = p.servers.find((x) => x.index === sv.index);
    const shardText = info ? `${info.parameters.length ? `tensors ${fmtIndices(info.parameters)}` : 'no tensors'} (${pluralInt(info.numel, 'parameter')})` : '–';
    server = {
      index: sv.index,
      shardText,
      version: sv.version,
      updatesPerSec: sv.updatesPerSec,
      figures: [
        { key: 'version', label: 'Model version', value: fmtInt(sv.version) },
        { key: 'updatesPerSec', label: 'Updates/s', value: fmtRate(sv.updatesPerSec) },
        { key: 'applied', label: 'Applied', value: fmtInt(sv.applied) },
        { key: 'stale', label: 'Stale', value: fmtInt(sv.stale) },
        { key: 'duplicate', label: 'Duplicate', value: fmtInt(sv.duplicate) },
        { key: 'refused', label: 'Refused', value: fmtInt(sv.refused) },
      ],
      histogram: psHistogram(sv.stalenessHistogram),
      pushRates: [...sv.pushRates]
        .sort((a, b) => a.workerId - b.workerId)
        .map((r) => ({ workerId: r.workerId, rank: r.rank, pushesPerSec: r.pushesPerSec, pushes: r.pushes, applied: r.applied, rateText: fmtRate(r.pushesPerSec) })),
    };
  }

  let worker: PsWorkerPanel | null = null;
  if (p.worker) {
    const w = p.worker;
    worker = {
      workerId: w.workerId,
      figures: [
        { key: 'workerId', label: 'Worker', value: `${w.workerId}` },
        { key: 'pulls', label: 'Pulls', value: fmtInt(w.pulls) },
        { key: 'pushes', label: 'Pushes', value: fmtInt(w.pushes) },
        { key: 'applied', label: 'Applied', value: fmtInt(w.applied) },
        { key: 'stale', label: 'Stale', value: fmtInt(w.stale) },
        { key: 'samples', label: 'Samples', value: fmtInt(w.samples) },
        { key: 'lastStaleness', label: 'Last staleness', value: w.lastStaleness === null ? '–' : fmtInt(w.lastStaleness) },
      ],
    };
  }

  let samples: PsSamplesPanel | null = null;
  if (p.samples) {
    const sm = p.samples;
    const fraction = sm.target > 0 ? Math.min(1, Math.max(0, sm.leased / sm.target)) : 0;
    // Epochs as people count them: the first is epoch 1; once every sample is handed out, the epochs done.
    const epochs = s.config && s.config.steps === null ? s.config.epochs : null;
    const epoch = sm.target > 0 && sm.leased >= sm.target ? sm.epoch : sm.epoch + 1;
    const epochText = `${fmtInt(epochs !== null ? Math.min(epoch, epochs) : epoch)}${epochs !== null ? ` of ${epochs}` : ''}`;
    samples = {
      target: sm.target,
      leased: sm.leased,
      fraction,
      leasedText: `Leased ${fmtInt(sm.leased)} of ${pluralInt(sm.target, 'sample')} (${fmtPercent(fraction)}) · virtual epoch ${epochText}`,
      figures: [
        { key: 'applied', label: 'Applied', value: fmtInt(sm.applied) },
        { key: 'stale', label: 'Stale', value: fmtInt(sm.stale) },
        { key: 'refused', label: 'Refused', value: fmtInt(sm.refused), warn: sm.refused > 0 },
        { key: 'lost', label: 'Lost', value: fmtInt(sm.lost), warn: sm.lost > 0 },
        { key: 'epoch', label: 'Virtual epoch', value: epochText },
      ],
      warn: sm.lost > 0 || sm.refused > 0,
    };
  }

  return { strategy: p.strategy, role: p.role, rank: p.rank, shape, layout, server, worker, samples };
}

// ---------------------------------------------------------------- derived: the run's summary

export interface SummaryEntry {
  /** The summary's key (shared by the entries of one flattened object). */
  key: string;
  label: string;
  value: string;
}

/** Shown already in the header, or not for people (the weights themselves). */
const SUMMARY_SKIP = new Set(['rank', 'worldSize', 'backend', 'model', 'dataset', 'weights']);
const SUMMARY_FIRST = ['testAccuracy', 'testLoss', 'finalLoss', 'steps', 'epochs', 'seconds', 'elapsedSec', 'samplesPerSec', 'stoppedBy', 'generations', 'pausedGenerations', 'weightHash'];

/**
 * The summary's scalar entries, most interesting first. One level of nested numbers (the
 * job's breakdownMs) is flattened; arrays and long strings are left out.
 */
export function summaryEntries(summary: Readonly<Record<string, unknown>>): SummaryEntry[] {
  const out: SummaryEntry[] = [];
  const scalar = (v: unknown) => v === null || typeof v === 'number' || typeof v === 'boolean' || (typeof v === 'string' && v.length <= 80);
  for (const [k, v] of Object.entries(summary)) {
    if (SUMMARY_SKIP.has(k)) continue;
    if (scalar(v)) out.push({ key: k, label: humanKey(k), value: fmtSummaryValue(k, v) });
    else if (v && typeof v === 'object' && !Array.isArray(v)) {
      const inner = Object.entries(v as Record<string, unknown>);
      if (inner.length > 0 && inner.length <= 8 && inner.every(([, x]) => x === null || typeof x === 'number')) {
        const unitKey = /Ms$/.test(k) ? 'Ms' : '';
        for (const [sub, x] of inner) out.push({ key: k, label: `${humanKey(k)}: ${sub}`, value: fmtSummaryValue(`${sub}${unitKey}`, x) });
      }
    }
  }
  const order = (key: string) => {
    const i = SUMMARY_FIRST.indexOf(key);
    return i < 0 ? SUMMARY_FIRST.length : i;
  };
  return out.sort((a, b) => order(a.key) - order(b.key));
}

export interface ReportItem {
  key: 'trained' | 'training' | 'time' | 'accuracy' | 'speed' | 'faults';
  label: string;
  value: string;
}

/** The end-of-run panel: a few facts for everyone, and the developers' figures behind "Details". */
export interface RunReport {
  main: ReportItem[];
  details: SummaryEntry[];
}

const MODEL_NAME: Readonly<Record<string, string>> = { mlp: 'MLP', cnn: 'CNN' };
const DATASET_NAME: Readonly<Record<string, string>> = { mnist: 'MNIST', synthetic: 'synthetic data' };
/** In the main part of the report, or said by the page elsewhere (rank, backend): not repeated in Details. */
const REPORTED = new Set(['testAccuracy', 'samplesPerSec', 'stepsRedone', 'steps', 'seconds', 'epochs']);

/** What the run was and how it went, once 'done' arrived (null before). */
export function runReport(s: DashboardState): RunReport | null {
  const summary = s.summary;
  if (!summary) return null;
  const c = s.config;
  const main: ReportItem[] = [];
  const model = typeof summary.model === 'string' ? summary.model : c?.model;
  const dataset = typeof summary.dataset === 'string' ? summary.dataset : c?.dataset;
  const samples = s.shard?.datasetSize ?? (c && c.trainSize > 0 ? c.trainSize : null);
  if (model && dataset) {
    const data = samples !== null ? `, ${fmtInt(samples)} training samples` : '';
    main.push({ key: 'trained', label: 'Trained', value: `${MODEL_NAME[model] ?? model} on ${DATASET_NAME[dataset] ?? dataset}${data}` });
  }
  const steps = typeof summary.steps === 'number' ? summary.steps : s.lastStep?.step;
  if (steps !== undefined) {
    // Epochs as people count them: the first is epoch 1, also while the run is still inside it.
    const epoch = s.lastStep ? Number(epochLabel(s, s.lastStep.epoch)) : null;
    const allEpochs = c !== null && c.steps === null && epoch === c.epochs && s.lastStep !== null && s.lastStep.step >= s.lastStep.totalSteps;
    const epochs = epoch === null ? '' : allEpochs ? ` · ${plural(epoch, 'epoch')}` : c && c.steps === null ? ` · epoch ${epoch} of ${c.epochs}` : ` · in epoch ${epoch}`;
    const tabs = s.worldSize !== null ? ` · ${plural(s.worldSize, 'tab')} at the end` : '';
    main.push({ key: 'training', label: 'Training', value: `${fmtInt(steps)} steps${epochs}${tabs}` });
  }
  const seconds = runSeconds(s);
  if (seconds !== null) main.push({ key: 'time', label: 'Total time', value: fmtDuration(seconds) });
  const accuracy = finalTestAccuracy(s);
  if (accuracy !== null) main.push({ key: 'accuracy', label: 'Final test accuracy', value: fmtPercent(accuracy, 2) });
  if (typeof summary.samplesPerSec === 'number') main.push({ key: 'speed', label: 'Speed', value: `${fmtInt(summary.samplesPerSec)} samples/s, all tabs together` });
  const redone = typeof summary.stepsRedone === 'number' ? summary.stepsRedone : 0;
  const f = s.faults;
  const faults = [
    f.left ? `${plural(f.left, 'tab')} closed` : '',
    f.froze ? `${plural(f.froze, 'tab')} froze or went silent` : '',
    f.evicted ? `${plural(f.evicted, 'tab')} evicted (replica differed)` : '',
    f.failed ? `${plural(f.failed, 'rank')} failed` : '',
    f.joined ? `${plural(f.joined, 'tab')} joined mid-run` : '',
    redone ? `${plural(redone, 'step')} trained again` : '',
  ].filter(Boolean);
  main.push({ key: 'faults', label: 'Faults survived', value: faults.length ? faults.join(', ') : 'none' });
  return { main, details: summaryEntries(summary).filter((e) => !REPORTED.has(e.key)) };
}

/** The report in one line, for the log. */
function summaryLine(s: DashboardState): string {
  return (runReport(s)?.main ?? [])
    .filter((e) => e.key !== 'trained')
    .map((e) => `${e.label}: ${e.value}`)
    .join(', ');
}

/** "testAccuracy" -> "Test accuracy"; duration keys lose their unit ("elapsedSec" -> "Elapsed"). */
function humanKey(k: string): string {
  const base = isDurationKey(k) ? k.replace(/_?(sec|seconds)$/i, '') : k.replace(/Ms$/, '');
  if (base === '') return 'Time';
  const words = base.replace(/([a-z0-9])([A-Z])/g, '$1 $2').replace(/[_-]+/g, ' ').toLowerCase();
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/** Keys like elapsedSec / seconds are durations; samplesPerSec is not. */
function isDurationKey(k: string): boolean {
  return !/per ?sec/i.test(k) && /(sec|seconds)$/i.test(k);
}

function fmtSummaryValue(k: string, v: unknown): string {
  if (v === null || v === undefined) return '–';
  if (k === 'stoppedBy' && typeof v === 'number') return `rank ${v}`;
  if (typeof v === 'number') {
    if (/acc/i.test(k) && v >= 0 && v <= 1) return fmtPercent(v, 2);
    if (isDurationKey(k)) return fmtDuration(v);
    if (/Ms$/.test(k)) return fmtMs(v);
    if (/per ?sec/i.test(k)) return fmtInt(v);
    return fmtNumber(v, 4);
  }
  return String(v);
}

// ---------------------------------------------------------------- helpers

/** The mean of the finite values, NaN when there are none. */
function mean(xs: readonly number[]): number {
  const ok = xs.filter(Number.isFinite);
  return ok.length ? ok.reduce((a, b) => a + b, 0) / ok.length : NaN;
}

function gcd(a: number, b: number): number {
  return b === 0 ? a : gcd(b, a % b);
}

function lcm(a: number, b: number): number {
  return (a / gcd(a, b)) * b;
}

/** "1 tab", "3 tabs"; `many` for nouns that do not just take an s ("micro-batches"). */
function plural(n: number, noun: string, many = `${noun}s`): string {
  return `${n} ${n === 1 ? noun : many}`;
}

/** plural() with the count as the page writes figures ("101,770 parameters"). */
function pluralInt(n: number, noun: string, many = `${noun}s`): string {
  return `${fmtInt(n)} ${n === 1 ? noun : many}`;
}

/** "2 of 3 tabs in the session" (fixed size) or "2 tabs in the session (needs 2, up to 4)". */
function tabsInSession(w: { arrived: number; min: number; max: number }): string {
  return w.min === w.max ? `${w.arrived} of ${plural(w.max, 'tab')} in the session` : `${plural(w.arrived, 'tab')} in the session (needs ${w.min}, up to ${w.max})`;
}

/** What happened to a lost rank, from the group's reason: counted apart in the summary. */
export type FaultKind = 'left' | 'froze' | 'evicted' | 'failed';

export function faultKind(reason: string): FaultKind {
  if (/tab closed|left the group|leaving/i.test(reason)) return 'left';
  if (/stall|paused|froze|frozen|silent|no sign of life|sent nothing|evicted for silence/i.test(reason)) return 'froze';
  if (/diverg|replica/i.test(reason)) return 'evicted';
  return 'failed';
}
