/**
 * Distributed autograd (torch.distributed.autograd): in a context, every tensor that crosses to
 * another worker in a call's arguments, a reply's result or an RRef fetch is recorded at both
 * ends, and `backward(contextId, lossFn)` sends the gradients back along those crossings to the
 * workers where the tensors came from, down to the parameters where they live. Each worker keeps
 * the gradients of its own variables per context (`getGradients`), for DistributedOptimizer.
 *
 * How, in TF.js: a tensor received in a context becomes a variable of the context on the
 * receiving worker, so that a gradient with respect to it can be taken (`tf.variableGrads`). TF.js
 * records no graph that outlives a call, so a worker's part of the backward pass recomputes the
 * forward of each call it served, with the variables it received, under `tf.variableGrads` (as
 * activation checkpointing does): a function called in a context must be deterministic (a
 * module's forward is). One that awaits (an RRef's toHere() in its forward, as torch's pipeline
 * tutorial's shards do) is recomputed with the engine's tape open across its awaits
 * (async_grads.ts), its fetches answered from the context: in a context, toHere() of one RRef
 * fetches once, and an RRef that arrived in a call's arguments fetches in that call's context.
 * Gradients are linear in their
 * upstream gradient, so each one arriving is carried back on its own and the parameters' sum is
 * the whole gradient: a worker reached twice, or a parameter used on two workers, sums both.
 */
import * as tf from '@tensorflow/tfjs';
import { tensorsIn } from './call_values.ts';
import { asyncVariableGrads } from './async_grads.ts';
import { RpcLimitError } from './errors.ts';
import { creatorOf } from './owner_table.ts';

/** Where a received tensor came from: the worker, the message key there, its index in the message. */
export interface Origin {
  worker: number;
  key: string;
  index: number;
}

interface Served {
  /** Recomputes the call's result from the variables it received. */
  run: () => unknown;
  fn: string;
  async: boolean;
}

class AutogradContext {
  /** The gradients of this worker's variables in the context, summed. */
  readonly grads = new Map<tf.Variable, tf.Tensor>();
  readonly origins = new Map<tf.Tensor, Origin>();
  readonly producers = new Map<tf.Tensor, { served: Served; index: number }>();
  /** What this worker sent under each key: to whom, and the tensors in message order. */
  readonly sent = new Map<string, { to: number; tensors: tf.Tensor[] }>();
  readonly received: tf.Variable[] = [];
  /** Received tensors without gradients, kept for recomputing. */
  readonly held: tf.Tensor[] = [];
  readonly peers = new Set<number>();
  /** RRef fetches made in the context, by RRef object: each fetches once (a recompute reads the same). */
  readonly fetches = new Map<object, Promise<unknown>>();

  constructor(readonly id: string) {}

  dispose(): void {
    for (const v of this.received) v.dispose();
    for (const t of this.held) t.dispose();
    for (const g of this.grads.values()) g.dispose();
    this.grads.clear();
  }
}

/** What the engine needs of the agent. */
export interface AutogradTransport {
  readonly rank: number;
  /** Sends `grad` for tensor `index` of message `key` of worker `to`; resolves once `to` carried it back. */
  sendGrad(to: number, context: string, key: string, index: number, grad: tf.Tensor): Promise<unknown>;
  /** Tells `to` that the context ended. */
  releaseContext(to: number, context: string): void;
  /** A rank's worker name, for errors. */
  workerName(rank: number): string;
}

/** Contexts one worker's calls may open at once on another (a bound on what each caller can make it keep). */
export const DEFAULT_MAX_CONTEXTS = 1024;

export class DistAutograd {
  private readonly contexts = new Map<string, AutogradContext>();
  /** Open contexts by the rank that opened them: each caller has its own bound. */
  private readonly perCreator = new Map<number, number>();
  /** RRefs that arrived in the arguments of a call in a context: their toHere() fetches in it. */
  private readonly argContexts = new WeakMap<object, string>();
  private active: string | undefined;
  private next = 1;

  constructor(
    private readonly t: AutogradTransport,
    private readonly maxContexts = DEFAULT_MAX_CONTEXTS,
  ) {}

