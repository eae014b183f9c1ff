/**
 * The store on a shared engine (`--store redis://...`): every server process on one Redis sees
 * the same keys, counters and waits of a session. Writes are Lua scripts (engine_lua.ts: atomic,
 * quota-checked, published on the session's channel); a blocking call subscribes to its
 * session's channel, then reads, and reads again on each write of one of its keys, so a write
 * through any server wakes it. The engine bound to loopback (or a private network) with its own
 * password; an engine that does not answer (gone, or silent for 2 s) makes requests fail with
 * STORE_UNAVAILABLE while ioredis reconnects, and the server serves on once it is back.
 */
import { Redis } from 'ioredis';
import { ErrorCode } from '../src/wire/protocol.ts';
import { CLAIM_AUTH_LUA, DELETE_LUA, EXISTS_LUA, WRITE_LUA } from './engine_lua.ts';
import { TOKEN_FILE, type SharedHashes } from './session_tokens.ts';
import { StoreRefusal, type StoreQuota } from './store.ts';
import type { SessionStore } from './session_store.ts';

/** A `--store` value that cannot be used: the message says what was wrong and what to do. */
export class StoreUrlError extends Error {
  override name = 'StoreUrlError';
}

/** The engine's address without its password, for messages and logs. */
export function shownStoreUrl(url: URL): string {
  return `${url.protocol}//${url.hostname}:${url.port || '6379'}`;
}

/** Parses `--store`: redis://[:PASSWORD@]HOST:PORT[/DB]; anything else is refused, saying what is taken. */
export function parseStoreUrl(raw: string): URL {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new StoreUrlError(
      `--store ${JSON.stringify(raw)} is not a URL: give redis://:PASSWORD@HOST:PORT (a Redis the servers share), or leave --store out for the in-memory store`,
    );
  }
  if (url.protocol === 'etcd:')
    throw new StoreUrlError(
      `--store ${shownStoreUrl(url)}: etcd was measured (bench/results/store_engine.md) but the shared store runs on Redis: give redis://:PASSWORD@HOST:PORT`,
    );
  if (url.protocol !== 'redis:')
    throw new StoreUrlError(
      `--store takes redis://:PASSWORD@HOST:PORT, not ${JSON.stringify(url.protocol)}: a Redis the servers share, or leave --store out for the in-memory store`,
    );
  if (!url.hostname) throw new StoreUrlError('--store redis:// needs a host: redis://:PASSWORD@127.0.0.1:6379');
  if (url.pathname && url.pathname !== '/' && !/^\/\d{1,2}$/.test(url.pathname))
    throw new StoreUrlError(`--store ${shownStoreUrl(url)}${url.pathname}: the path may only be a database number (/0../15)`);
  return url;
}

type Waiter = {
  keys: string[];
  owner: object;
  resolve: (values: Uint8Array[]) => void;
  reject: (err: unknown) => void;
  timer: ReturnType<typeof setTimeout>;
  checking: boolean;
  again: boolean;
  done: boolean;
};

/** How long the engine keeps a session's token hashes after their last use (as SessionTokens keeps them in memory). */
const AUTH_TTL_MS = 24 * 3600_000;
const authKey = (session: string) => `ddp:{${session}}:auth`;
/** An all-zero hash matches no token (as a damaged token file, session_tokens.ts): an ended session's. */
const ENDED_TOKEN_HASH = '0'.repeat(64);

type ScriptCall = (...args: Array<string | Buffer | number>) => Promise<unknown>;

/** One server's connections to the engine: commands, and a subscriber that routes each session's writes to its store. */
export class RedisEngine {
  readonly shown: string;
  private readonly cmd: Redis;
  private readonly sub: Redis;
  private readonly stores = new Map<string, RedisSessionStore>();
  /** Each channel's subscription (the promise of its confirmation) while a waiter needs it. */
  private readonly subscribed = new Map<string, { count: number; ready: Promise<unknown> }>();
  private closed = false;
  /** The connection's last error (a refused password shows here, not in the failed connect). */
  private lastError: string | undefined;

