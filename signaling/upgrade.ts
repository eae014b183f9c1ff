/**
 * The WebSocket side of the server, on `/ws`: the upgrade (a foreign page or host name is refused
 * with HTTP 403 before a socket exists), the accept (at most `maxConnectionsPerAddress` sockets per
 * address; the others are accepted only to be closed with TOO_MANY_CONNECTIONS and a reason, which
 * a browser can read where it cannot read an HTTP status), each socket's requests in order behind
 * its `hello`, its close, and the liveness checks (pings, silent members evicted).
 */
import type { Server as HttpServer } from 'node:http';
import type { Server as HttpsServer } from 'node:https';
import type { IncomingMessage } from 'node:http';
import { WebSocketServer, type WebSocket } from 'ws';
import { CloseCode, ErrorCode, SESSION_NAME, VOUCH_LIMIT, describeMemberClose, type Request } from '../src/wire/protocol.ts';
import { ProtocolViolation, parseRequest } from '../src/wire/protocol_validation.ts';
import { Connection } from './connection.ts';
import { AddressCounts } from './limits.ts';
import type { OriginPolicy } from './origin_check.ts';
import { dispatch } from './dispatch.ts';
import { PULSE_QUERY, acceptPulse, judge } from './pulse.ts';
import { refuse } from './replies.ts';
import type { ServerContext } from './server_context.ts';

/** Serves the protocol's sockets on `/ws` of `http`; its sockets join `ctx.connections`. */
export function acceptSockets(http: HttpServer | HttpsServer, ctx: ServerContext, origins: OriginPolicy): WebSocketServer {
  const { limits, log, quiet } = ctx;
  const perAddress = new AddressCounts();
  let lastOriginLog = 0;
  const owners = new WeakMap<IncomingMessage, { session: string; server: string }>();
  const wss = new WebSocketServer({
    server: http,
    path: '/ws',
    maxPayload: limits.maxFrameBytes,
    // Refused at the upgrade, before a socket exists: a foreign page or host name gets HTTP 403.
    verifyClient: ({ req }, done) => {
      const verdict = origins.check(req);
      if (verdict.ok) return route(ctx, req, owners).then(() => done(true));
      // At most one line a few seconds: a hostile page may retry in a loop.
      if (Date.now() - lastOriginLog > 5_000) {
        lastOriginLog = Date.now();
        log(`[server] refused a WebSocket from ${req.socket.remoteAddress}: ${verdict.message}`);
      }
      done(false, verdict.status, verdict.message);
    },
  });

  // ws re-emits the HTTP server's errors (a taken port); they are handled where listen is awaited.
  wss.on('error', () => {});
  const serve = (ws: WebSocket, address: string, url: string) => {
    if (!perAddress.tryAdd(address, limits.maxConnectionsPerAddress)) {
      // Accepted only to say why: a browser sees a close code and reason, never an HTTP status.
      quiet.note('socket close 4007', `[server] refused a socket from ${address}: it has ${limits.maxConnectionsPerAddress} open already`);
      ws.close(CloseCode.TOO_MANY_CONNECTIONS, `${limits.maxConnectionsPerAddress} sockets from your address are open: close some`);
      setTimeout(() => ws.terminate(), 1_000).unref();
      return;
    }
    const params = new URL(url, 'http://x').searchParams;
    // Served here, so this server owns its session (relay.ts): the lease is renewed while it is open.
    const session = params.get('session');
    const release = ctx.relay && session !== null ? ctx.relay.hold(session) : () => {};
    ws.on('close', release);
    // A member's Worker beating on its own socket (signaling/pulse.ts), not a protocol socket.
    if (params.has(PULSE_QUERY)) return acceptPulse(ctx, ws, () => perAddress.release(address));
    serveProtocol(ctx, ws, address, session, () => perAddress.release(address));
  };
  ctx.relay?.start(
    (ws, open) => serve(ws, open.address, open.url),
    (session) => {
      for (const conn of ctx.connections)
        if (conn.session?.name === session) conn.close(CloseCode.SERVER_CLOSING, 'another server holds this session now: reconnect');
    },
  );
  wss.on('connection', (ws, req) => {
    const address = req.socket.remoteAddress ?? 'unknown';
    ws.on('error', () => {});
    const owner = owners.get(req);
    if (ctx.relay && owner) {
      // Another server holds this session: the socket is relayed there, which applies every limit.
      ctx.relay.edge(ws, owner.server, { session: owner.session, address, url: req.url ?? '/ws' });
      return;
    }
    serve(ws, address, req.url ?? '/ws');
  });
  return wss;
}

/** A socket of a session another server owns (relay.ts) is marked to be relayed there. */
async function route(ctx: ServerContext, req: IncomingMessage, owners: WeakMap<IncomingMessage, { session: string; server: string }>) {
  const session = new URL(req.url ?? '/', 'http://x').searchParams.get('session');
  // A name no session may have is served here, where its hello is refused (no engine key for it).
  if (!ctx.relay || session === null || !SESSION_NAME.test(session)) return;
  try {
    const server = await ctx.relay.route(session);
    if (server !== undefined) owners.set(req, { session, server });
  } catch {
    // The engine does not answer: served here, where its requests meet STORE_UNAVAILABLE.
  }
}

