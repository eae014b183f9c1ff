/**
 * The store: torch's `Store` interface and `StoreClient`, its implementation over the
 * signaling server's WebSocket (what TCPStore's client is to its server). Works in the browser
 * and in Node (through `ws`), with any number of requests in flight on one socket.
 */
import {
  CloseCode,
  DEFAULT_STORE_TIMEOUT_MS,
  ErrorCode,
  PROTOCOL_VERSION,
  decodeValue,
  encodeValue,
  isIceServers,
  type ControlAction,
  type ControlEvent,
  type IceServer,
  type PeerLeftEvent,
  type RendezvousClosedEvent,
  type RequestFields,
  type RequestType,
  type ResultOf,
  type RoundEvent,
  type ServerMessage,
  type SignalEvent,
  type TokenEvent,
  type FaultsEvent,
  type WaitingEvent,
} from '../wire/protocol.ts';
import { parseServerMessage } from '../wire/protocol_validation.ts';
import { startTicker } from '../runtime/ticker.ts';
import { browserPulseAvailable, startPulse } from './pulse.ts';
import { onPageHide } from '../runtime/page_lifecycle.ts';
import { ConnectionClosedError, DistTimeoutError, NotHostError, RendezvousClosedError, RendezvousError, SessionEndedError, StoreError, StoreTimeoutError, TokenRotatedError, UnauthorizedError } from '../wire/errors.ts';

export type StoreValue = Uint8Array | string;

/** torch.distributed.Store: a key-value store shared by the ranks of a session. */
export interface Store {
  set(key: string, value: StoreValue): Promise<void>;
  /** Blocks until the key exists or `timeoutMs` passes (default: the store's timeout). */
  get(key: string, timeoutMs?: number): Promise<Uint8Array>;
  /** Adds to an integer counter (a missing key counts from 0); returns the new value. */
  add(key: string, amount: number): Promise<number>;
  /** torch's compare_set; returns the value the key holds afterwards (see the server's rules). */
  compareSet(key: string, expected: StoreValue, desired: StoreValue): Promise<Uint8Array>;
  wait(keys: string[], timeoutMs?: number): Promise<void>;
  check(keys: string[]): Promise<boolean>;
  deleteKey(key: string): Promise<boolean>;
  numKeys(): Promise<number>;
  append(key: string, value: StoreValue): Promise<void>;
  multiGet(keys: string[], timeoutMs?: number): Promise<Uint8Array[]>;
  multiSet(keys: string[], values: StoreValue[]): Promise<void>;
}

export interface StoreClientOptions {
  /** The session (namespace) to use. */
  session: string;
  /**
   * The session's secret (`newSessionToken()`; a share link's `#token=...`). The connection that
   * creates the session fixes it; every later one must present the same, or `connect` fails with
   * `UnauthorizedError`. Only the server's host creates sessions: a connection from the server's
   * own machine, one with `admin`, or the server's own `createSession` (the launcher's way);
   * anyone else naming a session that does not exist gets `UnauthorizedError`.
   */
  token: string;
  /** The server's admin secret (`RunningServer.adminSecret`): lets a connection from another machine create the session. */
  admin?: string;
  /**
   * The session's host secret (same format as a token). The connection that creates the session
   * fixes it; a later one presenting it becomes the host (`isHost`) and may send `control`; a
   * wrong one fails `connect` with `UnauthorizedError`. Ignored by a session created without one.
   */
  host?: string;
  /** Default timeout of blocking calls. Default 300 s, as torch. */
  timeoutMs?: number;
  /** How long to wait for the socket to open and the server to answer `hello`. Default 10 s. */
  connectTimeoutMs?: number;
  /** How long a non-blocking request may go unanswered before it fails. Default 30 s. */
  requestTimeoutMs?: number;
  /**
   * How often to renew TURN credentials the server minted for this session (`iceServers`), so
   * that links formed hours into a run still get valid ones. Default 30 min; 0: never.
   */
  iceRenewMs?: number;
  /**
   * Node only: the certificate(s), PEM, to trust for a wss:// server whose certificate no CA of
   * Node's signed, e.g. the self-signed `certs/cert.pem` of `npm start -- --https`
   * (NODE_EXTRA_CA_CERTS=FILE does the same for a whole process). A browser trusts what its own
   * certificate store trusts and cannot take this.
   */
  ca?: string | Uint8Array | ReadonlyArray<string | Uint8Array>;
  /**
   * Once a member, beat from a Worker on a second socket (src/c10d/pulse.ts), so that a page whose
   * thread is busy is not evicted as frozen. Default: on where a browser Worker exists, off in Node
   * (where it takes a worker thread).
   */
  pulse?: boolean;
}

