/**
 * One parameter server's shard of the model (TensorFlow's ParameterServerStrategy, asynchronous):
 * it holds its parameters as variables and one optimizer, and applies every worker's push as it
 * arrives, with no barrier across workers. Transport-free: whoever carries pushes and pulls
 * between tabs calls `apply` and `pull`.
 *
 * - The version is the number of updates applied. A worker pulls (version v, values), computes
 *   gradients on its batch, and pushes (worker, stepId, v, grads); the push's staleness is
 *   s = version now - v.
 * - `maxStaleness` S drops pushes with s > S (status 'stale', counted).
 * - `scaleLrByStaleness` multiplies the gradients by 1/(1+s) before the optimizer sees them. With
 *   SGD (and momentum, whose buffer then holds the scaled gradient) that is the learning rate
 *   scaled by 1/(1+s). With Adam it is not: Adam divides the first moment by the root of the
 *   second, so a gradient's scale mostly cancels out; what the scaling does change is the weight
 *   a stale gradient gets in the running moments next to fresher ones (its share of m shrinks by
 *   1/(1+s), of v by 1/(1+s)^2). Use it with SGD, or read it that way with Adam.
 * - A push is applied at most once: a worker's step ids must increase, and a push whose step id
 *   is not above the last one handled (applied or dropped as stale) for that worker is dropped
 *   ('duplicate', counted). A step id more than MAX_STEP_JUMP above it is refused: a worker's
 *   pushes count up one by one. Step ids loaded from a state dict (a checkpoint, which anyone
 *   with the session's link may have written) only say which push to drop again: a worker whose
 *   push is below its loaded record is not what the record says, and the record is forgotten.
 * - A malformed push (ids not integers, a version from the future, a wrong length, a NaN or an
 *   infinity) is refused ('refused', counted by reason), never applied. Refusals are returned,
 *   not thrown: a push comes from another tab.
 *
 * `apply` is synchronous, so each push is applied whole; `pull` snapshots the values and version
 * synchronously before its readback, so the values always belong to the version it returns.
 */
import * as tf from '@tensorflow/tfjs';
import type { WeightSpec } from '../../checkpoint/checkpoint_format.ts';
import { loadOptimizerState, type TensorBundle } from '../../checkpoint/state_dict.ts';
import type { ShardLayout } from './sharding.ts';
import { allFinite } from '../../wire/finite.ts';

import {
  REFUSAL_REASONS,
  ShardStateError,
  type ApplyResult,
  type ParameterServerShardOptions,
  type Push,
  type RefusalReason,
  type ShardStateDict,
  type ShardStats,
} from './shard_types.ts';

export {
  REFUSAL_REASONS,
  ShardStateError,
  type ApplyResult,
  type ParameterServerShardOptions,
  type Push,
  type RefusalReason,
  type ShardStateDict,
  type ShardStats,
} from './shard_types.ts';

let shardCounter = 0;

/** Most a worker's step id may pass its last handled one by (its pushes count up by one). */
export const MAX_STEP_JUMP = 1024;

const isCount = (x: unknown): x is number => typeof x === 'number' && Number.isSafeInteger(x) && x >= 0;

export class ParameterServerShard {
  readonly index: number;
  readonly numel: number;
  readonly shapes: number[][];
  readonly sizes: number[];
  readonly maxStaleness: number;
  readonly scaleLrByStaleness: boolean;
  readonly numWorkers: number;
  readonly maxWorkerRecords: number;
  readonly checkpointEvery: number;
  private readonly names: string[];
  private readonly variables: tf.Variable[];
  private readonly makeOptimizer: () => tf.Optimizer;
  private opt: tf.Optimizer;
  private currentVersion = 0;
  private readonly lastSteps = new Map<number, number>();
  /** Workers whose last step id came from a state dict, and no push since. */
  private readonly loadedSteps = new Set<number>();
  private readonly counts = { applied: 0, stale: 0, duplicate: 0 };
  private readonly refusedBy: Record<RefusalReason, number> = {
    'bad-worker': 0,
    'bad-step': 0,
    'bad-version': 0,
    'bad-length': 0,
    nonfinite: 0,
  };
  private readonly histogram: number[];
  private readonly perWorker = new Map<number, { pushes: number; applied: number }>();
  private disposed = false;

