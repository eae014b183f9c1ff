/**
 * DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models",
 * 2023; torchft's `DiLoCo` wrapper): each rank takes H inner steps with its own optimizer (AdamW
 * in the paper) on its own samples, communicating nothing; then the ranks all-reduce the
 * pseudo-gradient, the change of the weights since the last outer step (`last outer weights -
 * this rank's weights`, averaged over the ranks), and every rank applies it to the last outer
 * weights with the outer optimizer, torch's SGD with Nesterov momentum (the paper's outer lr 0.7,
 * momentum 0.9). One all-reduce of the model every H steps instead of every step.
 *
 * It is a communication hook (the inner steps' gradients stay this rank's own) that also owns
 * the outer step: runElastic's `diloco` option registers it and calls `sync` after the optimizer
 * step of every H-th step. Replicas are bit-identical right after each outer step: everything
 * the outer step computes comes from the all-reduce's result and the outer state, which are the
 * same bits on every rank, and torch's SGD runs on the host in float32 (src/optim.ts).
 *
 * The outer state (the last outer weights, the outer momentum, the outer step count and the step
 * it was taken at) is training state: it is the hook's state dict, saved in checkpoints and sent
 * with a replica's state to the ranks of a new round, all of it shared by every rank.
 *
 * Regroups (`rejoin`, at the start of each round after the state transfer): the ranks that trained
 * inner steps since the last outer step and held the group's outer state contribute their
 * pseudo-gradients to one outer step among the new round's ranks, so that a rank that left costs
 * only its own inner steps since the last outer step, the survivors' count, and a joiner starts
 * from the outer weights that step makes.
 */
import type * as tf from '@tensorflow/tfjs';
import type { ProcessGroup, WireDtype } from '../c10d/process_group.ts';
import { allFinite } from '../finite.ts';
import { SGD } from '../optim.ts';
import type { WeightSpec } from '../checkpoint/checkpoint_format.ts';
import { assignFlatWeights, flatTrainableWeights, hostWeights } from './replicas.ts';
import type { CommHook, CommHookState, GradBucket } from './comm_hooks/types.ts';

export interface DiLoCoOptions {
  /** Inner steps between two outer steps (the paper's H), >= 1. */
  syncEvery: number;
  /** The outer SGD's learning rate (default 0.7, the paper's). */
  outerLr?: number;
  /** The outer SGD's momentum (default 0.9, the paper's); 0: plain outer SGD. */
  outerMomentum?: number;
  /** Nesterov momentum (default true, the paper's; needs a momentum). */
  nesterov?: boolean;
  /**
   * What the pseudo-gradients travel as: 'float32' (default), or 'float16' / 'bfloat16' (half the
   * bytes; the reduction stays float32 and every rank decodes the same 16-bit average).
   */
  wire?: WireDtype;
}

/** What a rank held before a round's state transfer overwrote it: its own weights, for `rejoin`. */
export interface DiLoCoHeld {
  weights: Float32Array;
  /** Its committed steps, and its outer step count, then. */
  step: number;
  outerSteps: number;
}

/** How the round's start went: whether an outer step was taken, and how many ranks' inner steps it took in. */
export interface DiLoCoRejoin {
  outerStep: boolean;
  contributors: number;
}

export class DiLoCo implements CommHook {
  readonly name = 'diloco';
  readonly syncEvery: number;
  readonly outerLr: number;
  readonly outerMomentum: number;
  readonly nesterov: boolean;
  readonly wire: WireDtype;
  /** The last outer weights (null until the run's first round sets them). */
  private outerWeights: Float32Array | null = null;
  private outer: SGD;
  private steps = 0;
  private syncedAt = 0;
  /** Bytes this rank sent in outer steps, and how many it took. */
  bytesSent = 0;

