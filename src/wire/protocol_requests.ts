/**
 * The wire protocol's requests (part of protocol.ts, which re-exports it): what a client may
 * send the server, each request's fields and what it resolves to, and the bounds on them.
 */
import type { WireValue } from './protocol_values.ts';

/**
 * What the host of a session may do (`control`): 'stop' asks every tab to stop training (the
 * server only relays it); 'end' also ends the session (refused from then on, its sockets closed,
 * its keys dropped); 'min' changes the group's minimum size.
 */
export type ControlAction = 'stop' | 'end' | 'min';
export const CONTROL_ACTIONS: readonly ControlAction[] = ['stop', 'end', 'min'];
/**
 * Every action of `control`: the relayed ones, and 'remove' (a member, named by its rank in the
 * running round or its member id), which is not relayed: the session's token changes, the other
 * sockets get the new one (TokenEvent), and the removed member's socket closes with REMOVED.
 */
export type HostAction = ControlAction | 'remove';
export const HOST_ACTIONS: readonly HostAction[] = [...CONTROL_ACTIONS, 'remove'];

// ---------------------------------------------------------------------------------------------
// Client -> server requests. Every request carries a numeric `id`; its reply echoes the id.

export interface RequestFields {
  /**
   * Enter a session; `token` is the session's secret (SESSION_TOKEN), fixed by its first
   * connection. `host` (same format) is the host secret: the hello that creates the session's
   * token fixes it; a later hello with it must match (else UNAUTHORIZED) and makes that connection
   * the host, one without it is a plain member. On a session created without one, it is ignored.
   * Only the server's host creates sessions (a hello naming an unknown session is refused): a
   * connection from the server's own machine, or one presenting `admin`, the server's admin
   * secret (`npm start` prints a link with it).
   */
  hello: { session: string; version: number; token: string; host?: string; admin?: string };
  set: { key: string; value: WireValue };
  get: { key: string; timeoutMs: number };
  add: { key: string; amount: number };
  compareSet: { key: string; expected: WireValue; desired: WireValue };
  wait: { keys: string[]; timeoutMs: number };
  check: { keys: string[] };
  deleteKey: { key: string };
  numKeys: Record<string, never>;
  append: { key: string; value: WireValue };
  multiGet: { keys: string[]; timeoutMs: number };
  multiSet: { keys: string[]; values: WireValue[] };
  /**
   * Rendezvous (torchrun's --nnodes MIN:MAX): become a member of the session's group, which
   * trains with min..max ranks; a fixed world size N is min = max = N, and only then may a rank
   * be asked for. The server forms rounds of the group and sends each member its rank in them.
   */
  rendezvous: {
    min: number;
    max: number;
    rank?: number;
    /**
     * When the group is at its maximum, wait beyond it (a spectator: rounds with rank -1) rather
     * than be refused SESSION_FULL; it takes a rank when one comes free. At most `maxSpectators`.
     */
    spectate?: boolean;
  };
  /** Relay an opaque WebRTC signaling payload to another member of the round, addressed by rank. */
  signal: { to: number; data: SignalPayload };
  /**
   * A member is alive (any frame counts; this one exists for idle members). `heard`: the ranks
   * of round `round` this member heard over its peer links within the last VOUCH_WINDOW_MS, which
   * keeps them alive too while their own heartbeats are held up (a link saturated by the
   * all-reduce starves the socket's TCP behind it), for at most VOUCH_LIMIT heartbeat timeouts.
   */
  heartbeat: { heard?: { round: number; ranks: number[] } };
  /**
   * A member's key for its pulse: a socket on `/ws?pulse` whose first frame is the key and whose
   * later frames are beats, sent from a Worker, which beats on while the page's thread is busy
   * (the server then keeps the member for longer: signaling/pulse.ts). Members only (NOT_JOINED).
   */
  pulse: Record<string, never>;
  /** Fresh ICE servers for the session (TURN credentials minted now): a member renews them before its old ones expire. */
  iceServers: Record<string, never>;
  /**
   * Ask for a new round unless one newer than `fromRound` exists: to admit waiting members, or,
   * with `failed`, because round `fromRound` failed on this rank while every member is still
   * here (a link between two live tabs broke): the same members then start a new round, which
   * nothing else would form (torch's agents re-rendezvous after a worker group fails).
   */
  regroup: { fromRound: number; failed?: boolean };
  /**
   * The host steers the session (host connections only, else NOT_HOST). `min` (1..the group's
   * max) goes with action 'min' only. Every socket of the session gets a `control` event, except
   * for 'remove' (see HostAction): the others get a TokenEvent, the removed one is closed (REMOVED).
   */
  control: {
    action: HostAction;
    min?: number;
    /** Action 'remove': the member at `rank` of the running round (only while it is round `round`, if given), or member `member`. */
    rank?: number;
    round?: number;
    member?: number;
  };
  /**
   * The run is over (torch's RendezvousHandler.set_closed, at the agents' shutdown): from now on
   * the session's group forms no round and refuses arrivals with RENDEZVOUS_CLOSED, and the
   * other members are told ('rendezvous-closed'), rather than waiting out their timeout for a
   * group that will never train again. Members with a rank in the running round only; closing a
   * closed rendezvous changes nothing.
   */
  closeRendezvous: Record<string, never>;
  /**
   * Places held by members (ZooKeeper's ephemeral nodes): each key names a place the server holds
   * for the member that took it, for as long as that member is in the session's group; a member
   * that leaves (or is evicted) frees its places. Answers each key's holder (a member id, -1:
   * vacant). With `take`, a member that holds none of `keys` takes the first vacant one. Nobody
   * can take a place another member holds or write it with the store's operations: what a place
   * says (who serves parameter shard k, say) comes from the server, not from the member.
   */
  claim: { keys: string[]; take: boolean };
  /**
   * A server-attested gather (torch's all_gather_object over the store, with each row bound to
   * its sender): this rank of round `round` gives its row under `tag`; the reply, once every rank
   * of the round gave one (or `timeoutMs` passed, naming the ranks missing), holds every rank's
   * row in rank order. The server puts a row at the rank it knows the sender by: what a row says
   * about rank r comes from rank r. A sum all-reduce cannot promise that (any member can add into
   * any row); votes, work times and step figures go this way.
   */
  gather: { round: number; tag: string; values: number[]; timeoutMs: number };
}