  constructor(o: ParameterServerShardOptions) {
    this.index = o.index ?? 0;
    if (!isCount(this.index)) throw new RangeError(`the shard index must be a non-negative integer, got ${o.index}`);
    if (o.initial.length === 0) throw new RangeError('a parameter-server shard needs at least one parameter');
    this.maxStaleness = o.maxStaleness ?? Infinity;
    if (!(this.maxStaleness === Infinity || isCount(this.maxStaleness)))
      throw new RangeError(`maxStaleness must be a non-negative integer or Infinity, got ${o.maxStaleness}`);
    this.numWorkers = o.numWorkers ?? 1024;
    if (!isCount(this.numWorkers) || this.numWorkers < 1)
      throw new RangeError(`numWorkers must be a positive integer, got ${o.numWorkers}`);
    this.maxWorkerRecords = o.maxWorkerRecords ?? 4096;
    if (!isCount(this.maxWorkerRecords) || this.maxWorkerRecords < 1)
      throw new RangeError(`maxWorkerRecords must be a positive integer, got ${o.maxWorkerRecords}`);
    const buckets = o.histogramBuckets ?? 32;
    if (!isCount(buckets) || buckets < 1) throw new RangeError(`histogramBuckets must be a positive integer, got ${o.histogramBuckets}`);
    this.histogram = new Array<number>(buckets).fill(0);
    this.checkpointEvery = o.checkpointEvery ?? 0;
    if (!isCount(this.checkpointEvery)) throw new RangeError(`checkpointEvery must be a non-negative integer, got ${o.checkpointEvery}`);
    this.scaleLrByStaleness = o.scaleLrByStaleness ?? false;
    this.names = o.names ?? o.initial.map((_, i) => `param-${i}`);
    if (this.names.length !== o.initial.length) throw new RangeError(`got ${this.names.length} names for ${o.initial.length} parameters`);
    for (const t of o.initial) if (t.dtype !== 'float32') throw new RangeError(`parameters must be float32, got ${t.dtype}`);
    this.shapes = o.initial.map((t) => [...t.shape]);
    this.sizes = o.initial.map((t) => t.size);
    this.numel = this.sizes.reduce((a, b) => a + b, 0);
    // Not trainable: a tab that is both server and worker must not find these in its own
    // variableGrads / minimize. Names unique in the engine, and not integer-like.
    const id = ++shardCounter;
    this.variables = o.initial.map((t, i) => tf.variable(t, false, `ps${this.index}-${id}/${i}`));
    this.makeOptimizer = o.optimizer;
    this.opt = o.optimizer();
  }

  /** Shard `k` of `layout`, initialised from `model`'s trainable weights (the parameters `layout.shards[k]`). */
  static fromModel(
    model: tf.LayersModel,
    layout: ShardLayout,
    k: number,
    options: Omit<ParameterServerShardOptions, 'initial' | 'index' | 'names'>,
  ): ParameterServerShard {
    const params = layout.shards[k];
    if (params === undefined) throw new RangeError(`the layout has ${layout.numServers} servers, there is no shard ${k}`);
    if (model.trainableWeights.length !== layout.sizes.length) {
      throw new RangeError(`the model has ${model.trainableWeights.length} trainable weights, the layout ${layout.sizes.length}`);
    }
    return new ParameterServerShard({
      ...options,
      index: k,
      initial: params.map((p) => model.trainableWeights[p].read()),
      names: params.map((p) => `param-${p}`),
    });
  }

  /** Updates applied so far. */
  get version(): number {
    return this.currentVersion;
  }

  get optimizer(): tf.Optimizer {
    return this.opt;
  }

  /** The last applied step id of `worker`, or -1: a restarted worker continues above it. */
  lastStep(worker: number): number {
    return this.lastSteps.get(worker) ?? -1;
  }