  constructor(
    url: URL,
    /** How long the engine keeps a session's keys after the last server that held it let go. */
    private readonly ttlMs: number,
    private readonly log: (line: string) => void = () => {},
  ) {
    this.shown = shownStoreUrl(url);
    const options = {
      host: url.hostname,
      port: Number(url.port || 6379),
      password: decodeURIComponent(url.password) || undefined,
      username: decodeURIComponent(url.username) || undefined,
      db: url.pathname.length > 1 ? Number(url.pathname.slice(1)) : 0,
      lazyConnect: true,
      connectTimeout: 2_000,
      // A request while the engine is away fails after one reconnect attempt (STORE_UNAVAILABLE);
      // the connection keeps retrying behind it, so the server recovers by itself.
      maxRetriesPerRequest: 1,
      // An engine that holds the connection but does not answer (stopped, overloaded, a network
      // that drops packets) fails a request after this too, instead of hanging it.
      commandTimeout: 2_000,
      retryStrategy: (attempt: number) => Math.min(100 * attempt, 2_000),
    };
    this.cmd = new Redis(options);
    this.sub = new Redis(options);
    let down = false;
    this.cmd.on('error', (err: Error) => {
      this.lastError = err.message;
      if (!down && !this.closed) this.log(`[store] ${this.shown} does not answer (${err.message}); retrying`);
      down = true;
    });
    this.cmd.on('ready', () => {
      if (down) this.log(`[store] ${this.shown} answers again`);
      down = false;
    });
    this.sub.on('error', () => {});
    this.cmd.defineCommand('ddpWrite', { numberOfKeys: 2, lua: WRITE_LUA });
    this.cmd.defineCommand('ddpDelete', { numberOfKeys: 2, lua: DELETE_LUA });
    this.cmd.defineCommand('ddpExists', { numberOfKeys: 1, lua: EXISTS_LUA });
    this.cmd.defineCommand('ddpClaimAuth', { numberOfKeys: 1, lua: CLAIM_AUTH_LUA });
    this.sub.on('messageBuffer', (channel: Buffer, message: Buffer) => {
      this.stores.get(channel.toString())?.written(JSON.parse(message.toString()) as string[]);
    });
  }

  /** The sessions' token and host-secret hashes, shared by the servers (kept a day after their last use). */
  readonly auth: SharedHashes = {
    read: async (session, name) => {
      const field = name === TOKEN_FILE ? 'token' : 'host';
      const hex = await this.run((c) => c.hget(authKey(session), field));
      if (hex) void this.run((c) => c.pexpire(authKey(session), AUTH_TTL_MS)).catch(() => {});
      return hex ? Buffer.from(hex, 'hex') : undefined;
    },
    claim: async (session, token, host) => {
      const args = [authKey(session), token.toString('hex'), host?.toString('hex') ?? '', AUTH_TTL_MS];
      const [t, h] = (await this.run((c) => c.ddpClaimAuth!(...args))) as [string, string];
      return { token: Buffer.from(t, 'hex'), host: h ? Buffer.from(h, 'hex') : null };
    },
    replace: async (session, token) => {
      await this.run((c) => c.hset(authKey(session), 'token', token.toString('hex')));
    },
  };

  /** Connects and checks the password; rejects naming the engine and what to do. */
  async connect(): Promise<void> {
    try {
      await Promise.all([this.cmd.connect(), this.sub.connect()]);
      await this.cmd.ping();
    } catch (err) {
      this.close();
      const why = this.lastError ?? (err as Error).message;
      const auth = /NOAUTH|WRONGPASS|AUTH/i.test(why);
      throw new StoreUrlError(
        auth
          ? `the store ${this.shown} refused the password (${why}): give its requirepass in --store redis://:PASSWORD@HOST:PORT`
          : `cannot reach the store ${this.shown} (${why}): start redis-server there (npm run cluster starts one), or fix --store`,
      );
    }
  }

  /** The session's store on this engine (one per session and server). */
  open(session: string, quota: StoreQuota): RedisSessionStore {
    const store = new RedisSessionStore(this, session, quota, this.ttlMs);
    this.stores.set(store.channel, store);
    return store;
  }

  forget(store: RedisSessionStore): void {
    if (this.stores.get(store.channel) === store) this.stores.delete(store.channel);
  }

  /** Runs one command or script, turning an engine that does not answer into STORE_UNAVAILABLE. */
  async run<T>(call: (cmd: Redis & Record<string, ScriptCall>) => Promise<T>): Promise<T> {
    try {
      return await call(this.cmd as Redis & Record<string, ScriptCall>);
    } catch (err) {
      if (err instanceof StoreRefusal) throw err;
      throw new StoreRefusal(
        ErrorCode.STORE_UNAVAILABLE,
        `store unavailable: the server's shared store does not answer (${(err as Error).message}); the server keeps trying: try again in a few seconds`,
      );
    }
  }

