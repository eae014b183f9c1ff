/**
 * The requests of a session's group: `rendezvous` (join), `claim` (places), `closeRendezvous`,
 * `regroup`, `signal` (the relay between ranks of the running round) and `gather` (votes). Each needs a member of
 * the group, save `rendezvous` itself.
 */
import { ErrorCode, type Request } from '../src/wire/protocol.ts';
import { StoreRefusal } from './store.ts';
import type { Connection } from './connection.ts';
import type { Session } from './session.ts';
import { blocking, reply } from './replies.ts';
import type { ServerContext } from './server_context.ts';

export function rendezvous(ctx: ServerContext, conn: Connection, session: Session, req: Request<'rendezvous'>): void {
  const { limits, log } = ctx;
  if (conn.memberId !== undefined) throw new StoreRefusal(ErrorCode.ALREADY_JOINED, 'this socket already joined the group');
  // The round that includes the member may be announced before this reply.
  conn.memberId = session.join(
    { send: (m) => conn.send(m) },
    req,
    {
      settleMs: ctx.settleMs,
      regroupIntervalMs: limits.regroupIntervalMs,
      lossIntervalMs: limits.lossIntervalMs,
      maxSpectators: limits.maxSpectators,
      maxFailedRegroupsPerMember: limits.maxFailedRegroupsPerMember,
    },
    log,
  );
  const range =
    req.min === req.max ? `world size ${req.max}${req.rank === undefined ? '' : `, rank ${req.rank}`}` : `elastic ${req.min}..${req.max}`;
  log(`[server] session "${session.name}": member ${conn.memberId} arrived (${range}${req.spectate ? ', may spectate' : ''})`);
  reply(conn, req, { memberId: conn.memberId });
}

export function claim(conn: Connection, session: Session, req: Request<'claim'>): void {
  if (conn.memberId === undefined || !session.rendezvous?.isMember(conn.memberId)) {
    throw new StoreRefusal(
      ErrorCode.NOT_JOINED,
      "only a member of the session's group may hold or look up places (claim): rendezvous first",
    );
  }
  reply(conn, req, { holders: session.claim(conn.memberId, req.keys, req.take) });
}

export function closeRendezvous(conn: Connection, session: Session, req: Request<'closeRendezvous'>): void {
  const rendezvous = session.rendezvous;
  if (conn.memberId === undefined || !rendezvous)
    throw new StoreRefusal(ErrorCode.NOT_JOINED, 'closing the rendezvous needs a rank in the running round: rendezvous first');
  rendezvous.closeGroup(conn.memberId);
  reply(conn, req, null);
}

export async function regroup(ctx: ServerContext, conn: Connection, session: Session, req: Request<'regroup'>): Promise<void> {
  const rendezvous = session.rendezvous;
  const memberId = conn.memberId;
  if (memberId === undefined || !rendezvous)
    throw new StoreRefusal(ErrorCode.NOT_JOINED, 'regroup needs a member of the group: rendezvous first');
  // Answered at once, or when a regroup deferred by regroupIntervalMs forms its round.
  return reply(conn, req, {
    round: await blocking(ctx, conn, true, () => rendezvous.regroup(memberId, req.fromRound, req.failed === true)),
  });
}

export function signal(conn: Connection, session: Session, req: Request<'signal'>): void {
  const rendezvous = session.rendezvous;
  if (conn.memberId === undefined || !rendezvous) throw new StoreRefusal(ErrorCode.NOT_JOINED, 'join the group before sending signals');
  const target = rendezvous.participantAt(req.to);
  if (!target) {
    throw new StoreRefusal(ErrorCode.UNKNOWN_PEER, `rank ${req.to} is not a member of the running round of session "${session.name}"`, {
      rank: req.to,
    });
  }
  const fromRank = rendezvous.rankOf(conn.memberId);
  // A member that fell out of the round as it changed may still signal: not counted.
  if (fromRank === undefined)
    throw new StoreRefusal(ErrorCode.NOT_JOINED, 'this member has no rank in the running round: it cannot signal', undefined, false);
  target.send({ type: 'signal', from: fromRank, member: conn.memberId, data: req.data });
  reply(conn, req, null);
}

/** A rank's row of a server-attested gather (votes): answered with every rank's row once all gave theirs. */
export async function gather(ctx: ServerContext, conn: Connection, session: Session, req: Request<'gather'>): Promise<void> {
  const rendezvous = session.rendezvous;
  const memberId = conn.memberId;
  if (memberId === undefined || !rendezvous)
    throw new StoreRefusal(ErrorCode.NOT_JOINED, 'a gather needs a rank in the running round: rendezvous first');
  return reply(conn, req, {
    rows: await blocking(ctx, conn, true, () => rendezvous.gather(memberId, req.round, req.tag, req.values, req.timeoutMs)),
  });
}
