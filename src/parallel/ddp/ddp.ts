/**
 * DistributedDataParallel for a TF.js LayersModel, with torch's semantics:
 * - at creation, checks that every rank's parameters have the same shapes (an error names the
 *   first mismatch and the ranks) and broadcasts rank 0's weights;
 * - `backward` computes this rank's gradients and averages them across ranks with all-reduces
 *   over buckets (torch's defaults: first bucket 1 MiB, then 25 MiB; parameters in reverse
 *   order; the same buckets on every rank), overlapping each bucket's all-reduce with the next
 *   bucket's readback from the device;
 * - `noSync(fn)` accumulates gradients locally; the next synchronised backward all-reduces the
 *   sum (gradient accumulation);
 * - `step(optimizer)` applies the averaged gradients (torch's optimizer.step + zero_grad); with a
 *   host optimizer (optim.ts: SGD, Adam, AdamW with torch's formulas) the update runs on a float32
 *   master copy of the weights in JavaScript and the result is uploaded, so that ranks on
 *   different backends (WebGPU, WebGL, wasm, cpu; Chromium, Firefox) keep bit-identical weights;
 *   a TF.js optimizer updates on the device, with that backend's arithmetic;
 * - `setBatchShare(samples, globalSamples)`: ranks with uneven batches (a slow device gets fewer
 *   samples) weigh their gradients by their share, so that the average is the global batch's
 *   gradient, as one rank at the global batch would compute it (torch's DDP needs equal batches);
 * - `backward(localGradients)` takes gradients this rank computed elsewhere, on its DataParallel
 *   devices (torch's DDP over a multi-device module), instead of a loss function;
 * - `registerCommHook(hook)` (torch's register_comm_hook) replaces each bucket's all-reduce with
 *   the hook's reduction (comm_hooks/: fp16 and bf16 compression, PowerSGD, ...); without one,
 *   `allreduceHook()` is the plain float32 all-reduce;
 * - with `errorIfNonfinite` (the default), a backward whose averaged gradients hold a NaN or an infinity fails
 *   with NonFiniteGradientError on every rank (they all hold the same averages) and drops them;
 * - `options.aggregation` (robust/): a robust kind (trimmed mean, median, centered clipping)
 *   gathers every rank's own gradient and aggregates it alike on every rank instead of averaging,
 *   so that a member's hostile gradient does not move every replica; `lastAggregation` judges
 *   each rank's contribution.
 * Every rank applies bit-identical gradients to bit-identical weights: replicas stay identical
 * (`verifyReplicas` in replicas.ts checks that they do).
 *
 * Beside this module: buckets.ts (the buckets: assignment, layout, filling), ddp_types.ts (the
 * options and a backward's result), device_gradients.ts (gradients on the device), shapes.ts
 * (the shape check), hook.ts (the hook slot), carry.ts (values carried on the sum), robust/
 * (robust aggregation and, for measuring it, attacks).
 */
import type * as tf from '@tensorflow/tfjs';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { flatTrainableWeights, verifyReplicas, weightsHash } from '../replicas.ts';
import { NonFiniteGradientError } from '../../wire/errors.ts';
import { isPlainAllreduce } from '../comm_hooks/default_hooks.ts';
import type { CommHook, CommHookState, GradBucket, LoadCommHookStateOptions } from '../comm_hooks/types.ts';
import type { LocalGradients } from '../data_parallel/data_parallel.ts';
import { HostOptimizer, type ParamLayout } from '../../nn/optim.ts';
import { assignFlatWeights, hostWeights } from '../replicas.ts';
import { allFinite } from '../../wire/finite.ts';
import { assignBuckets, bucketParameters, firstNonfinite, type Bucket } from './buckets.ts';
import type { BackwardOptions, BackwardResult, BackwardTimings, DDPOptions } from './ddp_types.ts';
import { checkShapes } from './shapes.ts';
import { CarriedValues } from './carry.ts';
import { HookSlot } from './hook.ts';
import type { AggregationSpec } from '../robust/aggregators.ts';
import type { AggregationReport } from '../robust/reducer.ts';
import { DDPAggregation } from '../robust/ddp_aggregation.ts';
import { applyOnDevice, lossGradients, readBuckets, type BucketPass } from './device_gradients.ts';

