/**
 * The values this worker owns for RRefs (rref.ts): each value, whether it is made yet, and the
 * live forks that reference it. The last fork released deletes the value (a tensor is disposed);
 * a value that finishes being made after its last fork is gone is disposed at once.
 *
 * Each fork is charged to the rank that made this worker keep it (the caller of remote(), the
 * worker that asked for a fork, ...: always the rank the link attests), and each rank has its own
 * bound: one member that fills its share leaves every other caller served.
 */
import * as tf from '@tensorflow/tfjs';
import { RpcLimitError } from './errors.ts';
import { disposeAfterCall } from './call_values.ts';

interface Owned {
  state: 'pending' | 'ready' | 'failed';
  value?: unknown;
  error?: Error;
  /** Each live fork: the rank it is charged to, and the context it was passed on in by that context's creator. */
  readonly forks: Map<string, { charge: number; ctx?: string }>;
  readonly waiters: Array<() => void>;
}

/** A fork's holder: the rank before the first dot of its id ("holder.creator.n"). */
export function holderOf(fork: string): number {
  return Number(fork.slice(0, fork.indexOf('.')));
}

/** A value's creator: the rank before the dot of its id ("creator.n"). */
export function creatorOf(id: string): number {
  return Number(id.slice(0, id.indexOf('.')));
}

export class OwnerTable {
  private readonly values = new Map<string, Owned>();
  /** Forks (a value's first included) charged to each rank. */
  private readonly charged = new Map<number, number>();
  /** Fork requests waiting for the call that creates their value (see created()). */
  private readonly creating = new Map<string, Array<() => void>>();

  constructor(
    /** Forks held at once for one rank (a bound on what each caller can make this worker keep). */
    private readonly maxPerCaller: number,
    /** Names for the error: this worker's, and a rank's. */
    private readonly names: { self: string; of(rank: number): string },
  ) {}

  /** A new value, being made, referenced by `fork`, charged to `charge`. Throws if the id is taken or its share is full. */
  create(id: string, fork: string, charge: number): void {
    try {
      if (this.values.has(id)) throw new Error(`RRef id ${id} is already in use on its owner`);
      this.charge(charge);
      this.values.set(id, { state: 'pending', forks: new Map([[fork, { charge }]]), waiters: [] });
    } finally {
      for (const wake of this.creating.get(id)?.splice(0) ?? []) wake();
      this.creating.delete(id);
    }
  }

