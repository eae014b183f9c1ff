/**
 * The wire protocol between the signaling server (the rank-0 store) and its clients: the
 * contract both ends import, like TCPStore's shared `QueryType` enum. Every message type, its
 * fields and its result are declared here; `protocol_validation.ts` beside it parses and checks
 * them, and both ends switch on the type exhaustively. Messages are JSON text frames; store
 * values travel as base64 so that arbitrary bytes survive. Tensors never travel here: they go
 * peer to peer.
 */

/** 7: signals carry their sender's member id, votes go through `gather`, the host's `remove` and the `token` event. 8: the `faults` event. */
export const PROTOCOL_VERSION = 8;

/** Limits the server enforces; each is a named option of `startServer` with these defaults. */
export const DEFAULT_LIMITS = {
  /** Largest WebSocket frame accepted; a larger one closes the socket with 1009. */
  maxFrameBytes: 1 << 20,
  /** Most keys one session may hold. */
  maxKeysPerSession: 10_000,
  /** Most bytes (keys + values) one session may hold. */
  maxBytesPerSession: 64 << 20,
  /** Longest key, in characters. */
  maxKeyLength: 512,
  /** Most keys named in one request (wait, check, multiGet, multiSet). */
  maxKeysPerRequest: 1_000,
  /** Most protocol errors a socket may cause before it is closed as abusive. */
  maxErrorsPerSocket: 100,
  /** Longest a blocking store call may wait on the server. */
  maxTimeoutMs: 3_600_000,
  /** Most sessions the server holds at once; a `hello` naming a new one past this is refused. */
  maxSessions: 1_000,
  /** Most bytes (keys + values) all sessions together may hold. */
  maxServerBytes: 512 << 20,
  /** Most open sockets from one remote address. */
  maxConnectionsPerAddress: 128,
  /** Most blocking calls (get, wait, multiGet) one socket may have waiting on the server. */
  maxPendingPerSocket: 256,
  /** Largest reply the server builds (a multiGet of big values). */
  maxReplyBytes: 16 << 20,
  /** A socket that has not sent `hello` this long after opening is closed. */
  helloTimeoutMs: 10_000,
  /** The server pings every socket this often; one that has not answered the previous ping is cut off. */
  pingIntervalMs: 15_000,
  /** A socket whose unsent replies pass this many bytes (it does not read them) is cut off. */
  maxBufferedBytes: 32 << 20,
  /** Shortest time between two regroups a session's members may cause. */
  regroupIntervalMs: 1_000,
  /**
   * Shortest time between a round and the next one formed because members were lost: losses
   * within it are gathered into one round at its end (a class loses tabs together; a round per
   * loss would fail on the next).
   */
  lossIntervalMs: 1_000,
  /**
   * Most regroups after a failure one member may ask for in 10 minutes; past it, its next is
   * refused (RATE_LIMITED). Every member of a failed round asks, so an honest failure never needs
   * one member's word; a member asking alone, again and again, makes everyone redo state transfers.
   */
  maxFailedRegroupsPerMember: 30,
  /** Most members that wait beyond a full group (`rendezvous` with `spectate`); past it, SESSION_FULL. */
  maxSpectators: 64,
} as const;

export type Limits = { -readonly [K in keyof typeof DEFAULT_LIMITS]: number };

/** Default timeout of blocking store calls, as in torch's Store (300 s). */
export const DEFAULT_STORE_TIMEOUT_MS = 300_000;

/** Session names: short, URL-safe; not "." or ".." (they also name checkpoint folders). */
export const SESSION_NAME = /^(?!\.\.?$)[A-Za-z0-9_.-]{1,64}$/;

/**
 * Session tokens: base64url, at least 22 characters (128 bits; `newSessionToken` makes 256).
 * The first connection to a session fixes its token; the server keeps only its SHA-256. A host
 * secret (`hello.host`) has the same format.
 */
export const SESSION_TOKEN = /^[A-Za-z0-9_-]{22,128}$/;

/**
 * Refusal codes. Each is a stable value a client can match on; the message beside it says
 * what was wrong for a person.
 */
