/**
 * The rules an arrival must pass before the rendezvous admits it (rendezvous.ts): the group is
 * open, the size range matches the first member's, an asked-for rank is free and in range, and
 * there is room (or a spectator's place). Kept apart so the rendezvous reads as its rounds.
 */
import { ErrorCode, rendezvousClosedMessage, type RequestFields } from '../src/wire/protocol.ts';
import { StoreRefusal } from './store.ts';
import { MAX_MEMBER_ID } from '../src/wire/protocol_validation.ts';

/** What the admission rules read of the rendezvous at the moment a member arrives. */
export interface AdmissionState {
  sessionName: string;
  /** The size range the first member set, and the most spectators beyond it. */
  min: number;
  max: number;
  maxSpectators: number;
  /** The rendezvous closed: the last round and the rank done first. */
  closedBy: { round: number; rank: number } | undefined;
  /** Members here now (ranked, waiting or spectating). */
  members: number;
  /** Ranks members here asked for. */
  askedRanks: ReadonlyArray<number | undefined>;
  /** The id the arrival would get. */
  nextId: number;
}

/** Throws the StoreRefusal naming the first rule `request` breaks; returns when it may join. */
export function refuseArrival(state: AdmissionState, request: RequestFields['rendezvous']): void {
  const { sessionName, min, max, maxSpectators } = state;
  if (state.closedBy) {
    const { round, rank } = state.closedBy;
    throw new StoreRefusal(ErrorCode.RENDEZVOUS_CLOSED, rendezvousClosedMessage(sessionName, round, rank), {
      session: sessionName,
      round,
      by: rank,
    });
  }
  refuseRangeMismatch(state, request);
  const rank = request.rank;
  if (rank !== undefined && (rank < 0 || rank >= max)) {
    throw new StoreRefusal(ErrorCode.RANK_OUT_OF_RANGE, `rank ${rank} is outside 0..${max - 1} for world size ${max}`, {
      rank,
      worldSize: max,
    });
  }
  const spectators = Math.max(0, state.members - max);
  if (state.members >= max && !(request.spectate === true && spectators < maxSpectators)) {
    const full =
      min === max
        ? `session "${sessionName}" is full: all ${max} ranks have joined`
        : `session "${sessionName}" is full: it already has its maximum of ${max} ranks`;
    throw new StoreRefusal(
      ErrorCode.SESSION_FULL,
      request.spectate === true
        ? `${full}, and ${spectators} spectators wait, the most it takes`
        : `${full} (join with spectate to wait for a free rank)`,
      { max, spectators, maxSpectators },
    );
  }
  if (rank !== undefined && state.askedRanks.includes(rank)) {
    throw new StoreRefusal(ErrorCode.DUPLICATE_RANK, `rank ${rank} has already joined session "${sessionName}"`, { rank });
  }
  if (state.nextId > MAX_MEMBER_ID) {
    throw new StoreRefusal(
      ErrorCode.SESSION_FULL,
      `session "${sessionName}" has had ${MAX_MEMBER_ID} members since the server started, the most one session may: start a new session`,
      { max },
    );
  }
}

/** An arrival must name the range the first member set: a fixed world size, or the same elastic range. */
function refuseRangeMismatch(state: AdmissionState, request: RequestFields['rendezvous']): void {
  const { sessionName, min, max } = state;
  if (request.min === min && request.max === max) return;
  const fixed = min === max;
  if (fixed && request.min === request.max) {
    throw new StoreRefusal(
      ErrorCode.WORLD_SIZE_MISMATCH,
      `session "${sessionName}" has world size ${max}, but this rank asked for ${request.max}`,
      {
        sessionWorldSize: max,
        requested: request.max,
      },
    );
  }
  const theirs = fixed ? `a fixed world size of ${max}` : `${min}..${max} ranks (elastic)`;
  const mine = request.min === request.max ? `a fixed world size of ${request.max}` : `${request.min}..${request.max}`;
  throw new StoreRefusal(ErrorCode.ELASTIC_MISMATCH, `session "${sessionName}" has ${theirs}, but this tab asked for ${mine}`, {
    min,
    max,
  });
}
