/**
 * The wire protocol's codes (part of protocol.ts, which re-exports it): the error codes of
 * `error` replies and the WebSocket close codes the server uses, with the words for each.
 */
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
  /** The server's shared store (`--store redis://...`) does not answer: the server keeps trying; try again in a few seconds. */
  STORE_UNAVAILABLE: 'STORE_UNAVAILABLE',
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
