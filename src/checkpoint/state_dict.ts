/**
 * State dicts (torch's state_dict / load_state_dict): a model's weights and an optimizer's state
 * as bytes, and `TrainState`, everything a replica needs to continue a run (model, optimizer,
 * where the run is, and the user's own extras). A state dict goes into a checkpoint, or from a
 * surviving replica to the others after a regroup.
 */
import * as tf from '@tensorflow/tfjs';
import type { Checkpoint } from './checkpoint_format.ts';
import type { TensorBundle, WeightSpec } from '../wire/tfjs_artifacts.ts';
import type { SamplerState } from '../datasets/sampler.ts';
import { HostOptimizer } from '../nn/optim.ts';
import { NonFiniteWeightsError } from '../wire/errors.ts';

// The bundle's type is the wire's (the optimizers make them too); importable from here as before.
export type { TensorBundle } from '../wire/tfjs_artifacts.ts';
/** The model in TF.js's save format (topology, weight specs, weight bytes). */
export async function modelArtifacts(model: tf.LayersModel): Promise<Checkpoint['model']> {
  let captured: Checkpoint['model'] | undefined;
  await model.save(
    tf.io.withSaveHandler(async (artifacts) => {
      const weightData = artifacts.weightData === undefined ? new ArrayBuffer(0) : tf.io.CompositeArrayBuffer.join(artifacts.weightData);
      captured = { modelTopology: artifacts.modelTopology, weightSpecs: (artifacts.weightSpecs ?? []) as WeightSpec[], weightData };
      return { modelArtifactsInfo: { dateSaved: new Date(), modelTopologyType: 'JSON' } };
    }),
  );
  return captured!;
}

/** Sets the model's weights from saved artifacts (same architecture, weights in save order). */
export function loadModelWeights(model: tf.LayersModel, saved: TensorBundle, source = 'the loaded weights'): void {
  checkFiniteBundle(saved, source);
  const named = tf.io.decodeWeights(saved.weightData, saved.weightSpecs as tf.io.WeightsManifestEntry[]);
  const values = saved.weightSpecs.map((s) => named[s.name]);
  if (values.length !== model.weights.length) {
    throw new Error(`the saved model has ${values.length} weight tensors, this model has ${model.weights.length}`);
  }
  model.setWeights(values);
  for (const t of values) t.dispose();
}

/** The optimizer's state (iterations, moments ...) as specs and bytes; empty before its first step. */
export async function optimizerState(optimizer: tf.Optimizer): Promise<TensorBundle> {
  // A host optimizer's state is on the host already: its bytes, exactly.
  if (optimizer instanceof HostOptimizer) return optimizer.stateBundle();
  const weights = await optimizer.getWeights();
  try {
    const { data, specs } = await tf.io.encodeWeights(weights);
    return { weightSpecs: specs as WeightSpec[], weightData: data };
  } finally {
    // getWeights makes a new scalar for the iteration count each call; the rest are the optimizer's own variables.
    for (const w of weights) if (!(w.tensor instanceof tf.Variable)) w.tensor.dispose();
  }
}

/**
 * Restores optimizer state saved by `optimizerState` (moments matched by position, not name).
 * Use a fresh optimizer: TF.js's setWeights replaces the moment variables without disposing them.
 */
export async function loadOptimizerState(optimizer: tf.Optimizer, state: TensorBundle): Promise<void> {
  if (optimizer instanceof HostOptimizer) return optimizer.loadStateBundle(state);
  if (state.weightSpecs.length === 0) return;
  const named = tf.io.decodeWeights(state.weightData, state.weightSpecs as tf.io.WeightsManifestEntry[]);
  await optimizer.setWeights(state.weightSpecs.map((s) => ({ name: s.name, tensor: named[s.name] })));
  // setWeights copied them into variables.
  for (const t of Object.values(named)) t.dispose();
}

/** A JSON value: what the user's extras and a state dict's metadata may hold. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** torch's Stateful protocol: anything with a state dict (the user's extras, for example). */
export interface Stateful<T> {
  stateDict(): T | Promise<T>;
  loadStateDict(state: T): void | Promise<void>;
}

