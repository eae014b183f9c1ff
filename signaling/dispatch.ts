/**
 * The dispatch over request types: `hello` enters a session; every other request needs one, and
 * is refused in a session its host ended (heartbeats aside). The store's requests are answered
 * here; the group's (rendezvous_requests.ts) and the host's (host_control.ts) have their modules.
 * The switch is exhaustive: a request type added to the protocol fails to compile until handled.
 */
import { ErrorCode, type Request, type RequestType } from '../src/wire/protocol.ts';
import { ProtocolViolation } from '../src/wire/protocol_validation.ts';
import type { Connection } from './connection.ts';
import type { Session } from './session.ts';
import { StoreRefusal } from './store.ts';
import { checkReplySize } from './limits.ts';
import { iceServersFor } from './ice.ts';
import { pulseKey } from './pulse.ts';
import { endedMessage, hello } from './hello.ts';
import { claim, closeRendezvous, regroup, rendezvous, signal, gather } from './rendezvous_requests.ts';
import { control } from './host_control.ts';
import { blocking, reply } from './replies.ts';
import type { ServerContext } from './server_context.ts';

/** Handles one request of `conn`; a refusal rejects (the caller turns it into an error reply). */
export function dispatch(ctx: ServerContext, conn: Connection, req: Request): Promise<void> {
  return req.type === 'hello' ? hello(ctx, conn, req) : inSession(ctx, conn, req);
}

export function requireSession(conn: Connection, req: Request): Session {
  if (!conn.session) {
    throw new ProtocolViolation(ErrorCode.NO_SESSION, `"${req.type}" before "hello": choose a session first`, req.id);
  }
  return conn.session;
}

async function inSession(ctx: ServerContext, conn: Connection, req: Request<Exclude<RequestType, 'hello'>>): Promise<void> {
  const { limits } = ctx;
  const session = requireSession(conn, req);
  // Heartbeats still pass: a member is not evicted in the second before its socket is closed.
  if (session.ended && req.type !== 'heartbeat')
    throw new StoreRefusal(ErrorCode.SESSION_ENDED, endedMessage(session.name), { session: session.name });
  const store = session.store;
  switch (req.type) {
    case 'set':
      await store.set(req.key, b(req.value));
      return reply(conn, req, null);
    case 'get': {
      const [value] = (await store.getNow([req.key])) ?? [await blocking(ctx, conn, true, () => store.get(req.key, req.timeoutMs, conn))];
      checkReplySize([value!], limits.maxReplyBytes);
      return reply(conn, req, b64(value!));
    }
    case 'add':
      return reply(conn, req, await store.add(req.key, req.amount));
    case 'compareSet': {
      // The answer may be the current value, which appends can make larger than any frame.
      const value = await store.compareSet(req.key, b(req.expected), b(req.desired));
      checkReplySize([value], limits.maxReplyBytes);
      return reply(conn, req, b64(value));
    }
    case 'wait':
      if (!(await store.check(req.keys))) await blocking(ctx, conn, true, () => store.wait(req.keys, req.timeoutMs, conn));
      return reply(conn, req, null);
    case 'check':
      return reply(conn, req, await store.check(req.keys));
    case 'deleteKey':
      return reply(conn, req, await store.deleteKey(req.key));
    case 'numKeys':
      return reply(conn, req, await store.numKeys);
    case 'append':
      await store.append(req.key, b(req.value));
      return reply(conn, req, null);
    case 'multiGet': {
      const values =
        (await store.getNow(req.keys)) ?? (await blocking(ctx, conn, true, () => store.multiGet(req.keys, req.timeoutMs, conn)));
      checkReplySize(values, limits.maxReplyBytes);
      return reply(conn, req, values.map(b64));
    }
    case 'multiSet':
      await store.multiSet(req.keys, req.values.map(b));
      return reply(conn, req, null);
    case 'heartbeat':
      if (req.heard && conn.memberId !== undefined) session.vouch(conn.memberId, req.heard.round, req.heard.ranks, Date.now());
      return reply(conn, req, null);
    case 'pulse':
      if (conn.memberId === undefined)
        throw new StoreRefusal(ErrorCode.NOT_JOINED, "a pulse is for a member of the session's group: rendezvous first");
      return reply(conn, req, { key: pulseKey(conn) });
    case 'iceServers':
      // Only a connection that entered the session with its token gets here (requireSession).
      return reply(conn, req, iceServersFor(ctx.ice, session.name));
    case 'rendezvous':
      // Before the join, so that a loop of joins is slowed, not each join's id and round event.
      if (conn.memberId === undefined) ctx.joins.take(conn.address, session.name);
      return rendezvous(ctx, conn, session, req);
    case 'claim':
      return claim(conn, session, req);
    case 'closeRendezvous':
      return closeRendezvous(conn, session, req);
    case 'regroup':
      return regroup(ctx, conn, session, req);
    case 'signal':
      return signal(conn, session, req);
    case 'gather':
      return gather(ctx, conn, session, req);
    case 'control':
      return control(ctx, conn, session, req);
    default: {
      const unhandled: never = req;
      throw new ProtocolViolation(ErrorCode.UNKNOWN_TYPE, `unhandled type ${String(unhandled)}`);
    }
  }
}

function b(v: string): Uint8Array {
  return Buffer.from(v, 'base64');
}

function b64(v: Uint8Array): string {
  return Buffer.from(v.buffer, v.byteOffset, v.length).toString('base64');
}
