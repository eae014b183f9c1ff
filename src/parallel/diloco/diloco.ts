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
 * same bits on every rank, and torch's SGD runs on the host in float32 (src/nn/optim.ts).
 *
 * The outer state (the last outer weights, the outer momentum, the outer step count and the step
 * it was taken at) is training state: it is the hook's state dict, saved in checkpoints and sent
 * with a replica's state to the ranks of a new round, all of it shared by every rank.
 *
 * Streaming (Douillard et al., "Streaming DiLoCo with overlapping communication", 2025): with
 * `fragments` P > 1 the weights are cut into P contiguous fragments, and fragment f takes its
 * outer step at its own steps (every H steps, staggered by H/P), so that each outer step sends
 * 1/P of the model and the traffic spreads over the H steps. With `overlap` d >= 1 a fragment's
 * all-reduce runs while the next d inner steps compute; when it lands the rank merges it: the
 * fragment becomes the new outer weights plus the inner progress this rank made while it was on
 * the wire (`new outer + (weights now - weights sent)`), so no inner step is lost and each step's
 * progress enters exactly one pseudo-gradient. The replicas then differ by that progress: they
 * are identical after a full outer step (`syncNow`, at the end of a run; `rejoin`), and with
 * P = 1 and no overlap after every outer step. The outer weights are the same on every rank at
 * all times.
 *
 * Regroups (`rejoin`, at the start of each round after the state transfer): the ranks that trained
 * inner steps since the last outer step and held the group's outer state contribute their
 * pseudo-gradients to one outer step among the new round's ranks, so that a rank that left costs
 * only its own inner steps since the last outer step, the survivors' count, and a joiner starts
 * from the outer weights that step makes. An all-reduce still on the wire when a round fails is
 * dropped: the progress it carried is still in the weights, and the round's outer step takes it.
 *
 * Robust aggregation (`aggregation`, robust/outer_aggregation.ts): each fragment's
 * pseudo-gradients gathered from every rank and combined by a trimmed mean, median or centered
 * clipping instead of averaged, unweighted by samples; a rank that trained none since the
 * fragment's last outer step contributes nothing. An outer step whose result is not finite is
 * refused before anything changes: the outer weights, the momentum and the model stay as they were.
 */
import type * as tf from '@tensorflow/tfjs';
import type { ProcessGroup, WireDtype } from '../../c10d/process_group.ts';
import { allFinite } from '../../wire/finite.ts';
import { SGD } from '../../nn/optim.ts';
import { assignFlatWeights, flatTrainableWeights, hostWeights } from '../replicas.ts';
import type { CommHook, CommHookState, GradBucket } from '../comm_hooks/types.ts';
import { NonFiniteWeightsError } from '../../wire/errors.ts';
import type { AggregationReport } from '../robust/reducer.ts';
import type { AggregationSpec } from '../robust/aggregators.ts';
import { OuterAggregation } from '../robust/outer_aggregation.ts';
import type { DiLoCoHeld, DiLoCoOptions, DiLoCoRejoin } from './diloco_types.ts';
import {
  fragmentRanges,
  fragmentsSyncingAt,
  outerStateDict,
  parseOuterState,
  rejoinMean,
  rejoinRobust,
  type Fragment,
} from './fragments.ts';

export { fragmentRanges, fragmentsSyncingAt } from './fragments.ts';

export type { DiLoCoHeld, DiLoCoOptions, DiLoCoRejoin } from './diloco_types.ts';