  /** Applies a worker's push if it is well-formed, not a duplicate and not too stale. */
  apply(push: Push): ApplyResult {
    this.checkOpen();
    const { worker, stepId, version, grads } = push;
    const refuse = (reason: RefusalReason, detail: string): ApplyResult => {
      this.refusedBy[reason]++;
      return { status: 'refused', version: this.currentVersion, reason, detail };
    };
    if (!isCount(worker) || worker >= this.numWorkers)
      return refuse('bad-worker', `worker ${String(worker)} is not an integer in [0, ${this.numWorkers})`);
    const record = this.recordOf(worker);
    record.pushes++;
    if (!isCount(stepId)) return refuse('bad-step', `step id ${String(stepId)} of worker ${worker} is not a non-negative integer`);
    if (!isCount(version) || version > this.currentVersion) {
      return refuse(
        'bad-version',
        `worker ${worker} step ${stepId}: version ${String(version)} is not an integer in [0, ${this.currentVersion}] (this shard's version)`,
      );
    }
    if (!(grads instanceof Float32Array) || grads.length !== this.numel) {
      const got = grads instanceof Float32Array ? `${grads.length} gradients` : 'no Float32Array';
      return refuse('bad-length', `worker ${worker} step ${stepId}: ${got}, shard ${this.index} holds ${this.numel} elements`);
    }
    if (!allFinite(grads)) return refuse('nonfinite', `worker ${worker} step ${stepId}: the gradients hold a NaN or an infinity`);
    const loaded = this.loadedSteps.delete(worker);
    let lastStep = this.lastStep(worker);
    if (loaded && stepId < lastStep) {
      this.lastSteps.delete(worker);
      lastStep = -1;
    }
    if (stepId <= lastStep) {
      this.counts.duplicate++;
      return { status: 'duplicate', version: this.currentVersion, lastStep };
    }
    if (!loaded && lastStep >= 0 && stepId - lastStep > MAX_STEP_JUMP) {
      return refuse(
        'bad-step',
        `worker ${worker} step ${stepId}: ${stepId - lastStep} past its last handled step ${lastStep}, more than the ${MAX_STEP_JUMP} a worker's pushes may skip`,
      );
    }
    const staleness = this.currentVersion - version;
    this.histogram[Math.min(staleness, this.histogram.length - 1)]++;
    if (staleness > this.maxStaleness) {
      // Handled: the same push again is a duplicate, not a second stale one.
      this.lastSteps.set(worker, stepId);
      this.counts.stale++;
      return { status: 'stale', version: this.currentVersion, staleness };
    }
    const divisor = this.scaleLrByStaleness ? 1 + staleness : 1;
    // Each element divided once and rounded to float32: g / (1 + s), exactly as a hand computation gives it.
    this.applyGradients(divisor === 1 ? grads : grads.map((g) => g / divisor));
    this.lastSteps.set(worker, stepId);
    this.counts.applied++;
    record.applied++;
    return { status: 'applied', version: this.currentVersion, staleness, scale: 1 / divisor, checkpointDue: this.checkpointDue() };
  }

  /** A worker's record, made on its first push; the lowest id's records go past `maxWorkerRecords` (ids of gone tabs are never reused). */
  private recordOf(worker: number): { pushes: number; applied: number } {
    let record = this.perWorker.get(worker);
    if (record) return record;
    record = { pushes: 0, applied: 0 };
    this.perWorker.set(worker, record);
    if (this.perWorker.size > this.maxWorkerRecords) {
      const oldest = Math.min(...this.perWorker.keys());
      this.perWorker.delete(oldest);
      this.lastSteps.delete(oldest);
      this.loadedSteps.delete(oldest);
    }
    return record;
  }

  /**
   * Applies `grads` (flat, shard order) with the optimizer as they are, outside the push rules
   * (no ids, staleness or dedupe): for synchronous strategies that average first
   * (CentralStorageAccumulator). Returns the new version.
   */
  applyGradients(grads: Float32Array): number {
    this.checkOpen();
    if (grads.length !== this.numel)
      throw new RangeError(`shard ${this.index} holds ${this.numel} elements, got ${grads.length} gradients`);
    tf.tidy(() => {
      let offset = 0;
      const named = this.variables.map((v, i) => {
        const tensor = tf.tensor(grads.subarray(offset, offset + this.sizes[i]), this.shapes[i], 'float32');
        offset += this.sizes[i];
        return { name: v.name, tensor };
      });
      // An array, not a map: optimizers keep their slots (Adam's moments) by position.
      this.opt.applyGradients(named);
    });
    return ++this.currentVersion;
  }

  /** Whether the current version is one to checkpoint at (a multiple of `checkpointEvery`). */
  checkpointDue(): boolean {
    return this.checkpointEvery > 0 && this.currentVersion % this.checkpointEvery === 0;
  }