  /** The context this page's calls run in now, if any. */
  get current(): string | undefined {
    return this.active;
  }

  /**
   * torch's `with dist_autograd.context() as context_id`: runs `body` in a new context, then ends
   * it on every worker it reached. One context at a time per page.
   */
  async context<T>(body: (contextId: string) => Promise<T>): Promise<T> {
    if (this.active !== undefined) throw new Error(`distributed autograd context ${this.active} is still open: one at a time per page`);
    const id = `${this.t.rank}.${this.next++}`;
    const ctx = this.open(id);
    this.active = id;
    try {
      return await body(id);
    } finally {
      this.active = undefined;
      this.close(id);
      for (const peer of ctx.peers) this.t.releaseContext(peer, id);
    }
  }

  /** The context `id` on this worker, made at its first message here, charged to the rank that opened it. */
  open(id: string): AutogradContext {
    let ctx = this.contexts.get(id);
    if (!ctx) {
      const creator = creatorOf(id);
      const n = this.perCreator.get(creator) ?? 0;
      if (n >= this.maxContexts)
        throw new RpcLimitError(
          this.t.workerName(this.t.rank),
          this.t.workerName(creator),
          'maxAutogradContexts',
          this.maxContexts,
          'distributed autograd contexts',
          'end its contexts (distAutograd.context returns) before opening more, or raise maxAutogradContexts',
        );
      this.perCreator.set(creator, n + 1);
      ctx = new AutogradContext(id);
      this.contexts.set(id, ctx);
    }
    return ctx;
  }

  /** Whether context `id` is open on this worker. */
  has(id: string | undefined): id is string {
    return id !== undefined && this.contexts.has(id);
  }

  close(id: string): void {
    const ctx = this.contexts.get(id);
    if (!ctx) return;
    ctx.dispose();
    this.contexts.delete(id);
    const creator = creatorOf(id);
    const n = (this.perCreator.get(creator) ?? 1) - 1;
    if (n > 0) this.perCreator.set(creator, n);
    else this.perCreator.delete(creator);
  }

  /** RRefs that arrived in the arguments of a call in context `id`. */
  bindArguments(id: string, rrefs: object[]): void {
    for (const r of rrefs) this.argContexts.set(r, id);
  }

  /** The context an RRef's toHere() fetches in: this page's open one, or the one of the call that brought the RRef, while open. */
  contextFor(rref: object): string | undefined {
    const bound = this.argContexts.get(rref);
    return this.active ?? (this.has(bound) ? bound : undefined);
  }

  /** An RRef fetch in context `id`: made once per RRef object (a recompute of the call that made it reads the same tensors). */
  fetchOnce(id: string, rref: object, fetch: () => Promise<unknown>): Promise<unknown> {
    const ctx = this.open(id);
    let fetched = ctx.fetches.get(rref);
    if (!fetched) {
      fetched = fetch();
      ctx.fetches.set(rref, fetched);
    }
    return fetched;
  }

  /** This worker sent `tensors` under `key` to `to` in context `id`. */
  sent(id: string, key: string, to: number, tensors: tf.Tensor[]): void {
    const ctx = this.open(id);
    ctx.peers.add(to);
    ctx.sent.set(key, { to, tensors });
  }

  /**
   * A tensor received in context `id`: a float32 one becomes a variable of the context, recorded
   * with its origin (takes `t`); an int32 or bool one (indices, masks) has no gradient: it is kept
   * as it is until the context ends (a served call's backward recomputes with it).
   */
  received(id: string, t: tf.Tensor, origin: Origin): tf.Tensor {
    const ctx = this.open(id);
    ctx.peers.add(origin.worker);
    if (t.dtype !== 'float32') {
      ctx.held.push(tf.keep(t));
      return t;
    }
    const v = tf.variable(t, true, `rpc_ctx_${id}_${origin.worker}_${origin.key}_${origin.index}`.replace(/[^A-Za-z0-9_]/g, '_'));
    t.dispose();
    ctx.received.push(v);
    ctx.origins.set(v, origin);
    return v;
  }