type Handler<E> = (event: E) => void;
interface EventMap {
  signal: SignalEvent;
  'peer-left': PeerLeftEvent;
  round: RoundEvent;
  waiting: WaitingEvent;
  control: ControlEvent;
  'rendezvous-closed': RendezvousClosedEvent;
  /** The host removed a tab and the session's token changed: `token` is the one to use from now on (`StoreClient.token` has it already). */
  token: TokenEvent;
  /** The group's fault history, as the server recorded it (on each change, and as this member arrives). */
  faults: FaultsEvent;
  close: { code: number; reason: string };
}

interface Pending {
  resolve(result: unknown): void;
  reject(err: Error): void;
  timer: ReturnType<typeof setTimeout>;
  what: string;
}

/** Minimal structural view of a WebSocket: the browser's and `ws`'s both fit. */
interface SocketLike {
  readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
}
type SocketConstructor = new (url: string, protocols?: string[], options?: { ca: StoreClientOptions['ca'] }) => SocketLike;

/** WebSocket.OPEN, the same in browsers and in `ws`. */
const OPEN = 1;

async function socketConstructor(withCa: boolean): Promise<SocketConstructor> {
  const native = (globalThis as { WebSocket?: unknown }).WebSocket;
  if (withCa) {
    // Only `ws` takes a CA; a browser (whose bundle may polyfill `process`) has no Node version.
    const node = (globalThis as { process?: { versions?: { node?: string } } }).process?.versions?.node;
    if (!node) throw new TypeError('the `ca` option is for Node: a browser trusts the certificates its own certificate store trusts');
  } else if (native) return native as SocketConstructor;
  // Node 20 has no global WebSocket; `ws` is the implementation the server uses too.
  const ws = await import('ws');
  return ws.WebSocket as unknown as SocketConstructor;
}

/** Accepts the page URL (http://host:port/...) or the socket URL (ws://host:port/ws). */
export function storeSocketUrl(url: string): string {
  const u = new URL(url);
  if (u.protocol === 'http:') u.protocol = 'ws:';
  else if (u.protocol === 'https:') u.protocol = 'wss:';
  else if (u.protocol !== 'ws:' && u.protocol !== 'wss:') {
    throw new TypeError(`store URL must be http(s):// or ws(s)://, got ${url}`);
  }
  u.pathname = '/ws';
  u.search = '';
  u.hash = '';
  return u.toString();
}

/** Node's TLS error codes for a server certificate it does not trust. */
const UNTRUSTED_CERT = new Set([
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
]);

/** ": <ws's reason>" for a failed connect, with what to do about an untrusted certificate. */
function whyNotConnected(failure: { message?: string; error?: { code?: string } } | undefined): string {
  const message = typeof failure?.message === 'string' && failure.message ? failure.message : undefined;
  if (!message) return '';
  const code = failure?.error?.code;
  if (code && UNTRUSTED_CERT.has(code)) {
    return `: ${message}. Trust the server's certificate: pass it as \`ca\` (StoreClient.connect's option; a self-signed server's is certs/cert.pem) or set NODE_EXTRA_CA_CERTS to its file`;
  }
  if (code === 'ERR_TLS_CERT_ALTNAME_INVALID') return `: ${message}. Connect by a name or address the server's certificate covers`;
  return `: ${message}`;
}

