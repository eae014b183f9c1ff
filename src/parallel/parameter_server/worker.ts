/**
 * What a parameter-server worker does between a pull and a push, without any transport: with its
 * model's weights set from the pulled values (`assignFlatWeights`, in replicas.ts), compute the
 * gradients of its batch as one flat buffer (model order, as DDP lays them out), then cut it per
 * server with `splitByShard`.
 */
import * as tf from '@tensorflow/tfjs';

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

/** What a worker holds between computing and delivering a push (kept across rounds). */
export interface PendingPush {
  stepId: number;
  parts: Float32Array[];
  versions: number[];
  samples: number;
}
