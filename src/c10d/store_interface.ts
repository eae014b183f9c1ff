/**
 * torch.distributed.Store, the contract every store here keeps (`StoreClient` over the server's
 * socket, `HashStore` in memory), and `PrefixStore`, the view of one that scopes every key, so
 * that groups and subgroups share one store without their keys meeting.
 */
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
    return this.inner.wait(
      keys.map((k) => this.k(k)),
      timeoutMs,
    );
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
    return this.inner.multiGet(
      keys.map((k) => this.k(k)),
      timeoutMs,
    );
  }
  multiSet(keys: string[], values: StoreValue[]) {
    return this.inner.multiSet(
      keys.map((k) => this.k(k)),
      values,
    );
  }
}
