/**
 * Small models for the training job and tests. Initial weights come from `seed` alone, so every
 * rank (and every world size) starts from the same weights even before DDP's broadcast.
 * Models output logits; the loss applies the softmax.
 */
import * as tf from '@tensorflow/tfjs';

export type ModelKind = 'mlp' | 'cnn';

export interface ModelSpec {
  kind: ModelKind;
  inputShape: number[];
  numClasses: number;
  seed: number;
  /** Width of the MLP's hidden layer. Default 128 for images, 32 for vectors. */
  hidden?: number;
}

export function buildModel(spec: ModelSpec): tf.LayersModel {
  const { kind, inputShape, numClasses, seed } = spec;
  // One seed per layer, derived from the model's seed, so layers do not share random streams.
  let layerIndex = 0;
  const kernel = () => tf.initializers.glorotUniform({ seed: seed * 1000 + ++layerIndex });
  const model = tf.sequential({ name: `${kind}-seed${seed}` });
  if (kind === 'mlp') {
    const hidden = spec.hidden ?? (inputShape.length > 1 ? 128 : 32);
    if (inputShape.length > 1) model.add(tf.layers.flatten({ inputShape }));
    model.add(
      tf.layers.dense({
        units: hidden,
        activation: 'relu',
        kernelInitializer: kernel(),
        ...(inputShape.length > 1 ? {} : { inputShape }),
      }),
    );
    model.add(tf.layers.dense({ units: numClasses, kernelInitializer: kernel() }));
  } else if (kind === 'cnn') {
    if (inputShape.length !== 3) throw new Error(`the cnn model needs image inputs [h, w, c], got shape [${inputShape.join(', ')}]`);
    model.add(tf.layers.conv2d({ inputShape, filters: 8, kernelSize: 3, activation: 'relu', kernelInitializer: kernel() }));
    model.add(tf.layers.maxPooling2d({ poolSize: 2 }));
    model.add(tf.layers.conv2d({ filters: 16, kernelSize: 3, activation: 'relu', kernelInitializer: kernel() }));
    model.add(tf.layers.maxPooling2d({ poolSize: 2 }));
    model.add(tf.layers.flatten());
    model.add(tf.layers.dense({ units: numClasses, kernelInitializer: kernel() }));
  } else {
    const unknown: never = kind;
    throw new Error(`unknown model "${String(unknown)}"; use mlp or cnn`);
  }
  return model;
}

/** Mean softmax cross-entropy of logits against integer labels. */
export function classificationLoss(logits: tf.Tensor, labels: tf.Tensor1D, numClasses: number): tf.Scalar {
  return tf.tidy(() => tf.losses.softmaxCrossEntropy(tf.oneHot(labels, numClasses), logits) as tf.Scalar);
}
