/**
 * `elastic`: the pieces of an elastic run below `runElastic` and `runAgent`: the per-step vote,
 * the state saved and restored between rounds, the events' parts and the events' handler.
 */
export { stepVote, stepsVote, type StepVote, type StepsVote } from './elastic/vote.ts';
export { saveState, restoreStatePart, appendCommHookState, splitCommHookState, type RunRecord, type Restored } from './elastic/recovery.ts';
export { setEventHandler } from './elastic/events.ts';
export type { StepBalance } from './elastic/balance.ts';
export type { StepTimeline } from './elastic/timeline.ts';
