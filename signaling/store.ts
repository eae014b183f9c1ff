/**
 * The server side of the store: one `KeyValueStore` per session, with TCPStore's semantics.
 * No sockets here: the server calls these methods and turns results and `StoreRefusal`s into
 * replies. Blocking calls (get, wait, multiGet) are promises that settle when the keys exist or
 * the deadline passes.
 */
import { ErrorCode } from '../src/wire/protocol.ts';
import type { SessionStore } from './session_store.ts';

/**
 * Refusals a correct client can meet through no fault of its own request: a blocking call timed
 * out, other sessions filled the server, other members filled or shaped the group, the round
 * changed under a signal, the host ended the session. They do not count toward
 * `maxErrorsPerSocket`; every other refusal means the request itself (or its own session's use of
 * the store) was wrong, and counts.
 */
const ORDINARY_REFUSALS = new Set<ErrorCode>([
  ErrorCode.TIMEOUT,
  ErrorCode.QUOTA_SERVER_BYTES,
  ErrorCode.TOO_MANY_SESSIONS,
  ErrorCode.WORLD_SIZE_MISMATCH,
  ErrorCode.RANK_OUT_OF_RANGE,
  ErrorCode.DUPLICATE_RANK,
  ErrorCode.SESSION_FULL,
  ErrorCode.ELASTIC_MISMATCH,
  ErrorCode.UNKNOWN_PEER,
  ErrorCode.SESSION_ENDED,
  ErrorCode.STORE_UNAVAILABLE,
]);

export class StoreRefusal extends Error {
  override name = 'StoreRefusal';
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details?: Record<string, unknown>,
    /** Whether it counts toward the socket's bad-message limit (see ORDINARY_REFUSALS). */
    readonly counted: boolean = !ORDINARY_REFUSALS.has(code),
  ) {
    super(message);
  }
}

/** Bytes held by all sessions together, shared by their stores (`maxServerBytes`). */
export interface ByteBudget {
  used: number;
  readonly max: number;
}

export interface StoreQuota {
  maxKeys: number;
  maxBytes: number;
  /** The server-wide budget this store draws from too; none: only the session's own quota. */
  server?: ByteBudget;
}

interface Waiter {
  keys: string[];
  /** Gets the values as they were when the last key arrived (a later delete cannot take them away). */
  resolve: (values: Uint8Array[]) => void;
  timer: ReturnType<typeof setTimeout>;
  /** Lets the owner (a socket) cancel its waiters when it goes away. */
  owner: object;
}

const INTEGER = /^[+-]?\d+$/;
const enc = new TextEncoder();
const dec = new TextDecoder();

export class KeyValueStore implements SessionStore {
  private readonly data = new Map<string, Uint8Array>();
  private bytes = 0;
  private readonly waiters = new Map<string, Set<Waiter>>();

  constructor(private readonly quota: StoreQuota) {}

  get numKeys(): number {
    return this.data.size;
  }

  get totalBytes(): number {
    return this.bytes;
  }

  has(key: string): boolean {
    return this.data.has(key);
  }

  getNow(keys: string[]): Uint8Array[] | undefined {
    return this.check(keys) ? this.snapshot(keys) : undefined;
  }

  set(key: string, value: Uint8Array): void {
    this.reserve([[key, value.length]]);
    this.write(key, value);
  }

  /** Resolves with the value once the key exists; rejects with TIMEOUT after `timeoutMs`. */
  async get(key: string, timeoutMs: number, owner: object): Promise<Uint8Array> {
    return (await this.waitFor([key], timeoutMs, owner))[0]!;
  }

  /** TCPStore's add: a missing key counts from 0; the stored value is the decimal text. */
  add(key: string, amount: number): number {
    const current = this.data.get(key);
    let base = 0;
    if (current !== undefined) {
      const text = dec.decode(current);
      if (!INTEGER.test(text.trim())) {
        throw new StoreRefusal(
          ErrorCode.NOT_AN_INTEGER,
          `add("${key}") needs an integer value, but the key holds ${JSON.stringify(text.slice(0, 40))}`,
          { key },
        );
      }
      base = Number(text.trim());
    }
    const next = base + amount;
    if (!Number.isSafeInteger(next)) {
      throw new StoreRefusal(ErrorCode.NOT_AN_INTEGER, `add("${key}") overflows: ${base} + ${amount}`, { key });
    }
    const bytes = enc.encode(String(next));
    this.reserve([[key, bytes.length]]);
    this.write(key, bytes);
    return next;
  }

  /**
   * torch's compare_set, case by case (TCPStore backend):
   * - key missing, expected empty: set it to desired, return desired;
   * - key missing, expected not empty: change nothing, return expected;
   * - key present and equal to expected: set it to desired, return desired;
   * - key present and different: change nothing, return the current value.
   */
  compareSet(key: string, expected: Uint8Array, desired: Uint8Array): Uint8Array {
    const current = this.data.get(key);
    if (current === undefined) {
      if (expected.length !== 0) return expected;
    } else if (!equalBytes(current, expected)) {
      return current;
    }
    this.reserve([[key, desired.length]]);
    this.write(key, desired);
    return desired;
  }

  /** Resolves when every key exists; rejects with TIMEOUT naming the missing keys. */
  async wait(keys: string[], timeoutMs: number, owner: object): Promise<void> {
    await this.waitFor(keys, timeoutMs, owner);
  }

