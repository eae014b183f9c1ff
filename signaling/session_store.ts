/**
 * What the server needs of a session's store: the in-memory `KeyValueStore` (store.ts, the
 * default) and the Redis-backed `RedisSessionStore` (engine_store.ts, `--store redis://...`) keep
 * it. Every call may answer now or later (the engine's is a round trip), so the dispatch awaits
 * each; the rules (torch's TCPStore, the quotas, the refusals) are the same in both.
 */
export interface SessionStore {
  set(key: string, value: Uint8Array): void | Promise<void>;
  /** The keys' values if every key exists now, else undefined (a blocking call need not wait). */
  getNow(keys: string[]): Uint8Array[] | undefined | Promise<Uint8Array[] | undefined>;
  get(key: string, timeoutMs: number, owner: object): Promise<Uint8Array>;
  add(key: string, amount: number): number | Promise<number>;
  compareSet(key: string, expected: Uint8Array, desired: Uint8Array): Uint8Array | Promise<Uint8Array>;
  wait(keys: string[], timeoutMs: number, owner: object): Promise<void>;
  check(keys: string[]): boolean | Promise<boolean>;
  deleteKey(key: string): boolean | Promise<boolean>;
  /** torch's num_keys. */
  readonly numKeys: number | Promise<number>;
  has(key: string): boolean | Promise<boolean>;
  append(key: string, value: Uint8Array): void | Promise<void>;
  multiGet(keys: string[], timeoutMs: number, owner: object): Promise<Uint8Array[]>;
  multiSet(keys: string[], values: Uint8Array[]): void | Promise<void>;
  /** Drops every waiter a departed socket left behind (their promises never settle). */
  cancelWaiters(owner: object): void;
  /** This server lets the session go (no socket here for a while): its waiters here go. */
  close(): void;
  /** The host ended the session: its keys go, for every server. */
  clear(): void | Promise<void>;
  /** Blocking calls waiting on this server. */
  readonly pendingWaiters: number;
  /** The session still has sockets here: an engine keeps its keys (they expire only once no server holds it). */
  touch?(): void;
}