  /** The shard's values (flat, shard order) and the version they belong to. */
  async pull(): Promise<{ version: number; values: Float32Array }> {
    this.checkOpen();
    const version = this.currentVersion;
    const flat = tf.tidy(() => tf.concat(this.variables.map((v) => v.reshape([-1]))));
    try {
      // data(), not dataSync(): dataSync can return stale data on TF.js's WebGPU backend.
      return { version, values: (await flat.data()) as Float32Array };
    } finally {
      flat.dispose();
    }
  }

  stats(): ShardStats {
    const refused = REFUSAL_REASONS.reduce((n, r) => n + this.refusedBy[r], 0);
    const workers = [...this.perWorker.entries()]
      .sort(([a], [b]) => a - b)
      .map(([worker, r]) => ({ worker, pushes: r.pushes, applied: r.applied, lastStep: this.lastStep(worker) }));
    return {
      version: this.currentVersion,
      ...this.counts,
      refused,
      refusedBy: { ...this.refusedBy },
      stalenessHistogram: [...this.histogram],
      workers,
    };
  }

  /**
   * The shard's state, consistent at one version: the parameters and the optimizer's slots are
   * copied with no apply in between (if one lands while the optimizer's slots are being listed,
   * the snapshot is taken again).
   */
  async stateDict(): Promise<ShardStateDict> {
    for (let attempt = 0; attempt < 100; attempt++) {
      this.checkOpen();
      const version = this.currentVersion;
      const opt = this.opt;
      const params = this.variables.map((v, i) => ({ name: this.names[i], tensor: tf.clone(v) }));
      const lastSteps = [...this.lastSteps.entries()].sort(([a], [b]) => a - b);
      const slots = await opt.getWeights();
      if (this.currentVersion !== version || this.opt !== opt || this.disposed) {
        tf.dispose(params.map((p) => p.tensor));
        for (const w of slots) if (!(w.tensor instanceof tf.Variable)) w.tensor.dispose();
        continue;
      }
      // Copies of the optimizer's variables now, before any later apply changes them.
      const optimizer = slots.map((w) => ({ name: w.name, tensor: w.tensor instanceof tf.Variable ? tf.clone(w.tensor) : w.tensor }));
      const powers = betaPowerVariables(opt)?.map((v) => tf.clone(v));
      try {
        const betaPowers = powers ? await Promise.all(powers.map(async (p) => (await p.data())[0])) : undefined;
        return {
          index: this.index,
          version,
          lastSteps,
          params: await encode(params),
          optimizer: await encode(optimizer),
          ...(betaPowers ? { betaPowers } : {}),
        };
      } finally {
        tf.dispose([...params.map((p) => p.tensor), ...optimizer.map((w) => w.tensor), ...(powers ?? [])]);
      }
    }
    throw new Error(`shard ${this.index}: pushes kept landing while its state was being copied (100 attempts)`);
  }

  /**
   * Restores a state written by `stateDict` (of a shard with the same parameter shapes): checked
   * first, then loaded into a fresh optimizer, then swapped in at once (a push applied while it
   * loads is overwritten, as if it had come before the restore).
   */
  async loadStateDict(state: ShardStateDict): Promise<void> {
    this.checkOpen();
    this.checkState(state);
    const named = tf.io.decodeWeights(state.params.weightData, state.params.weightSpecs as tf.io.WeightsManifestEntry[]);
    const fresh = this.makeOptimizer();
    try {
      await loadOptimizerState(fresh, state.optimizer);
      const powers = betaPowerVariables(fresh);
      if (powers && state.betaPowers)
        tf.tidy(() =>
          powers.forEach((v, i) => {
            v.assign(tf.scalar(state.betaPowers![i]));
          }),
        );
    } catch (err) {
      fresh.dispose();
      tf.dispose(Object.values(named));
      throw new ShardStateError(
        `shard ${this.index}: the optimizer state does not load: ${err instanceof Error ? err.message : String(err)}`,
      );
    }
    if (this.disposed) {
      fresh.dispose();
      tf.dispose(Object.values(named));
      this.checkOpen();
    }
    state.params.weightSpecs.forEach((spec, i) => {
      this.variables[i].assign(named[spec.name] as tf.Tensor);
    });
    tf.dispose(Object.values(named));
    this.opt.dispose();
    this.opt = fresh;
    this.currentVersion = state.version;
    this.lastSteps.clear();
    this.loadedSteps.clear();
    for (const [worker, step] of state.lastSteps) {
      this.lastSteps.set(worker, step);
      this.loadedSteps.add(worker);
    }
  }

