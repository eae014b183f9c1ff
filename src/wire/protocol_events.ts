/**
 * The wire protocol's server messages (part of protocol.ts, which re-exports it): replies,
 * error replies, and the events the server pushes (signals, rounds, departures, control,
 * tokens, faults).
 */
import type { ErrorCode } from './protocol_codes.ts';
import type { ControlAction, RequestType, ResultOf, SignalPayload } from './protocol_requests.ts';
// ---------------------------------------------------------------------------------------------
// Server -> client messages.

export interface ReplyMessage {
  type: 'reply';
  id: number;
  result: ResultOf[RequestType];
}

export interface ErrorMessage {
  type: 'error';
  /** The request this answers; absent when the frame could not be parsed far enough. */
  id?: number;
  code: ErrorCode;
  message: string;
  /** Facts behind the error (the keys waited for, the ranks involved, ...). */
  details?: Record<string, unknown>;
}

/** A relayed signaling payload from another member. */
export interface SignalEvent {
  type: 'signal';
  /** The sender's rank in the server's running round. */
  from: number;
  /**
   * The sender's member id, set by the server (attested): a link is bound to this, never to the
   * member ids a channel string names, which the sender wrote.
   */
  member: number;
  data: SignalPayload;
}

/** A member of the running round left (its socket closed, or it was evicted), by rank in that round. */
export interface PeerLeftEvent {
  type: 'peer-left';
  round: number;
  rank: number;
  /** Why: its connection closed, or it was evicted for silence. */
  reason: string;
}

/**
 * A new round of the group (torch's rendezvous round): a fixed set of ranks 0..worldSize-1.
 * Each member gets its own copy with its rank; `rank` is -1 for a member left waiting (the
 * group is at its maximum: a spectator), whose copy has the running round's `worldSize`. A
 * `paused` round has fewer than `min` members (worldSize 0): nobody trains until more arrive.
 * `min` is the session's current minimum (the host may change it).
 */
export interface RoundEvent {
  type: 'round';
  round: number;
  rank: number;
  worldSize: number;
  /**
   * The member id (the server's, from the member's `rendezvous` reply) of each rank, in rank
   * order ([] in a paused round): who is who, as the server knows it, not as the members say.
   */
  members: number[];
  paused: boolean;
  min: number;
  max: number;
}

/**
 * Who is waiting (torch's num_nodes_waiting), sent to every member whenever it changes: before
 * the first round, while paused, and while a round runs (the running ranks then admit the
 * waiting ones at their next step boundary with `regroup`).
 */
export interface WaitingEvent {
  type: 'waiting';
  /** The latest round (0 before the first). */
  round: number;
  /**
   * Members that hold no rank in a running round and wait for the next one. While a round runs,
   * only those a regroup could admit (at most max minus the running ranks): what the ranks act on.
   */
  waiting: number;
  /** Members waiting beyond the group's maximum (spectators): no regroup admits them until a rank comes free. */
  spectators: number;
  /** Every member of the session's group, waiting or not. */
  members: number;
  min: number;
  max: number;
}

/** The host sent `control`: relayed to every socket of the session, the host's own included. */
export interface ControlEvent {
  type: 'control';
  action: ControlAction;
  /** The new minimum (action 'min' only). */
  min?: number;
  by: 'host';
}

/**
 * A rank of the running round closed the rendezvous (the run ended): sent to the members that
 * hold no rank in it (they waited to be admitted, or spectated), which will never get one, and to
 * the round's other ranks: one whose last step failed while the others finished it (a collective
 * can complete on some ranks and fail on another) would wait for a round that never forms.
 */
export interface RendezvousClosedEvent {
  type: 'rendezvous-closed';
  /** The last round, the one that ran to the end. */
  round: number;
  /** The rank of that round that closed it. */
  by: number;
}

/** Why a member cannot join, or stops waiting: the words of RENDEZVOUS_CLOSED, for both ends. */
export function rendezvousClosedMessage(session: string, round: number, by: number): string {
  return `the run of session "${session}" has ended (rank ${by} closed its rendezvous after round ${round}): a tab that arrives after the end has nothing to join; to train again, start a new session`;
}

/** The same for a rank of that last round whose round failed as the others finished the run. */
export function rendezvousClosedOnRankMessage(session: string, round: number, by: number, rank: number): string {
  return `the run of session "${session}" has ended without this rank: its last round (${round}) failed here, on rank ${rank}, while the other ranks finished the run and rank ${by} closed the rendezvous; the final model is theirs (and the last checkpoint's), this replica stopped at its last committed step`;
}

/**
 * The session's token changed (the host removed a member): sent to every socket of the session but
 * the removed one's. Hellos must present `token` from now on (one with the old token is refused
 * with UNAUTHORIZED, `details.rotated`); this socket stays in the session as it is.
 */
export interface TokenEvent {
  type: 'token';
  token: string;
  /** What happened, for a person ("the host removed rank 2 of round 5"). */
  reason: string;
}

/** What a hello with a token the host's removal replaced is told (UNAUTHORIZED, `details.rotated`). */
export const ROTATED_TOKEN_MESSAGE = "this link is no longer valid: the host changed the session's link; ask the host for the new one";

/**
 * What happened to a member of the group, as the server saw it: lost from a running round (its
 * tab closed; it froze or went silent past the heartbeat bound; the host removed it; its
 * connection closed otherwise), or given a rank in a round after the first one (it joined the
 * running group: a new tab, a reload, a tab back after a stall).
 */
export type FaultKind = 'left' | 'froze' | 'removed' | 'failed' | 'joined';
export const FAULT_KINDS: readonly FaultKind[] = ['left', 'froze', 'removed', 'failed', 'joined'];

/** One fault of the group's history. */
export interface FaultEntry {
  kind: FaultKind;
  /** The round it was lost from, or the round it joined. */
  round: number;
  /** Its rank in that round. */
  rank: number;
  /** The server's words for a loss ("its tab closed"); '' for a join. */
  reason: string;
}

/** Most entries a `faults` event lists (the latest); the counts go on past it. Longest reason. */
export const MAX_FAULT_ENTRIES = 64;
export const MAX_FAULT_REASON = 200;

/**
 * The group's fault history, as the server recorded it (server-attested: nothing in it is a
 * member's word about another): sent to every member of the group whenever it changes, and to
 * each member as it arrives, so that every tab, a late one included, holds the same record. The
 * counts cover the whole run; the entries are the latest MAX_FAULT_ENTRIES, oldest first.
 */
export interface FaultsEvent {
  type: 'faults';
  counts: Record<FaultKind, number>;
  entries: FaultEntry[];
}

export type ServerMessage =
  | ReplyMessage
  | ErrorMessage
  | SignalEvent
  | PeerLeftEvent
  | RoundEvent
  | WaitingEvent
  | ControlEvent
  | RendezvousClosedEvent
  | TokenEvent
  | FaultsEvent;