export class DiLoCo implements CommHook {
  readonly name = 'diloco';
  /** Inner steps are this rank's own: DDP does not weigh their gradients by batch share (the pseudo-gradients are weighed instead). */
  readonly localSteps = true;
  readonly syncEvery: number;
  readonly outerLr: number;
  readonly outerMomentum: number;
  readonly nesterov: boolean;
  readonly wire: WireDtype;
  readonly fragmentCount: number;
  readonly overlap: number;
  /** The last outer weights (null until the run's first round sets them), the same on every rank. */
  private outerWeights: Float32Array | null = null;
  private fragments: Fragment[] = [];
  /**
   * This rank's outer all-reduces so far: how many, their time from start to result (span), and
   * the time the rank waited for them (exposed): 1 - exposed / span of them ran behind compute.
   */
  readonly comm = { allReduces: 0, spanMs: 0, exposedMs: 0 };
  /** What `hold` last gave: an outer step over weights it holds moves it along (see stepFragment). */
  private held: DiLoCoHeld | null = null;
  /** Whether the run tells this DiLoCo each step's samples (countStep): then pseudo-gradients are weighed by them. */
  private counted = false;
  /** `aggregation` and `attack`. */
  private readonly combine: OuterAggregation;

  constructor(o: DiLoCoOptions) {
    const { syncEvery, outerLr = 0.7, outerMomentum = 0.9, nesterov = true, wire = 'float32', fragments = 1, overlap = 0 } = o;
    if (!Number.isSafeInteger(syncEvery) || syncEvery < 1)
      throw new RangeError(`DiLoCo: syncEvery must be an integer >= 1, got ${syncEvery}`);
    if (!(Number.isFinite(outerLr) && outerLr > 0)) throw new RangeError(`DiLoCo: outerLr must be a positive number, got ${outerLr}`);
    if (!(Number.isFinite(outerMomentum) && outerMomentum >= 0 && outerMomentum < 1))
      throw new RangeError(`DiLoCo: outerMomentum must be in [0, 1), got ${outerMomentum}`);
    if (nesterov && outerMomentum === 0) throw new RangeError('DiLoCo: Nesterov needs an outer momentum > 0 (or nesterov: false)');
    if (wire !== 'float32' && wire !== 'float16' && wire !== 'bfloat16' && wire !== 'int8')
      throw new RangeError(`DiLoCo: wire must be float32, float16, bfloat16 or int8, got ${String(wire)}`);
    if (!Number.isSafeInteger(fragments) || fragments < 1 || fragments > syncEvery)
      throw new RangeError(`DiLoCo: fragments must be an integer from 1 to syncEvery (${syncEvery}), got ${fragments}`);
    // A fragment's all-reduce lands before the next fragment's starts: one on the wire at a time.
    const gap = Math.floor(syncEvery / fragments);
    if (!Number.isSafeInteger(overlap) || overlap < 0 || (overlap > 0 && overlap >= gap))
      throw new RangeError(`DiLoCo: overlap must be an integer from 0 to below syncEvery / fragments (${gap}), got ${overlap}`);
    this.syncEvery = syncEvery;
    this.outerLr = outerLr;
    this.outerMomentum = outerMomentum;
    this.nesterov = nesterov;
    this.wire = wire;
    this.fragmentCount = fragments;
    this.overlap = overlap;
    this.combine = new OuterAggregation(o.aggregation, o.attack);
  }

  /** How the pseudo-gradients are combined (`aggregation`): the mean unless asked. */
  get aggregation(): AggregationSpec {
    return this.combine.spec;
  }

  /** The last fragment's robust aggregation (each rank's pseudo-gradient judged); null under the mean or before the first. */
  get lastAggregation(): AggregationReport | null {
    return this.combine.last;
  }

  /**
   * Collective: fragment `f`'s pseudo-gradient (its outer weights less `sent`, this rank's
   * weights) combined over the ranks: the average weighed by samples, by all-reduce, or the
   * robust aggregate (unweighted; none from a rank that trained no samples on it). Takes the
   * fragment's sample window. The collective is issued before this returns.
   */
  private combineDelta(pg: ProcessGroup, f: Fragment, sent: Float32Array, step: number): Promise<Float32Array> {
    const present = f.all === 0 || f.mine > 0;
    const taken = this.takeWeight(f, pg.worldSize);
    const weight = f.robust ? 1 : taken;
    const outer = this.outerWeights!;
    const delta = new Float32Array(sent.length);
    for (let i = 0; i < sent.length; i++) delta[i] = (outer[f.start + i]! - sent[i]!) * weight;
    const part = this.fragments.indexOf(f);
    if (f.robust) return this.combine.reduce(pg, f.robust, delta, present, step, part).then((r) => r.values);
    this.combine.attackOwn(pg, delta, step, part);
    return pg.allReduce(delta, 'avg', { wire: this.wire });
  }

