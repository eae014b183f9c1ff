/**
 * The training dashboard's actions and state, as types: what the reducer (dashboard_state.ts) takes
 * and returns, apart from it so that the panel models it calls (dashboard_*.ts) can read them.
 */
import type { ProbeFigure } from '../backend_figures.ts';
import type { ContributionTally } from '../../src/parallel/ddp/contributions.ts';
import type { DeviceInfo, DeviceStats } from '../../src/parallel/data_parallel/data_parallel.ts';
import type { BackendName, FleetMember, RankStepMetrics, TrainConfig, TrainEvent } from '../train/events.ts';
import type { LinkObservation } from './ring_view.ts';
import type { FaultEntry, FaultKind } from '../../src/wire/protocol.ts';

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
  /** The person pressed "Skip the evaluation" while the evaluation after the run went on. */
  | { type: 'skip-eval-requested' }
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
  /** The run ended without this tab: it waited or watched (`rank` null), or its last round failed as the others finished (its rank in that round). */
  | { type: 'watched-end'; rank?: number | null }
  /** The host stopped the run, ended the session or changed the minimum. */
  | { type: 'control'; action: ControlAction; min?: number }
  /** The host confirmed removing the tab at `rank` of the group table. */
  | { type: 'remove-requested'; rank: number }
  /** The host removed another tab, and the session's link changed (`reason`, the server's words). */
  | { type: 'link-changed'; reason: string }
  /** The host removed this tab from the session: it stops, keeps its replica, and cannot rejoin with its link. */
  | { type: 'removed' }
  /** The group's fault history as the server recorded it (the page hears it from its rendezvous): the same on every tab. */
  | { type: 'faults'; counts: Readonly<Record<FaultKind, number>>; entries: readonly FaultEntry[] };

export type DashboardEvent = TrainEvent | PageEvent;

/** An event and when it happened, in ms since the epoch: the only clock the state sees. */
export interface DashboardAction {
  at: number;
  event: DashboardEvent;
}

// ---------------------------------------------------------------- state

/** `full`: every rank is taken (not a failure); `ended`: the host ended the session; `removed`: the host removed this tab. */
export type Phase = 'connecting' | 'waiting' | 'starting' | 'training' | 'done' | 'stopped' | 'failed' | 'full' | 'ended' | 'removed';
export type LogLevel = 'info' | 'warn' | 'error';
export type StepEvent = Extract<TrainEvent, { type: 'step' }>;
type EvalEvent = Extract<TrainEvent, { type: 'eval' }>;
type SampleEvent = Extract<TrainEvent, { type: 'sample' }>;
type ShardEvent = Extract<TrainEvent, { type: 'shard' }>;
export type WaitingEvent = Extract<TrainEvent, { type: 'waiting' }>;
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

/** One step of the dashboard's step clock (time_left.ts times the steps with it). */
export interface ClockEntry {
  readonly step: number;
  /** The step's elapsed seconds since training started. */
  readonly t: number;
  /** Seconds spent evaluating so far (left out of step times). */
  readonly evalT: number;
  /** The group's size and round at this step: a step time never spans two groups. */
  readonly world: number;
  readonly round: number | null;
  /** 1 for the group's first step reported here, 2 for the next, ... */
  readonly inGroup: number;
}

export interface DashboardState {
  readonly session: string;
  readonly phase: Phase;
  readonly config: TrainConfig | null;
  /** This tab's rank in the current group, from its latest 'joined'. */
  readonly self: number | null;
  /** The server's round of that group, when the job says it (the host removes a tab by rank and round). */
  readonly round: number | null;
  /** Size of the current group (from 'joined', or the widest step seen). */
  readonly worldSize: number | null;
  /** `probe`: backend=auto's measured time per step on each backend (the chosen one is `name`). */
  readonly backend: { name: BackendName; adapter: string | null; fallbackReason?: string; probe?: readonly ProbeFigure[] } | null;
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
   * Step number, elapsed seconds, the evaluation seconds so far and the group, of the last
   * STEP_CLOCK steps: the step time's window (time_left.ts; evaluation pauses are taken out of it).
   */
  readonly stepClock: ReadonlyArray<ClockEntry>;
  /** When the last step was reported (the action's time), to time the evaluation after it. */
  readonly lastStepAt: number | null;
  /** Evaluations timed so far and their seconds in all. */
  readonly evalClock: { readonly count: number; readonly seconds: number };
  /** The last RECENT steps' figures of each rank of the current group. */
  readonly recent: ReadonlyMap<number, readonly RankStepMetrics[]>;
  readonly lastEval: EvalEvent | null;
  readonly bestEval: number | null;
  /** A language model's latest sampled text. */
  readonly lastSample: SampleEvent | null;
  readonly stopRequested: boolean;
  readonly stoppedBy: { by: number; atStep: number } | null;
  readonly summary: Readonly<Record<string, unknown>> | null;
  /** The evaluation after the run ('evaluating'): from its start the weights are final and can be saved. */
  readonly finalEval: {
    readonly step: number;
    readonly done: number;
    readonly total: number;
    readonly skipRequested: boolean;
    readonly skipped: boolean;
  } | null;
  /** 'done' arrived: the model exists (also after a stop, which the job follows with 'done'). */
  readonly finished: boolean;
  /** This tab's rank in the last round when that round failed here as the other tabs finished the run. */
  readonly endedWithoutRank: number | null;
  /** The session's store (its server's Redis) does not answer: the server's words, while this tab's requests are tried again; null once it answers. */
  readonly storeUnavailable: string | null;
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
  /**
   * The faults the run went through: the server's record of the group (ranks lost, and why; tabs
   * that joined the running group), which every tab gets whole, a late one too, and the steps
   * trained again, from the run record every rank holds with the state. Never a tab's own count.
   */
  readonly faults: FaultHistory;
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
  /**
   * Robust aggregation: each rank's contributions over the current round's aggregations (steps,
   * or DiLoCo's outer steps), from 'aggregation' events; null under the mean or before the first.
   */
  readonly contributions: ContributionTally | null;
  /**
   * Each tab's own pictures (dataset local): the latest evaluation on every tab's own held-out
   * pictures and the latest epoch's counts; null for other datasets and before the first.
   */
  readonly local: {
    readonly evaluation: Extract<TrainEvent, { type: 'local-eval' }> | null;
    readonly counts: Extract<TrainEvent, { type: 'local-counts' }> | null;
  } | null;
}

export type { FaultKind, FaultEntry };

/** The group's fault history as this tab holds it (see DashboardState.faults). */
export interface FaultHistory {
  /** Every fault of the run by kind, from the server (not capped). */
  readonly counts: Readonly<Record<FaultKind, number>>;
  /** The latest of them (the server keeps MAX_FAULT_ENTRIES), oldest first. */
  readonly entries: readonly FaultEntry[];
  /** Steps trained again so far (the run record's). */
  readonly stepsRedone: number;
}
