/**
 * One session held by several servers (`--store redis://...`): each session has one owner server,
 * recorded on the engine under a lease (`ddp:{session}:owner`, renewed while the owner holds any of
 * the session's sockets). The owner runs the session as one server does alone (tokens, rendezvous,
 * controls, limits). Any other server that receives a socket of the session (the store's or a
 * pulse) checks Origin and Host as always, then relays it to the owner over the engine's pub/sub:
 * the owner serves a `RelayedSocket` (the few members of a ws socket the server uses) fed from its
 * channel, and what it sends goes back to the edge, which writes it to the real socket.
 *
 * Liveness: the owner's pings travel to the edge, which pings the real socket and answers once the
 * client answered, so a dead edge or client is cut off like any silent socket. A dead owner's
 * lease lapses: its edges close the relayed sockets (SERVER_CLOSING), the clients reconnect, and the
 * first socket to come claims the lease: a new owner (the engine kept the keys and tokens).
 * Servers trust each other's frames (the remote address the edge reports): they share the
 * engine and its password.
 */
import { EventEmitter } from 'node:events';
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import type { WebSocket } from 'ws';
import { CloseCode, type Limits } from '../src/wire/protocol.ts';

/** How long an owner's claim holds without renewal: a dead owner's sessions move after this. */
export const LEASE_MS = 3_000;
const RENEW_MS = 1_000;
const CID_BYTES = 16;
/** Kinds of relayed frames: open, text, binary, close, ping (owner to edge), pong (edge to owner). */
type Kind = 'o' | 't' | 'b' | 'c' | 'p' | 'q';

/** Claims the lease if free (or ours), renews it; returns the owner. */
const CLAIM_LUA = `
local v = redis.call('GET', KEYS[1])
if (not v) or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
return v`;

const ownerKey = (session: string) => `ddp:{${session}}:owner`;
const channelOf = (server: string) => `ddp:relay:${server}`;

function frame(kind: Kind, cid: string, payload: Buffer | string = ''): Buffer {
  return Buffer.concat([Buffer.from(kind + cid), Buffer.isBuffer(payload) ? payload : Buffer.from(payload)]);
}

/** What a relayed socket was opened with, as the edge saw it. */
export interface RelayedOpen {
  session: string;
  /** The client's address as the edge saw it (for the per-address limits and logs). */
  address: string;
  /** The request's path and query (`/ws?session=...`, `/ws?pulse&session=...`). */
  url: string;
}

/**
 * The owner's side of a relayed socket: what the connection handler (upgrade.ts, pulse.ts,
 * connection.ts) uses of a ws `WebSocket`, fed by and sending to the edge.
 */
export class RelayedSocket extends EventEmitter {
  readonly OPEN = 1;
  readyState = 1;
  /** Bounded at the edge, on the real socket (it closes a slow reader there). */
  readonly bufferedAmount = 0;

  constructor(
    private readonly out: (kind: Kind, payload?: Buffer | string) => void,
    private readonly ended: () => void,
  ) {
    super();
  }

  send(data: string | Buffer): void {
    if (this.readyState !== 1) return;
    this.out(typeof data === 'string' ? 't' : 'b', data);
  }

  ping(): void {
    if (this.readyState === 1) this.out('p');
  }

  close(code = 1000, reason = ''): void {
    if (this.readyState !== 1) return;
    this.out('c', JSON.stringify({ code, reason }));
    this.closed(code);
  }

  terminate(): void {
    this.close(1006, 'cut off');
  }

  /** The edge said the socket closed (or this side closed it): 'close' once. */
  closed(code: number): void {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.ended();
    this.emit('close', code, Buffer.alloc(0));
  }
}

/** Serves a socket as if it had arrived here (upgrade.ts's accept path). */
export type Serve = (ws: WebSocket, open: RelayedOpen) => void;

