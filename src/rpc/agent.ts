/**
 * The RPC agent of one worker (torch's RpcAgent, TensorPipe's role): calls to functions of other
 * workers by their registered names, over the process group's message channel
 * (c10d/message_channel.ts), and the owner's side of RRefs.
 *
 * A call is a message {t: "call", id, fn, args}; the callee runs the function registered under
 * `fn` (never code from the wire) and answers {t: "reply", id, result} or {t: "reply", id, error}.
 * A function that returns a promise does not hold the callee while it waits: JavaScript runs the
 * next call meanwhile, which is what torch's @rpc.functions.async_execution asks for.
 *
 * Tensors: the callee's arguments are new tensors, and the agent disposes them, and the tensors of
 * the result, once the reply is sent, except variables and tensors the function marked with
 * tf.keep (a function that keeps an argument keeps it with tf.keep or a copy). The caller owns the
 * tensors of the result it receives.
 */
import * as tf from '@tensorflow/tfjs';
import type { MessageChannel } from '../c10d/message_channel.ts';
import { decodeMessage, encodeMessage } from './codec.ts';
import { RRefWire } from './rref_wire.ts';
import { WorkerNames } from './worker_names.ts';
import { DistAutograd } from './dist_autograd.ts';
import { RpcError, RpcRemoteError, RpcUnreachableError } from './errors.ts';
import { PendingCalls } from './pending_calls.ts';
import { FunctionTable } from './function_table.ts';
import { OwnerTable, creatorOf, holderOf } from './owner_table.ts';
import { RRef, type RRefHost, type WorkerInfo } from './rref.ts';
import { checkHead, type Head, type RemoteFailure, type RequestHead } from './messages.ts';
import { DEFAULT_RPC_TIMEOUT_MS, NAME, type RpcAgentOptions, type RpcFunction } from './agent_options.ts';
import { callMethod, disposeAfterCall, failure, rrefsIn, tensorsIn, waitUntil } from './call_values.ts';
import { serveDistributedOptimizer } from './distributed_optimizer.ts';
import { serveRemoteModules } from './remote_module.ts';

export type { RpcAgentOptions, RpcFunction } from './agent_options.ts';

/** A request this worker serves. */
type Served = Exclude<Extract<Head, { id: number }>, { t: 'reply' }>;

export class RpcAgent implements RRefHost {
  readonly rank: number;
  readonly worldSize: number;
  readonly name: string;
  readonly rpcTimeoutMs: number;
  private readonly workers: WorkerNames;
  private readonly functions: FunctionTable;
  private readonly pending = new PendingCalls(() => this.wake(this.doneWaiters));
  private readonly owned: OwnerTable;
  private readonly running = new Map<number, number>();
  /** Each destination's messages leave in the order they were posted (encoding may finish out of order). */
  private readonly order = new Map<number, Promise<unknown>>();
  /** The workers that said each step of their graceful shutdown. */
  private readonly heard = { leaving: new Set<number>(), done: new Set<number>() };
  private readonly helloWaiters: Array<() => void> = [];
  private readonly doneWaiters: Array<() => void> = [];
  private closed: Error | undefined;
  private readonly maxCallsPerWorker: number;
  private readonly rrefs: RRefWire;
  /** Distributed autograd's contexts on this worker (torch.distributed.autograd). */
  readonly autograd: DistAutograd;

