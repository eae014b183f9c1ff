/**
 * The wire protocol between the signaling server (the rank-0 store) and its clients: the
 * contract both ends import, like TCPStore's shared `QueryType` enum. Every message type, its
 * fields and its result are declared here; `protocol_validation.ts` beside it parses and checks
 * them, and both ends switch on the type exhaustively. Messages are JSON text frames; store
 * values travel as base64 so that arbitrary bytes survive. Tensors never travel here: they go
 * peer to peer.
 *
 * One module for importers, in parts by message family: protocol_codes.ts (error and close
 * codes), protocol_requests.ts (client -> server), protocol_events.ts (server -> client) and
 * protocol_values.ts (values as base64); this file holds the version, the session rules and the
 * server's limits, and re-exports the parts.
 */
export * from './protocol_codes.ts';
export * from './protocol_requests.ts';
export * from './protocol_events.ts';
export * from './protocol_values.ts';

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