export const ErrorCode = {
  /** The frame was not valid JSON. */
  BAD_JSON: 'BAD_JSON',
  /** The message lacked a field or a field had the wrong type or range. */
  BAD_MESSAGE: 'BAD_MESSAGE',
  /** The message type is not one this server knows. */
  UNKNOWN_TYPE: 'UNKNOWN_TYPE',
  /** A request came before `hello` chose a session. */
  NO_SESSION: 'NO_SESSION',
  /** A second `hello` on one socket. */
  ALREADY_IN_SESSION: 'ALREADY_IN_SESSION',
  /** The session name is not allowed. */
  BAD_SESSION: 'BAD_SESSION',
  /** The client speaks another protocol version. */
  BAD_VERSION: 'BAD_VERSION',
  /** A blocking store call waited its whole timeout. */
  TIMEOUT: 'TIMEOUT',
  /** `add` on a key whose value is not an integer. */
  NOT_AN_INTEGER: 'NOT_AN_INTEGER',
  /** The session holds too many keys. */
  QUOTA_KEYS: 'QUOTA_KEYS',
  /** The session holds too many bytes. */
  QUOTA_BYTES: 'QUOTA_BYTES',
  /** `rendezvous` with a fixed world size other than the session's fixed world size. */
  WORLD_SIZE_MISMATCH: 'WORLD_SIZE_MISMATCH',
  /** `rendezvous` with a rank outside 0..worldSize-1. */
  RANK_OUT_OF_RANGE: 'RANK_OUT_OF_RANGE',
  /** `rendezvous` with a rank another member asked for. */
  DUPLICATE_RANK: 'DUPLICATE_RANK',
  /** `rendezvous` to a session that already has its maximum of members. */
  SESSION_FULL: 'SESSION_FULL',
  /** A second `rendezvous` on one socket. */
  ALREADY_JOINED: 'ALREADY_JOINED',
  /** `signal` or `regroup` from a socket without a rank in the running round. */
  NOT_JOINED: 'NOT_JOINED',
  /** `signal` to a rank that is not a member of the running round. */
  UNKNOWN_PEER: 'UNKNOWN_PEER',
  /** `rendezvous` with a size range other than the session's, where one of them is elastic. */
  ELASTIC_MISMATCH: 'ELASTIC_MISMATCH',
  /**
   * `hello` without the session's token, with another one, or naming a session that does not
   * exist from a connection that may not create one. Nothing of the session was read or changed.
   */
  UNAUTHORIZED: 'UNAUTHORIZED',
  /** `hello` naming a new session while the server holds `maxSessions`. */
  TOO_MANY_SESSIONS: 'TOO_MANY_SESSIONS',
  /** All sessions together would hold more than `maxServerBytes`. */
  QUOTA_SERVER_BYTES: 'QUOTA_SERVER_BYTES',
  /** A socket has `maxPendingPerSocket` blocking calls waiting already. */
  TOO_MANY_PENDING: 'TOO_MANY_PENDING',
  /** The reply would be larger than `maxReplyBytes`. */
  REPLY_TOO_LARGE: 'REPLY_TOO_LARGE',
  /** A request names the same key twice. */
  DUPLICATE_KEYS: 'DUPLICATE_KEYS',
  /** A request came faster than its limit allows (regroups). */
  RATE_LIMITED: 'RATE_LIMITED',
  /** `control` from a connection that did not present the session's host secret. */
  NOT_HOST: 'NOT_HOST',
  /** `hello`, `rendezvous` or any request to a session its host ended: create a new session. */
  SESSION_ENDED: 'SESSION_ENDED',
  /** `rendezvous` to a session whose run ended (every rank of its last round was done): nothing is left to join. */
  RENDEZVOUS_CLOSED: 'RENDEZVOUS_CLOSED',
  /** A `gather` whose round ended (a rank left, or a new round formed) before every rank gave its row. */
  GATHER_ABORTED: 'GATHER_ABORTED',
} as const;
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

