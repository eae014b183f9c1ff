/**
 * A replica's full training state (model weights and optimizer state) as bytes: to put in a
 * checkpoint, or to broadcast from a surviving replica to the others after a regroup.
 */
import * as tf from '@tensorflow/tfjs';
import type { Checkpoint, WeightSpec } from './checkpoint.ts';

export interface TensorBundle {
  weightSpecs: WeightSpec[];
  weightData: ArrayBuffer;
}

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
export function loadModelWeights(model: tf.LayersModel, saved: TensorBundle): void {
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
  const weights = await optimizer.getWeights();
  const { data, specs } = await tf.io.encodeWeights(weights);
  return { weightSpecs: specs as WeightSpec[], weightData: data };
}

/**
 * Restores optimizer state saved by `optimizerState` (moments matched by position, not name).
 * Use a fresh optimizer: TF.js's setWeights replaces the moment variables without disposing them.
 */
export async function loadOptimizerState(optimizer: tf.Optimizer, state: TensorBundle): Promise<void> {
  if (state.weightSpecs.length === 0) return;
  const named = tf.io.decodeWeights(state.weightData, state.weightSpecs as tf.io.WeightsManifestEntry[]);
  await optimizer.setWeights(state.weightSpecs.map((s) => ({ name: s.name, tensor: named[s.name] })));
  // setWeights copied them into variables.
  for (const t of Object.values(named)) t.dispose();
}
