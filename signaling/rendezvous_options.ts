/**
 * What a rendezvous (rendezvous.ts) is configured with, and what it needs of a member's
 * connection: the contract session.ts fills in.
 */
import type { ServerMessage } from '../src/wire/protocol.ts';

/** What the rendezvous needs from a member's connection: a way to send it an event. */
export interface Participant {
  send(message: ServerMessage): void;
}

export interface RendezvousOptions {
  /** The size range arrivals must name (the first member's); the minimum in force may differ (`setMin`). */
  min: number;
  max: number;
  /** Most members waiting beyond `max` (`spectate`). */
  maxSpectators: number;
  /** Wait this long for more members once `min` are there, before the first round. */
  settleMs: number;
  /** Shortest time between two rounds formed by `regroup`. */
  regroupIntervalMs: number;
  /** Most regroups after a failure one member may ask for in FAILED_REGROUP_WINDOW_MS. */
  maxFailedRegroupsPerMember?: number;
  /** Shortest time between a round and the next one formed because members were lost. Default 0. */
  lossIntervalMs?: number;
}

/** How long a loss waits for others that come with it (separate socket closes of one event) before its round forms. */
export const LOSS_GATHER_MS = 100;
