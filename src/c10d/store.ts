/**
 * The store: torch's `Store` interface and `StoreClient`, its implementation over the
 * signaling server's WebSocket (what TCPStore's client is to its server). Works in the browser
 * and in Node (through `ws`), with any number of requests in flight on one socket. Beside it:
 * store_interface.ts (the `Store` contract and `PrefixStore`), store_options.ts (what `connect`
 * takes), store_socket.ts (opening the socket) and store_errors.ts (error replies as errors).
 */
import {
  CloseCode,
  DEFAULT_STORE_TIMEOUT_MS,
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
import { ConnectionClosedError, DistTimeoutError } from '../wire/errors.ts';
import type { Store, StoreValue } from './store_interface.ts';
import type { StoreClientOptions } from './store_options.ts';
import { OPEN, openSocket, storeSocketUrl, type SocketLike } from './store_socket.ts';
import { describeRequest, toError } from './store_errors.ts';
import { DEFAULT_STORE_UNAVAILABLE_RETRY_MS, STORE_REQUESTS, StoreAvailability, type StoreAvailabilityEvent } from './store_unavailable.ts';

export { PrefixStore, type Store, type StoreValue } from './store_interface.ts';
export type { StoreClientOptions } from './store_options.ts';
export { storeSocketUrl } from './store_socket.ts';

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
  /** The server's shared store refuses requests (STORE_UNAVAILABLE; they are tried again for a while), or answers again: store_unavailable.ts. */
  store: StoreAvailabilityEvent;
  close: { code: number; reason: string };
}

interface Pending {
  resolve(result: unknown): void;
  reject(err: Error): void;
  timer: ReturnType<typeof setTimeout>;
  what: string;
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
    store: new Set(),
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
  private readonly availability: StoreAvailability;

  private constructor(
    private readonly socket: SocketLike,
    private readonly options: StoreClientOptions,
    private readonly requestTimeoutMs: number,
  ) {
    this.session = options.session;
    this.currentToken = options.token;
    this.timeoutMs = options.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS;
    this.availability = new StoreAvailability(
      options.storeUnavailableRetryMs ?? DEFAULT_STORE_UNAVAILABLE_RETRY_MS,
      (e) => {
        for (const h of this.handlers.store) h(e);
      },
      () => this.send('numKeys', {}),
    );
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
    // The session in the URL too: a proxy in front of several servers routes each session's sockets to one (docs/deployment.md).
    const route = `session=${encodeURIComponent(options.session)}`;
    const { socket, closedEarly } = await openSocket(`${wsUrl}?${route}`, options, connectTimeoutMs);
    const client = new StoreClient(socket, options, options.requestTimeoutMs ?? 30_000);
    client.pulseUrl = `${wsUrl}?pulse&${route}`;
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
      if (hello.iceServers !== undefined && !isIceServers(hello.iceServers))
        throw new Error(`the server sent malformed ICE servers in its hello reply: ${JSON.stringify(hello.iceServers).slice(0, 200)}`);
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
    if (!STORE_REQUESTS.has(type)) return this.send(type, fields, serverTimeoutMs);
    // A blocking request tried again waits what is left of its timeout.
    return this.availability.run(
      type,
      serverTimeoutMs,
      (left) => this.send(type, left === undefined ? fields : { ...fields, timeoutMs: left }, left),
      () => this.isClosed,
    );
  }

  private send<T extends RequestType>(type: T, fields: RequestFields[T], serverTimeoutMs?: number): Promise<ResultOf[T]> {
    const what = describeRequest(type, fields as Record<string, unknown>);
    if (this.closed) {
      const { code, reason } = this.closed;
      return Promise.reject(
        new ConnectionClosedError(`cannot ${what}: the connection to the store is closed (${code} ${reason})`, code, reason),
      );
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
      p.reject(
        new ConnectionClosedError(`connection to the store closed (${code} ${reason || 'no reason'}) during ${p.what}`, code, reason),
      );
      this.pending.delete(id);
    }
    for (const h of this.handlers.close) h({ code, reason });
  }
}