  /** Resolves once `channel`'s writes reach this server. */
  subscribe(channel: string): Promise<unknown> {
    let s = this.subscribed.get(channel);
    if (!s) {
      s = { count: 0, ready: this.sub.subscribe(channel) };
      this.subscribed.set(channel, s);
    }
    s.count++;
    return s.ready;
  }

  unsubscribe(channel: string): void {
    const s = this.subscribed.get(channel);
    if (!s || --s.count > 0) return;
    this.subscribed.delete(channel);
    if (!this.closed) this.sub.unsubscribe(channel).catch(() => {});
  }

  close(): void {
    this.closed = true;
    this.cmd.disconnect();
    this.sub.disconnect();
  }
}

/** One session's store on the engine, as this server sees it: the data is the engine's, the waiters this server's. */
export class RedisSessionStore implements SessionStore {
  readonly channel: string;
  private readonly kv: string;
  private readonly n: string;
  private readonly waiters = new Set<Waiter>();
  private readonly auth: string;

  constructor(
    private readonly engine: RedisEngine,
    session: string,
    private readonly quota: StoreQuota,
    private readonly ttlMs: number,
  ) {
    // One hash tag per session: its keys stay together should the engine be a Redis Cluster.
    this.kv = `ddp:{${session}}:kv`;
    this.n = `ddp:{${session}}:n`;
    this.channel = `ddp:{${session}}:w`;
    this.auth = authKey(session);
  }

  get pendingWaiters(): number {
    return this.waiters.size;
  }

  private async write(op: string, ...args: Array<string | Buffer>): Promise<Buffer> {
    const head = [this.kv, this.n, this.quota.maxKeys, this.quota.maxBytes, this.ttlMs, this.channel, op];
    const [code, detail] = (await this.engine.run((c) => c.ddpWriteBuffer!(...head, ...args))) as [Buffer, Buffer];
    const status = code.toString();
    if (status === 'OK' || status === 'VALUE') return detail;
    throw this.refusal(status, detail.toString(), op === 'add' || op === 'cas' ? String(args[0]) : '', args[1]);
  }

  private refusal(status: string, detail: string, key: string, amount: unknown): StoreRefusal {
    switch (status) {
      case 'NOT_AN_INTEGER':
        return new StoreRefusal(
          ErrorCode.NOT_AN_INTEGER,
          `add("${key}") needs an integer value, but the key holds ${JSON.stringify(detail)}`,
          { key },
        );
      case 'OVERFLOW':
        return new StoreRefusal(ErrorCode.NOT_AN_INTEGER, `add("${key}") overflows: ${Number(detail)} + ${String(amount)}`, { key });
      case 'QUOTA_KEYS':
        return new StoreRefusal(
          ErrorCode.QUOTA_KEYS,
          `the session would hold ${detail} keys; the limit is ${this.quota.maxKeys}. Delete keys you no longer need.`,
          { limit: this.quota.maxKeys },
        );
      case 'QUOTA_BYTES':
        return new StoreRefusal(
          ErrorCode.QUOTA_BYTES,
          `the session would hold ${detail} bytes; the limit is ${this.quota.maxBytes}. Store less, or delete keys.`,
          { limit: this.quota.maxBytes },
        );
      default:
        return new StoreRefusal(ErrorCode.BAD_MESSAGE, `the store's script refused ${status} ${detail}`);
    }
  }

  async set(key: string, value: Uint8Array): Promise<void> {
    await this.write('set', key, Buffer.from(value));
  }

  async add(key: string, amount: number): Promise<number> {
    return Number((await this.write('add', key, String(amount))).toString());
  }

  async compareSet(key: string, expected: Uint8Array, desired: Uint8Array): Promise<Uint8Array> {
    return new Uint8Array(await this.write('cas', key, Buffer.from(expected), Buffer.from(desired)));
  }

  async append(key: string, value: Uint8Array): Promise<void> {
    await this.write('append', key, Buffer.from(value));
  }

  async multiSet(keys: string[], values: Uint8Array[]): Promise<void> {
    await this.write('multiSet', ...keys.flatMap((k, i) => [k, Buffer.from(values[i]!)]));
  }

  async deleteKey(key: string): Promise<boolean> {
    return (await this.engine.run((c) => c.ddpDelete!(this.kv, this.n, key))) === 1;
  }

  async check(keys: string[]): Promise<boolean> {
    return (await this.exists(keys)).every(Boolean);
  }