export { assignBuckets, type Bucket } from './buckets.ts';
export type { BackwardOptions, BackwardResult, BackwardTimings, DDPOptions } from './ddp_types.ts';
export { ShapeMismatchError } from './shapes.ts';

export class DistributedDataParallel {
  readonly model: tf.LayersModel;
  readonly pg: ProcessGroup;
  readonly buckets: Bucket[];
  private readonly variables: tf.Variable[];
  private readonly sizes: number[];
  private readonly numel: number;
  /** Accumulated local gradients (noSync) and, after a synchronised backward, the averages. */
  private readonly grad: Float32Array;
  private hasGrad = false;
  private syncing = true;
  private readonly errorIfNonfinite: boolean;
  /** The hook reducing each bucket (ddp_hook.ts); the plain all-reduce until one is registered. */
  private readonly hooks = new HookSlot();
  /** Synchronised backwards started (the last one's step number is `startStep - 1 + syncs`). */
  private syncs = 0;
  private readonly startStep: number;
  /** Bytes sent by the synchronised backwards' reductions, in total, and how many backwards finished them (for `bytesPerStep`). */
  private commBytesTotal = 0;
  private commSteps = 0;
  /** The buckets as hooks see them, made once (every step reuses the parameters' layout). */
  private readonly layouts: Array<GradBucket['parameters']>;
  /** Each parameter's span of the flat buffers, for host optimizers. */
  private readonly paramLayout: ParamLayout[];
  /** This rank's gradient weight for uneven batches: samples * worldSize / globalSamples (1: equal batches). */
  private gradientScale = 1;
  /** The last backward's timings (the elastic runner balances batches by them). */
  private lastTimingsValue: BackwardTimings | null = null;
  /** Values to ride on the next synchronised backward's last reduction (carry), and their sums once it ran. */
  private readonly carried = new CarriedValues();
  /** `options.aggregation` and `options.attack`: robust/ddp_aggregation.ts. */
  private readonly combine: DDPAggregation;
  /** Whether a robust kind gathers and aggregates the gradients (else the mean, by bucketed all-reduces). */
  private readonly robust: boolean;

  private constructor(model: tf.LayersModel, pg: ProcessGroup, options: DDPOptions) {
    this.model = model;
    this.pg = pg;
    // Match ranks by position in trainableWeights, never by name: names carry per-page counters.
    this.variables = model.trainableWeights.map((w) => w.read() as tf.Variable);
    this.sizes = model.trainableWeights.map((w) => w.shape.reduce<number>((a, b) => a * (b ?? 1), 1));
    this.numel = this.sizes.reduce((a, b) => a + b, 0);
    this.grad = new Float32Array(this.numel);
    const mib = 1 << 20;
    this.buckets = assignBuckets(this.sizes, (options.firstBucketCapMB ?? 1) * mib, (options.bucketCapMB ?? 25) * mib);
    this.errorIfNonfinite = options.errorIfNonfinite ?? true;
    const startStep = options.startStep ?? 1;
    if (!Number.isSafeInteger(startStep) || startStep < 1) throw new RangeError(`startStep must be a positive integer, got ${startStep}`);
    this.startStep = startStep;
    this.paramLayout = this.sizes.map((size, i) => ({
      shape: model.trainableWeights[i]!.shape.map((d) => d ?? 1),
      offset: this.sizes.slice(0, i).reduce((a, b) => a + b, 0),
      size,
    }));
    const shapes = model.trainableWeights.map((w) => w.shape.map((d) => d ?? 1));
    this.layouts = this.buckets.map((b) => bucketParameters(b, shapes, this.sizes));
    this.combine = new DDPAggregation(options, pg.rank, pg.worldSize);
    this.robust = this.combine.reducer !== null;
  }

  /** Wraps `model`: checks shapes across ranks and broadcasts rank 0's weights (unless `initSync` is false). */
  static async create(model: tf.LayersModel, pg: ProcessGroup, options: DDPOptions = {}): Promise<DistributedDataParallel> {
    const ddp = new DistributedDataParallel(model, pg, options);
    if (options.initSync ?? true) {
      await checkShapes(pg, model, options.name ?? 'ddp');
      await ddp.broadcastWeights(0);
    }
    return ddp;
  }