  /**
   * Waits until the call that creates value `id` arrived (made or refused): a fork request, sent
   * at once, may overtake the call its creator posted first. Past `timeoutMs`, throws naming it.
   */
  async created(id: string, timeoutMs: number): Promise<void> {
    if (this.values.has(id)) return;
    const waiters = this.creating.get(id) ?? [];
    this.creating.set(id, waiters);
    await new Promise<void>((resolve, reject) => {
      const wake = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => {
        waiters.splice(waiters.indexOf(wake), 1);
        if (waiters.length === 0) this.creating.delete(id);
        reject(new Error(`RRef ${id} was not created on its owner within ${timeoutMs} ms of a request to fork it`));
      }, timeoutMs);
      waiters.push(wake);
    });
  }

  /** How many forks are charged to `rank` here. */
  chargedTo(rank: number): number {
    return this.charged.get(rank) ?? 0;
  }

  private charge(rank: number): void {
    const n = this.chargedTo(rank);
    if (n >= this.maxPerCaller)
      throw new RpcLimitError(
        this.names.self,
        this.names.of(rank),
        'maxOwnedRRefs',
        this.maxPerCaller,
        'RRef values and references',
        'release RRefs it no longer needs (rref.release()) before making more, or raise maxOwnedRRefs on the owner',
      );
    this.charged.set(rank, n + 1);
  }

  private uncharge(rank: number): void {
    const n = this.chargedTo(rank) - 1;
    if (n > 0) this.charged.set(rank, n);
    else this.charged.delete(rank);
  }

  /**
   * Value `id` (fork `fork`, charged to `charge`; `known`: created already, by this worker's own
   * remote()) is what `make` resolves to, or its error; `held` (the call's argument tensors) are
   * disposed once it is made, except what the value keeps.
   */
  make(id: string, fork: string, charge: number, known: boolean, make: () => Promise<unknown>, held: tf.Tensor[]): void {
    if (!known) this.create(id, fork, charge);
    make().then(
      (value) => {
        this.settle(id, { value });
        disposeAfterCall(held, value);
      },
      (error: Error) => {
        this.settle(id, { error });
        disposeAfterCall(held, undefined);
      },
    );
  }

  settle(id: string, outcome: { value: unknown } | { error: Error }): void {
    const o = this.values.get(id);
    if (!o) {
      if ('value' in outcome) disposeValue(outcome.value);
      return;
    }
    if ('value' in outcome) {
      o.state = 'ready';
      o.value = outcome.value;
    } else {
      o.state = 'failed';
      o.error = outcome.error;
    }
    for (const wake of o.waiters.splice(0)) wake();
  }

  /** The value once made; rejects with its error if making it failed, or if it is gone. */
  async whenReady(id: string): Promise<unknown> {
    const o = this.values.get(id);
    if (!o) throw new Error(`RRef ${id} has no value on its owner (every reference to it was released)`);
    if (o.state === 'pending') await new Promise<void>((r) => o.waiters.push(r));
    if (o.state === 'failed') throw o.error!;
    if (o.state === 'pending') throw new Error(`RRef ${id}'s every reference was released before its value was made`);
    return o.value;
  }

  /** Reads a value without waiting (RRef.localValue). */
  peek(id: string): { ready: true; value: unknown } | { ready: false; error?: Error } | undefined {
    const o = this.values.get(id);
    if (!o) return undefined;
    if (o.state === 'ready') return { ready: true, value: o.value };
    return o.error ? { ready: false, error: o.error } : { ready: false };
  }

  /** Whether rank `rank` holds a live fork of `id` (it may then fork it, fetch it, call it). */
  heldBy(id: string, rank: number): boolean {
    const o = this.values.get(id);
    return o !== undefined && [...o.forks.keys()].some((f) => holderOf(f) === rank);
  }

  /**
   * Whether `rank` may fetch `id` in context `ctx` that it did not open: it holds a fork that the
   * context's creator passed on to it in that context (torch's pipeline: shard 2 fetching shard 1's output).
   */
  fetchesIn(id: string, rank: number, ctx: string): boolean {
    const o = this.values.get(id);
    return o !== undefined && [...o.forks].some(([f, e]) => holderOf(f) === rank && e.ctx === ctx);
  }

  /** A new fork of `id`, charged to `charge`; `ctx`: passed on in that context by its creator. */
  addFork(id: string, fork: string, charge: number, ctx?: string): void {
    const o = this.values.get(id);
    if (!o) throw new Error(`RRef ${id} has no value on its owner`);
    if (o.forks.has(fork)) throw new Error(`fork ${fork} of RRef ${id} exists already`);
    this.charge(charge);
    o.forks.set(fork, ctx === undefined ? { charge } : { charge, ctx });
  }

  /** Ends `fork`; the last one deletes the value. Returns whether the fork existed. */
  removeFork(id: string, fork: string): boolean {
    const o = this.values.get(id);
    const entry = o?.forks.get(fork);
    if (!o || entry === undefined) return false;
    o.forks.delete(fork);
    this.uncharge(entry.charge);
    if (o.forks.size === 0) {
      this.values.delete(id);
      if (o.state === 'ready') disposeValue(o.value);
      for (const wake of o.waiters.splice(0)) wake();
    }
    return true;
  }

  /** Each value and its live forks: what tests and shutdown count. */
  counts(): Array<{ id: string; forks: number; state: Owned['state'] }> {
    return [...this.values].map(([id, o]) => ({ id, forks: o.forks.size, state: o.state }));
  }

  get size(): number {
    return this.values.size;
  }
}

/** A deleted value's memory: a tensor (not a variable a model holds) is disposed; other objects are left to the garbage collector. */
function disposeValue(value: unknown): void {
  if (value instanceof tf.Tensor && !(value instanceof tf.Variable) && !value.isDisposed) value.dispose();
}
