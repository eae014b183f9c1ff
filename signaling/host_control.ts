/**
 * `control`: the session's host (the connection that presented its host secret at `hello`) stops
 * it, ends it, or changes its minimum. Every socket of the session hears the control first, then
 * sees its effect; 'end' also closes them and refuses the session from then on. 'remove' (a tab)
 * is not relayed: host_remove.ts changes the session's token and closes the removed tab's socket.
 */
import { CloseCode, ErrorCode, type ControlEvent, type Request } from '../src/wire/protocol.ts';
import { ProtocolViolation } from '../src/wire/protocol_validation.ts';
import { StoreRefusal } from './store.ts';
import type { Connection } from './connection.ts';
import type { Session } from './session.ts';
import { reply } from './replies.ts';
import type { ServerContext } from './server_context.ts';
import { removeMember } from './host_remove.ts';

/** How long an ended session's sockets have to receive the 'end' event before they are closed. */
const END_CLOSE_DELAY_MS = 1_000;

export function control(ctx: ServerContext, conn: Connection, session: Session, req: Request<'control'>): void | Promise<void> {
  if (!conn.isHost) {
    const what = req.action === 'min' ? 'change its minimum' : req.action === 'remove' ? 'remove a tab from it' : `${req.action} it`;
    throw new StoreRefusal(
      ErrorCode.NOT_HOST,
      `only the host of session "${session.name}" may ${what}: this connection did not present the session's host secret (open the host link)`,
      { action: req.action },
    );
  }
  if (req.action === 'remove') return removeMember(ctx, conn, session, req);
  let event: ControlEvent;
  if (req.action === 'min') {
    const min = req.min;
    const rendezvous = session.rendezvous;
    if (min === undefined) throw new ProtocolViolation(ErrorCode.BAD_MESSAGE, 'action "min" needs a field "min"', req.id);
    if (!rendezvous) {
      throw new StoreRefusal(
        ErrorCode.BAD_MESSAGE,
        `session "${session.name}" has no group yet: its minimum can be changed once a member has joined`,
      );
    }
    const max = rendezvous.options.max;
    if (min > max) {
      throw new StoreRefusal(
        ErrorCode.BAD_MESSAGE,
        `min ${min} is outside 1..${max}: the group of session "${session.name}" has at most ${max} ranks`,
        { min, max },
      );
    }
    event = { type: 'control', action: 'min', min, by: 'host' };
  } else {
    event = { type: 'control', action: req.action, by: 'host' };
  }
  ctx.log(`[server] session "${session.name}": the host sent ${req.action}${req.min === undefined ? '' : ` ${req.min}`}`);
  // Everyone hears it first, then sees its effect (a paused round, the closing socket).
  for (const c of ctx.connections) if (c.session === session) c.send(event);
  if (event.action === 'min' && event.min !== undefined) {
    session.minOverride = event.min;
    session.rendezvous?.setMin(event.min, `the host set the minimum to ${event.min}`);
  } else if (event.action === 'end') {
    endSession(ctx, session);
  }
  return reply(conn, req, null);
}

/**
 * The host ended the session: refused from now on, its group stopped and keys dropped at once,
 * its sockets closed once the 'end' event had time to arrive. The ended session keeps its name
 * (refusing hellos) until the idle sweeper drops it.
 */
function endSession(ctx: ServerContext, session: Session): void {
  session.end();
  ctx.log(`[server] session "${session.name}": ended by its host`);
  setTimeout(() => {
    for (const c of ctx.connections)
      if (c.session === session) c.close(CloseCode.SESSION_ENDED, `the host ended session "${session.name}"`);
  }, END_CLOSE_DELAY_MS).unref();
}