  constructor(
    private readonly channel: MessageChannel,
    worldSize: number,
    options: RpcAgentOptions,
  ) {
    this.rank = channel.rank;
    const name = typeof options.name === 'function' ? options.name(this.rank) : options.name;
    if (!NAME.test(name)) throw new RangeError(`RPC worker name "${name}": use 1 to 128 letters, digits, "_", "-", ":" or "."`);
    this.worldSize = worldSize;
    this.name = name;
    this.rpcTimeoutMs = options.rpcTimeoutMs ?? DEFAULT_RPC_TIMEOUT_MS;
    this.maxCallsPerWorker = options.maxCallsPerWorker ?? 1024;
    this.workers = new WorkerNames(this.rank, worldSize, this.name);
    this.functions = new FunctionTable(this.name);
    this.owned = new OwnerTable(options.maxOwnedRRefs ?? 65_536, { self: this.name, of: (r) => this.workerName(r) });
    this.rrefs = new RRefWire({
      rank: this.rank,
      worldSize,
      owned: this.owned,
      host: this,
      fork: (owner, id, fork, ctx) => this.request(owner, 'fork', { t: 'fork', rref: id, fork, ...(ctx === undefined ? {} : { ctx }) }, {}),
      release: (owner, id, fork) => (this.closed ? Promise.resolve() : this.post(owner, { t: 'release', rref: id, fork })),
    });
    this.autograd = new DistAutograd(
      {
        rank: this.rank,
        sendGrad: (to, ctx, key, index, grad) => this.request(to, 'backward', { t: 'grad', ctx, key, index }, { grad }),
        releaseContext: (to, ctx) => void this.post(to, { t: 'ctx', ctx }).catch(() => {}),
        workerName: (r) => this.workerName(r),
      },
      options.maxAutogradContexts,
    );
    serveDistributedOptimizer(this);
    serveRemoteModules(this);
    channel.onMessage((from, bytes) => void this.onMessage(from, bytes));
    channel.onBroken((err) => this.close(err));
  }

  /** Says this worker's name to every other and waits for theirs (torch's init_rpc rendezvous). */
  async start(timeoutMs = 60_000): Promise<void> {
    for (let r = 0; r < this.worldSize; r++) if (r !== this.rank) void this.post(r, { t: 'hello', name: this.name }).catch(() => {});
    await waitUntil(
      this.name,
      () => this.workers.complete || this.closed !== undefined,
      this.helloWaiters,
      timeoutMs,
      () => `the names of workers ${this.workers.missing().join(', ')} (RPC start)`,
    );
    if (this.closed) throw this.closed;
    this.workers.checkUnique();
  }

  /**
   * An RRef owned by this worker to `value` (torch's rpc.RRef(value)): send it to other workers
   * and they reach the value here; it lives while any reference to it does.
   */
  localRRef<T>(value: T): RRef<T> {
    return this.rrefs.own(value, false, this.functions.caller ?? this.rank);
  }

  /** The agent's own services (DistributedOptimizer, RemoteModule): names starting with "__". */
  registerInternal(name: string, fn: RpcFunction): void {
    this.functions.registerInternal(name, fn);
  }

  /** An RRef of this worker to `value`, released once the reply carrying it is sent (the caller's fork keeps it). */
  ownForReply<T>(value: T): RRef<T> {
    return this.rrefs.own(value, true, this.functions.caller ?? this.rank);
  }

  /** Makes `fn` callable by other workers as `name` (every worker registers the same functions). */
  register(name: string, fn: RpcFunction): void {
    this.functions.register(name, fn);
  }

  /** Every worker, in rank order. */
  workerInfos(): WorkerInfo[] {
    return this.workers.all();
  }

  /** The worker named `name` (this one when left out); throws naming the known workers. */
  getWorkerInfo(name?: string): WorkerInfo {
    if (name === undefined) return { name: this.name, id: this.rank };
    return this.workers.byName(name);
  }

  workerInfo(rank: number): WorkerInfo {
    return this.workers.byRank(rank);
  }

  /** Calls `fn` on worker `to` and resolves with its result (torch's rpc_async; rpcSync is the same promise). */
  rpcAsync<R = unknown>(to: string | number | WorkerInfo, fn: string, args: unknown[] = [], timeoutMs?: number): Promise<R> {
    const rank = this.workers.rankOf(to);
    return this.request(rank, fn, { t: 'call', fn }, { args }, timeoutMs) as Promise<R>;
  }

  /** Runs `fn` on worker `to` and keeps its result there; the RRef is returned at once (torch's remote). */
  remote<R = unknown>(to: string | number | WorkerInfo, fn: string, args: unknown[] = [], timeoutMs?: number): RRef<R> {
    return this.newRemote(this.workers.rankOf(to), fn, (rref) => ({ t: 'call', fn, rref }), args, timeoutMs);
  }

