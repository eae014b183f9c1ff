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
import type { FleetMember, TrainEvent } from '../train/events.ts';
import type { DashboardAction, DashboardState, FaultHistory, LogEntry, LogLevel, PageEvent, Phase, PsStatus, RankPipelineMetrics, Role, StepEvent, WaitingEvent } from './dashboard_types.ts';
import { epochLabel, plural, pluralInt } from './dashboard_format.ts';
import { describeJob } from './dashboard_job.ts';
import { pipelineLine } from './dashboard_pipeline.ts';
import { psLayoutKey, psLayoutLine, psRoleKey, psRoleLine } from './dashboard_ps.ts';
import { summaryLine } from './dashboard_report.ts';
import { pathWords } from './dashboard_ring.ts';
import { fmtInt, fmtNumber, fmtPercent } from './format.ts';
import { tallyContributions } from '../../src/parallel/ddp/contributions.ts';
import { STEP_CLOCK, clockEntry } from './time_left.ts';

// ---------------------------------------------------------------- actions and state

// Their types are dashboard_types.ts's (the panel models read them there), exported here as well.
export type { Role, ControlAction, PageEvent, DashboardEvent, DashboardAction, Phase, LogLevel, PsStatus, PipelineLayout, PipelineTimeline, RankPipelineMetrics, LogEntry, ErrorMessage, DashboardState, FaultKind, FaultEntry, FaultHistory } from './dashboard_types.ts';

/** Recent steps kept per rank for averages (throughput, time breakdown, stat cards). */
export const RECENT = 20;
export const MAX_LOG = 400;

const NO_ROLE: Role = { host: false, hasHost: false, spectator: false };