export class StoreClient implements Store {
  readonly session: string;
  readonly timeoutMs: number;
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly handlers: { [K in keyof EventMap]: Set<Handler<EventMap[K]>> } = {
    signal: new Set(),
    'peer-left': new Set(),
    round: new Set(),
    waiting: new Set(),
    control: new Set(),
    'rendezvous-closed': new Set(),
    token: new Set(),
    faults: new Set(),
    close: new Set(),
  };
  /** The server's instance id (changes when the server restarts). */
  instance = '';
  private hostReply = { host: false, hasHost: false };
  /** The session's token as this connection last had it: the one it connected with, or the newer one a 'token' event brought. */
  private currentToken: string;
  /** STUN/TURN servers the server gave this session (with TURN credentials minted for it), or none. */
  iceServers: IceServer[] = [];
  private stopHeartbeat: (() => void) | undefined;
  private stopPulse: (() => void) | undefined;
  private pulseUrl = '';
  /** The peers this member heard lately, sent with each heartbeat (a process group sets it). */
  private heardPeers: (() => { round: number; ranks: number[] } | undefined) | undefined;
  private iceRenewal: ReturnType<typeof setInterval> | undefined;
  private closed: { code: number; reason: string } | undefined;
  private readonly stopWatchingPage: () => void;

  private constructor(
    private readonly socket: SocketLike,
    private readonly options: StoreClientOptions,
    private readonly requestTimeoutMs: number,
  ) {
    this.session = options.session;
    this.currentToken = options.token;
    this.timeoutMs = options.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS;
    socket.onmessage = (ev) => this.onMessage(ev.data);
    socket.onclose = (ev) => this.onClose(ev.code, ev.reason);
    // A closing tab says so: the server tells its group at once that it left, and why, instead
    // of the group finding out from a broken socket (or, if the socket lingers, a heartbeat timeout).
    this.stopWatchingPage = onPageHide(() => this.close(CloseCode.LEFT, 'its tab closed'));
  }

