/**
 * `elastic`: the pieces of an elastic run below `runElastic` and `runAgent`: the per-step vote,
 * the state saved and restored between rounds, the events' parts and the events' handler.
 */
export { stepVote, stepsVote, type StepVote, type StepsVote } from './elastic/vote.ts';
export { saveState, restoreStatePart, type Restored } from './elastic/checkpoints.ts';
export type { RunRecord } from './elastic/run_record.ts';
export { appendCommHookState, splitCommHookState } from './elastic/hook_state.ts';
export { setEventHandler } from './parallel/events.ts';
export type { StepBalance } from './elastic/balance.ts';
export type { StepTimeline } from './elastic/timeline.ts';
