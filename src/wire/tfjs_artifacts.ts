/**
 * TF.js's save format as this library reads and writes it, without TF.js: a tensor's spec (name,
 * shape, dtype), a bundle of named tensors as specs plus their bytes (a model's weights, an
 * optimizer's state), and a model topology's layers. Checkpoints, state transfers, the host's
 * offered model and the optimizers all speak it, so it sits at the bottom.
 */

export interface WeightSpec {
  name: string;
  shape: number[];
  dtype: string;
}

/** Named tensors: their specs, and their values one after another in `weightData` (TF.js's encodeWeights). */
export interface TensorBundle {
  weightSpecs: WeightSpec[];
  weightData: ArrayBuffer;
}

/** A JSON object (not null, not an array). */
export function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A layer as a TF.js (or Keras) model topology writes it. */
export interface LayerJson {
  class_name: string;
  config: Record<string, unknown>;
}

/**
 * A model topology's class and layers, in order: TF.js's `{class_name, config: {layers}}`, an
 * older `config` that is the list itself, or Keras's saved format wrapping it in `model_config`.
 * The layers are the topology's own objects (a caller may edit a copy of the topology through them).
 */
export function topologyLayers(topology: unknown): { className: string | undefined; layers: LayerJson[] } {
  let t: Record<string, unknown> = isObject(topology) ? topology : {};
  if (isObject(t.model_config)) t = t.model_config;
  const config = t.config;
  const layers = Array.isArray(config) ? config : isObject(config) && Array.isArray(config.layers) ? config.layers : [];
  return { className: typeof t.class_name === 'string' ? t.class_name : undefined, layers: layers as LayerJson[] };
}