  /** Opens a socket to the server at `url` and enters `options.session`. */
  static async connect(url: string, options: StoreClientOptions): Promise<StoreClient> {
    const wsUrl = storeSocketUrl(url);
    const connectTimeoutMs = options.connectTimeoutMs ?? 10_000;
    const Ctor = await socketConstructor(options.ca !== undefined);
    const socket = options.ca === undefined ? new Ctor(wsUrl) : new Ctor(wsUrl, undefined, { ca: options.ca });
    // The server may close right after accepting (too many sockets from this address): keep why.
    let closedEarly: { code: number; reason: string } | undefined;
    // Node's `ws` says why a socket failed (a certificate it does not trust); browsers never do.
    let failure: { message?: string; error?: { code?: string } } | undefined;
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        socket.close();
        reject(new DistTimeoutError(`the store server at ${wsUrl} to accept the connection`, connectTimeoutMs));
      }, connectTimeoutMs);
      socket.onopen = () => {
        clearTimeout(timer);
        resolve();
      };
      socket.onerror = (ev) => {
        failure = typeof ev === 'object' && ev !== null ? (ev as typeof failure) : undefined;
      };
      socket.onclose = (ev) => {
        clearTimeout(timer);
        closedEarly = { code: ev.code, reason: ev.reason };
        reject(new ConnectionClosedError(`could not connect to the store server at ${wsUrl} (code ${ev.code})${whyNotConnected(failure)}`, ev.code, ev.reason));
      };
    });
    const client = new StoreClient(socket, options, options.requestTimeoutMs ?? 30_000);
    client.pulseUrl = `${wsUrl}?pulse`;
    if (closedEarly) client.onClose(closedEarly.code, closedEarly.reason);
    try {
      const fields = {
        session: options.session,
        version: PROTOCOL_VERSION,
        token: options.token,
        ...(options.host === undefined ? {} : { host: options.host }),
        ...(options.admin === undefined ? {} : { admin: options.admin }),
      };
      const hello = await client.request('hello', fields, connectTimeoutMs);
      client.instance = hello.instance;
      client.hostReply = { host: hello.host, hasHost: hello.hasHost };
      // From the server, but checked before WebRTC sees it: a malformed list would throw deep inside.
      if (hello.iceServers !== undefined && !isIceServers(hello.iceServers)) throw new Error(`the server sent malformed ICE servers in its hello reply: ${JSON.stringify(hello.iceServers).slice(0, 200)}`);
      client.iceServers = hello.iceServers ?? [];
      client.renewIceServers(options.iceRenewMs ?? 30 * 60_000);
    } catch (err) {
      // Refused (a full server, a bad name): the socket would only count against this address's limit.
      client.close();
      throw err;
    }
    return client;
  }

  /** This connection presented the session's host secret: it may `control` the session. */
  get isHost(): boolean {
    return this.hostReply.host;
  }

  /** The session has a host secret (its creator gave one). */
  get hasHost(): boolean {
    return this.hostReply.hasHost;
  }

  /**
   * The session's token now: the one this connection presented, until the host removes a tab and
   * the server sends the new one. Reconnects, checkpoint routes and share links must use this one.
   */
  get token(): string {
    return this.currentToken;
  }

  get isClosed(): boolean {
    return this.closed !== undefined;
  }

  on<K extends keyof EventMap>(type: K, handler: Handler<EventMap[K]>): () => void {
    this.handlers[type].add(handler);
    return () => this.handlers[type].delete(handler);
  }

  /** Closes the connection; `code` (1000 or one of CloseCode's 4xxx) tells the server why. */
  close(code: number = 1000, reason = 'client closed'): void {
    this.stopHeartbeat?.();
    this.stopHeartbeat = undefined;
    this.stopPulse?.();
    this.stopPulse = undefined;
    this.stopWatchingPage();
    this.socket.close(code, reason);
  }

  // --- Store -----------------------------------------------------------------------------------

  async set(key: string, value: StoreValue): Promise<void> {
    await this.request('set', { key, value: encodeValue(value) });
  }

  async get(key: string, timeoutMs = this.timeoutMs): Promise<Uint8Array> {
    return decodeValue(await this.request('get', { key, timeoutMs }, timeoutMs));
  }

  add(key: string, amount: number): Promise<number> {
    return this.request('add', { key, amount });
  }

  async compareSet(key: string, expected: StoreValue, desired: StoreValue): Promise<Uint8Array> {
    return decodeValue(await this.request('compareSet', { key, expected: encodeValue(expected), desired: encodeValue(desired) }));
  }

  async wait(keys: string[], timeoutMs = this.timeoutMs): Promise<void> {
    await this.request('wait', { keys, timeoutMs }, timeoutMs);
  }

  check(keys: string[]): Promise<boolean> {
    return this.request('check', { keys });
  }

  deleteKey(key: string): Promise<boolean> {
    return this.request('deleteKey', { key });
  }

  numKeys(): Promise<number> {
    return this.request('numKeys', {});
  }

  async append(key: string, value: StoreValue): Promise<void> {
    await this.request('append', { key, value: encodeValue(value) });
  }

  async multiGet(keys: string[], timeoutMs = this.timeoutMs): Promise<Uint8Array[]> {
    return (await this.request('multiGet', { keys, timeoutMs }, timeoutMs)).map(decodeValue);
  }

  async multiSet(keys: string[], values: StoreValue[]): Promise<void> {
    await this.request('multiSet', { keys, values: values.map(encodeValue) });
  }

  // --- Rendezvous and signaling (used by the rendezvous handler and the process group) --------

  /**
   * Joins the session's group with a size range (min = max for a fixed world size, which may
   * ask for a rank) and starts heartbeats: a member that stops sending, like a frozen tab, is
   * evicted. Rounds arrive as 'round' events, possibly before this resolves. With `spectate`, a
   * full group takes this member as a spectator (rounds with rank -1) instead of refusing it.
   */
  async rendezvous(request: RequestFields['rendezvous'], heartbeatIntervalMs = 1_000): Promise<{ memberId: number }> {
    const result = await this.request('rendezvous', request);
    // On a tick a background tab keeps (ticker.ts): a hidden tab is slow, not frozen.
    this.stopHeartbeat ??= startTicker(heartbeatIntervalMs, () => {
      if (this.socket.readyState !== OPEN) return;
      const heard = this.heardPeers?.();
      this.request('heartbeat', heard && heard.ranks.length > 0 ? { heard } : {}).catch(() => {});
    });
    if (this.stopPulse === undefined && (this.options.pulse ?? browserPulseAvailable())) void this.beginPulse(heartbeatIntervalMs);
    return result;
  }

  /** Starts this member's pulse (once); without one it is judged on its heartbeats alone. */
  private async beginPulse(everyMs: number): Promise<void> {
    this.stopPulse = () => {};
    const { ca } = this.options;
    const stop = await this.request('pulse', {})
      .then(({ key }) => startPulse({ url: this.pulseUrl, key, everyMs, ...(ca === undefined ? {} : { ca }) }))
      .catch(() => undefined);
    if (this.closed) stop?.();
    else if (stop) this.stopPulse = stop;
  }

  /**
   * What each heartbeat says about the peers (the ranks of a round this member heard over its
   * links lately): the server then keeps them too while their own sockets are held up. Returns
   * what unsets it (only if it is still the one set: a later round's group replaces it).
   */
  reportHeardPeers(provider: () => { round: number; ranks: number[] } | undefined): () => void {
    this.heardPeers = provider;
    return () => {
      if (this.heardPeers === provider) this.heardPeers = undefined;
    };
  }

  /**
   * Places held by members (ZooKeeper's ephemeral nodes, kept by the server): each key's holder,
   * a member id or -1 (vacant: never held, or its holder left the group). With `take`, this
   * member takes the first vacant key unless it holds one of them already. Needs a member.
   */
  async claim(keys: string[], take = false): Promise<number[]> {
    const { holders } = await this.request('claim', { keys, take });
    if (!Array.isArray(holders) || holders.length !== keys.length || !holders.every((h) => Number.isSafeInteger(h) && h >= -1)) {
      throw new Error(`the server sent a malformed claim reply for ${keys.length} key(s): ${JSON.stringify(holders).slice(0, 200)}`);
    }
    return holders;
  }

  /**
   * The run is over: no round forms again, members waiting without a rank are told, and arrivals
   * are refused with RendezvousClosedError. Needs a rank in the running round; idempotent.
   */
  async closeRendezvous(): Promise<void> {
    await this.request('closeRendezvous', {});
  }

  /**
   * Asks the server for a new round unless one newer than `fromRound` exists: one that admits the
   * waiting members, or, with `failed`, one of the same members after round `fromRound` failed.
   */
  regroup(fromRound: number, failed = false): Promise<{ round: number }> {
    return this.request('regroup', failed ? { fromRound, failed } : { fromRound });
  }

  /**
   * The host steers the session: 'stop' asks every tab to stop training, 'end' ends the session
   * (its sockets are closed with 4008 and it is refused from then on), 'min' sets the group's
   * minimum to `min` (1..max). Every socket of the session, this one included, gets a 'control'
   * event. Fails with StoreError NOT_HOST unless this connection `isHost`.
   */
  async control(action: ControlAction, min?: number): Promise<void> {
    await this.request('control', min === undefined ? { action } : { action, min });
  }

  /**
   * This rank's row of a server-attested gather in round `round` (see the protocol's `gather`):
   * resolves with every rank's row in rank order, each placed by the server at its sender's
   * rank. Fails with a StoreTimeoutError naming the ranks missing after `timeoutMs`, and at once
   * (GATHER_ABORTED) when the round ends first.
   */
  async gather(round: number, tag: string, values: number[], timeoutMs: number): Promise<number[][]> {
    const { rows } = await this.request('gather', { round, tag, values, timeoutMs }, timeoutMs);
    if (!Array.isArray(rows) || !rows.every((r) => Array.isArray(r) && r.every((v) => typeof v === 'number' && Number.isFinite(v)))) {
      throw new Error(`the server sent a malformed reply to gather "${tag}" of round ${round}`);
    }
    return rows;
  }

  /**
   * The host removes a tab: the member with `rank` in the running round (only while that is round
   * `round`, when given: ranks are renumbered each round), or the member with id `member`. The
   * session's token changes: resolves with the new one (every other socket of the session gets it
   * too, the removed one's is closed with 4011 and its link no longer opens the session). Fails
   * with NotHostError unless this connection `isHost`, and with StoreError UNKNOWN_PEER naming what
   * was not found (that rank, that round, that member).
   */
  async removeMember(target: { rank: number; round?: number } | { member: number }): Promise<{ token: string }> {
    await this.request('control', { action: 'remove', ...target });
    // The server sent the new token before its reply, on this same socket.
    return { token: this.currentToken };
  }

  /** Relays a signaling payload to the member with rank `to`. */
  async signal(to: number, data: RequestFields['signal']['data']): Promise<void> {
    await this.request('signal', { to, data });
  }

  // --- Plumbing --------------------------------------------------------------------------------

  /**
   * Sends one request and resolves with its result. Blocking requests get the server's timeout
   * plus a grace period on this side, so a dead server still fails the call.
   */
  request<T extends RequestType>(type: T, fields: RequestFields[T], serverTimeoutMs?: number): Promise<ResultOf[T]> {
    const what = describeRequest(type, fields as Record<string, unknown>);
    if (this.closed) {
      const { code, reason } = this.closed;
      return Promise.reject(new ConnectionClosedError(`cannot ${what}: the connection to the store is closed (${code} ${reason})`, code, reason));
    }
    const id = this.nextId++;
    const limit = serverTimeoutMs === undefined ? this.requestTimeoutMs : serverTimeoutMs + 10_000;
    return new Promise<ResultOf[T]>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new DistTimeoutError(`the store server to answer: ${what}`, limit));
      }, limit);
      this.pending.set(id, { resolve: resolve as (r: unknown) => void, reject, timer, what });
      // A closing socket sends nothing: its close event fails the call with the server's code and reason.
      if (this.socket.readyState === OPEN) this.socket.send(JSON.stringify({ type, id, ...fields }));
    });
  }

  private onMessage(data: unknown): void {
    let msg: ServerMessage;
    try {
      msg = parseServerMessage(typeof data === 'string' ? data : String(data));
    } catch (err) {
      console.error('[store] ignoring a malformed frame from the server:', err);
      return;
    }
    switch (msg.type) {
      case 'reply': {
        const p = this.settle(msg.id);
        p?.resolve(msg.result);
        return;
      }
      case 'error': {
        const p = msg.id === undefined ? undefined : this.settle(msg.id);
        const err = toError(msg.code, msg.message, msg.details ?? {});
        if (p) p.reject(err);
        else console.error(`[store] server error: ${msg.message}`);
        return;
      }
      case 'signal':
      case 'peer-left':
      case 'round':
      case 'waiting':
      case 'control':
      case 'rendezvous-closed':
      case 'faults':
        for (const h of this.handlers[msg.type]) (h as Handler<typeof msg>)(msg);
        return;
      case 'token':
        this.currentToken = msg.token;
        for (const h of this.handlers.token) h(msg);
        return;
      default: {
        const unknown: never = msg;
        console.error('[store] unhandled message', unknown);
      }
    }
  }

  private settle(id: number): Pending | undefined {
    const p = this.pending.get(id);
    if (!p) return undefined;
    clearTimeout(p.timer);
    this.pending.delete(id);
    return p;
  }

  /** Renews minted TURN credentials every `everyMs` while the connection lives (none minted: nothing to renew). */
  private renewIceServers(everyMs: number): void {
    if (!(everyMs > 0) || !this.iceServers.some((s) => s.credential !== undefined && /^\d+:/.test(s.username ?? ''))) return;
    this.iceRenewal = setInterval(() => {
      this.request('iceServers', {})
        .then((servers) => {
          if (isIceServers(servers)) this.iceServers = servers;
        })
        .catch(() => {
          // Kept as they were: the old ones serve until they expire, and the next renewal tries again.
        });
    }, everyMs);
    (this.iceRenewal as { unref?: () => void }).unref?.();
  }

  private onClose(code: number, reason: string): void {
    this.closed = { code, reason };
    if (this.iceRenewal !== undefined) clearInterval(this.iceRenewal);
    this.stopHeartbeat?.();
    this.stopHeartbeat = undefined;
    this.stopPulse?.();
    this.stopPulse = undefined;
    this.stopWatchingPage();
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new ConnectionClosedError(`connection to the store closed (${code} ${reason || 'no reason'}) during ${p.what}`, code, reason));
      this.pending.delete(id);
    }
    for (const h of this.handlers.close) h({ code, reason });
  }
}

