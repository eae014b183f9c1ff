/**
 * RRef: a reference to a value that lives on one worker (its owner), torch's
 * torch.distributed.rpc.RRef. `remote()` returns one at once, while the owner is still computing
 * the value; `toHere()` copies the value here, `localValue()` reads it on the owner, and
 * `rpcSync()`/`rpcAsync()` call its methods where it lives.
 *
 * Reference counting, as torch's: every RRef object (on a user or on the owner) is one fork of
 * the value, and the owner keeps the value while any fork is live. Passing an RRef to another
 * worker in a call's arguments or result makes a new fork there, registered with the owner before
 * the message leaves (so the owner never deletes a value a message is carrying). A fork ends with
 * `release()` (or when the object is garbage-collected, or at shutdown); the
 * last one ends the value: the owner deletes it, disposing it if it is a tensor.
 */

/** A worker of the RPC group: its name and rank (torch's WorkerInfo: name, id). */
export interface WorkerInfo {
  readonly name: string;
  readonly id: number;
}

/** What an RRef needs of its worker's agent (agent.ts). */
export interface RRefHost {
  readonly rank: number;
  workerInfo(rank: number): WorkerInfo;
  fetchRRef(rref: RRef, timeoutMs?: number): Promise<unknown>;
  callOnRRef(rref: RRef, method: string, args: unknown[], timeoutMs?: number): Promise<unknown>;
  /** Calls a method of the value where it lives and keeps the result there (rref.remote()). */
  remoteOnRRef(rref: RRef, method: string, args: unknown[], timeoutMs?: number): RRef;
  ownedValue(id: string): { ready: true; value: unknown } | { ready: false; error?: Error } | undefined;
  releaseRRef(rref: RRef): void;
}

/** Methods of T, called where the value lives, the result kept there: each returns an RRef to it at once. */
export type RRefRemoteProxy<T> = {
  [K in keyof T]: T[K] extends (...args: infer A) => infer R ? (...args: A) => RRef<Awaited<R>> : never;
};

/** Methods of T, called where the value lives: each returns a promise of the method's result. */
export type RRefProxy<T> = {
  [K in keyof T]: T[K] extends (...args: infer A) => infer R ? (...args: A) => Promise<Awaited<R>> : never;
};

export class RRef<T = unknown> {
  private released = false;

  /** Made by the agent: `remote()`, or a reference arriving in a message. */
  constructor(
    private readonly host: RRefHost,
    /** The owner's rank. */
    readonly ownerRank: number,
    /** The value's id, unique in the group ("rank:n" of the worker that created it). */
    readonly id: string,
    /** This reference's fork id, unique in the group. */
    readonly fork: string,
  ) {}

  /** The worker that holds the value. */
  owner(): WorkerInfo {
    return this.host.workerInfo(this.ownerRank);
  }

  /** The owner's name (torch's owner_name()). */
  ownerName(): string {
    return this.owner().name;
  }

  isOwner(): boolean {
    return this.ownerRank === this.host.rank;
  }

  /** Whether this reference was released (it can no longer be used). */
  get isReleased(): boolean {
    return this.released;
  }

  /** Whether the owner has the value (on the owner only; torch's confirmed/ready checks). */
  isReady(): boolean {
    return this.isOwner() && this.host.ownedValue(this.id)?.ready === true;
  }

  /**
   * The value itself, on the owner (torch's local_value()). Throws on a user (use toHere()), and
   * on the owner while the value is still being made (await toHere() first) or failed.
   */
  localValue(): T {
    this.checkLive('localValue');
    if (!this.isOwner())
      throw new Error(
        `localValue() is for the owner (${this.ownerName()}); this is ${this.host.workerInfo(this.host.rank).name}: use toHere()`,
      );
    const owned = this.host.ownedValue(this.id);
    if (!owned) throw new Error(`RRef ${this.id} has no value on its owner any more`);
    if (!owned.ready) throw owned.error ?? new Error(`RRef ${this.id}'s value is still being made on its owner: await toHere() first`);
    return owned.value as T;
  }

  /** A copy of the value here (tensors arrive as new tensors this worker owns); on the owner, the value itself. */
  toHere(timeoutMs?: number): Promise<T> {
    this.checkLive('toHere');
    return this.host.fetchRRef(this, timeoutMs) as Promise<T>;
  }

  /** Calls the value's methods on the owner, waiting for each result (torch's rref.rpc_sync()). */
  rpcSync(timeoutMs?: number): RRefProxy<T> {
    return this.proxy(timeoutMs);
  }

  /** The same as rpcSync() here: every call returns a promise (torch's rref.rpc_async()). */
  rpcAsync(timeoutMs?: number): RRefProxy<T> {
    return this.proxy(timeoutMs);
  }

  /**
   * Calls the value's methods on the owner and keeps each result there (torch's rref.remote()):
   * an RRef to the result, at once, owned by this RRef's owner.
   */
  remote(timeoutMs?: number): RRefRemoteProxy<T> {
    this.checkLive('remote');
    return new Proxy({} as RRefRemoteProxy<T>, {
      get: (_target, method) => {
        if (typeof method !== 'string' || method === 'then') return undefined;
        return (...args: unknown[]) => this.host.remoteOnRRef(this, method, args, timeoutMs);
      },
    });
  }

  /** Ends this reference: the owner deletes the value once no reference is left. Idempotent. */
  release(): void {
    if (this.released) return;
    this.released = true;
    this.host.releaseRRef(this);
  }

  toString(): string {
    return `RRef(${this.id} on ${this.ownerName()})`;
  }

  private proxy(timeoutMs: number | undefined): RRefProxy<T> {
    this.checkLive('rpcSync');
    return new Proxy({} as RRefProxy<T>, {
      get: (_target, method) => {
        if (typeof method !== 'string' || method === 'then') return undefined;
        return (...args: unknown[]) => this.host.callOnRRef(this, method, args, timeoutMs);
      },
    });
  }

  private checkLive(what: string): void {
    if (this.released) throw new Error(`${what}() on RRef ${this.id}, which this worker released`);
  }
}