/** One protocol socket: its requests in order behind its `hello`, and its close. */
function serveProtocol(ctx: ServerContext, ws: WebSocket, address: string, routed: string | null, release: () => void): void {
  const { limits, quiet, connections } = ctx;
  const conn = new Connection(ws, address, limits, quiet);
  connections.add(conn);
  ws.on('message', (data, isBinary) => {
    conn.lastSeen = Date.now();
    if (isBinary) {
      refuse(ctx, conn, new ProtocolViolation(ErrorCode.BAD_MESSAGE, 'binary frames are not part of the protocol'));
      return;
    }
    let request: Request;
    try {
      request = parseRequest(data.toString(), limits);
    } catch (err) {
      refuse(ctx, conn, err);
      return;
    }
    // Sessions shared with other servers: the URL's session routed this socket to its owner (relay.ts), so the hello must be for that one.
    if (ctx.relay && request.type === 'hello' && request.session !== routed) {
      const where = `/ws?session=${encodeURIComponent(request.session)}`;
      const why = `this server shares its sessions with other servers: open the socket at ${where}, the session of its hello`;
      refuse(ctx, conn, new ProtocolViolation(ErrorCode.BAD_MESSAGE, why), request.id);
      return;
    }
    const run = () => dispatch(ctx, conn, request).catch((err: unknown) => refuse(ctx, conn, err, request.id));
    // Checking a token may read the disk: requests sent right behind `hello` wait for it.
    // A second hello runs after the first, so it meets ALREADY_IN_SESSION rather than racing it.
    if (request.type === 'hello') conn.hello = conn.hello ? conn.hello.then(run) : run();
    else if (conn.hello) void conn.hello.then(run);
    else void run();
  });
  // A socket error (e.g. an oversized frame) is followed by 'close'.
  ws.on('close', (code) => {
    connections.delete(conn);
    release();
    conn.closed();
    detach(ctx, conn, code);
  });
}

/**
 * Starts the liveness checks over `ctx.connections`: silent members are evicted, sockets that do
 * not answer pings are cut off. Returns what stops them.
 */
export function watchSockets(ctx: ServerContext): () => void {
  const { limits, log, connections, heartbeatTimeoutMs, busyTimeoutMs } = ctx;
  // Frozen tabs keep their sockets open but stop sending: evict members that go silent.
  const every = Math.max(100, Math.min(1_000, heartbeatTimeoutMs / 4));
  let lastTick = Date.now();
  const watchdog = setInterval(() => {
    const now = Date.now();
    const gap = now - lastTick;
    lastTick = now;
    // A tick this late means the server itself was held up (a busy machine, a long GC pause):
    // the heartbeats that came meanwhile wait in the sockets, read after the timers. Evicting
    // now would take every member for silent (seen: 32 tabs on 2 cores, several evicted at once);
    // the next tick sees them.
    if (gap > 2 * every) {
      log(
        `[server] the liveness check ran ${gap} ms after the last (every ${every} ms): this server was held up; no evictions until the sockets are read`,
      );
      return;
    }
    for (const conn of connections) {
      // An ended session's sockets are being closed anyway.
      if (conn.memberId === undefined || conn.session?.ended) continue;
      const silent = now - conn.lastSeen;
      const verdict = judge(silent, conn.pulseSeen === undefined ? undefined : now - conn.pulseSeen, heartbeatTimeoutMs, busyTimeoutMs);
      if (verdict.keep) {
        // Suspected, not evicted: said once per spell, in the server's log.
        if (verdict.busy && conn.busySince === undefined)
          log(
            `[server] session "${conn.session?.name}": member ${conn.memberId} silent for ${silent} ms but its Worker beats: busy, kept up to ${busyTimeoutMs} ms`,
          );
        conn.busySince = verdict.busy ? (conn.busySince ?? now) : undefined;
        continue;
      }
      // Heard over its peer links by another member of its round: its own socket is held up
      // (a saturated link starves TCP behind the all-reduce's traffic), not its page. For a while.
      const vouched = conn.session?.lastVouched(conn.memberId);
      if (vouched !== undefined && now - vouched <= heartbeatTimeoutMs && silent <= VOUCH_LIMIT * heartbeatTimeoutMs) continue;
      log(`[server] session "${conn.session?.name}": evicting member ${conn.memberId}, silent for ${silent} ms`);
      conn.session?.rendezvous?.remove(conn.memberId, `was evicted: ${verdict.reason}`);
      conn.memberId = undefined;
      // A frozen page may never answer the close handshake: close() destroys it after a grace.
      conn.close(CloseCode.EVICTED, `evicted: no heartbeat for ${silent} ms`);
    }
  }, every);
  watchdog.unref();
  // Every socket, member or not, must answer pings: a dead peer's socket can stay open for hours.
  const pinger = setInterval(() => {
    for (const conn of connections) conn.probe();
  }, limits.pingIntervalMs);
  pinger.unref();
  return () => {
    clearInterval(watchdog);
    clearInterval(pinger);
  };
}

/** A socket closed with `code`: a member's group hears why at once (a tab closing says so with CloseCode.LEFT). */
function detach(ctx: ServerContext, conn: Connection, code: number): void {
  const session = conn.session;
  if (!session) return;
  session.store.cancelWaiters(conn);
  if (conn.memberId !== undefined) {
    const why = describeMemberClose(code);
    ctx.log(`[server] session "${session.name}": member ${conn.memberId} left (${code}: ${why})`);
    session.rendezvous?.remove(conn.memberId, why);
  }
  session.connections--;
  if (session.connections === 0) session.idleSince = Date.now();
}