  /** Outer steps taken so far in the run, over all fragments (the group's count, the same on every rank). */
  get outerSteps(): number {
    return this.fragments.reduce((a, f) => a + f.steps, 0);
  }

  /** The step after which every fragment had last taken an outer step (0 before the first). */
  get syncedAtStep(): number {
    return this.fragments.length === 0 ? 0 : Math.min(...this.fragments.map((f) => f.syncedAt));
  }

  /** Whether every fragment took its outer step after `step` and none is on the wire: the replicas are identical. */
  inSync(step: number): boolean {
    return this.fragments.length > 0 && this.fragments.every((f) => f.syncedAt === step && f.inFlight === null);
  }

  /**
   * After each inner step: this rank trained `samples` of the step's `globalSamples` (the sum over
   * the ranks; every rank passes the same). Each pseudo-gradient is then weighed by the rank's
   * share of the samples trained since it was last taken (samples x worldSize / all of the group's
   * in that window, in an 'avg' all-reduce): the outer step follows the samples, so a slow rank
   * given fewer samples by balanced batches counts for what it trained, not as much as the others.
   * Equal shares weigh exactly 1. Without calls, every rank weighs 1 (torchft's DiLoCo).
   */
  countStep(samples: number, globalSamples: number): void {
    if (
      !Number.isSafeInteger(samples) ||
      !Number.isSafeInteger(globalSamples) ||
      samples < 0 ||
      globalSamples < 1 ||
      samples > globalSamples
    ) {
      throw new RangeError(
        `DiLoCo.countStep: samples must be an integer in 0..globalSamples and globalSamples a positive integer, got ${samples} of ${globalSamples}`,
      );
    }
    this.counted = true;
    for (const f of this.fragments) {
      f.mine += samples;
      f.all += globalSamples;
    }
  }

  /** This rank's weight for fragment f's pseudo-gradient, then f's window starts over. */
  private takeWeight(f: Fragment, worldSize: number): number {
    const w = f.all > 0 ? (f.mine * worldSize) / f.all : 1;
    f.mine = 0;
    f.all = 0;
    return w;
  }

  /** Inner steps are local: the bucket's gradients are this rank's own. */
  reduce(_pg: ProcessGroup, bucket: GradBucket): Promise<Float32Array> {
    return Promise.resolve(bucket.buffer);
  }

  /** Whether some fragment's outer step falls after `step`. */
  syncsAt(step: number): boolean {
    return fragmentsSyncingAt(step, this.syncEvery, this.fragmentCount).length > 0;
  }

  /**
   * Collective, after the optimizer step of `step`, before the step's vote: merges the fragments
   * whose all-reduce was due by now (waiting for those still on the wire). Resolves with how many.
   */
  async land(model: tf.LayersModel, step: number): Promise<number> {
    const due = this.fragments.filter((f) => f.inFlight !== null && f.inFlight.due <= step);
    if (due.length === 0) return 0;
    await this.merge(model, due);
    return due.length;
  }