  private async exists(keys: string[]): Promise<boolean[]> {
    const found = (await this.engine.run((c) => c.ddpExists!(this.kv, ...keys))) as number[];
    return found.map((x) => x === 1);
  }

  get numKeys(): Promise<number> {
    return this.engine.run((c) => c.hlen(this.kv));
  }

  async has(key: string): Promise<boolean> {
    return (await this.exists([key]))[0] === true;
  }

  async getNow(keys: string[]): Promise<Uint8Array[] | undefined> {
    const values = await this.engine.run((c) => c.hmgetBuffer(this.kv, ...keys));
    if (values.some((v) => v === null)) return undefined;
    return values.map((v) => new Uint8Array(v!));
  }

  async get(key: string, timeoutMs: number, owner: object): Promise<Uint8Array> {
    return (await this.waitFor([key], timeoutMs, owner))[0]!;
  }

  async wait(keys: string[], timeoutMs: number, owner: object): Promise<void> {
    await this.waitFor(keys, timeoutMs, owner);
  }

  multiGet(keys: string[], timeoutMs: number, owner: object): Promise<Uint8Array[]> {
    return this.waitFor(keys, timeoutMs, owner);
  }

  /** Subscribed first, then read: a write between the two is read, one after it is heard. */
  private waitFor(keys: string[], timeoutMs: number, owner: object): Promise<Uint8Array[]> {
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        keys,
        owner,
        resolve,
        reject,
        checking: false,
        again: false,
        done: false,
        timer: setTimeout(() => void this.timeout(waiter, timeoutMs), timeoutMs),
      };
      this.waiters.add(waiter);
      this.engine.subscribe(this.channel).then(
        () => this.recheck(waiter),
        (err: unknown) => this.finish(waiter, () => reject(unavailable(err))),
      );
    });
  }

  private async timeout(waiter: Waiter, timeoutMs: number): Promise<void> {
    if (waiter.done) return;
    this.finish(waiter, () => {});
    const found = await this.exists(waiter.keys).catch(() => waiter.keys.map(() => false));
    const missing = waiter.keys.filter((_, i) => !found[i]);
    waiter.reject(
      new StoreRefusal(
        ErrorCode.TIMEOUT,
        `timed out after ${timeoutMs} ms waiting for key${missing.length > 1 ? 's' : ''} ${missing.map((k) => `"${k}"`).join(', ')}`,
        { keys: missing, timeoutMs },
      ),
    );
  }

  private async recheck(waiter: Waiter): Promise<void> {
    if (waiter.done) return;
    if (waiter.checking) {
      waiter.again = true;
      return;
    }
    waiter.checking = true;
    try {
      do {
        waiter.again = false;
        const values = await this.getNow(waiter.keys);
        if (values && !waiter.done) return this.finish(waiter, () => waiter.resolve(values));
      } while (waiter.again && !waiter.done);
    } catch (err) {
      this.finish(waiter, () => waiter.reject(err));
    } finally {
      waiter.checking = false;
    }
  }

  /** Keys of this session were written (on any server): the waiters on any of them read again. */
  written(keys: string[]): void {
    const set = new Set(keys);
    for (const w of this.waiters) if (w.keys.some((k) => set.has(k))) void this.recheck(w);
  }

  private finish(waiter: Waiter, settle: () => void): void {
    if (waiter.done) return;
    waiter.done = true;
    clearTimeout(waiter.timer);
    this.waiters.delete(waiter);
    this.engine.unsubscribe(this.channel);
    settle();
  }

  cancelWaiters(owner: object): void {
    for (const w of [...this.waiters]) if (w.owner === owner) this.finish(w, () => {});
  }

  close(): void {
    for (const w of [...this.waiters]) this.finish(w, () => {});
    this.engine.forget(this);
  }

  /** The host ended the session: its keys go, and its token becomes one no token matches, so no server opens it again. */
  async clear(): Promise<void> {
    this.close();
    await this.engine.run((c) => c.multi().del(this.kv, this.n).hset(this.auth, 'token', ENDED_TOKEN_HASH).exec());
  }

  touch(): void {
    void this.engine.run((c) => c.multi().pexpire(this.kv, this.ttlMs).pexpire(this.n, this.ttlMs).exec()).catch(() => {});
  }
}

function unavailable(err: unknown): StoreRefusal {
  return err instanceof StoreRefusal
    ? err
    : new StoreRefusal(
        ErrorCode.STORE_UNAVAILABLE,
        `store unavailable: the server's shared store does not answer (${String(err)}); try again in a few seconds`,
      );
}
