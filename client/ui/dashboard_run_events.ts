/**
 * The dashboard's reducer (dashboard_state.ts) for the run's progress: the shard of each epoch,
 * the steps and evaluations, and the strategy's own figures (pipeline, devices, parameter server).
 */
import type { DashboardEvent, DashboardState, PsStatus, RankPipelineMetrics, StepEvent } from './dashboard_types.ts';
import { epochLabel, plural, pluralInt } from './dashboard_format.ts';
import { pipelineLine } from './dashboard_pipeline.ts';
import { psLayoutKey, psLayoutLine, psRoleKey, psRoleLine } from './dashboard_ps.ts';
import { fmtInt, fmtNumber, fmtPercent } from './format.ts';
import { STEP_CLOCK, clockEntry } from './time_left.ts';
import { RECENT, isOver, logAt, noteEpoch, withLog, withRank } from './dashboard_reducer_util.ts';

/** An epoch's share of the data for this rank. */
export function onShard(state: DashboardState, event: Extract<DashboardEvent, { type: 'shard' }>, at: number): DashboardState {
  const log = logAt(at);
  const s = noteEpoch(state, event.epoch);
  return log(
    { ...s, shard: event, phase: s.phase === 'connecting' || s.phase === 'waiting' || s.phase === 'full' ? 'starting' : s.phase },
    'info',
    s.config?.balance && (s.worldSize ?? 1) > 1
      ? `Epoch ${epochLabel(s, event.epoch)}: the group's ${fmtInt(event.datasetSize)} samples, ${fmtInt(event.stepsPerEpoch)} steps, each step's batch split by the tabs' speeds.`
      : `Epoch ${epochLabel(s, event.epoch)}: this rank's shard is ${fmtInt(event.samples)} of ${fmtInt(event.datasetSize)} samples, ${fmtInt(event.stepsPerEpoch)} steps.`,
  );
}

/** This tab's place in a pipeline: its stage, replica and schedule. */
export function onPipeline(state: DashboardState, event: Extract<DashboardEvent, { type: 'pipeline' }>, at: number): DashboardState {
  const log = logAt(at);
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

/** The devices (Workers) this tab computes on. */
export function onDevices(state: DashboardState, event: Extract<DashboardEvent, { type: 'devices' }>, at: number): DashboardState {
  const log = logAt(at);
  const next = { ...state, devices: event.devices };
  // Said when they start (again: a rebuilt model gets new ones), not on every update of their figures.
  if (event.devices.some((d) => d.steps !== undefined)) return next;
  return log(
    next,
    'info',
    `This tab computes on ${plural(event.devices.length, 'device')} (Workers, each with its own copy of the model): ${event.devices.map((d) => `device ${d.device} on ${d.backend}`).join(', ')}.`,
  );
}

/** The parameter server's status, about once a second. */
export function onPs(state: DashboardState, event: Extract<DashboardEvent, { type: 'ps' }>, at: number): DashboardState {
  const log = logAt(at);
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
    if (refused > 0)
      next = log(
        next,
        'warn',
        `${pluralInt(refused, 'sample')} refused by the parameter server: pushed malformed, or for a version it no longer has.`,
      );
  }
  return next;
}

/** A test-set evaluation during the run. */
export function onEval(state: DashboardState, event: Extract<DashboardEvent, { type: 'eval' }>, at: number): DashboardState {
  const log = logAt(at);
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

/** The evaluation after the run: its progress. */
export function onEvaluating(state: DashboardState, event: Extract<DashboardEvent, { type: 'evaluating' }>, at: number): DashboardState {
  const log = logAt(at);
  const prev = state.finalEval;
  // The job logs the skip itself (the console hears it too).
  const next: DashboardState = {
    ...state,
    finalEval: {
      step: event.step,
      done: event.done,
      total: event.total,
      skipRequested: prev?.skipRequested ?? false,
      skipped: event.skipped === true,
    },
  };
  if (prev !== null) return next;
  return log(
    next,
    'info',
    `Training is over at step ${fmtInt(event.step)}: its weights are final and can be downloaded now, while they are evaluated on the test set.`,
  );
}

export function onStep(state: DashboardState, e: StepEvent, at: number): DashboardState {
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
    if (m.pipeline) {
      pipelineRanks ??= new Map(s.pipelineRanks);
      pipelineRanks.set(m.rank, m.pipeline);
    }
  }
  const clock = [
    ...s.stepClock,
    clockEntry(s.stepClock.at(-1), {
      step: e.step,
      elapsedSec: e.elapsedSec,
      evalT: s.evalClock.seconds,
      world: e.ranks.length,
      round: s.round,
    }),
  ];
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