  /**
   * Collective, after the step's vote (every rank of `pg` calls it with the same step): the outer
   * steps of the fragments whose turn it is, taken now (no overlap) or started on the wire, to be
   * merged by `land` `overlap` steps later. Resolves with whether the replicas are identical now.
   */
  async sync(pg: ProcessGroup, model: tf.LayersModel, step: number): Promise<boolean> {
    const due = fragmentsSyncingAt(step, this.syncEvery, this.fragmentCount)
      .map((f) => this.fragments[f]!)
      .filter((f) => f.syncedAt < step && f.inFlight === null);
    if (due.length === 0) return false;
    const local = await this.localWeights(model);
    this.outerWeightsFor(local);
    for (const f of due) {
      const sent = local.slice(f.start, f.end);
      const mine = f.mine;
      const sum = this.timed(this.combineDelta(pg, f, sent, step));
      // A round that fails drops it (see rejoin): its rejection must not go unhandled meanwhile.
      sum.catch(() => {});
      f.inFlight = { sum, sent, due: step + this.overlap, mine };
    }
    if (this.overlap > 0) return false;
    await this.merge(model, due);
    return this.inSync(step);
  }

  /** Collective: lands every all-reduce on the wire, then one outer step of every fragment at once: the replicas are identical (runElastic's at the end of a run, or of one stopped). */
  async syncNow(pg: ProcessGroup, model: tf.LayersModel, step: number): Promise<void> {
    await this.landAll(model);
    const local = await this.localWeights(model);
    const delta = new Float32Array(local.length);
    const outer = this.outerWeightsFor(local);
    const t0 = performance.now();
    if (this.combine.robust) {
      // One aggregation per fragment (each keeps its own centered-clip center), issued in fragment order.
      const parts = this.fragments.map((f) => this.combineDelta(pg, f, local.slice(f.start, f.end), step));
      await this.timed(
        Promise.all(parts).then((sums) => {
          sums.forEach((v, k) => {
            delta.set(v, this.fragments[k]!.start);
          });
          return delta;
        }),
      );
    } else {
      for (const f of this.fragments) {
        const weight = this.takeWeight(f, pg.worldSize);
        for (let i = f.start; i < f.end; i++) delta[i] = (outer[i]! - local[i]!) * weight;
      }
      this.combine.attackOwn(pg, delta, step, 0);
      await this.timed(pg.allReduce(delta, 'avg', { wire: this.wire }));
    }
    this.comm.exposedMs += performance.now() - t0;
    this.apply(model, local, delta, local, step);
  }

  /** Merges every all-reduce on the wire, whenever it was due. */
  private async landAll(model: tf.LayersModel): Promise<void> {
    const flying = this.fragments.filter((f) => f.inFlight !== null);
    if (flying.length > 0) await this.merge(model, flying);
  }

  /**
   * Collective, at the start of a round, after the state transfer gave every rank the source's
   * model and this hook the group's outer state: an outer step over the inner steps the ranks
   * took since the last one, from each rank whose `held` weights count (it trained those steps
   * in the group's last outer phase: same outer step count, same committed step as the group's),
   * averaged over those ranks, each fragment's weighed by the samples each trained on it since
   * (see countStep; a fragment no one trained keeps its outer weights, momentum aside); then
   * every rank holds the new outer weights. Without such a rank, nothing changes (every rank has
   * the source's weights). `step` is the group's committed step.
   */
  async rejoin(pg: ProcessGroup, model: tf.LayersModel, held: DiLoCoHeld | null, step: number): Promise<DiLoCoRejoin> {
    for (const f of this.fragments) {
      f.inFlight = null;
      f.mine = 0;
      f.all = 0;
    }
    if (this.outerWeights === null) {
      // A fresh run, or one resumed from a checkpoint without DiLoCo's state: the outer phase starts here.
      this.setOuterWeights(await flatTrainableWeights(model), step);
      return { outerStep: false, contributors: 0 };
    }
    if (step <= this.syncedAtStep) return { outerStep: false, contributors: 0 };
    const prev = this.outerWeights;
    const counts = held !== null && held.outerSteps === this.outerSteps && held.step === step && held.weights.length === prev.length;
    const combined = await (this.combine.robust
      ? rejoinRobust(pg, prev, this.fragments, counts ? held : null, this.combine, step)
      : rejoinMean(pg, prev, this.fragments, counts ? held : null));
    if (combined === null) return { outerStep: false, contributors: 0 };
    const { delta, contributors } = combined;
    const now = await this.localWeights(model);
    this.held = null; // taken in here; the runner holds again after the round's start
    this.apply(model, now, delta, now, step);
    return { outerStep: true, contributors };
  }

