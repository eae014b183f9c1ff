/**
 * Typed errors. Each has a stable `name` to match on and carries the facts a user needs to act:
 * which key, which rank, how long was waited.
 */
import type { ErrorCode } from './protocol.ts';

/** The server refused a request; `code` is one of the protocol's `ErrorCode`s. */
export class StoreError extends Error {
  override name = 'StoreError';
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

/** A blocking store call (get, wait, multiGet) waited its whole timeout. */
export class StoreTimeoutError extends StoreError {
  override name = 'StoreTimeoutError';
  constructor(
    message: string,
    readonly keys: string[],
    readonly timeoutMs: number,
  ) {
    super('TIMEOUT', message, { keys, timeoutMs });
  }
}

/** Rendezvous refused this rank (world size mismatch, rank out of range, duplicate, full). */
export class RendezvousError extends StoreError {
  override name = 'RendezvousError';
}

/** The server refused the session's token (missing, malformed or not the session's). Not recoverable by retrying. */
export class UnauthorizedError extends StoreError {
  override name = 'UnauthorizedError';
  constructor(
    message: string,
    readonly session: string,
  ) {
    super('UNAUTHORIZED', message, { session });
  }
}

/** The connection to the server closed while something was waiting on it. */
export class ConnectionClosedError extends Error {
  override name = 'ConnectionClosedError';
  constructor(
    message: string,
    readonly closeCode?: number,
    readonly reason?: string,
  ) {
    super(message);
  }
}

/** A wait that is not a store call (rendezvous, a peer link, a collective) ran out of time. */
export class DistTimeoutError extends Error {
  override name = 'DistTimeoutError';
  constructor(
    /** What was being waited for, in words. */
    readonly waitingFor: string,
    readonly timeoutMs: number,
  ) {
    super(`timed out after ${timeoutMs} ms waiting for ${waitingFor}`);
  }
}

/** A peer closed or stopped answering during a collective. */
export class PeerLostError extends Error {
  override name = 'PeerLostError';
  constructor(
    readonly rank: number,
    readonly reason: string,
  ) {
    super(`lost rank ${rank}: ${reason}`);
  }
}

/** Ranks issued different collectives (op, length, root) at the same sequence number. */
export class CollectiveMismatchError extends Error {
  override name = 'CollectiveMismatchError';
  constructor(
    message: string,
    readonly seq: number,
  ) {
    super(message);
  }
}

/** A tensor frame broke the framing rules (duplicate, out of order, truncated chunk). */
export class FramingError extends Error {
  override name = 'FramingError';
}

/**
 * The group was closed from this side: destroyed, or replaced because the server formed a new
 * round (a member left or arrived). Collectives of a closed group reject with it.
 */
export class GroupClosedError extends Error {
  override name = 'GroupClosedError';
}

/**
 * Another rank aborted a collective this rank took part in, for a reason other than a lost peer,
 * a mismatch or bad framing (those arrive as their own errors): its group closed, its link timed
 * out, or something failed there.
 */
export class CollectiveAbortedError extends Error {
  override name = 'CollectiveAbortedError';
  constructor(
    /** The rank that aborted first. */
    readonly origin: number,
    readonly seq: number,
    readonly reason: string,
    /** Whether the origin's failure is one a new round recovers from (a closed group, a timeout). */
    readonly recoverable: boolean,
  ) {
    super(`rank ${origin} aborted collective #${seq}: ${reason}`);
  }
}

/**
 * Whether a new round of the group can recover from `err`: a lost rank or server, a group
 * replaced by a new round, a wait that ran out because a peer went away. A mismatch between
 * ranks, bad frames or a bug in the training step are not: every round would fail the same way.
 */
export function isRecoverable(err: unknown): boolean {
  return (
    err instanceof PeerLostError ||
    err instanceof ConnectionClosedError ||
    err instanceof GroupClosedError ||
    err instanceof DistTimeoutError ||
    err instanceof StoreTimeoutError ||
    (err instanceof CollectiveAbortedError && err.recoverable)
  );
}