  /** An RRef to what `owner` makes by the request `head` (a call, or a method of an RRef's value), returned at once. */
  private newRemote<R>(owner: number, fn: string, head: (v: { id: string; fork: string }) => RequestHead, args: unknown[], ms?: number) {
    const value = { id: this.rrefs.newValueId(), fork: this.rrefs.newFork(this.rank) };
    const rref = this.rrefs.track(new RRef<R>(this, owner, value.id, value.fork));
    // On this worker the value is known at once (the call itself comes back through the loopback).
    if (owner === this.rank) this.owned.create(value.id, value.fork, this.rank);
    // The owner's failure to make the value (or its refusal to keep it) is the RRef's: toHere() reports it.
    this.rrefs.madeBy(rref, this.request(owner, fn, head(value), { args }, ms));
    return rref;
  }

  // --- RRefHost ----------------------------------------------------------------------------------

  fetchRRef(rref: RRef, timeoutMs?: number): Promise<unknown> {
    if (rref.ownerRank === this.rank) return this.owned.whenReady(rref.id);
    // In a context (this page's, or the one of the call whose arguments brought the RRef): recorded, once.
    const ctx = this.autograd.contextFor(rref);
    const fetch = () => this.request(rref.ownerRank, 'toHere', { t: 'fetch', rref: rref.id }, {}, timeoutMs, ctx);
    return this.rrefs.madeFirst(rref, ctx === undefined ? fetch() : this.autograd.fetchOnce(ctx, rref, fetch));
  }

  callOnRRef(rref: RRef, method: string, args: unknown[], timeoutMs?: number): Promise<unknown> {
    // On the owner, at once; in an autograd context, through the loopback, so the call is recorded.
    if (rref.ownerRank === this.rank && this.autograd.current === undefined)
      return this.owned.whenReady(rref.id).then((v) => callMethod(v, method, args));
    return this.rrefs.madeFirst(rref, this.request(rref.ownerRank, method, { t: 'method', rref: rref.id, method }, { args }, timeoutMs));
  }

  remoteOnRRef(rref: RRef, method: string, args: unknown[], timeoutMs?: number): RRef {
    return this.newRemote(rref.ownerRank, method, (result) => ({ t: 'method', rref: rref.id, method, result }), args, timeoutMs);
  }

  ownedValue(id: string) {
    return this.owned.peek(id);
  }

  releaseRRef(rref: RRef): void {
    this.rrefs.release(rref);
  }

  /** The values this worker owns for RRefs and their live forks (torch's get_debug_info counts). */
  ownedRRefs(): Array<{ id: string; forks: number; state: 'pending' | 'ready' | 'failed' }> {
    return this.owned.counts();
  }

  /** Live RRef objects on this worker (its forks, owned values' included). */
  liveRRefs(): number {
    return this.rrefs.liveCount;
  }

  // --- Shutdown ----------------------------------------------------------------------------------

  /**
   * torch's rpc.shutdown. Graceful (the default): waits for this worker's outstanding calls,
   * releases its RRefs, then waits until every worker has done the same (so every call and every
   * reference in the group has ended) before closing. Not graceful: fails what is outstanding now.
   */
  async shutdown({ graceful = true, timeoutMs = 60_000 }: { graceful?: boolean; timeoutMs?: number } = {}): Promise<void> {
    if (this.closed) return;
    if (graceful) {
      const idle = () =>
        waitUntil(
          this.name,
          () => this.pending.size === 0 || this.closed !== undefined,
          this.doneWaiters,
          timeoutMs,
          () => this.pending.describe(),
        );
      await idle();
      // Once every worker leaves, no call starts but those served work makes, which end before the calls they serve do.
      await this.barrier('leaving', timeoutMs);
      await idle();
      // Every release leaves before this worker's "done": an owner that has every "done" has every release.
      await this.rrefs.releaseAll();
      await this.barrier('done', timeoutMs);
    }
    this.close(new RpcError(`the RPC agent of ${this.name} was shut down`, this.name, 'shutdown'));
  }