  get parameterCount(): number {
    return this.numel;
  }

  /**
   * Makes `hook` reduce each bucket's gradients from the next synchronised backward on, in place
   * of the plain all-reduce (torch's `register_comm_hook`). Every rank must register the same
   * kind of hook. Once only, before the first backward: a second registration, or one after
   * gradients were synchronised, throws.
   */
  registerCommHook(hook: CommHook): void {
    this.hooks.register(hook, this.syncs, (h) => this.combine.checkHook(h));
  }

  /** The hook reducing the buckets: the registered one, else the default `allreduceHook()`. */
  get commHook(): CommHook {
    return this.hooks.hook;
  }

  /** The hook's state (error feedback, warm starts, ...) for a checkpoint or a joiner; null for a hook without state. */
  commHookState(): CommHookState | null {
    return this.hooks.state();
  }

  /**
   * Restores what `commHookState()` gave (on every rank, so that they reduce alike). Throws if the
   * state is another hook's. `options.otherRank`: the state is another rank's (a joiner's warm
   * start, rank 0's checkpoint on another rank): the hook takes only what is the same on every
   * rank (see LoadCommHookStateOptions).
   */
  loadCommHookState(state: CommHookState, options?: LoadCommHookStateOptions): void {
    this.hooks.load(state, options);
  }

  /** Synchronised backwards so far (the optimizer steps DDP averaged gradients for). */
  get syncedSteps(): number {
    return this.syncs;
  }

  /**
   * Bytes this rank sent per synchronised backward for its reductions (`BackwardResult.commBytes`),
   * averaged over the backwards whose reductions finished (0 before the first).
   */
  get bytesPerStep(): number {
    return this.commSteps === 0 ? 0 : this.commBytesTotal / this.commSteps;
  }

  /**
   * Computes gradients of `lossFn` for this rank's batch and, unless inside `noSync`, averages
   * the (accumulated) gradients across ranks. Returns the loss and where the time went.
   * Given `LocalGradients` instead (the flat gradients of this rank's batch, computed by a
   * DataParallel's devices), averages those: the loss and compute time are theirs, and nothing
   * is read back.
   */
  async backward(lossFn: (() => tf.Scalar) | LocalGradients, options: BackwardOptions = {}): Promise<BackwardResult> {
    if (typeof lossFn !== 'function') return this.reduceGradients(lossFn, options);
    // No samples this step (balanced batches gave them to faster ranks): nothing to compute; the
    // rank still takes part in the reductions, with zeros, and receives the averages.
    if (this.gradientScale === 0) {
      if (options.inputs && options.inputs.length > 0)
        throw new Error(
          'backward with inputs needs samples: a rank with no samples (setBatchShare(0, ...)) has no inputs to differentiate',
        );
      return this.reduceGradients({ grads: new Float32Array(this.numel), loss: 0, computeMs: 0 }, {});
    }
    const t0 = performance.now();
    const { loss, grads, inputGrads } = await lossGradients(lossFn, this.variables, options.inputs ?? []);
    const t1 = performance.now();
    const syncing = this.syncing;
    const step = syncing ? this.startStep + this.syncs++ : 0;
    const carriedValues = syncing ? this.carried.pending : 0;
    const sentBefore = this.pg.bytesSent();
    let pass: BucketPass;
    try {
      const bucketed = { buckets: this.buckets, variables: this.variables, sizes: this.sizes, grad: this.grad, accumulate: this.hasGrad };
      // Under the mean, each bucket's reduction starts as soon as it is read back.
      const reduce =
        syncing && !this.robust ? (p: BucketPass, index: number, view: Float32Array) => this.startReduction(p, index, view, step) : null;
      pass = await readBuckets(bucketed, grads, t1 - t0, options.straggler, reduce);
    } catch (err) {
      for (const g of inputGrads) g.dispose();
      throw err;
    } finally {
      for (const g of Object.values(grads)) g.dispose();
    }
    this.hasGrad = true;
    const w0 = performance.now();
    try {
      await Promise.all(pass.reductions);
      if (syncing && this.robust) {
        pass.commStart = w0;
        if (!(await this.reduceRobustly(step)) && this.errorIfNonfinite) pass.nonfinite.push(...this.buckets);
        pass.commEnd = performance.now();
      }
    } catch (err) {
      for (const g of inputGrads) g.dispose();
      throw err;
    }
    // The wait ends when the last reduction landed, not when this continuation ran: on a busy page
    // the event loop's delay after that is not communication (and the span would not cover it).
    const communicated = pass.reductions.length > 0 || (syncing && this.robust);
    const waiting = (communicated ? Math.max(pass.commEnd, w0) : performance.now()) - w0;
    const commBytes = syncing ? this.countComm(sentBefore) : 0;
    if (pass.nonfinite.length > 0) {
      for (const g of inputGrads) g.dispose();
      this.dropNonfinite(pass.nonfinite);
    }
    const comm = communicated ? pass.commEnd - pass.commStart : 0;
    const timings = { compute: t1 - t0, readback: pass.readback, allreduce: waiting, slowed: pass.slowed, comm };
    this.lastTimingsValue = timings;
    return { loss, timings, commBytes, carriedValues, inputGrads };
  }