/** Most values in one rank's gather row; most open gathers one rank may have rows in; longest tag. */
export const MAX_GATHER_VALUES = 4_096;
export const MAX_OPEN_GATHERS = 8;
export const MAX_GATHER_TAG = 64;

/** Most keys one `claim` may name; most places a session may hold (stale ones are reused first). */
export const MAX_CLAIM_KEYS = 64;
export const MAX_CLAIMS_PER_SESSION = 4_096;
/** Most places one member may hold at once (a parameter server holds one). */
/** A member vouches for the peers it heard over their links within this long (their liveness frames come every second). */
export const VOUCH_WINDOW_MS = 1_500;
/** Vouches keep a silent member for at most this many heartbeat timeouts: a member cannot keep a gone one in the group for long. */
export const VOUCH_LIMIT = 4;
export const MAX_CLAIMS_PER_MEMBER = 16;

/** An ICE server as RTCPeerConnection takes it (the server hands them out with `hello`). */
export interface IceServer {
  urls: string[];
  username?: string;
  credential?: string;
}

/** Bounds on the ICE servers a client accepts from the server. */
export const MAX_ICE_SERVERS = 16;

/** A well-formed list of ICE servers: what a client checks before giving it to WebRTC. */
export function isIceServers(x: unknown): x is IceServer[] {
  const short = (v: unknown) => typeof v === 'string' && v.length <= 512;
  return (
    Array.isArray(x) &&
    x.length <= MAX_ICE_SERVERS &&
    x.every(
      (s) =>
        typeof s === 'object' &&
        s !== null &&
        Array.isArray((s as IceServer).urls) &&
        (s as IceServer).urls.length <= 8 &&
        (s as IceServer).urls.every((u) => short(u) && /^(stun|stuns|turn|turns):/.test(u as string)) &&
        ((s as IceServer).username === undefined || short((s as IceServer).username)) &&
        ((s as IceServer).credential === undefined || short((s as IceServer).credential)),
    )
  );
}

/** What each request resolves to. */
export interface ResultOf {
  /**
   * `instance` changes when the server restarts: link names include it, so old links never match.
   * `host`: this connection presented the session's host secret; `hasHost`: the session has one.
   * `iceServers`: STUN/TURN servers for the session's WebRTC links (TURN credentials minted for
   * this session, time-limited); empty when the server has none configured.
   */
  hello: { session: string; instance: string; host: boolean; hasHost: boolean; iceServers: IceServer[] };
  set: null;
  get: WireValue;
  add: number;
  compareSet: WireValue;
  wait: null;
  check: boolean;
  deleteKey: boolean;
  numKeys: number;
  append: null;
  multiGet: WireValue[];
  multiSet: null;
  rendezvous: { memberId: number };
  signal: null;
  heartbeat: null;
  pulse: { key: string };
  iceServers: IceServer[];
  regroup: { round: number };
  control: null;
  closeRendezvous: null;
  claim: { holders: number[] };
  gather: { rows: number[][] };
}

export type RequestType = keyof RequestFields;
export type Request<T extends RequestType = RequestType> = T extends RequestType ? { type: T; id: number } & RequestFields[T] : never;

/** A signaling payload: opaque to the server, small, JSON. */
export interface SignalPayload {
  /** Which link this belongs to; lets a later round's group ignore an earlier one's signals. */
  channel: string;
  body: unknown;
}