  /** Tells every other worker `t` (a step of the graceful shutdown) and waits until each has told this one. */
  private async barrier(t: 'leaving' | 'done', timeoutMs: number): Promise<void> {
    const heard = this.heard[t];
    for (let r = 0; r < this.worldSize; r++) if (r !== this.rank) await this.post(r, { t }).catch(() => {});
    const others = () => this.workerInfos().filter((w) => w.id !== this.rank && !heard.has(w.id));
    await waitUntil(
      this.name,
      () => heard.size === this.worldSize - 1 || this.closed !== undefined,
      this.doneWaiters,
      timeoutMs,
      () =>
        `workers ${others()
          .map((w) => w.name)
          .join(', ')} to shut down too (graceful shutdown, "${t}")`,
    );
  }

  // --- Messages ----------------------------------------------------------------------------------

  private async request(
    rank: number,
    fn: string,
    head: RequestHead,
    values: Record<string, unknown>,
    timeoutMs?: number,
    inContext?: string,
  ): Promise<unknown> {
    const worker = this.workerInfo(rank).name;
    if (this.closed) throw new RpcUnreachableError(worker, fn, this.closed.message, { cause: this.closed });
    // A call, method call or fetch made in a distributed autograd context carries it (dist_autograd.ts).
    const ctx = head.t === 'call' || head.t === 'method' || head.t === 'fetch' ? (inContext ?? this.autograd.current) : undefined;
    const { id, reply } = this.pending.open(rank, worker, fn, timeoutMs ?? this.rpcTimeoutMs, ctx);
    const sink: tf.Tensor[] = [];
    if (ctx !== undefined) this.autograd.sent(ctx, `a:${id}`, rank, sink);
    try {
      await this.post(rank, { ...head, id, ...(ctx === undefined ? {} : { ctx }) } as Head, values, head.t !== 'fork', sink);
    } catch (err) {
      this.pending.settle(id, err instanceof RpcError ? err : new RpcUnreachableError(worker, fn, (err as Error).message, { cause: err }));
    }
    return reply;
  }

  /**
   * Encodes and sends one message to `rank` (to itself through a loopback, as torch allows), after
   * the messages posted to it before (a fetch never overtakes the call that makes the value). Fork
   * requests go at once (`ordered` false): a message being encoded may be waiting for one.
   */
  private post(rank: number, head: Head, values: Record<string, unknown> = {}, ordered = true, tensors?: tf.Tensor[]): Promise<void> {
    const encoded = encodeMessage(head as unknown as Record<string, unknown>, values, this.rrefs, rank, tensors);
    const deliver = async (bytes: Uint8Array) => {
      if (rank === this.rank) queueMicrotask(() => void this.onMessage(rank, bytes));
      else await this.channel.send(rank, bytes);
    };
    if (!ordered) return encoded.then(deliver);
    const sent = (this.order.get(rank) ?? Promise.resolve()).then(() => encoded).then(deliver);
    this.order.set(
      rank,
      sent.catch(() => {}),
    );
    return sent;
  }

  private async onMessage(from: number, bytes: Uint8Array): Promise<void> {
    let msg: ReturnType<typeof decodeMessage>;
    let head: Head;
    try {
      msg = decodeMessage(bytes);
      head = checkHead(msg.head);
    } catch (err) {
      console.warn(`[rpc] dropped a malformed message from rank ${from}: ${(err as Error).message}`);
      return;
    }
    switch (head.t) {
      case 'hello':
        this.workers.heard(from, head.name);
        return this.wake(this.helloWaiters);
      case 'leaving':
      case 'done':
        this.heard[head.t].add(from);
        return this.wake(this.doneWaiters);
      case 'reply':
        return this.onReply(from, head, msg);
      case 'release':
        if (holderOf(head.fork) === from) this.owned.removeFork(head.rref, head.fork);
        return;
      case 'ctx':
        if (creatorOf(head.ctx) === from) this.autograd.close(head.ctx);
        return;
      case 'call':
      case 'method':
      case 'fetch':
      case 'fork':
      case 'grad':
        return this.serve(from, head, msg);
    }
  }

