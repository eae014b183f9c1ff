/**
 * `control` 'remove': the session's host removes a tab, named by its rank in the running round or
 * its member id. Whoever holds the session's link could come straight back, so the session's token
 * changes (SessionTokens.rotate: only its SHA-256 is kept, persisted where the old one was): every
 * other socket of the session gets the new token ('token' event), the removed member leaves the
 * group at once (its round re-forms without it, as after an eviction), and its socket is closed
 * with REMOVED. From then on a hello with the old token is refused, saying the link changed.
 */
import { CloseCode, ErrorCode, type Request, type TokenEvent } from '../src/wire/protocol.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { StoreRefusal } from './store.ts';
import type { Connection } from './connection.ts';
import type { Session } from './session.ts';
import { reply } from './replies.ts';
import type { ServerContext } from './server_context.ts';

/** What the rest of the group is told about the removed member ('peer-left', the round log). */
export const REMOVED_REASON = 'was removed by the host';

/** The member a 'remove' names, and how the host named it. */
interface Target {
  conn: Connection;
  memberId: number;
  /** "rank 2 of round 5" or "member 7". */
  label: string;
}

export async function removeMember(ctx: ServerContext, conn: Connection, session: Session, req: Request<'control'>): Promise<void> {
  const target = findTarget(ctx, session, req);
  if (target.conn === conn) {
    throw new StoreRefusal(
      ErrorCode.BAD_MESSAGE,
      `${target.label} of session "${session.name}" is this tab, the host's own: to leave, close the tab (removing it would change the session's link for nothing)`,
      { member: target.memberId },
    );
  }
  const token = newSessionToken();
  // In memory first, at once: from here on a hello with the old token is refused.
  ctx.tokens.rotate(session.name, token);
  ctx.log(`[server] session "${session.name}": the host removed ${target.label} (member ${target.memberId}); the session's token changed`);
  const event: TokenEvent = { type: 'token', token, reason: `the host removed ${target.label} from the session` };
  // Everyone else has the new token before anything else happens; the removed tab never sees it.
  for (const c of ctx.connections) if (c.session === session && c !== target.conn) c.send(event);
  session.rendezvous?.remove(target.memberId, REMOVED_REASON);
  target.conn.memberId = undefined;
  target.conn.close(CloseCode.REMOVED, `removed by the host of session "${session.name}"`.slice(0, 120));
  try {
    await ctx.tokens.persistRotation(session.name);
  } catch (err) {
    // The new token works; only a restarted server would still know the old one's hash.
    ctx.log(
      `[server] session "${session.name}": could not write the new token's hash to its checkpoint folder (${(err as Error).message}): after a restart the old link would open it again`,
    );
  }
  reply(conn, req, null);
}

function findTarget(ctx: ServerContext, session: Session, req: Request<'control'>): Target {
  const rv = session.rendezvous;
  let memberId: number | undefined;
  let label: string;
  if (req.member !== undefined) {
    memberId = rv?.isMember(req.member) ? req.member : undefined;
    label = `member ${req.member}`;
    if (memberId === undefined) {
      throw new StoreRefusal(
        ErrorCode.UNKNOWN_PEER,
        `member ${req.member} is not in the group of session "${session.name}" (it left, or never joined): nothing to remove`,
        { member: req.member },
      );
    }
  } else {
    const rank = req.rank ?? -1;
    if (!rv?.running) {
      throw new StoreRefusal(
        ErrorCode.UNKNOWN_PEER,
        `session "${session.name}" has no running round, so no rank ${rank} to remove: name the tab by its member id instead, or wait until its group trains`,
        { rank },
      );
    }
    if (req.round !== undefined && req.round !== rv.round) {
      throw new StoreRefusal(
        ErrorCode.UNKNOWN_PEER,
        `round ${req.round} of session "${session.name}" is over (round ${rv.round} runs now, and its rank ${rank} may be another tab): nothing was removed; look at the group's tabs again and choose again`,
        { rank, round: req.round, current: rv.round },
      );
    }
    memberId = rv.memberAt(rank);
    label = `rank ${rank} of round ${rv.round}`;
    if (memberId === undefined) {
      throw new StoreRefusal(
        ErrorCode.UNKNOWN_PEER,
        `round ${rv.round} of session "${session.name}" has no rank ${rank} (it left, or the round is smaller): nothing to remove`,
        { rank, round: rv.round },
      );
    }
  }
  const id = memberId;
  const conn = [...ctx.connections].find((c) => c.session === session && c.memberId === id);
  if (!conn)
    throw new StoreRefusal(
      ErrorCode.UNKNOWN_PEER,
      `${label} of session "${session.name}" has no connection any more (it is leaving): nothing to remove`,
      { member: id },
    );
  return { conn, memberId: id, label };
}