  constructor(o: DiLoCoOptions) {
    const { syncEvery, outerLr = 0.7, outerMomentum = 0.9, nesterov = true, wire = 'float32' } = o;
    if (!Number.isSafeInteger(syncEvery) || syncEvery < 1) throw new RangeError(`DiLoCo: syncEvery must be an integer >= 1, got ${syncEvery}`);
    if (!(Number.isFinite(outerLr) && outerLr > 0)) throw new RangeError(`DiLoCo: outerLr must be a positive number, got ${outerLr}`);
    if (!(Number.isFinite(outerMomentum) && outerMomentum >= 0 && outerMomentum < 1)) throw new RangeError(`DiLoCo: outerMomentum must be in [0, 1), got ${outerMomentum}`);
    if (nesterov && outerMomentum === 0) throw new RangeError('DiLoCo: Nesterov needs an outer momentum > 0 (or nesterov: false)');
    if (wire !== 'float32' && wire !== 'float16' && wire !== 'bfloat16') throw new RangeError(`DiLoCo: wire must be float32, float16 or bfloat16, got ${String(wire)}`);
    this.syncEvery = syncEvery;
    this.outerLr = outerLr;
    this.outerMomentum = outerMomentum;
    this.nesterov = nesterov;
    this.wire = wire;
    this.outer = this.newOuterOptimizer();
  }

  /** Outer steps taken so far in the run (the group's count, the same on every rank). */
  get outerSteps(): number {
    return this.steps;
  }

  /** The step the last outer step was taken after (0 before the first). */
  get syncedAtStep(): number {
    return this.syncedAt;
  }

  /** Inner steps are local: the bucket's gradients are this rank's own. */
  reduce(_pg: ProcessGroup, bucket: GradBucket): Promise<Float32Array> {
    return Promise.resolve(bucket.buffer);
  }

  /** Whether `sync` takes an outer step after `step` (every `syncEvery`-th step of the run). */
  syncsAt(step: number): boolean {
    return step % this.syncEvery === 0;
  }

  /**
   * Collective, after the optimizer step of `step` (every rank of `pg` calls it with the same
   * step): at the steps `syncsAt` names, the outer step. Resolves with whether it took one.
   */
  async sync(pg: ProcessGroup, model: tf.LayersModel, step: number): Promise<boolean> {
    if (!this.syncsAt(step) || step <= this.syncedAt) return false;
    await this.syncNow(pg, model, step);
    return true;
  }

  /** Collective: an outer step now, whatever the step (runElastic's at the end of a run that ends between two). */
  async syncNow(pg: ProcessGroup, model: tf.LayersModel, step: number): Promise<void> {
    const local = await flatTrainableWeights(model);
    const prev = this.outerWeightsFor(local);
    const delta = new Float32Array(local.length);
    for (let i = 0; i < local.length; i++) delta[i] = prev[i]! - local[i]!;
    const before = pg.bytesSent();
    await pg.allReduce(delta, 'avg', { wire: this.wire });
    this.bytesSent += pg.bytesSent() - before;
    this.apply(model, delta, step);
  }

  /**
   * Collective, at the start of a round, after the state transfer gave every rank the source's
   * model and this hook the group's outer state: an outer step over the inner steps the ranks
   * took since the last one, from each rank whose `held` weights count (it trained those steps
   * in the group's last outer phase: same outer step count, same committed step as the group's),
   * averaged over those ranks; then every rank holds the new outer weights. Without such a rank,
   * nothing changes (every rank has the source's weights). `step` is the group's committed step.
   */
  async rejoin(pg: ProcessGroup, model: tf.LayersModel, held: DiLoCoHeld | null, step: number): Promise<DiLoCoRejoin> {
    if (this.outerWeights === null || step <= this.syncedAt) {
      // A fresh run, or one resumed from a checkpoint without DiLoCo's state: the outer phase starts here.
      if (this.outerWeights === null) {
        this.outerWeights = await flatTrainableWeights(model);
        this.syncedAt = step;
      }
      return { outerStep: false, contributors: 0 };
    }
    const prev = this.outerWeights;
    const counts = held !== null && held.outerSteps === this.steps && held.step === step && held.weights.length === prev.length;
    // The pseudo-gradient, then one slot counting the ranks it comes from: one all-reduce.
    const sum = new Float32Array(prev.length + 1);
    if (counts) {
      for (let i = 0; i < prev.length; i++) sum[i] = prev[i]! - held.weights[i]!;
      sum[prev.length] = 1;
    }
    const before = pg.bytesSent();
    await pg.allReduce(sum, 'sum');
    this.bytesSent += pg.bytesSent() - before;
    const contributors = sum[prev.length]!;
    if (!(contributors >= 1)) return { outerStep: false, contributors: 0 };
    const delta = sum.subarray(0, prev.length);
    // The same division on every rank of the same sums: the same bits.
    for (let i = 0; i < delta.length; i++) delta[i] = delta[i]! / contributors;
    this.apply(model, delta, step);
    return { outerStep: true, contributors };
  }