const RENDEZVOUS_CODES = new Set<string>([
  ErrorCode.WORLD_SIZE_MISMATCH,
  ErrorCode.RANK_OUT_OF_RANGE,
  ErrorCode.DUPLICATE_RANK,
  ErrorCode.SESSION_FULL,
  ErrorCode.ALREADY_JOINED,
  ErrorCode.ELASTIC_MISMATCH,
]);

function toError(code: ErrorCode, message: string, details: Record<string, unknown>): StoreError {
  if (code === ErrorCode.TIMEOUT) {
    const keys = Array.isArray(details.keys) ? (details.keys as string[]) : [];
    const timeoutMs = typeof details.timeoutMs === 'number' ? details.timeoutMs : 0;
    return new StoreTimeoutError(message, keys, timeoutMs);
  }
  if (RENDEZVOUS_CODES.has(code)) return new RendezvousError(code, message, details);
  if (code === ErrorCode.UNAUTHORIZED) return new (details.rotated === true ? TokenRotatedError : UnauthorizedError)(message, typeof details.session === 'string' ? details.session : '');
  if (code === ErrorCode.NOT_HOST) return new NotHostError(message, details);
  if (code === ErrorCode.SESSION_ENDED) return new SessionEndedError(message, typeof details.session === 'string' ? details.session : '');
  if (code === ErrorCode.RENDEZVOUS_CLOSED) {
    const int = (v: unknown) => (typeof v === 'number' && Number.isSafeInteger(v) ? v : -1);
    return new RendezvousClosedError(message, typeof details.session === 'string' ? details.session : '', int(details.round), int(details.by));
  }
  return new StoreError(code, message, details);
}

