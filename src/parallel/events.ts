/**
 * Every event a run records, whichever strategy trains it: the agent's (elastic/events.ts:
 * rounds, steps, failures, checkpoints ...) and those a strategy adds (a robust aggregation's
 * judgments). Every event goes to the run's own `onEvent` and to the process-wide handler set
 * with `setEventHandler`, which is how a launcher hears from a user's script without the script
 * wiring anything. Events are plain JSON.
 */
import type { AgentEvent } from '../elastic/events.ts';
import type { AggregationJudged } from './ddp/contributions.ts';

export type ElasticEvent =
  | AgentEvent
  /**
   * A robust aggregation (DDP's step, DiLoCo's outer step): what the group judged of each rank's
   * contribution, rounded (see contributions.ts). Every rank judges alike, so each reports the same.
   */
  | ({ type: 'aggregation'; round: string; rank: number } & AggregationJudged);

let handler: ((e: ElasticEvent) => void) | undefined;

/** Sends every elastic event of this page to `h` (or nowhere, with undefined); returns the previous handler. */
export function setEventHandler(h: ((e: ElasticEvent) => void) | undefined): ((e: ElasticEvent) => void) | undefined {
  const previous = handler;
  handler = h;
  return previous;
}

export function recordEvent(e: ElasticEvent): void {
  handler?.(e);
}