  /** This rank's weights now, for `rejoin` after the next state transfer. */
  async hold(model: tf.LayersModel, step: number): Promise<DiLoCoHeld> {
    // The host optimizers' master copy when it is current (no readback), else the device's weights.
    const weights = hostWeights(model)?.slice() ?? (await flatTrainableWeights(model));
    return { weights, step, outerSteps: this.steps };
  }

  /** The outer step with the averaged pseudo-gradient `delta`: torch's SGD on the last outer weights, then every rank's model is the result. */
  private apply(model: tf.LayersModel, delta: Float32Array, step: number): void {
    const params = this.outerWeightsFor(delta).slice();
    this.outer.stepFlat(params, delta, [{ shape: [params.length], offset: 0, size: params.length }]);
    assignFlatWeights(model, params, "DiLoCo's outer step");
    this.outerWeights = params;
    this.steps++;
    this.syncedAt = step;
  }

  private outerWeightsFor(like: Float32Array): Float32Array {
    const prev = this.outerWeights;
    if (prev === null) throw new Error('DiLoCo: no outer weights yet: rejoin(...) sets them at the start of the first round');
    if (prev.length !== like.length) throw new RangeError(`DiLoCo: the outer weights have ${prev.length} values, the model ${like.length}: the state is another model's`);
    return prev;
  }

  private newOuterOptimizer(): SGD {
    return new SGD({ lr: this.outerLr, momentum: this.outerMomentum, nesterov: this.nesterov });
  }

  /** The outer state: every part of it is the same on every rank. */
  stateDict(): CommHookState {
    const tensors: Record<string, Float32Array> = {};
    if (this.outerWeights) tensors['outer_weights'] = this.outerWeights.slice();
    const bundle = this.outer.stateBundle();
    const values = new Float32Array(bundle.weightData);
    if (values.length > 1) tensors['momentum_buffer'] = values.slice(1);
    return {
      name: this.name,
      meta: { outerSteps: this.steps, syncedAtStep: this.syncedAt, outerOptimizerSteps: this.outer.stepCount, syncEvery: this.syncEvery },
      tensors,
    };
  }

  /** Loads the group's outer state (a checkpoint's, or the round's source's); checks it first, since it came from a file or a peer. */
  loadStateDict(state: CommHookState): void {
    const bad = (what: string) => new RangeError(`DiLoCo state: ${what}`);
    const count = (key: string): number => {
      const v = state.meta[key];
      if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) throw bad(`${key} ${String(v)} is not a count`);
      return v;
    };
    const steps = count('outerSteps');
    const syncedAt = count('syncedAtStep');
    const optimizerSteps = count('outerOptimizerSteps');
    const weights = state.tensors['outer_weights'] ?? null;
    const momentum = state.tensors['momentum_buffer'] ?? null;
    if (momentum && (!weights || momentum.length !== weights.length)) throw bad(`a momentum buffer of ${momentum.length} values for ${weights?.length ?? 0} weights`);
    for (const t of [weights, momentum]) if (t && !allFinite(t)) throw bad('a non-finite value; non-finite state is never loaded');
    if (momentum && this.outerMomentum === 0) throw bad('it has an outer momentum buffer, and this DiLoCo no outer momentum (outerMomentum)');
    if (!momentum && this.outerMomentum > 0 && optimizerSteps > 0) throw bad(`no outer momentum buffer after ${optimizerSteps} outer steps with momentum`);
    const outer = this.newOuterOptimizer();
    if (weights && (optimizerSteps > 0 || momentum)) {
      const specs: WeightSpec[] = [{ name: 'step', shape: [], dtype: 'float32' }];
      if (momentum) specs.push({ name: '0/momentum_buffer', shape: [weights.length], dtype: 'float32' });
      const data = new Float32Array(1 + (momentum?.length ?? 0));
      data[0] = optimizerSteps;
      if (momentum) data.set(momentum, 1);
      outer.loadStateBundle({ weightSpecs: specs, weightData: data.buffer });
    }
    this.outer = outer;
    this.outerWeights = weights ? weights.slice() : null;
    this.steps = steps;
    this.syncedAt = syncedAt;
  }
}

/** runElastic's hook for DiLoCo: `new DiLoCo(options)`. */
export function diloco(options: DiLoCoOptions): DiLoCo {
  return new DiLoCo(options);
}