  /** Starts bucket `index`'s reduction (its share weighed, an attack applied when measuring one), noting when it lands. */
  private startReduction(pass: BucketPass, index: number, view: Float32Array, step: number): void {
    this.scaleForShare(view);
    this.attackOwn(view, step, index);
    if (pass.reductions.length === 0) pass.commStart = performance.now();
    // The finiteness check counts as communication: the span then still covers the wait.
    const reduced = this.reduceBucket(index, view, step).then((avg) => {
      if (this.errorIfNonfinite && !allFinite(avg)) pass.nonfinite.push(this.buckets[index]!);
      pass.commEnd = Math.max(pass.commEnd, performance.now());
      return avg;
    });
    pass.reductions.push(reduced);
  }

  /** Counts the bytes a synchronised backward's reductions sent since `sentBefore` (for `bytesPerStep`); returns them. */
  private countComm(sentBefore: number): number {
    const commBytes = this.pg.bytesSent() - sentBefore;
    this.commBytesTotal += commBytes;
    this.commSteps++;
    return commBytes;
  }

  /**
   * Drops the gradients and throws NonFiniteGradientError naming the first parameter of
   * `nonfinite` (buckets whose averages hold a NaN or an infinity). Every rank holds the same
   * averages, so every rank names the same parameter; dropping the gradients makes a later
   * step() refuse rather than apply them.
   */
  private dropNonfinite(nonfinite: Bucket[]): never {
    this.refuse(firstNonfinite(nonfinite, this.grad, this.sizes));
  }

  /** Drops the gradients and throws NonFiniteGradientError naming parameter `index`. */
  private refuse(index: number): never {
    this.zeroGrad();
    throw new NonFiniteGradientError(this.pg.rank, this.model.trainableWeights[index]!.originalName, index);
  }