/** Where a run is: committed steps, and the sampler's position (epoch, position in its global order). */
export interface Progress extends SamplerState {
  /** Steps committed in the whole run. */
  step: number;
}

export interface TrainStateDict {
  progress: Progress;
  /** The model in TF.js's save format (all weights, in save order). */
  model: Checkpoint['model'];
  optimizer: TensorBundle;
  extras: Json;
}

export interface TrainStateOptions {
  model: tf.LayersModel;
  /**
   * Makes the optimizer. Called again each time a state is loaded: a fresh optimizer restored
   * from the same bytes on every rank keeps the replicas bit-identical (a restored Adam
   * recomputes its beta powers with pow(), which can differ in the last bit from the running
   * product), and TF.js's setWeights would leak the old moment variables.
   */
  optimizer: () => tf.Optimizer;
  /** The user's own state (a step counter of theirs, a learning-rate schedule, ...). */
  extras?: Stateful<Json>;
}

/**
 * A replica's training state: model, optimizer, progress and extras, with `stateDict()` and
 * `loadStateDict()`. The elastic runner keeps `progress` up to date as steps commit.
 */
export class TrainState {
  readonly model: tf.LayersModel;
  private opt: tf.Optimizer;
  progress: Progress = { step: 0, epoch: 0, position: 0 };

  constructor(private readonly options: TrainStateOptions) {
    this.model = options.model;
    this.opt = options.optimizer();
  }

  get optimizer(): tf.Optimizer {
    return this.opt;
  }

  async stateDict(): Promise<TrainStateDict> {
    return {
      progress: { ...this.progress },
      model: await modelArtifacts(this.model),
      optimizer: await optimizerState(this.opt),
      extras: this.options.extras ? await this.options.extras.stateDict() : null,
    };
  }

  /** Restores every part of `state`, into a fresh optimizer. */
  async loadStateDict(state: TrainStateDict): Promise<void> {
    checkProgress(state.progress);
    loadModelWeights(this.model, state.model, 'the loaded training state');
    const fresh = this.options.optimizer();
    await loadOptimizerState(fresh, state.optimizer);
    this.opt.dispose();
    this.opt = fresh;
    this.progress = { ...state.progress };
    if (this.options.extras) await this.options.extras.loadStateDict(state.extras);
  }

  /** Frees the optimizer's variables (the model is the caller's). */
  dispose(): void {
    this.opt.dispose();
  }
}

/**
 * Refuses (NonFiniteWeightsError) a bundle whose float32 tensors hold a NaN or an infinity: a
 * checkpoint or a peer's state must not make a model non-finite. Reads the bytes, no device.
 */
export function checkFiniteBundle(saved: TensorBundle, source: string): void {
  const data = saved.weightData;
  let offset = 0;
  for (const [index, spec] of saved.weightSpecs.entries()) {
    const size = spec.shape.reduce((a, b) => a * b, 1);
    const bytes = size * (spec.dtype === 'bool' ? 1 : 4);
    if (spec.dtype === 'float32') {
      if (offset + bytes > data.byteLength) return; // a short bundle: decodeWeights says so
      const values = new Float32Array(data.slice(offset, offset + bytes));
      for (let i = 0; i < values.length; i++) if (!Number.isFinite(values[i]!)) throw new NonFiniteWeightsError(spec.name, index, source);
    }
    offset += bytes;
  }
}

/** The most epochs a state may claim: the sampler seeds each epoch with seed + epoch, which must stay a safe integer. */
const MAX_EPOCH = 2 ** 31;

/** Refuses (RangeError) progress no run can be at: a restored checkpoint's or a peer's state. */
export function checkProgress(p: unknown): void {
  const o = (typeof p === 'object' && p !== null ? p : {}) as Record<string, unknown>;
  for (const key of ['step', 'epoch', 'position'] as const) {
    const v = o[key];
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0)
      throw new RangeError(`the state's progress.${key} must be an integer >= 0, got ${String(v)}: the checkpoint or state is damaged`);
  }
  if ((o.epoch as number) > MAX_EPOCH)
    throw new RangeError(`the state's progress.epoch ${String(o.epoch)} is past ${MAX_EPOCH}: the checkpoint or state is damaged`);
}