function describeRequest(type: string, fields: Record<string, unknown>): string {
  if (typeof fields.key === 'string') return `${type}("${fields.key}")`;
  if (Array.isArray(fields.keys)) return `${type}(${fields.keys.map((k) => `"${String(k)}"`).join(', ')})`;
  return type;
}

/** torch's PrefixStore: every key goes through `prefix/`, so groups can share one store. */
export class PrefixStore implements Store {
  constructor(
    readonly prefix: string,
    private readonly inner: Store,
  ) {}
  private k(key: string): string {
    return `${this.prefix}/${key}`;
  }
  set(key: string, value: StoreValue) {
    return this.inner.set(this.k(key), value);
  }
  get(key: string, timeoutMs?: number) {
    return this.inner.get(this.k(key), timeoutMs);
  }
  add(key: string, amount: number) {
    return this.inner.add(this.k(key), amount);
  }
  compareSet(key: string, expected: StoreValue, desired: StoreValue) {
    return this.inner.compareSet(this.k(key), expected, desired);
  }
  wait(keys: string[], timeoutMs?: number) {
    return this.inner.wait(keys.map((k) => this.k(k)), timeoutMs);
  }
  check(keys: string[]) {
    return this.inner.check(keys.map((k) => this.k(k)));
  }
  deleteKey(key: string) {
    return this.inner.deleteKey(this.k(key));
  }
  numKeys() {
    return this.inner.numKeys();
  }
  append(key: string, value: StoreValue) {
    return this.inner.append(this.k(key), value);
  }
  multiGet(keys: string[], timeoutMs?: number) {
    return this.inner.multiGet(keys.map((k) => this.k(k)), timeoutMs);
  }
  multiSet(keys: string[], values: StoreValue[]) {
    return this.inner.multiSet(keys.map((k) => this.k(k)), values);
  }
}