  /**
   * Resolves with the keys' values once all exist. The values are taken the moment the last one
   * arrives: requests handled before the caller resumes (a `deleteKey` in the same read) cannot
   * change what it gets.
   */
  private waitFor(keys: string[], timeoutMs: number, owner: object): Promise<Uint8Array[]> {
    if (keys.every((k) => this.data.has(k))) return Promise.resolve(this.snapshot(keys));
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        keys,
        owner,
        resolve: (values) => {
          this.removeWaiter(waiter);
          resolve(values);
        },
        timer: setTimeout(() => {
          this.removeWaiter(waiter);
          const missing = keys.filter((k) => !this.data.has(k));
          reject(
            new StoreRefusal(
              ErrorCode.TIMEOUT,
              `timed out after ${timeoutMs} ms waiting for key${missing.length > 1 ? 's' : ''} ${missing.map((k) => `"${k}"`).join(', ')}`,
              { keys: missing, timeoutMs },
            ),
          );
        }, timeoutMs),
      };
      for (const k of keys) {
        if (this.data.has(k)) continue;
        let set = this.waiters.get(k);
        if (!set) {
          set = new Set();
          this.waiters.set(k, set);
        }
        set.add(waiter);
      }
    });
  }

  check(keys: string[]): boolean {
    return keys.every((k) => this.data.has(k));
  }

  deleteKey(key: string): boolean {
    const v = this.data.get(key);
    if (v === undefined) return false;
    this.account(-(key.length + v.length));
    this.data.delete(key);
    return true;
  }

  append(key: string, value: Uint8Array): void {
    const current = this.data.get(key);
    if (current === undefined) {
      this.set(key, value);
      return;
    }
    const joined = new Uint8Array(current.length + value.length);
    joined.set(current);
    joined.set(value, current.length);
    this.reserve([[key, joined.length]]);
    this.write(key, joined);
  }

  multiGet(keys: string[], timeoutMs: number, owner: object): Promise<Uint8Array[]> {
    return this.waitFor(keys, timeoutMs, owner);
  }

  multiSet(keys: string[], values: Uint8Array[]): void {
    // All or nothing: check the quota for the whole batch first.
    this.reserve(keys.map((k, i) => [k, values[i].length]));
    keys.forEach((k, i) => {
      this.write(k, values[i]);
    });
  }

  /** Drops every waiter a departed socket left behind (their promises never settle). */
  cancelWaiters(owner: object): void {
    for (const set of this.waiters.values()) {
      for (const w of set) {
        if (w.owner === owner) {
          clearTimeout(w.timer);
          this.removeWaiter(w);
        }
      }
    }
  }

  /** The session is dropped: its waiters go, and its bytes return to the server's budget. */
  close(): void {
    for (const set of this.waiters.values()) for (const w of set) clearTimeout(w.timer);
    this.waiters.clear();
    this.account(-this.bytes);
    this.data.clear();
  }

  clear(): void {
    this.close();
  }

  get pendingWaiters(): number {
    const all = new Set<Waiter>();
    for (const set of this.waiters.values()) for (const w of set) all.add(w);
    return all.size;
  }

  /** Throws QUOTA_* when writing these (key, value length) pairs would exceed the quota. */
  private reserve(writes: Array<[string, number]>): void {
    let keys = this.data.size;
    let bytes = this.bytes;
    const seen = new Set<string>();
    for (const [k, len] of writes) {
      const old = this.data.get(k);
      if (old === undefined && !seen.has(k)) keys++;
      seen.add(k);
      bytes += k.length + len - (old === undefined ? 0 : k.length + old.length);
    }
    if (keys > this.quota.maxKeys) {
      throw new StoreRefusal(
        ErrorCode.QUOTA_KEYS,
        `the session would hold ${keys} keys; the limit is ${this.quota.maxKeys}. Delete keys you no longer need.`,
        { limit: this.quota.maxKeys },
      );
    }
    if (bytes > this.quota.maxBytes) {
      throw new StoreRefusal(
        ErrorCode.QUOTA_BYTES,
        `the session would hold ${bytes} bytes; the limit is ${this.quota.maxBytes}. Store less, or delete keys.`,
        { limit: this.quota.maxBytes },
      );
    }
    const server = this.quota.server;
    if (server && bytes > this.bytes && server.used + (bytes - this.bytes) > server.max) {
      throw new StoreRefusal(
        ErrorCode.QUOTA_SERVER_BYTES,
        `the server is full: all sessions together would hold ${server.used + (bytes - this.bytes)} bytes; the limit is ${server.max}. Try again later, or delete keys you no longer need.`,
        { limit: server.max },
      );
    }
  }

  private write(key: string, value: Uint8Array): void {
    const old = this.data.get(key);
    this.account(key.length + value.length - (old === undefined ? 0 : key.length + old.length));
    this.data.set(key, value);
    const waiting = this.waiters.get(key);
    if (!waiting) return;
    for (const w of [...waiting]) {
      if (w.keys.every((k) => this.data.has(k))) {
        clearTimeout(w.timer);
        w.resolve(this.snapshot(w.keys));
      }
    }
  }

  /** The keys' values now (all must exist). */
  private snapshot(keys: string[]): Uint8Array[] {
    return keys.map((k) => this.data.get(k)!);
  }

  /** Changes the bytes held, here and in the server's budget. */
  private account(delta: number): void {
    this.bytes += delta;
    if (this.quota.server) this.quota.server.used += delta;
  }

  private removeWaiter(w: Waiter): void {
    for (const k of w.keys) {
      const set = this.waiters.get(k);
      if (!set) continue;
      set.delete(w);
      if (set.size === 0) this.waiters.delete(k);
    }
  }
}

function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