const NO_RANKS: readonly number[] = [];
const NO_FLEET: readonly FleetMember[] = [];
const NO_PIPELINE_RANKS: ReadonlyMap<number, RankPipelineMetrics> = new Map();
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
        ? { ...state, joined: NO_RANKS, lost: NO_RANKS, links: new Map(), recent: new Map(), pipelineRanks: NO_PIPELINE_RANKS, ringProven: false, fleet: NO_FLEET, contributions: null }
        : state;
      const next: DashboardState = {
        ...group,
        self: event.rank,
        round: event.round ?? null,
        worldSize: event.worldSize,
        joined: withRank(group.joined, event.rank),
        backend: { name: event.backend, adapter: event.adapter, fallbackReason: event.fallbackReason, ...(event.probe ? { probe: event.probe } : {}) },
        phase: state.phase === 'connecting' || state.phase === 'waiting' || state.phase === 'full' ? 'starting' : state.phase,
        // A rank of its own: this tab no longer watches from the side.
        role: state.role.spectator ? { ...state.role, spectator: false } : state.role,
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
        s.config?.balance && (s.worldSize ?? 1) > 1
          ? `Epoch ${epochLabel(s, event.epoch)}: the group's ${fmtInt(event.datasetSize)} samples, ${fmtInt(event.stepsPerEpoch)} steps, each step's batch split by the tabs' speeds.`
          : `Epoch ${epochLabel(s, event.epoch)}: this rank's shard is ${fmtInt(event.samples)} of ${fmtInt(event.datasetSize)} samples, ${fmtInt(event.stepsPerEpoch)} steps.`,
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

    case 'aggregation': {
      // The round's tally (a new round's ranks are other tabs: its tally starts afresh).
      const { type: _type, ...judged } = event;
      return { ...state, contributions: tallyContributions(state.contributions, judged) };
    }

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
        s.config?.model === 'lm'
          ? `Eval at step ${event.step} (epoch ${epochLabel(s, event.epoch)}): test loss ${fmtNumber(event.testLoss, 4)} nats per character (perplexity ${fmtNumber(Math.exp(event.testLoss), 2)}), next-character accuracy ${fmtPercent(event.testAccuracy, 2)}.`
          : `Eval at step ${event.step} (epoch ${epochLabel(s, event.epoch)}): test accuracy ${fmtPercent(event.testAccuracy, 2)}, test loss ${fmtNumber(event.testLoss, 4)}.`,
      );
    }

    case 'sample':
      return log({ ...state, lastSample: event }, 'info', `At step ${event.step} the model writes: ${JSON.stringify(event.prompt + event.text)}`);

    case 'log':
      return log(state, event.level, event.message);

    case 'fleet':
      return onFleet(state, event, at);

    case 'rank-lost': {
      // After 'done' the group is finished with; a rank closing its tab then is no loss. Each
      // rank is lost once per group (the group renumbers its ranks when it forms again). The
      // faults are not counted here, from what this tab saw, but by the server ('faults').
      if (state.finished || state.lost.includes(event.rank)) return log(state, 'info', `Lost rank ${event.rank}: ${event.reason}.`);
      const next = log(state, 'error', `Lost rank ${event.rank}: ${event.reason}.`);
      return { ...next, lost: withRank(next.lost, event.rank) };
    }

    case 'faults':
      return { ...state, faults: { ...state.faults, counts: event.counts, entries: event.entries } };

    case 'steps-redone':
      return event.steps === state.faults.stepsRedone ? state : { ...state, faults: { ...state.faults, stepsRedone: event.steps } };

    case 'stopped':
      return log(
        { ...state, stoppedBy: { by: event.by, atStep: event.atStep }, phase: !state.finished && !isOver(state.phase) ? 'stopped' : state.phase },
        'warn',
        state.stoppedByHost ? `Training stopped at step ${event.atStep} by the host.` : `Training stopped by rank ${event.by}${event.by === state.self ? ' (this tab)' : ''} at step ${event.atStep}.`,
      );

    case 'evaluating': {
      const prev = state.finalEval;
      // The job logs the skip itself (the console hears it too).
      const next: DashboardState = { ...state, finalEval: { step: event.step, done: event.done, total: event.total, skipRequested: prev?.skipRequested ?? false, skipped: event.skipped === true } };
      if (prev !== null) return next;
      return log(next, 'info', `Training is over at step ${fmtInt(event.step)}: its weights are final and can be downloaded now, while they are evaluated on the test set.`);
    }

    case 'skip-eval-requested':
      if (state.finalEval === null || state.finalEval.skipRequested || state.finished) return state;
      return log({ ...state, finalEval: { ...state.finalEval, skipRequested: true } }, 'info', 'Skipping the evaluation, as asked by this tab.');

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
        { ...state, phase: 'starting', failure: null, error: null, canContinue: false, finished: false, finalEval: null, endedWithoutRank: null, stopRequested: false, stoppedBy: null, lost: NO_RANKS },
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
      if (event.rank != null) {
        return log(
          { ...state, phase: 'done', finished: true, endedWithoutRank: event.rank },
          'warn',
          `The run ended without this tab: its last round failed here (rank ${event.rank}) while the other tabs finished it. The final model is theirs; this tab's replica stopped at its last committed step.`,
        );
      }
      return log({ ...state, phase: 'done', finished: true, role: { ...state.role, spectator: false } }, 'info', 'The run finished before this tab got a rank: it trained without this tab.');

    case 'full':
      if (isOver(state.phase)) return state;
      return log({ ...state, phase: 'full', fullRanks: event.ranks }, 'warn', `The session is full${event.ranks !== null ? ` (${plural(event.ranks, 'rank')})` : ''}: this tab has no rank.`);

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

    case 'failed': {
      const { type: _type, canContinue, ...error } = event;
      // After the host ended the session (or removed this tab), losing the connection is what that means.
      if (state.phase === 'ended' || state.phase === 'removed') return log(state, 'info', `${event.title}: ${event.detail}`);
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
      // A stop during the evaluation after the run skips it (train_page.ts).
      if (state.finalEval !== null && !state.finished) return log({ ...state, finalEval: { ...state.finalEval, skipRequested: true } }, 'info', 'The host skipped the evaluation after the run.');
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

/** The host removes a tab: its request, the link changing for the tabs that stay, and the removed tab's end. */
function onRemoval(state: DashboardState, e: Extract<PageEvent, { type: 'remove-requested' | 'link-changed' | 'removed' }>, log: (s: DashboardState, level: LogLevel, message: string) => DashboardState): DashboardState {
  switch (e.type) {
    case 'remove-requested':
      return log(state, 'info', `Removing rank ${e.rank} from the session, as asked by this tab (the host); the session's link changes.`);
    case 'link-changed': {
      const share = state.role.host ? 'Share the new link below: the old one no longer opens the session.' : "This tab trains on; the link below is the session's new one.";
      return log(state, 'warn', `${e.reason.charAt(0).toUpperCase()}${e.reason.slice(1)}, so the session's link changed. ${share}`);
    }
    case 'removed':
      if (state.phase === 'removed') return state;
      return log({ ...state, phase: 'removed', stopRequested: false, error: null, canContinue: false }, 'warn', 'The host removed this tab from the session: it stopped training, and its link no longer opens the session. Its replica can still be downloaded.');
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
  const clock = [...s.stepClock, clockEntry(s.stepClock.at(-1), { step: e.step, elapsedSec: e.elapsedSec, evalT: s.evalClock.seconds, world: e.ranks.length, round: s.round })];
  let next: DashboardState = {
    ...s,
    phase: isOver(s.phase) ? s.phase : 'training',
    worldSize: s.worldSize === null || e.ranks.length > s.worldSize ? e.ranks.length : s.worldSize,
    lastStep: e,
    joined,
    recent,
    pipelineRanks: pipelineRanks ?? s.pipelineRanks,
    ringProven: true,
    stepClock: clock.length > STEP_CLOCK ? clock.slice(-STEP_CLOCK) : clock,
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
export function isOver(phase: Phase): boolean {
  return phase === 'done' || phase === 'stopped' || phase === 'failed' || phase === 'ended' || phase === 'removed';
}

/** "2 of 3 tabs in the session" (fixed size) or "2 tabs in the session (needs 2, up to 4)". */
function tabsInSession(w: { arrived: number; min: number; max: number }): string {
  return w.min === w.max ? `${w.arrived} of ${plural(w.max, 'tab')} in the session` : `${plural(w.arrived, 'tab')} in the session (needs ${w.min}, up to ${w.max})`;
}
