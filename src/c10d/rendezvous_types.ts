/**
 * What the rendezvous handler (rendezvous.ts) takes and gives: its options, the rounds it forms
 * (each a fixed set of ranks with its own ProcessGroup), and the events it reports as it goes.
 */
import type { LinkOptions, ProcessGroup } from './process_group.ts';
import type { ControlAction, FaultsEvent } from '../wire/protocol.ts';
import type { StoreClient } from './store.ts';
import type { StoreAvailabilityEvent } from './store_unavailable.ts';

export interface RendezvousOptions extends LinkOptions {
  /** The server: http://host:port/ (the page's origin) or ws://host:port/ws. */
  url: string;
  session: string;
  /** The session's secret (`newSessionToken()`, a share link's `#token=...`). */
  token: string;
  /** The session's host secret, if this member is its host (kept when the handler rejoins). See StoreClientOptions.host. */
  host?: string;
  /** The fewest ranks a round may have; below it the group pauses. (The session's host may change it.) */
  min: number;
  /** The most ranks; members beyond it are refused (SESSION_FULL), unless they `spectate`. */
  max: number;
  /** Ask for this rank (fixed world sizes, min = max, only). */
  rank?: number;
  /**
   * When the group is full, wait as a spectator (a 'spectating' event, no process group) instead
   * of failing with SESSION_FULL; `nextRendezvous` resolves once a rank comes free for it.
   */
  spectate?: boolean;
  /** How long waiting for a round may take, and the default for blocking store calls. Default 300 s. */
  timeoutMs?: number;
  /** How often to tell the server this member is alive. Default 1 s. */
  heartbeatIntervalMs?: number;
  /**
   * Rejoin, with backoff, after the server went away or evicted this member, after this member
   * found its page was paused past `stallTimeoutMs`, and when its page comes back from the
   * back/forward cache. Default false.
   */
  reconnect?: boolean;
  /** How long to keep trying to rejoin. Default 10 min. */
  reconnectTimeoutMs?: number;
  /**
   * After a round failed on this member with nobody gone (see `roundFailed`), how long to wait
   * for the server to form a round by itself before asking it to. Longer than the server takes
   * to evict a frozen member (its heartbeat timeout, 5 s by default), so that the new round is
   * formed without it. Default 6 s.
   */
  failedRoundGraceMs?: number;
  /** Use this open connection for the first rendezvous instead of opening one. */
  store?: StoreClient;
  /**
   * The session's token changed (its host removed a tab): the handler rejoins with the new one
   * from then on; whatever else presents the token (checkpoint routes, a page's link) should too.
   */
  onToken?(token: string): void;
  /**
   * Keep the peer links between rounds (transport/link_pool.ts): a new round reuses the open link
   * to each tab it had one with, so that a regroup opens only the links no earlier round needed.
   * Default: true with the browser's WebRTC links, false with a `linkFactory` of the caller's (whose
   * tests may reach into each round's links); false opens every round's links afresh.
   */
  reuseLinks?: boolean;
}

/** One round this member takes part in. */
export interface Round {
  /** Counts the rounds this handler has seen (server round numbers restart with the server). */
  id: number;
  /** The server's round number. */
  round: number;
  /** Names the round's group apart from every other (server instance and round). */
  key: string;
  rank: number;
  worldSize: number;
  /** Each rank's member id, as the server tells it (members cannot forge it): who is who across rounds. */
  members: readonly number[];
  pg: ProcessGroup;
  /** When the server's event announcing it reached this member (performance.now()), before any of its links opened. */
  receivedAt: number;
}

export type RendezvousEvent =
  | { type: 'round'; id: number; round: number; rank: number; worldSize: number }
  /** The group fell below its minimum; nobody trains until more members arrive ('waiting' says how many are here). */
  | { type: 'paused'; round: number; min: number }
  /**
   * How many members wait for the next round (torch's num_nodes_waiting: only those a regroup
   * could admit), how many wait beyond the full group (spectators), and how many there are.
   */
  | { type: 'waiting'; waiting: number; members: number; min: number; max: number; running: boolean; spectators: number }
  /** This member waits beyond a full group (it asked to `spectate`): round `round` runs with `worldSize` ranks without it. */
  | { type: 'spectating'; round: number; worldSize: number; max: number }
  /** The session's host sent a control (every member hears it; 'end' is followed by the connection closing). */
  | { type: 'control'; action: ControlAction; min?: number }
  /** The run ended while this member held no rank: rank `by` of round `round` closed the rendezvous. */
  | { type: 'closed'; round: number; by: number }
  /** The group's fault history as the server recorded it (the same on every member): on each change, and as this member arrives. */
  | { type: 'faults'; counts: FaultsEvent['counts']; entries: FaultsEvent['entries'] }
  | { type: 'reconnecting'; attempt: number; waitMs: number; reason: string }
  | { type: 'reconnected' }
  /** The server's shared store (a Redis) refuses this member's requests, which are tried again; or it answers again (store_unavailable.ts). */
  | ({ type: 'store' } & StoreAvailabilityEvent);