  /** This rank's weights now, for `rejoin` after the next state transfer. */
  async hold(model: tf.LayersModel, step: number): Promise<DiLoCoHeld> {
    const samples = this.counted ? this.fragments.map((f) => f.mine + (f.inFlight?.mine ?? 0)) : null;
    this.held = { weights: await this.localWeights(model), step, outerSteps: this.outerSteps, samples };
    return this.held;
  }

  /** Waits for the fragments' all-reduces and merges them: each becomes its new outer weights plus what this rank trained since it was sent. */
  private async merge(model: tf.LayersModel, fragments: Fragment[]): Promise<void> {
    const t0 = performance.now();
    const sums = await Promise.all(fragments.map((f) => f.inFlight!.sum));
    this.comm.exposedMs += performance.now() - t0;
    const local = await this.localWeights(model);
    const parts = fragments.map((f, k) => {
      const { sent, due } = f.inFlight!;
      f.inFlight = null;
      return { f, delta: sums[k]!, sent, step: due - this.overlap };
    });
    this.outerStep(model, local, parts);
  }

  /** Every fragment's outer step with the averaged pseudo-gradient `delta` (the whole model's), `local` then assigned to the model. */
  private apply(model: tf.LayersModel, local: Float32Array, delta: Float32Array, sent: Float32Array, step: number): void {
    this.outerStep(
      model,
      local,
      this.fragments.map((f) => ({ f, delta: delta.subarray(f.start, f.end), sent: sent.slice(f.start, f.end), step })),
    );
  }

  /**
   * The fragments' outer steps, all or none. Each is torch's SGD on the fragment's last outer
   * weights with its combined pseudo-gradient `delta`; `local`'s part of the fragment becomes the
   * new outer weights plus the inner progress made since `sent` (its weights when the
   * pseudo-gradient was taken), and `local` is assigned to the model. Checked before anything is
   * kept: when a new outer weight or model weight is not finite, the outer SGDs' states are put
   * back and NonFiniteWeightsError thrown, and the outer weights, momentum, counts and model stay
   * as they were (a refused step leaves nothing non-finite behind).
   */
  private outerStep(
    model: tf.LayersModel,
    local: Float32Array,
    parts: Array<{ f: Fragment; delta: Float32Array; sent: Float32Array; step: number }>,
  ): void {
    const outer = this.outerWeights!;
    const next = local.slice();
    const nextOuter = outer.slice();
    const saved = parts.map(({ f }) => f.outer.stateBundle());
    try {
      for (const { f, delta, sent } of parts) {
        const params = nextOuter.subarray(f.start, f.end);
        f.outer.stepFlat(params, delta, [{ shape: [params.length], offset: 0, size: params.length }]);
        for (let i = 0; i < params.length; i++) next[f.start + i] = params[i]! + (local[f.start + i]! - sent[i]!);
      }
      refuseNonfinite(model, nextOuter, "DiLoCo's outer step (the new outer weights)");
      assignFlatWeights(model, next, "DiLoCo's outer step");
    } catch (err) {
      parts.forEach(({ f }, k) => {
        f.outer.loadStateBundle(saved[k]!);
      });
      throw err;
    }
    outer.set(nextOuter);
    local.set(next);
    for (const { f, sent, step } of parts) this.committed(f, nextOuter.subarray(f.start, f.end), sent, step);
  }

