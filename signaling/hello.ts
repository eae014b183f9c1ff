/**
 * `hello`: a socket enters a session. Its token is checked (or fixes the session's token, when
 * this hello may create it), then its host secret; a refused hello closes its socket having read
 * or changed nothing of the session.
 */
import { timingSafeEqual } from 'node:crypto';
import {
  CloseCode,
  ErrorCode,
  PROTOCOL_VERSION,
  ROTATED_TOKEN_MESSAGE,
  SESSION_NAME,
  SESSION_TOKEN,
  type Request,
} from '../src/wire/protocol.ts';
import { ProtocolViolation } from '../src/wire/protocol_validation.ts';
import { StoreRefusal } from './store.ts';
import type { Connection } from './connection.ts';
import { iceServersFor } from './ice.ts';
import { isLoopback } from './network.ts';
import { reply } from './replies.ts';
import type { ServerContext } from './server_context.ts';

export async function hello(ctx: ServerContext, conn: Connection, req: Request<'hello'>): Promise<void> {
  const { sessions, tokens } = ctx;
  if (conn.session) {
    throw new ProtocolViolation(ErrorCode.ALREADY_IN_SESSION, `this socket is already in session "${conn.session.name}"`, req.id);
  }
  if (req.version !== PROTOCOL_VERSION) {
    throw new StoreRefusal(
      ErrorCode.BAD_VERSION,
      `protocol version ${req.version} is not supported; this server speaks ${PROTOCOL_VERSION}`,
    );
  }
  if (!SESSION_NAME.test(req.session)) {
    throw new StoreRefusal(
      ErrorCode.BAD_SESSION,
      `session name ${JSON.stringify(req.session)} is not allowed: use 1-64 of A-Z a-z 0-9 _ . - (not "." or "..")`,
    );
  }
  // Before the token is claimed: a creating hello with a bad host secret must fix nothing.
  if (req.host !== undefined && !SESSION_TOKEN.test(req.host)) {
    return unauthorized(
      ctx,
      conn,
      req,
      'a malformed host secret',
      `the host secret must be 22-128 characters of A-Z a-z 0-9 _ - (the host link's secret; newSessionToken() makes one)`,
    );
  }
  // Checked before the token is claimed, so a refused session leaves no token behind.
  sessions.checkRoomFor(req.session);
  const claim = await tokens.claimSession(req.session, req.token, req.host, mayCreate(ctx, conn, req));
  if (!claim.ok && claim.why === 'full') {
    throw new StoreRefusal(
      ErrorCode.TOO_MANY_SESSIONS,
      `the server keeps the tokens of ${ctx.maxKnownSessions} sessions already; join an existing session or try again later`,
      { limit: ctx.maxKnownSessions },
    );
  }
  if (!claim.ok && claim.why === 'unknown') {
    return unauthorized(
      ctx,
      conn,
      req,
      'an unknown session',
      `session "${req.session}" does not exist on this server. Open the full link the host shared (with its #token=...); only the host creates sessions (on the server's own machine, or with the admin link npm start prints)`,
    );
  }
  if (!claim.ok && claim.why === 'rotated') return rotated(ctx, conn, req);
  if (!claim.ok) {
    const malformed = !SESSION_TOKEN.test(req.token);
    return unauthorized(
      ctx,
      conn,
      req,
      `${malformed ? 'a malformed' : 'a wrong'} token`,
      malformed
        ? `the session token must be 22-128 characters of A-Z a-z 0-9 _ - (the #token=... of the session's link; newSessionToken() makes one)`
        : `wrong token for session "${req.session}": use the session's full link (with its #token=...), or choose another session name`,
    );
  }
  if (sessions.get(req.session)?.ended) return sessionEnded(conn, req);
  // Only the hello that fixed the token fixed a host secret; others must match it.
  const host = await tokens.checkHost(req.session, req.host);
  if (host === 'wrong') {
    return unauthorized(
      ctx,
      conn,
      req,
      'a wrong host secret',
      `wrong host secret for session "${req.session}": the host link is wrong (open it exactly as it was made), or open the session's member link to join as a member`,
    );
  }
  // The host may have removed a tab while this hello read the disk: the token it brought is then
  // no longer the session's, and this socket would never hear the new one.
  if (!tokens.isCurrent(req.session, req.token)) return rotated(ctx, conn, req);
  const session = sessions.open(req.session);
  // Another hello may have ended it while this one read the host secret.
  if (session.ended) return sessionEnded(conn, req);
  session.connections++;
  conn.isHost = host === 'host';
  conn.entered(session);
  return reply(conn, req, {
    session: session.name,
    instance: ctx.instance,
    host: conn.isHost,
    hasHost: tokens.hasHost(session.name),
    iceServers: iceServersFor(ctx.ice, session.name),
  });
}

/** What a request to an ended session, or a hello to one, is told. */
export function endedMessage(session: string): string {
  return `the host ended session "${session}": create a new one`;
}

/** Whether this hello may create its session: the host's (the server's machine, or the admin secret). */
function mayCreate(ctx: ServerContext, conn: Connection, req: Request<'hello'>): boolean {
  return (ctx.loopbackCreates && isLoopback(conn.address)) || (req.admin !== undefined && sameSecret(req.admin, ctx.adminSecret));
}

/**
 * A hello with a token the host replaced when it removed a tab (the removed tab's link, or a tab
 * whose socket was down at that moment: it gets no grace, see docs/deployment.md#security).
 */
function rotated(ctx: ServerContext, conn: Connection, req: Request<'hello'>): void {
  unauthorized(ctx, conn, req, 'a token the host replaced', ROTATED_TOKEN_MESSAGE, { rotated: true });
}

/** Refuses a hello as UNAUTHORIZED and closes its socket: nothing of the session was read or changed. */
function unauthorized(
  ctx: ServerContext,
  conn: Connection,
  req: Request<'hello'>,
  what: string,
  message: string,
  details: Record<string, unknown> = {},
): void {
  conn.errors++;
  ctx.quiet.note('refused UNAUTHORIZED', `[server] session "${req.session}": refused a connection from ${conn.address} with ${what}`);
  conn.send({ type: 'error', id: req.id, code: ErrorCode.UNAUTHORIZED, details: { session: req.session, ...details }, message });
  conn.close(CloseCode.UNAUTHORIZED, 'unauthorized');
}

/** Refuses a hello to an ended session and closes its socket (it could do nothing there). */
function sessionEnded(conn: Connection, req: Request<'hello'>): void {
  conn.send({
    type: 'error',
    id: req.id,
    code: ErrorCode.SESSION_ENDED,
    details: { session: req.session },
    message: endedMessage(req.session),
  });
  conn.close(CloseCode.SESSION_ENDED, 'session ended');
}

/** Compares two secrets in constant time. */
function sameSecret(given: string, secret: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(secret);
  return a.length === b.length && timingSafeEqual(a, b);
}