  /** Frees the variables and the optimizer. */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    tf.dispose(this.variables);
    this.opt.dispose();
  }

  private checkOpen(): void {
    if (this.disposed) throw new Error(`parameter-server shard ${this.index} is disposed`);
  }

  /** Refuses a state dict that does not fit this shard, before anything is allocated. */
  private checkState(s: ShardStateDict): void {
    const bad = (why: string) => new ShardStateError(`shard ${this.index}: the state dict does not fit: ${why}`);
    if (
      s.betaPowers !== undefined &&
      !(Array.isArray(s.betaPowers) && s.betaPowers.length === 2 && s.betaPowers.every((b) => typeof b === 'number' && Number.isFinite(b)))
    ) {
      throw bad('its beta powers are not two finite numbers');
    }
    if (!isCount(s.version)) throw bad(`its version ${String(s.version)} is not a non-negative integer`);
    if (
      !Array.isArray(s.lastSteps) ||
      s.lastSteps.length > this.maxWorkerRecords ||
      !s.lastSteps.every((e) => Array.isArray(e) && isCount(e[0]) && e[0] < this.numWorkers && isCount(e[1]))
    ) {
      throw bad(
        `its last step ids are not at most ${this.maxWorkerRecords} [worker < ${this.numWorkers}, step] pairs of non-negative integers`,
      );
    }
    const specs = s.params?.weightSpecs;
    if (!Array.isArray(specs) || specs.length !== this.shapes.length)
      throw bad(`it has ${Array.isArray(specs) ? specs.length : 'no'} parameters, this shard ${this.shapes.length}`);
    specs.forEach((spec, i) => {
      if (spec.dtype !== 'float32' || !sameShape(spec.shape, this.shapes[i])) {
        throw bad(
          `parameter ${i} (${this.names[i]}) is [${String(spec.shape)}] ${spec.dtype}, this shard's is [${this.shapes[i].join(', ')}] float32`,
        );
      }
    });
    if (new Set(specs.map((sp) => sp.name)).size !== specs.length) throw bad('its parameter names repeat');
    if (s.params.weightData?.byteLength !== this.numel * 4) {
      throw bad(`its parameters take ${s.params.weightData?.byteLength} bytes, this shard's ${this.numel * 4}`);
    }
    const slots = s.optimizer?.weightSpecs;
    if (!Array.isArray(slots) || slots.length > 1 + 3 * this.shapes.length)
      throw bad('its optimizer state is not a list of at most 1 + 3 per parameter tensors');
    let bytes = 0;
    for (const slot of slots) {
      const shape = [[], ...this.shapes].find((sh) => sameShape(slot.shape, sh));
      if (!shape || (slot.dtype !== 'float32' && slot.dtype !== 'int32'))
        throw bad(`optimizer tensor ${slot.name} is [${String(slot.shape)}] ${slot.dtype}: neither a scalar nor a parameter's shape`);
      bytes += shape.reduce((a, b) => a * b, 1) * 4;
    }
    if (s.optimizer.weightData?.byteLength !== bytes)
      throw bad(`its optimizer state takes ${s.optimizer.weightData?.byteLength} bytes, its tensors ${bytes}`);
  }
}

/**
 * Adam's running beta powers: TF.js keeps them in (private) variables `accBeta1`, `accBeta2`;
 * null for optimizers without them.
 */
function betaPowerVariables(opt: tf.Optimizer): tf.Variable[] | null {
  const o = opt as unknown as { accBeta1?: unknown; accBeta2?: unknown };
  return o.accBeta1 instanceof tf.Variable && o.accBeta2 instanceof tf.Variable ? [o.accBeta1, o.accBeta2] : null;
}

function sameShape(a: unknown, b: number[]): boolean {
  return Array.isArray(a) && a.length === b.length && a.every((d, k) => d === b[k]);
}

async function encode(tensors: Array<{ name: string; tensor: tf.Tensor }>): Promise<TensorBundle> {
  const { data, specs } = await tf.io.encodeWeights(tensors);
  return { weightSpecs: specs as WeightSpec[], weightData: data };
}
