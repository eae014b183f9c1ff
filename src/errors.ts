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
