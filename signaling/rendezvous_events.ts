/**
 * The events the rendezvous (rendezvous.ts) sends its members, as the wire protocol shapes them:
 * kept apart from the membership logic that decides when they go out.
 */
import type { RoundEvent, WaitingEvent } from '../src/wire/protocol.ts';

/** Round `round` as a member with `rank` (-1: none) sees it; `active` is undefined while the group is paused. */
export function roundEventFor(round: number, rank: number, active: number[] | undefined, min: number, max: number): RoundEvent {
  return {
    type: 'round',
    round,
    rank,
    worldSize: active ? active.length : 0,
    members: active ? [...active] : [],
    paused: active === undefined,
    min,
    max,
  };
}

/**
 * How many wait for the next round: `waiting` members a regroup would admit (every member while no
 * round runs), out of `queued` waiting while one runs (the rest are spectators beyond a full group).
 */
export function waitingEventFor(
  round: number,
  waiting: number,
  queued: number,
  group: { readonly size: number; readonly min: number; readonly options: { max: number } },
): WaitingEvent {
  return {
    type: 'waiting',
    round,
    waiting,
    // Beyond a full group only while one runs: a group not running has no more than max members.
    spectators: queued > 0 ? queued - waiting : 0,
    members: group.size,
    min: group.min,
    max: group.options.max,
  };
}
