/**
 * The job's losses and metrics on logits and integer labels, for every model: one label per
 * sample (classification) or one per position (a language model's next tokens).
 */
import * as tf from '@tensorflow/tfjs';

/**
 * Mean softmax cross-entropy of logits against integer labels: one label per sample (logits
 * [B, C], labels [B]), or one per position (a language model's logits [B, T, C], labels [B, T]),
 * every label counted alike.
 */
export function classificationLoss(logits: tf.Tensor, labels: tf.Tensor, numClasses: number): tf.Scalar {
  return tf.tidy(() => {
    // [B, C] stays as it is: the classification loss is the same ops as it always was.
    const flatLogits = logits.rank === 2 ? logits : logits.reshape([-1, numClasses]);
    const flatLabels = labels.rank === 1 ? labels : labels.reshape([-1]);
    return tf.losses.softmaxCrossEntropy(tf.oneHot(flatLabels.toInt() as tf.Tensor1D, numClasses), flatLogits) as tf.Scalar;
  });
}

/** Predictions that match their labels (argmax of the last axis), summed: a scalar, float32. */
export function correctPredictions(logits: tf.Tensor, labels: tf.Tensor): tf.Scalar {
  return tf.tidy(() => logits.argMax(-1).equal(labels.toInt()).sum().cast('float32') as tf.Scalar);
}
