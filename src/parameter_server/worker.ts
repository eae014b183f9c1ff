/**
 * What a parameter-server worker does between a pull and a push, without any transport: set its
 * model's weights from the pulled values, compute the gradients of its batch as one flat buffer
 * (model order, as DDP lays them out), then cut it per server with `splitByShard`.
 */
import * as tf from '@tensorflow/tfjs';

function sizeOf(shape: readonly (number | null)[]): number {
  return shape.reduce<number>((a, b) => a * (b ?? 1), 1);
}

/** Sets `model`'s trainable weights from one flat buffer in `model.trainableWeights` order. */
export function assignFlatWeights(model: tf.LayersModel, flat: Float32Array): void {
  const weights = model.trainableWeights;
  const total = weights.reduce((n, w) => n + sizeOf(w.shape), 0);
  if (flat.length !== total) throw new RangeError(`the flat weights have ${flat.length} elements, the model's trainable weights ${total}`);
  let offset = 0;
  for (const w of weights) {
    const size = sizeOf(w.shape);
    const t = tf.tensor(flat.subarray(offset, offset + size), w.shape as number[], 'float32');
    (w.read() as tf.Variable).assign(t);
    t.dispose();
    offset += size;
  }
}

/**
 * The loss of `lossFn` and its gradients with respect to `model`'s trainable weights, flattened
 * in `model.trainableWeights` order (one readback from the device).
 */
export async function flatGradients(model: tf.LayersModel, lossFn: () => tf.Scalar): Promise<{ loss: number; grads: Float32Array }> {
  const variables = model.trainableWeights.map((w) => w.read() as tf.Variable);
  const { value, grads } = tf.variableGrads(lossFn, variables);
  const flat = tf.tidy(() => tf.concat(variables.map((v) => grads[v.name].reshape([-1]))));
  try {
    const [loss, values] = await Promise.all([value.data(), flat.data()]);
    return { loss: loss[0], grads: values as Float32Array };
  } finally {
    tf.dispose([value, flat, ...Object.values(grads)]);
  }
}
