/**
 * How a request is answered: its reply, its refusal (counted against the socket's
 * `maxErrorsPerSocket`), and the bound on the blocking calls a socket may have waiting.
 */
import { CloseCode, ErrorCode, type ErrorMessage, type Request, type RequestType, type ResultOf } from '../src/wire/protocol.ts';
import { ProtocolViolation } from '../src/wire/protocol_validation.ts';
import { StoreRefusal } from './store.ts';
import type { Connection } from './connection.ts';
import type { ServerContext } from './server_context.ts';

export function reply<T extends RequestType>(conn: Connection, req: Request<T>, result: ResultOf[T]): void {
  conn.send({ type: 'reply', id: req.id, result });
}

/**
 * Turns a refusal into an error reply; closes sockets that keep sending bad messages. Protocol
 * violations and the refusals a correct client does not meet (see StoreRefusal.counted) count.
 */
export function refuse(ctx: ServerContext, conn: Connection, err: unknown, id?: number): void {
  const { limits, quiet } = ctx;
  let message: ErrorMessage;
  if (err instanceof ProtocolViolation) {
    message = { type: 'error', id: err.id ?? id, code: err.code, message: err.message };
    conn.errors++;
  } else if (err instanceof StoreRefusal) {
    message = { type: 'error', id, code: err.code, message: err.message, details: err.details };
    if (err.counted) conn.errors++;
  } else {
    // A bug here, not the client's doing: logged (the first of each kind with its stack), not counted.
    const kind = (err instanceof Error ? `${err.name}: ${err.message}` : String(err)).slice(0, 200);
    quiet.note(`unexpected ${kind}`, `[server] unexpected error: ${kind}`, err instanceof Error ? err.stack : undefined);
    message = { type: 'error', id, code: ErrorCode.BAD_MESSAGE, message: `server could not handle this: ${String(err)}` };
  }
  if (err instanceof ProtocolViolation || (err instanceof StoreRefusal && message.code !== ErrorCode.TIMEOUT)) {
    const where = conn.session ? ` in session "${conn.session.name}"` : '';
    quiet.note(`refused ${message.code}`, `[server] refused a request from ${conn.address}${where}: ${message.code}: ${message.message}`);
  }
  conn.send(message);
  if (conn.errors > limits.maxErrorsPerSocket) {
    conn.close(CloseCode.TOO_MANY_ERRORS, `more than ${limits.maxErrorsPerSocket} bad messages`);
  }
}

/**
 * Runs a call that may wait on the server (get, wait, multiGet, regroup), counting it against
 * the socket's `maxPendingPerSocket` while it waits; `waits` false: it will not wait (its keys
 * exist already), so the limit does not apply.
 */
export async function blocking<T>(ctx: ServerContext, conn: Connection, waits: boolean, call: () => Promise<T>): Promise<T> {
  const { limits } = ctx;
  if (waits && conn.pending >= limits.maxPendingPerSocket) {
    throw new StoreRefusal(
      ErrorCode.TOO_MANY_PENDING,
      `this socket has ${conn.pending} blocking calls waiting already; the limit is ${limits.maxPendingPerSocket}. Wait for some to finish, or ask for several keys in one wait or multiGet.`,
      { limit: limits.maxPendingPerSocket },
    );
  }
  conn.pending++;
  try {
    return await call();
  } finally {
    conn.pending--;
  }
}