/** WebSocket close codes the server uses (4000-4999 are for applications). */
export const CloseCode = {
  /** ws's own code for a frame over `maxFrameBytes`. */
  MESSAGE_TOO_BIG: 1009,
  /** The socket sent more than `maxErrorsPerSocket` bad messages. */
  TOO_MANY_ERRORS: 4001,
  /** The server is shutting down. */
  SERVER_CLOSING: 4002,
  /** A member sent nothing for longer than the heartbeat timeout (a frozen tab). */
  EVICTED: 4003,
  /** The socket sent no `hello` within `helloTimeoutMs`. */
  HELLO_TIMEOUT: 4004,
  /** The socket did not read its replies: more than `maxBufferedBytes` were waiting to be sent. */
  SLOW_READER: 4005,
  /** `hello` was refused as UNAUTHORIZED: the socket can do nothing else. */
  UNAUTHORIZED: 4006,
  /** The remote address has `maxConnectionsPerAddress` sockets open already. */
  TOO_MANY_CONNECTIONS: 4007,
  /** The session's host ended it (`control` 'end'): every socket of the session is closed. */
  SESSION_ENDED: 4008,
  /** Sent by a client: its tab is closing (or entering the back/forward cache). The server tells the group at once. */
  LEFT: 4009,
  /** Sent by a client: its page was paused past its stall bound, so it leaves the round and joins again. */
  STALLED: 4010,
  /** The session's host removed this member (`control` 'remove'): the session's token changed, so its link no longer opens it. */
  REMOVED: 4011,
} as const;

export type CloseCodeValue = (typeof CloseCode)[keyof typeof CloseCode];

/**
 * Why a member whose socket closed with `code` is gone, for the rest of its group ("rank 2 ..."):
 * the words the server puts in 'peer-left' and in its round log. Any other code (1000, 1001,
 * 1006: the socket just closed or broke) is a plain closed connection.
 */
export function describeMemberClose(code: number): string {
  const known = code as CloseCodeValue;
  switch (known) {
    case CloseCode.LEFT:
      return 'its tab closed';
    case CloseCode.STALLED:
      return 'was paused (its tab froze or its computer slept) and joins again';
    case CloseCode.EVICTED:
      return 'was evicted: nothing received from it (frozen or hung)';
    case CloseCode.SESSION_ENDED:
      return 'left: the host ended the session';
    case CloseCode.REMOVED:
      return 'was removed by the host';
    case CloseCode.SERVER_CLOSING:
      return 'left: the server is shutting down';
    case CloseCode.MESSAGE_TOO_BIG:
    case CloseCode.TOO_MANY_ERRORS:
    case CloseCode.SLOW_READER:
      return 'was cut off by the server (it broke a limit)';
    // Never members: closed before or instead of joining.
    case CloseCode.HELLO_TIMEOUT:
    case CloseCode.UNAUTHORIZED:
    case CloseCode.TOO_MANY_CONNECTIONS:
      return 'closed its connection to the server';
    default: {
      const other: never = known;
      void other;
      return 'closed its connection to the server';
    }
  }
}

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

/** Base64 text of a store value. */
export type WireValue = string;

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
  // eslint-disable-next-line @typescript-eslint/no-empty-object-type
  numKeys: {};
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
  pulse: {};
  /** Fresh ICE servers for the session (TURN credentials minted now): a member renews them before its old ones expire. */
  iceServers: {};
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
  closeRendezvous: {};
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
export type Request<T extends RequestType = RequestType> = T extends RequestType
  ? { type: T; id: number } & RequestFields[T]
  : never;

/** A signaling payload: opaque to the server, small, JSON. */
export interface SignalPayload {
  /** Which link this belongs to; lets a later round's group ignore an earlier one's signals. */
  channel: string;
  body: unknown;
}

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

export type ServerMessage = ReplyMessage | ErrorMessage | SignalEvent | PeerLeftEvent | RoundEvent | WaitingEvent | ControlEvent | RendezvousClosedEvent | TokenEvent | FaultsEvent;

// ---------------------------------------------------------------------------------------------
// Values: bytes <-> base64, without Node's Buffer so the browser can use it too.

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder();

export function toBytes(v: Uint8Array | string): Uint8Array {
  return typeof v === 'string' ? textEncoder.encode(v) : v;
}

export function bytesToString(b: Uint8Array): string {
  return textDecoder.decode(b);
}

export function encodeValue(v: Uint8Array | string): WireValue {
  const bytes = toBytes(v);
  let bin = '';
  const CHUNK = 0x8000;
  for (let i = 0; i < bytes.length; i += CHUNK) {
    bin += String.fromCharCode(...bytes.subarray(i, i + CHUNK));
  }
  return btoa(bin);
}

export function decodeValue(v: WireValue): Uint8Array {
  const bin = atob(v);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
