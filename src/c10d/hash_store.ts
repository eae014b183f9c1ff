/**
 * torch.distributed.HashStore: the Store in memory, shared by whoever holds the object (one
 * page's own groups, a test). The same rules as the server's TCPStore, which the Store
 * compliance suite (test/store_compliance.test.ts) checks on both: a blocking get, wait and
 * multiGet with a timeout that names the missing keys, add on integers (a missing key counts
 * from 0), torch's compare_set, append, check, deleteKey, numKeys.
 */
import { DEFAULT_STORE_TIMEOUT_MS, ErrorCode } from '../wire/protocol.ts';
import { StoreError, StoreTimeoutError } from '../wire/errors.ts';
import type { Store, StoreValue } from './store.ts';

const enc = new TextEncoder();
const dec = new TextDecoder();
const INTEGER = /^[+-]?\d+$/;

function bytesOf(v: StoreValue): Uint8Array {
  return typeof v === 'string' ? enc.encode(v) : v.slice();
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

export class HashStore implements Store {
  private readonly data = new Map<string, Uint8Array>();
  private readonly waiters = new Set<() => void>();

  constructor(readonly timeoutMs = DEFAULT_STORE_TIMEOUT_MS) {}

  async set(key: string, value: StoreValue): Promise<void> {
    this.write(key, bytesOf(value));
  }

  async get(key: string, timeoutMs = this.timeoutMs): Promise<Uint8Array> {
    return (await this.waitFor([key], timeoutMs))[0]!;
  }

  async add(key: string, amount: number): Promise<number> {
    const current = this.data.get(key);
    let base = 0;
    if (current !== undefined) {
      const text = dec.decode(current).trim();
      if (!INTEGER.test(text))
        throw new StoreError(
          ErrorCode.NOT_AN_INTEGER,
          `add("${key}") needs an integer value, but the key holds ${JSON.stringify(text.slice(0, 40))}`,
          { key },
        );
      base = Number(text);
    }
    const next = base + amount;
    if (!Number.isSafeInteger(next))
      throw new StoreError(ErrorCode.NOT_AN_INTEGER, `add("${key}") overflows: ${base} + ${amount}`, { key });
    this.write(key, enc.encode(String(next)));
    return next;
  }

  /** torch's compare_set (see the server's KeyValueStore for the four cases). */
  async compareSet(key: string, expected: StoreValue, desired: StoreValue): Promise<Uint8Array> {
    const current = this.data.get(key);
    const want = bytesOf(expected);
    if (current === undefined ? want.length !== 0 : !sameBytes(current, want)) return (current ?? want).slice();
    const value = bytesOf(desired);
    this.write(key, value);
    return value.slice();
  }

  async wait(keys: string[], timeoutMs = this.timeoutMs): Promise<void> {
    await this.waitFor(keys, timeoutMs);
  }

  async check(keys: string[]): Promise<boolean> {
    return keys.every((k) => this.data.has(k));
  }

  async deleteKey(key: string): Promise<boolean> {
    return this.data.delete(key);
  }

  async numKeys(): Promise<number> {
    return this.data.size;
  }

  async append(key: string, value: StoreValue): Promise<void> {
    const current = this.data.get(key) ?? new Uint8Array(0);
    const tail = bytesOf(value);
    const joined = new Uint8Array(current.length + tail.length);
    joined.set(current);
    joined.set(tail, current.length);
    this.write(key, joined);
  }

  multiGet(keys: string[], timeoutMs = this.timeoutMs): Promise<Uint8Array[]> {
    return this.waitFor(keys, timeoutMs);
  }

  async multiSet(keys: string[], values: StoreValue[]): Promise<void> {
    if (keys.length !== values.length) throw new RangeError(`multiSet has ${keys.length} keys but ${values.length} values`);
    keys.forEach((k, i) => {
      this.data.set(k, bytesOf(values[i]!));
    });
    this.wake();
  }

  private write(key: string, value: Uint8Array): void {
    this.data.set(key, value);
    this.wake();
  }

  private wake(): void {
    for (const w of [...this.waiters]) w();
  }

  /** The keys' values (copies) once all exist, taken the moment the last one arrives. */
  private waitFor(keys: string[], timeoutMs: number): Promise<Uint8Array[]> {
    const values = () => keys.map((k) => this.data.get(k)!.slice());
    if (keys.every((k) => this.data.has(k))) return Promise.resolve(values());
    return new Promise((resolve, reject) => {
      const check = () => {
        if (!keys.every((k) => this.data.has(k))) return;
        this.waiters.delete(check);
        clearTimeout(timer);
        resolve(values());
      };
      const timer = setTimeout(() => {
        this.waiters.delete(check);
        const missing = keys.filter((k) => !this.data.has(k));
        reject(
          new StoreTimeoutError(
            `timed out after ${timeoutMs} ms waiting for key${missing.length > 1 ? 's' : ''} ${missing.map((k) => `"${k}"`).join(', ')}`,
            missing,
            timeoutMs,
          ),
        );
      }, timeoutMs);
      this.waiters.add(check);
    });
  }
}
