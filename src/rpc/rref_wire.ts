/**
 * RRefs crossing between workers (torch's fork protocol, rref.ts): each reference sent is a new
 * fork, registered with the owner before it leaves, and each live RRef object of this worker is
 * tracked so that releasing it (explicitly, at shutdown, or when it is garbage-collected) ends its
 * fork on the owner.
 */
import type { RRefCodec, WireRRef } from './codec.ts';
import { holderOf, type OwnerTable } from './owner_table.ts';
import { RRef, type RRefHost } from './rref.ts';

export interface RRefWireDeps {
  rank: number;
  worldSize: number;
  owned: OwnerTable;
  host: RRefHost;
  /** Registers fork `fork` of value `id` with its owner (sent in context `ctx`); resolves once the owner answered. */
  fork(owner: number, id: string, fork: string, ctx: string | undefined): Promise<unknown>;
  /** Tells the owner that fork `fork` of value `id` ended. */
  release(owner: number, id: string, fork: string): Promise<void>;
}

export class RRefWire implements RRefCodec<RRef> {
  /** This worker's live RRef objects by fork id (weakly: a collected one is released by the registry), and their forks. */
  private readonly live = new Map<string, { ref: WeakRef<RRef>; fork: { owner: number; id: string; fork: string } }>();
  private readonly collected = new FinalizationRegistry<{ owner: number; id: string; fork: string }>((f) => this.end(f));
  /** Fork requests in flight, by value id: a release of the value waits for them. */
  private readonly forking = new Map<string, Set<Promise<unknown>>>();
  private nextFork = 1;
  /** Releases on their way to owners. */
  private readonly releasing = new Set<Promise<unknown>>();
  private nextValue = 1;
  /** RRefs made for a reply (`own(value, true)`): released once it is sent. */
  private readonly transient = new WeakSet<RRef>();
  /** The calls that made this worker's remote() RRefs. */
  private readonly creations = new WeakMap<RRef, Promise<unknown>>();

  constructor(private readonly d: RRefWireDeps) {}

  get liveCount(): number {
    return this.live.size;
  }

  /** A new value id ("creator.n"). */
  newValueId(): string {
    return `${this.d.rank}.${this.nextValue++}`;
  }

  /**
   * An RRef of this worker to `value`, which it now owns, charged to rank `charge`; `transient`:
   * to be released once the reply carrying it is sent.
   */
  own<T>(value: T, transient: boolean, charge: number): RRef<T> {
    const id = this.newValueId();
    const fork = this.newFork(this.d.rank);
    this.d.owned.create(id, fork, charge);
    this.d.owned.settle(id, { value });
    const rref = this.track(new RRef<T>(this.d.host, this.d.rank, id, fork));
    if (transient) this.transient.add(rref);
    return rref;
  }

  /** `rref` is made by the call `made` (remote()): its failure is the RRef's. */
  madeBy(rref: RRef, made: Promise<unknown>): void {
    made.catch(() => {});
    this.creations.set(rref, made);
  }

  /** `use` of an RRef; if it fails and the call that made the RRef failed, that call's error says why. */
  madeFirst<T>(rref: RRef, use: Promise<T>): Promise<T> {
    const made = this.creations.get(rref);
    return made === undefined
      ? use
      : use.catch(async (err: unknown) => {
          await made;
          throw err;
        });
  }

  isTransient(rref: RRef): boolean {
    return this.transient.has(rref);
  }

  /** A new fork id for a reference held by `holder` ("holder.creator.n"). */
  newFork(holder: number): string {
    return `${holder}.${this.d.rank}.${this.nextFork++}`;
  }

  /**
   * A reference to send to `to`: a new fork, registered with the owner before it leaves, so the
   * owner never deletes a value a message carries. Sent to the owner itself, the fork is
   * registered when the message arrives (this worker's own fork keeps the value meanwhile: its
   * release goes after the message on the same ordered link).
   */
  toWire(v: unknown, to: number, ctx?: string): Promise<WireRRef> | undefined {
    if (!(v instanceof RRef)) return undefined;
    if (v.isReleased) throw new RangeError(`RRef ${v.id} was released on this worker and cannot be sent`);
    const fork = this.newFork(to);
    const wire = { owner: v.ownerRank, id: v.id, fork };
    // The owner's own value sent: the new fork is the receiver's to hold, and charged to it.
    if (v.ownerRank === this.d.rank) this.d.owned.addFork(v.id, fork, to, ctx);
    if (v.ownerRank === this.d.rank || v.ownerRank === to) return Promise.resolve(wire);
    const forked = this.d.fork(v.ownerRank, v.id, fork, ctx);
    const inFlight = this.forking.get(v.id) ?? new Set();
    this.forking.set(v.id, inFlight.add(forked));
    const done = () => {
      inFlight.delete(forked);
      if (inFlight.size === 0) this.forking.delete(v.id);
    };
    forked.then(done, done);
    return forked.then(() => wire);
  }

  fromWire(w: WireRRef, from: number): RRef {
    const { rank, worldSize, owned } = this.d;
    if (holderOf(w.fork) !== rank) throw new RangeError(`rank ${from} sent a reference forked for rank ${holderOf(w.fork)}`);
    if (w.owner >= worldSize) throw new RangeError(`an RRef owned by rank ${w.owner}, outside the group of ${worldSize}`);
    if (w.owner === rank && from !== rank) {
      // A reference to a value of this worker, sent by a holder: the fork is registered now (see toWire).
      if (!owned.heldBy(w.id, from)) throw new RangeError(`rank ${from} sent a reference to RRef ${w.id}, which it does not hold`);
      owned.addFork(w.id, w.fork, from);
    }
    return this.track(new RRef(this.d.host, w.owner, w.id, w.fork));
  }

  track<T>(rref: RRef<T>): RRef<T> {
    const fork = { owner: rref.ownerRank, id: rref.id, fork: rref.fork };
    this.live.set(rref.fork, { ref: new WeakRef(rref as RRef), fork });
    this.collected.register(rref, fork, rref);
    return rref;
  }

  /** Ends `rref`'s fork (RRef.release calls this through the agent). */
  release(rref: RRef): void {
    this.collected.unregister(rref);
    this.end({ owner: rref.ownerRank, id: rref.id, fork: rref.fork });
  }

  /** Releases every live RRef of this worker (shutdown); resolves once every release has left. */
  releaseAll(): Promise<unknown> {
    // A collected RRef whose finalizer has not run yet is ended here too (its finalizer then finds nothing).
    for (const { ref, fork } of [...this.live.values()]) {
      const rref = ref.deref();
      if (rref) rref.release();
      else this.end(fork);
    }
    return Promise.allSettled([...this.releasing]);
  }

  private end(f: { owner: number; id: string; fork: string }): void {
    // Once: a collected RRef ended by releaseAll() is still in the finalization registry.
    if (!this.live.delete(f.fork)) return;
    if (f.owner === this.d.rank) {
      this.d.owned.removeFork(f.id, f.fork);
      return;
    }
    // After this worker's fork requests for the value: they need its fork to still count.
    const before = Promise.allSettled([...(this.forking.get(f.id) ?? [])]);
    const sent = before.then(() => this.d.release(f.owner, f.id, f.fork)).catch(() => {});
    this.releasing.add(sent);
    void sent.then(() => this.releasing.delete(sent));
  }
}