  private onReply(from: number, head: Extract<Head, { t: 'reply' }>, msg: ReturnType<typeof decodeMessage>): void {
    const p = this.pending.from(head.id, from);
    if (!p) return;
    if (head.error) {
      this.pending.settle(head.id, new RpcRemoteError(p.worker, p.fn, head.error.type, head.error.message));
      return;
    }
    // Recorded in the call's own context only: a reply cannot name (and so open) another.
    const ctx = head.ctx !== undefined && head.ctx === p.ctx ? p.ctx : undefined;
    const key = `r:${this.rank}:${head.id}`;
    const onTensor =
      ctx === undefined ? undefined : (t: tf.Tensor, index: number) => this.autograd.received(ctx, t, { worker: from, key, index });
    try {
      this.pending.settle(head.id, { value: msg.value('result', this.rrefs, from, onTensor) });
    } catch (err) {
      this.pending.settle(head.id, new RpcRemoteError(p.worker, p.fn, 'RpcSerializationError', (err as Error).message));
    }
  }

  /** Answers a call, a method call, a fetch or a fork request from `from`. */
  private async serve(from: number, head: Served, msg: ReturnType<typeof decodeMessage>): Promise<void> {
    const count = this.running.get(from) ?? 0;
    if (count >= this.maxCallsPerWorker)
      return this.answer(
        from,
        head.id,
        failure(new RangeError(`${this.name} already runs ${count} calls from this worker (maxCallsPerWorker)`)),
      );
    this.running.set(from, count + 1);
    const inputs: tf.Tensor[] = [];
    let result: { value: unknown } | RemoteFailure;
    try {
      result = { value: await this.handle(from, head, msg, inputs) };
    } catch (err) {
      result = failure(err);
    }
    try {
      await this.answer(from, head.id, result, 'ctx' in head && head.t !== 'grad' ? head.ctx : undefined);
    } finally {
      this.running.set(from, (this.running.get(from) ?? 1) - 1);
      disposeAfterCall([...inputs, ...('value' in result && head.t !== 'fetch' ? tensorsIn(result.value) : [])], undefined);
      if ('value' in result) for (const r of rrefsIn(result.value)) if (this.rrefs.isTransient(r)) r.release();
    }
  }

  private async handle(from: number, head: Served, msg: ReturnType<typeof decodeMessage>, inputs: tf.Tensor[]) {
    // A call runs in its caller's own context only (gradients, which may come from any worker of it, are
    // checked by their keys; a fork names the context of the message it is for); a fetch may join one
    // open here with a reference the context's creator passed on in it (fetchesIn).
    const { ctx } = head as { ctx?: string };
    if (head.t !== 'grad' && head.t !== 'fork' && ctx !== undefined && creatorOf(ctx) !== from)
      if (head.t !== 'fetch' || !this.autograd.has(ctx) || !this.owned.fetchesIn(head.rref, from, ctx))
        throw new RangeError(`rank ${from} may call only in distributed autograd contexts of its own, not ${ctx}`);
    switch (head.t) {
      case 'call': {
        const args = this.argsOf(msg, from, inputs, head);
        const invoke = () => this.functions.invoke(head.fn, args, from);
        return head.rref
          ? this.keep(head.rref, from, inputs, () => this.run(head.ctx, head.fn, invoke))
          : this.run(head.ctx, head.fn, invoke);
      }
      case 'method': {
        this.checkHeld(head.rref, from);
        const args = this.argsOf(msg, from, inputs, head);
        // A value to keep is registered before the wait: the caller's next messages may name it.
        const call = async () => {
          const value = await this.owned.whenReady(head.rref);
          return this.run(head.ctx, head.method, () => this.functions.serving(from, () => callMethod(value, head.method, args)));
        };
        return head.result ? this.keep(head.result, from, inputs, call) : call();
      }
      case 'fetch':
        this.checkHeld(head.rref, from);
        return this.owned.whenReady(head.rref);
      case 'fork':
        // Its creator's fork request may overtake the call that makes the value (forks go at once).
        if (creatorOf(head.rref) === from) await this.owned.created(head.rref, this.rpcTimeoutMs || DEFAULT_RPC_TIMEOUT_MS);
        this.checkHeld(head.rref, from);
        // Bound to the context only when its creator asks: no one else can let a worker into it.
        this.owned.addFork(head.rref, head.fork, from, ctx !== undefined && creatorOf(ctx) === from ? ctx : undefined);
        return null;
      case 'grad': {
        const grad = msg.value('grad', this.rrefs, from);
        if (!(grad instanceof tf.Tensor)) throw new TypeError('a gradient message carries a tensor');
        inputs.push(grad);
        await this.autograd.onGrad(from, head.ctx, head.key, head.index, grad);
        return null;
      }
    }
  }