  /** A call served in context `id`: how to recompute it, and the tensors of its result. */
  served(id: string, fn: string, run: () => unknown, result: unknown, async: boolean): void {
    const ctx = this.open(id);
    const served = { run, fn, async };
    for (const [index, t] of tensorsIn(result).entries()) ctx.producers.set(t, { served, index });
  }

  /** The gradients of this worker's variables in context `id` (torch's get_gradients). */
  getGradients(id: string): Map<tf.Variable, tf.Tensor> {
    const ctx = this.contexts.get(id);
    if (!ctx) throw new RangeError(`no distributed autograd context ${id} on this worker`);
    return new Map(ctx.grads);
  }

  /**
   * torch's dist_autograd.backward(context_id, [loss]): `lossFn` computes the loss, synchronously,
   * from tensors received in the context and this worker's variables; the gradients go back to
   * every worker the forward pass reached. Resolves with the loss once every worker is done.
   */
  async backward(id: string, lossFn: () => tf.Scalar): Promise<number> {
    const ctx = this.contexts.get(id);
    if (!ctx) throw new RangeError(`no distributed autograd context ${id} on this worker`);
    const { value, grads } = tf.variableGrads(lossFn);
    const loss = (await value.data())[0]!;
    value.dispose();
    await this.carry(ctx, grads);
    return loss;
  }

  /** A gradient from `from` for tensor `index` this worker sent under `key`: carried back from here. */
  async onGrad(from: number, id: string, key: string, index: number, grad: tf.Tensor): Promise<void> {
    const ctx = this.contexts.get(id);
    const sent = ctx?.sent.get(key);
    if (!ctx || !sent || sent.to !== from || index >= sent.tensors.length)
      throw new RangeError(
        `a gradient for tensor ${index} of message ${key} in context ${id}, which this worker did not send to that worker`,
      );
    await this.propagate(ctx, sent.tensors[index]!, grad);
  }

  private async propagate(ctx: AutogradContext, t: tf.Tensor, grad: tf.Tensor): Promise<void> {
    const origin = ctx.origins.get(t);
    if (origin) return void (await this.t.sendGrad(origin.worker, ctx.id, origin.key, origin.index, grad));
    const made = ctx.producers.get(t);
    if (made) return this.recompute(ctx, made.served, made.index, grad);
    if (t instanceof tf.Variable && t.trainable) {
      const old = ctx.grads.get(t);
      ctx.grads.set(t, old ? tf.tidy(() => old.add(grad)) : grad.clone());
      old?.dispose();
    }
  }

  /** One served call's share of the backward pass: its forward again, under variableGrads, with `dy` at output `index`. */
  private async recompute(ctx: AutogradContext, served: Served, index: number, dy: tf.Tensor): Promise<void> {
    const output = (result: unknown) => {
      const out = tensorsIn(result)[index];
      if (!out) throw new RangeError(`"${served.fn}" returned fewer tensors when recomputed: it must be deterministic`);
      return tf.sum(tf.mul(out, dy)) as tf.Scalar;
    };
    let grads: tf.NamedTensorMap = {};
    try {
      // A function that awaits (an RRef's toHere()) is recomputed with the tape open across its awaits.
      grads = served.async
        ? await asyncVariableGrads(async () => served.run(), output, disposeRecomputed)
        : tf.variableGrads(() => output(served.run())).grads;
    } catch (err) {
      // No variable reaches the output: nothing to carry back.
      if (!/Cannot find a connection between any variable/.test((err as Error).message)) throw err;
    }
    await this.carry(ctx, grads);
  }

  private async carry(ctx: AutogradContext, grads: tf.NamedTensorMap): Promise<void> {
    const variables = tf.engine().registeredVariables;
    try {
      await Promise.all(Object.entries(grads).map(([name, g]) => this.propagate(ctx, variables[name]!, g)));
    } finally {
      tf.dispose(Object.values(grads));
    }
  }
}

/** A recomputed result's tensors, once its gradients are taken (variables and kept tensors stay). */
function disposeRecomputed(result: unknown): void {
  for (const t of tensorsIn(result)) if (!(t instanceof tf.Variable) && !t.kept && !t.isDisposed) t.dispose();
}
