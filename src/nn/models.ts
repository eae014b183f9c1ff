/**
 * Small models for the training job and tests. Initial weights come from `seed` alone, so every
 * rank (and every world size) starts from the same weights even before DDP's broadcast.
 * Models output logits; the loss applies the softmax.
 *
 * A model is also a list of layer factories (`modelLayers`): a pipeline stage builds only its
 * own layers, and each layer's initial weights are the same as in the whole model, because a
 * layer's seed is fixed by its place in the list, not by the order layers are built in.
 */
import * as tf from '@tensorflow/tfjs';
import { languageModelLayers } from './language_model.ts';
import { sequentialOf, type LayerFactory } from './layer_factory.ts';
import { LM_DEFAULTS } from './lm_defaults.ts';

/** 'lm': the character-level transformer of language_model.ts, on windows of text (datasets/text.ts). */
export type ModelKind = 'mlp' | 'cnn' | 'lm';

export { LM_DEFAULTS };

export interface ModelSpec {
  kind: ModelKind;
  inputShape: number[];
  numClasses: number;
  seed: number;
  /**
   * Width of the hidden dense layer. The MLP's: default 128 for images, 32 for vectors. The CNN's,
   * between its convolutions and its classifier: default 0, none (5,258 parameters on MNIST);
   * 128 makes it the usual MNIST CNN (53,866), whose gradients are mostly that one matrix.
   * The language model's: the width of its residual stream (default 64, a multiple of its 4 heads).
   */
  hidden?: number;
}

/** The model's layers, in order, as factories (see `LayerFactory`). */
export function modelLayers(spec: ModelSpec): LayerFactory[] {
  const { kind, inputShape, numClasses, seed } = spec;
  // One seed per weighted layer, derived from the model's seed, so layers do not share random streams.
  let layerIndex = 0;
  const kernel = () => {
    const s = seed * 1000 + ++layerIndex;
    return () => tf.initializers.glorotUniform({ seed: s });
  };
  const shape = (s: number[] | undefined) => (s ? { inputShape: s } : {});
  if (kind === 'mlp') {
    const hidden = spec.hidden ?? (inputShape.length > 1 ? 128 : 32);
    if (!Number.isSafeInteger(hidden) || hidden < 1) throw new Error(`the mlp's hidden layer must be a width >= 1, got ${hidden}`);
    const k1 = kernel();
    const k2 = kernel();
    return [
      ...(inputShape.length > 1 ? [(s?: number[]) => tf.layers.flatten(shape(s))] : []),
      (s?: number[]) => tf.layers.dense({ units: hidden, activation: 'relu', kernelInitializer: k1(), ...shape(s) }),
      (s?: number[]) => tf.layers.dense({ units: numClasses, kernelInitializer: k2(), ...shape(s) }),
    ];
  }
  if (kind === 'cnn') {
    if (inputShape.length !== 3) throw new Error(`the cnn model needs image inputs [h, w, c], got shape [${inputShape.join(', ')}]`);
    const k1 = kernel();
    const k2 = kernel();
    const k3 = kernel();
    const hidden = spec.hidden ?? 0;
    if (!Number.isSafeInteger(hidden) || hidden < 0)
      throw new Error(`the cnn's hidden layer must be a width >= 0 (0: none), got ${hidden}`);
    // Drawn after the others' seeds, so a CNN without it keeps the weights it always had.
    const kh = kernel();
    return [
      (s?: number[]) => tf.layers.conv2d({ filters: 8, kernelSize: 3, activation: 'relu', kernelInitializer: k1(), ...shape(s) }),
      (s?: number[]) => tf.layers.maxPooling2d({ poolSize: 2, ...shape(s) }),
      (s?: number[]) => tf.layers.conv2d({ filters: 16, kernelSize: 3, activation: 'relu', kernelInitializer: k2(), ...shape(s) }),
      (s?: number[]) => tf.layers.maxPooling2d({ poolSize: 2, ...shape(s) }),
      (s?: number[]) => tf.layers.flatten(shape(s)),
      ...(hidden > 0
        ? [(s?: number[]) => tf.layers.dense({ units: hidden, activation: 'relu', kernelInitializer: kh(), ...shape(s) })]
        : []),
      (s?: number[]) => tf.layers.dense({ units: numClasses, kernelInitializer: k3(), ...shape(s) }),
    ];
  }
  if (kind === 'lm') {
    // Inputs are windows of token ids [T]; the classes are the vocabulary.
    if (inputShape.length !== 1) throw new Error(`the language model needs windows of token ids [T], got shape [${inputShape.join(', ')}]`);
    const dModel = spec.hidden ?? LM_DEFAULTS.dModel;
    if (!Number.isSafeInteger(dModel) || dModel < LM_DEFAULTS.heads || dModel % LM_DEFAULTS.heads !== 0)
      throw new Error(`the language model's width must be a multiple of its ${LM_DEFAULTS.heads} heads, got ${dModel}`);
    return languageModelLayers({
      vocabSize: numClasses,
      contextLength: inputShape[0]!,
      dModel,
      heads: LM_DEFAULTS.heads,
      blocks: LM_DEFAULTS.blocks,
      seed,
    });
  }
  const unknown: never = kind;
  throw new Error(`unknown model "${String(unknown)}"; use mlp, cnn or lm`);
}

export function buildModel(spec: ModelSpec): tf.LayersModel {
  return sequentialOf(modelLayers(spec), spec.inputShape, `${spec.kind}-seed${spec.seed}`);
}

// Layer factories are their own module (the language model makes them too); importable from here as before.
export { layerFactoriesOf, sequentialOf, type LayerFactory } from './layer_factory.ts';

// The losses are their own module (the language model uses them too); importable from here as before.
export { classificationLoss, correctPredictions } from './losses.ts';