  /** Fragment `f`'s outer step is kept (its new outer weights `params`): counted, and weights held at its step moved along. */
  private committed(f: Fragment, params: Float32Array, sent: Float32Array, step: number): void {
    f.steps++;
    f.syncedAt = step;
    // Weights held at the step this pseudo-gradient was taken: the outer step took their progress
    // in, so they move along as this rank's did; else a round failing before the next hold would
    // find them an outer step behind the group's and count nothing of them.
    const held = this.held;
    if (held && held.step === step && held.weights.length === this.outerWeights!.length) {
      for (let i = 0; i < params.length; i++) held.weights[f.start + i] = params[i]! + (held.weights[f.start + i]! - sent[i]!);
      held.outerSteps++;
      // Held at the step it was sent: nothing of the held weights is left uncounted in this fragment.
      if (held.samples) held.samples[this.fragments.indexOf(f)] = 0;
    }
  }

  /** `allReduce`, counted in `comm` when it resolves. */
  private timed(allReduce: Promise<Float32Array>): Promise<Float32Array> {
    const t0 = performance.now();
    return allReduce.then((sum) => {
      this.comm.allReduces++;
      this.comm.spanMs += performance.now() - t0;
      return sum;
    });
  }

  /** The host optimizers' master copy when it is current (no readback), else the device's weights: a copy either way. */
  private async localWeights(model: tf.LayersModel): Promise<Float32Array> {
    return hostWeights(model)?.slice() ?? (await flatTrainableWeights(model));
  }

  private outerWeightsFor(like: Float32Array): Float32Array {
    const prev = this.outerWeights;
    if (prev === null) throw new Error('DiLoCo: no outer weights yet: rejoin(...) sets them at the start of the first round');
    if (prev.length !== like.length)
      throw new RangeError(`DiLoCo: the outer weights have ${prev.length} values, the model ${like.length}: the state is another model's`);
    return prev;
  }

  /** Outer weights and fresh fragments over them (no outer step taken yet). */
  private setOuterWeights(weights: Float32Array, step: number): void {
    this.outerWeights = weights;
    this.fragments = fragmentRanges(weights.length, this.fragmentCount).map(({ start, end }) => ({
      start,
      end,
      outer: this.newOuterOptimizer(),
      steps: 0,
      syncedAt: step,
      inFlight: null,
      mine: 0,
      all: 0,
      robust: this.combine.newReducer(),
    }));
  }

  private newOuterOptimizer(): SGD {
    return new SGD({ lr: this.outerLr, momentum: this.outerMomentum, nesterov: this.nesterov });
  }

  /** The outer state: every part of it is the same on every rank. In-flight all-reduces are not part of it (their progress is still in the weights). */
  stateDict(): CommHookState {
    return {
      name: this.name,
      ...outerStateDict(this.outerWeights, this.fragments, {
        fragments: this.fragmentCount,
        syncEvery: this.syncEvery,
        outerSteps: this.outerSteps,
      }),
    };
  }

  /** Loads the group's outer state (a checkpoint's, or the round's source's); checks it first, since it came from a file or a peer. */
  loadStateDict(state: CommHookState): void {
    const loaded = parseOuterState(
      state,
      this.fragmentCount,
      this.outerMomentum,
      () => this.newOuterOptimizer(),
      () => this.combine.newReducer(),
    );
    this.outerWeights = loaded?.weights ?? null;
    this.fragments = loaded?.fragments ?? [];
  }
}

/** runElastic's hook for DiLoCo: `new DiLoCo(options)`. */
export function diloco(options: DiLoCoOptions): DiLoCo {
  return new DiLoCo(options);
}

/** Throws NonFiniteWeightsError naming the first of `model`'s trainable weights whose part of `flat` holds a NaN or an infinity. */
function refuseNonfinite(model: tf.LayersModel, flat: Float32Array, source: string): void {
  let at = 0;
  for (const [index, w] of model.trainableWeights.entries()) {
    const size = w.shape.reduce<number>((a, b) => a * (b ?? 1), 1);
    if (!allFinite(flat.subarray(at, at + size))) throw new NonFiniteWeightsError(w.originalName, index, source);
    at += size;
  }
}