/** The relay: one per server on the engine. */
export class SessionRelay {
  /** This server's name on the engine (its relay channel). */
  readonly id = randomBytes(9).toString('base64url');
  private readonly cmd: Redis;
  private readonly sub: Redis;
  /** Sockets served here, per session: this server owns those sessions and renews their leases. */
  private readonly held = new Map<string, number>();
  /** Owner side: relayed sockets by connection id. */
  private readonly relayed = new Map<string, { ws: RelayedSocket; edge: string; session: string }>();
  /** Edge side: real sockets relayed elsewhere, by connection id. */
  private readonly edges = new Map<string, { ws: WebSocket; owner: string; session: string }>();
  private readonly timer: ReturnType<typeof setInterval>;
  private serve: Serve = () => {};
  private lost: (session: string) => void = () => {};
  /** Resolves once relayed sockets can reach this server. */
  readonly ready: Promise<unknown>;

  constructor(
    url: URL,
    private readonly limits: Limits,
    private readonly log: (line: string) => void,
  ) {
    const options = {
      host: url.hostname,
      port: Number(url.port || 6379),
      password: decodeURIComponent(url.password) || undefined,
      username: decodeURIComponent(url.username) || undefined,
      db: url.pathname.length > 1 ? Number(url.pathname.slice(1)) : 0,
      connectTimeout: 2_000,
      // An engine that holds the connection but does not answer: a socket's owner is not waited for
      // past this (it is served here, where its requests meet STORE_UNAVAILABLE), as the store's requests.
      commandTimeout: 2_000,
      maxRetriesPerRequest: 1,
      retryStrategy: (attempt: number) => Math.min(100 * attempt, 2_000),
    };
    this.cmd = new Redis(options);
    this.sub = new Redis(options);
    this.cmd.on('error', () => {});
    this.sub.on('error', () => {});
    this.cmd.defineCommand('ddpClaimOwner', { numberOfKeys: 1, lua: CLAIM_LUA });
    this.sub.on('messageBuffer', (_channel: Buffer, message: Buffer) => {
      try {
        this.received(message);
      } catch (err) {
        this.log(`[server] a relayed frame could not be read: ${(err as Error).message}`);
      }
    });
    this.ready = this.sub.subscribe(channelOf(this.id));
    this.timer = setInterval(() => void this.tick(), RENEW_MS);
    this.timer.unref();
  }

  /** `serve` takes the sockets relayed here; `lost` closes a session's sockets here once another server owns it. */
  start(serve: Serve, lost: (session: string) => void): void {
    this.serve = serve;
    this.lost = lost;
  }

  /** The owner of `session`: this server (undefined) when it holds or now claims the lease, else the owner's id. */
  async route(session: string): Promise<string | undefined> {
    const owner = await this.claim(session);
    return owner === this.id ? undefined : owner;
  }

  private async claim(session: string): Promise<string> {
    const call = (this.cmd as unknown as Record<string, (...a: Array<string | number>) => Promise<string>>).ddpClaimOwner!;
    return call.call(this.cmd, ownerKey(session), this.id, LEASE_MS);
  }