  /** `backward` for gradients computed elsewhere (see LocalGradients): accumulated, then each bucket reduced. */
  private async reduceGradients(local: LocalGradients, options: BackwardOptions): Promise<BackwardResult> {
    if (options.inputs && options.inputs.length > 0)
      throw new Error('backward(localGradients) takes no inputs: their gradients must come with the loss function');
    if (!(local.grads instanceof Float32Array) || local.grads.length !== this.numel) {
      throw new RangeError(
        `backward(localGradients): ${local.grads instanceof Float32Array ? `${local.grads.length} gradient values` : 'no Float32Array of gradients'}, the model has ${this.numel} trainable values`,
      );
    }
    let slowed = 0;
    // A straggler waits in proportion to the devices' compute, before the first reduction.
    if (options.straggler) slowed = await options.straggler.after(local.computeMs);
    if (this.hasGrad) for (let i = 0; i < this.numel; i++) this.grad[i] += local.grads[i]!;
    else this.grad.set(local.grads);
    this.hasGrad = true;
    const timings = { compute: local.computeMs, readback: 0, allreduce: 0, slowed, comm: 0 };
    if (!this.syncing) return { loss: local.loss, timings, commBytes: 0, carriedValues: 0, inputGrads: [] };
    const step = this.startStep + this.syncs++;
    const carriedValues = this.carried.pending;
    this.lastTimingsValue = timings;
    if (!this.robust) {
      this.scaleForShare(this.grad);
      this.attackOwn(this.grad, step, 0);
    }
    const sentBefore = this.pg.bytesSent();
    const w0 = performance.now();
    const reductions = this.robust
      ? []
      : this.buckets.map((bucket, index) => this.reduceBucket(index, this.grad.subarray(bucket.start, bucket.end), step));
    const averaged = await Promise.all(reductions);
    const robustFinite = this.robust ? await this.reduceRobustly(step) : true;
    const commEnd = performance.now();
    timings.allreduce = commEnd - w0;
    timings.comm = reductions.length > 0 || this.robust ? commEnd - w0 : 0;
    const commBytes = this.countComm(sentBefore);
    if (this.errorIfNonfinite) {
      const nonfinite = this.robust ? (robustFinite ? [] : this.buckets) : this.buckets.filter((_, i) => !allFinite(averaged[i]!));
      if (nonfinite.length > 0) this.dropNonfinite(nonfinite);
    }
    return { loss: local.loss, timings, commBytes, carriedValues, inputGrads: [] };
  }

  /**
   * Lets `values` ride on the next synchronised backward: its last bucket is all-reduced as one
   * 'sum' of [bucket, values] and the bucket divided by the world size after (the same bits as the
   * plain 'avg'), so small per-step figures (runElastic's vote) cost no meeting of their own.
   * `takeCarried()` then answers the values' sums over the ranks. Only with the plain all-reduce
   * (no hook, or `allreduceHook()`): with another hook nothing is carried and this returns false.
   * Every rank must carry the same number of values at the same backward.
   */
  carry(values: Float32Array): boolean {
    this.combine.checkCarry();
    const plain = isPlainAllreduce(this.hooks.hook) && this.buckets.length > 0;
    this.carried.set(plain ? values : null);
    return plain;
  }

  /**
   * The sums over ranks of what `carry` gave, once a synchronised backward carried them; null when
   * none has since (a step without a backward, or inside `noSync`). Clears what was carried and
   * anything still waiting to be, so values never ride on a later step than the one they were for.
   */
  takeCarried(): Float32Array | null {
    return this.carried.take();
  }

  /**
   * Bucket `index`'s reduction by the hook: called at once (so the collectives it issues before
   * its first await keep bucket order on every rank), its result copied into the bucket unless
   * the hook reduced in place.
   */
  private async reduceBucket(index: number, view: Float32Array, step: number): Promise<Float32Array> {
    const bucket: GradBucket = { index, buffer: view, parameters: this.layouts[index]!, step, isLast: index === this.buckets.length - 1 };
    if (bucket.isLast && this.carried.pending > 0) {
      await this.carried.reduceWith(this.pg, view);
      return view;
    }
    return this.hooks.reduce(this.pg, bucket);
  }

  /** Runs `fn` with gradient synchronisation off: backward calls only accumulate locally. */
  async noSync<T>(fn: () => Promise<T>): Promise<T> {
    const previous = this.syncing;
    this.syncing = false;
    try {
      return await fn();
    } finally {
      this.syncing = previous;
    }
  }

  /**
   * This rank trains `samples` of the step's `globalSamples` (the sum over ranks): from the next
   * synchronised backward on, its gradients (the mean over its own samples) are weighted by
   * samples * worldSize / globalSamples before the averaging, so that the average is the mean over
   * the global batch. Equal batches (torch's case) weigh 1. A share of 0 samples: `backward` computes
   * nothing (the loss function is not called), takes part in the reductions with zeros and
   * returns loss 0. Every rank sets its own share; the
   * shares must add up to `globalSamples`. A hook with `localSteps` (DiLoCo) gets the rank's
   * own mean unweighted.
   */
  setBatchShare(samples: number, globalSamples: number): void {
    if (
      !Number.isSafeInteger(samples) ||
      !Number.isSafeInteger(globalSamples) ||
      samples < 0 ||
      globalSamples < 1 ||
      samples > globalSamples
    ) {
      throw new RangeError(
        `setBatchShare: samples must be an integer in 0..globalSamples and globalSamples a positive integer, got ${samples} of ${globalSamples}`,
      );
    }
    this.gradientScale = (samples * this.pg.worldSize) / globalSamples;
  }

