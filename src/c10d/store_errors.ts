/**
 * The server's error replies as the typed errors of errors.ts (a timeout with its keys, a
 * refused rendezvous, a rotated token, ...), and the names requests go by in messages.
 */
import { ErrorCode } from '../wire/protocol.ts';
import {
  NotHostError,
  RendezvousClosedError,
  RendezvousError,
  SessionEndedError,
  StoreError,
  StoreTimeoutError,
  TokenRotatedError,
  UnauthorizedError,
} from '../wire/errors.ts';

const RENDEZVOUS_CODES = new Set<string>([
  ErrorCode.WORLD_SIZE_MISMATCH,
  ErrorCode.RANK_OUT_OF_RANGE,
  ErrorCode.DUPLICATE_RANK,
  ErrorCode.SESSION_FULL,
  ErrorCode.ALREADY_JOINED,
  ErrorCode.ELASTIC_MISMATCH,
]);

/** The error an `error` reply with `code` stands for. */
export function toError(code: ErrorCode, message: string, details: Record<string, unknown>): StoreError {
  if (code === ErrorCode.TIMEOUT) {
    const keys = Array.isArray(details.keys) ? (details.keys as string[]) : [];
    const timeoutMs = typeof details.timeoutMs === 'number' ? details.timeoutMs : 0;
    return new StoreTimeoutError(message, keys, timeoutMs);
  }
  if (RENDEZVOUS_CODES.has(code)) return new RendezvousError(code, message, details);
  if (code === ErrorCode.UNAUTHORIZED)
    return new (details.rotated === true ? TokenRotatedError : UnauthorizedError)(
      message,
      typeof details.session === 'string' ? details.session : '',
    );
  if (code === ErrorCode.NOT_HOST) return new NotHostError(message, details);
  if (code === ErrorCode.SESSION_ENDED) return new SessionEndedError(message, typeof details.session === 'string' ? details.session : '');
  if (code === ErrorCode.RENDEZVOUS_CLOSED) {
    const int = (v: unknown) => (typeof v === 'number' && Number.isSafeInteger(v) ? v : -1);
    return new RendezvousClosedError(
      message,
      typeof details.session === 'string' ? details.session : '',
      int(details.round),
      int(details.by),
    );
  }
  return new StoreError(code, message, details);
}

/** A request as messages name it: its type and its key(s). */
export function describeRequest(type: string, fields: Record<string, unknown>): string {
  if (typeof fields.key === 'string') return `${type}("${fields.key}")`;
  if (Array.isArray(fields.keys)) return `${type}(${fields.keys.map((k) => `"${String(k)}"`).join(', ')})`;
  return type;
}