  /** A socket of `session` served here: its lease is renewed until the last one closes. */
  hold(session: string): () => void {
    this.held.set(session, (this.held.get(session) ?? 0) + 1);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const n = (this.held.get(session) ?? 1) - 1;
      if (n > 0) this.held.set(session, n);
      else this.held.delete(session);
    };
  }

  /** Edge side: relays the real socket `ws` to `owner`. */
  edge(ws: WebSocket, owner: string, open: RelayedOpen): void {
    const cid = randomBytes(CID_BYTES / 2).toString('hex');
    this.edges.set(cid, { ws, owner, session: open.session });
    const to = (kind: Kind, payload?: Buffer | string) =>
      void this.cmd.publish(channelOf(owner), frame(kind, cid, payload)).catch(() => {});
    to('o', JSON.stringify({ ...open, edge: this.id }));
    ws.on('message', (data: Buffer, isBinary: boolean) => to(isBinary ? 'b' : 't', data));
    ws.on('pong', () => to('q'));
    ws.on('close', (code: number, reason: Buffer) => {
      this.edges.delete(cid);
      to('c', JSON.stringify({ code, reason: reason.toString() }));
    });
  }

  private received(message: Buffer): void {
    if (message.length < 1 + CID_BYTES) return;
    const kind = String.fromCharCode(message[0]!) as Kind;
    const cid = message.subarray(1, 1 + CID_BYTES).toString();
    const payload = message.subarray(1 + CID_BYTES);
    const edge = this.edges.get(cid);
    if (edge) {
      this.toClient(edge.ws, kind, payload);
      return;
    }
    if (kind === 'o') {
      this.opened(cid, payload);
      return;
    }
    const r = this.relayed.get(cid);
    if (!r) return;
    if (kind === 't' || kind === 'b') r.ws.emit('message', Buffer.from(payload), kind === 'b');
    else if (kind === 'q') r.ws.emit('pong');
    else if (kind === 'c') r.ws.closed((JSON.parse(payload.toString()) as { code: number }).code);
  }

  /** Edge side: what the owner sent for a client. */
  private toClient(ws: WebSocket, kind: Kind, payload: Buffer): void {
    if (ws.readyState !== ws.OPEN) return;
    if (kind === 't' || kind === 'b') {
      ws.send(kind === 't' ? payload.toString() : payload);
      // As for a socket served here: a client that does not read is cut off, not buffered without bound.
      if (ws.bufferedAmount > this.limits.maxBufferedBytes) {
        ws.close(CloseCode.SLOW_READER, `not reading: over ${this.limits.maxBufferedBytes} bytes waiting to be sent`);
      }
    } else if (kind === 'p') ws.ping();
    else if (kind === 'c') {
      const { code, reason } = JSON.parse(payload.toString()) as { code: number; reason: string };
      if (code === 1006) ws.terminate();
      else ws.close(code, reason);
    }
  }

  /** Owner side: an edge relays a socket here. */
  private opened(cid: string, payload: Buffer): void {
    const open = JSON.parse(payload.toString()) as RelayedOpen & { edge: string };
    const release = this.hold(open.session);
    const ws = new RelayedSocket(
      (kind, data) => void this.cmd.publish(channelOf(open.edge), frame(kind, cid, data)).catch(() => {}),
      () => {
        this.relayed.delete(cid);
        release();
      },
    );
    ws.on('error', () => {});
    this.relayed.set(cid, { ws, edge: open.edge, session: open.session });
    this.serve(ws as unknown as WebSocket, { session: open.session, address: open.address, url: open.url });
  }

  /** Renews the leases of sessions held here; closes relayed sockets whose owner's lease lapsed or moved. */
  private async tick(): Promise<void> {
    try {
      const held = [...this.held.keys()];
      const owners = await Promise.all(held.map((s) => this.claim(s)));
      // Our lease lapsed meanwhile (the engine was away) and another server took the session: one owner only.
      owners.forEach((owner, i) => {
        if (owner === this.id) return;
        this.log(`[server] session "${held[i]}": another server owns it now: its sockets here reconnect`);
        this.lost(held[i]!);
      });
      const sessions = new Map<string, string>();
      for (const e of this.edges.values()) sessions.set(e.session, e.owner);
      for (const [session, owner] of sessions) {
        const now = await this.cmd.get(ownerKey(session));
        if (now === owner) continue;
        this.log(
          `[server] session "${session}": its server went away (lease ${now === null ? 'lapsed' : 'moved'}): its relayed sockets reconnect`,
        );
        for (const e of this.edges.values())
          if (e.session === session) e.ws.close(CloseCode.SERVER_CLOSING, 'the server holding this session went away: reconnect');
      }
    } catch {
      // The engine does not answer: the store's requests say STORE_UNAVAILABLE; leases are renewed on the next tick.
    }
  }

  close(): void {
    clearInterval(this.timer);
    // The edges hear it before our leases go: their clients reconnect at once.
    for (const r of [...this.relayed.values()]) r.ws.close(CloseCode.SERVER_CLOSING, 'server shutting down');
    for (const e of this.edges.values()) e.ws.close(CloseCode.SERVER_CLOSING, 'server shutting down');
    // Our leases go at once: the next socket of each session makes a new owner without waiting.
    const mine = [...this.held.keys()];
    void Promise.all(
      mine.map((s) =>
        this.cmd.eval("if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end", 1, ownerKey(s), this.id),
      ),
    )
      .catch(() => {})
      .finally(() => {
        this.cmd.disconnect();
        this.sub.disconnect();
      });
  }
}