  /** Where the last backward's time went (null before the first). */
  get lastTimings(): BackwardTimings | null {
    return this.lastTimingsValue;
  }

  private scaleForShare(values: Float32Array): void {
    const scale = this.gradientScale;
    // A hook whose steps are local takes this rank's own mean (DiLoCo weighs its pseudo-gradients by samples).
    if (scale === 1 || this.hooks.hook.localSteps === true) return;
    for (let i = 0; i < values.length; i++) values[i] = values[i]! * scale;
  }

  /**
   * Applies the averaged gradients with `optimizer` and clears them (step + zero_grad). A host
   * optimizer (optim.ts) updates the float32 master copy of the weights and uploads it: the same
   * bits on every backend. The update is done when this returns, unless the weights were written
   * by something else since the last step (then the master copy is read back first): await it.
   */
  step(optimizer: tf.Optimizer): Promise<void> {
    if (!this.hasGrad) throw new Error('step() before backward(): there are no gradients to apply');
    if (optimizer instanceof HostOptimizer) {
      const master = hostWeights(this.model);
      if (master) {
        this.stepOnHost(optimizer, master);
        return Promise.resolve();
      }
      return flatTrainableWeights(this.model).then((flat) => this.stepOnHost(optimizer, flat));
    }
    applyOnDevice(optimizer, this.variables, this.grad, this.sizes);
    this.zeroGrad();
    return Promise.resolve();
  }

  private stepOnHost(optimizer: HostOptimizer, master: Float32Array): void {
    optimizer.stepFlat(master, this.grad, this.paramLayout);
    assignFlatWeights(this.model, master);
    this.zeroGrad();
  }

  /** Clears the gradients (torch's zero_grad): none to apply until the next backward. */
  private zeroGrad(): void {
    this.grad.fill(0);
    this.hasGrad = false;
  }

  /** All trainable weights, flattened in `model.trainableWeights` order. */
  async flatWeights(): Promise<Float32Array> {
    return flatTrainableWeights(this.model);
  }

  /** A fingerprint of this replica's weights: equal on every rank when replicas are identical. */
  async weightsHash(): Promise<string> {
    return weightsHash(this.model);
  }

  /** Collective: throws ReplicaDivergenceError on every rank if the replicas' weights differ (see verifyReplicas). */
  async verifyReplicas(): Promise<string> {
    return verifyReplicas(this.pg, this.model);
  }

  /** Sets every rank's weights to rank `src`'s (DDP does this once, from rank 0, at creation). */
  async broadcastWeights(src: number): Promise<void> {
    const flat = await this.flatWeights();
    await this.pg.broadcast(flat, src);
    // Also the host master copy that host optimizers update.
    assignFlatWeights(this.model, flat);
  }

  /** How the gradients are combined (`options.aggregation`): the mean unless asked. */
  get aggregation(): AggregationSpec {
    return this.combine.spec;
  }

  /** The last synchronised backward's robust aggregation (each rank's contribution judged); null under the mean or before the first. */
  get lastAggregation(): AggregationReport | null {
    return this.combine.last;
  }

  private attackOwn(values: Float32Array, step: number, part: number): void {
    this.combine.attackOwn(values, this.pg.rank, step, part, this.gradientScale !== 0);
  }

  /**
   * The robust step (robust/ddp_aggregation.ts): `grad` becomes the aggregate of every rank's
   * own gradient. Resolves with whether it is finite; when no rank's gradient was usable, drops
   * the gradients and throws NonFiniteGradientError naming the first refused one's parameter.
   */
  private async reduceRobustly(step: number): Promise<boolean> {
    const outcome = await this.combine.reduce(this.pg, this.grad, this.gradientScale !== 0, step);
    if (outcome.kind === 'aggregated') return outcome.finite;
    let index = 0;
    for (let at = this.sizes[0]!; at <= outcome.index; at += this.sizes[++index]!);
    this.refuse(index);
  }
}