  /** Keeps what `make` resolves to as the value `v` the caller `from` asked for (remote()); answers null at once. */
  private keep(v: { id: string; fork: string }, from: number, inputs: tf.Tensor[], make: () => Promise<unknown>): null {
    if (creatorOf(v.id) !== from || holderOf(v.fork) !== from)
      throw new RangeError(`rank ${from} may create only RRef ids and forks of its own`);
    // The value outlives the reply: its arguments are disposed when it is made, not now.
    this.owned.make(v.id, v.fork, from, from === this.rank, make, inputs.splice(0));
    return null;
  }

  /** Runs a served function; in a distributed autograd context, records how to recompute it. */
  private async run(ctx: string | undefined, fn: string, invoke: () => unknown): Promise<unknown> {
    const raw = invoke();
    const value = await raw;
    if (ctx !== undefined) this.autograd.served(ctx, fn, invoke, value, value !== raw);
    return value;
  }

  /** A call's arguments; in a context, each tensor becomes the context's variable, recorded with where it came from. */
  private argsOf(msg: ReturnType<typeof decodeMessage>, from: number, inputs: tf.Tensor[], head: { id: number; ctx?: string }): unknown[] {
    const { ctx } = head;
    const key = `a:${head.id}`;
    const onTensor =
      ctx === undefined ? undefined : (t: tf.Tensor, index: number) => this.autograd.received(ctx, t, { worker: from, key, index });
    const args = msg.value('args', this.rrefs, from, onTensor);
    if (!Array.isArray(args)) throw new TypeError('a call\'s "args" is a list');
    inputs.push(...tensorsIn(args));
    if (ctx !== undefined) this.autograd.bindArguments(ctx, rrefsIn(args));
    return args;
  }

  private checkHeld(id: string, from: number): void {
    if (!this.owned.heldBy(id, from)) throw new RangeError(`worker ${this.workerInfo(from).name} holds no reference to RRef ${id} here`);
  }

  private async answer(to: number, id: number, result: { value: unknown } | RemoteFailure, ctx?: string): Promise<void> {
    try {
      if ('value' in result) {
        const sink: tf.Tensor[] = [];
        if (ctx !== undefined) this.autograd.sent(ctx, `r:${to}:${id}`, to, sink);
        await this.post(to, { t: 'reply', id, ...(ctx === undefined ? {} : { ctx }) }, { result: result.value }, true, sink);
      } else await this.post(to, { t: 'reply', id, error: result.error });
    } catch (err) {
      // A result that cannot be sent (not serializable, too large) is the caller's error.
      if (this.closed) return;
      await this.post(to, { t: 'reply', id, error: failure(err).error }).catch(() => {});
    }
  }

  private workerName(rank: number): string {
    return this.workers.complete || rank === this.rank ? this.workerInfo(rank).name : `rank ${rank}`;
  }

  // --- Helpers -----------------------------------------------------------------------------------

  private close(err: Error): void {
    if (this.closed) return;
    this.closed = err;
    this.pending.failAll(err);
    this.wake(this.helloWaiters);
    this.wake(this.doneWaiters);
  }

  private wake(waiters: Array<() => void>): void {
    for (const w of waiters.splice(0)) w();
  }
}
