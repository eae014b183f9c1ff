/**
 * This rank's gradients of a loss (for `DistributedDataParallel.backward`): the model's and, kept
 * apart, the given inputs' (a pipeline stage sends those upstream instead of reducing them), the
 * loss read back, and the model's read back bucket by bucket; and the averages, once reduced, as
 * a TF.js optimizer takes them on the device. Nothing leaks when a readback fails (a lost GPU
 * device, say).
 */
import * as tf from '@tensorflow/tfjs';
import { fillBucket, type Bucket } from './buckets.ts';
import type { BackwardOptions } from './ddp_types.ts';

export interface LossGradients {
  loss: number;
  /** The variables' gradients, by variable name: the caller disposes them. */
  grads: tf.NamedTensorMap;
  /** The inputs' gradients, in the inputs' order: the caller hands them on or disposes them. */
  inputGrads: tf.Tensor[];
}

/** Differentiates `lossFn` with respect to `variables` and `inputs`, and reads the loss back. */
export async function lossGradients(
  lossFn: () => tf.Scalar,
  variables: readonly tf.Variable[],
  inputs: readonly tf.Variable[],
): Promise<LossGradients> {
  const { value, grads } = tf.variableGrads(lossFn, [...variables, ...inputs]);
  // The inputs' gradients go back to the caller (a pipeline stage sends them upstream), not into the buckets.
  const inputGrads = inputs.map((v) => {
    const g = grads[v.name]!;
    delete grads[v.name];
    return g;
  });
  let loss: number;
  try {
    loss = (await value.data())[0];
  } catch (err) {
    // A failed readback (a lost GPU device, say) must not leak the gradients.
    for (const g of [...Object.values(grads), ...inputGrads]) g.dispose();
    throw err;
  } finally {
    value.dispose();
  }
  return { loss, grads, inputGrads };
}

/** One backward's pass over the buckets: where the time went, and the reductions DDP started. */
export interface BucketPass {
  readback: number;
  slowed: number;
  /** When the first reduction started and the last landed (for `BackwardTimings.comm`). */
  commStart: number;
  commEnd: number;
  reductions: Array<Promise<unknown>>;
  /** Buckets whose averages hold a NaN or an infinity (checked as each all-reduce lands). */
  nonfinite: Bucket[];
}

/** The flat gradient buffer and how the model's variables fill it. */
export interface Bucketed {
  buckets: readonly Bucket[];
  variables: readonly tf.Variable[];
  /** Each variable's element count, in model order. */
  sizes: number[];
  /** The flat buffer, in model order. */
  grad: Float32Array;
  /** Add to what `grad` holds (noSync's accumulation) instead of replacing it. */
  accumulate: boolean;
}

/** Bucket `bucket`'s gradients, read back from the device as one flat array in bucket order. */
async function readBucket(grads: tf.NamedTensorMap, bucket: Bucket, variables: readonly tf.Variable[]): Promise<Float32Array> {
  const flat = tf.tidy(() => tf.concat(bucket.params.map((i) => grads[variables[i].name].reshape([-1]))));
  try {
    return (await flat.data()) as Float32Array;
  } finally {
    flat.dispose();
  }
}

/**
 * Reads each bucket's gradients back from the device into the flat buffer, in bucket order,
 * calling `reduce` on each bucket's span as soon as it is filled, so that its reduction overlaps
 * the next bucket's readback. `computeMs` (the forward and backward) counts with the first
 * readback, which waits for them to finish; a straggler waits after each readback.
 */
export async function readBuckets(
  b: Bucketed,
  grads: tf.NamedTensorMap,
  computeMs: number,
  straggler: BackwardOptions['straggler'],
  reduce: ((pass: BucketPass, index: number, view: Float32Array) => void) | null,
): Promise<BucketPass> {
  const pass: BucketPass = { readback: 0, slowed: 0, commStart: 0, commEnd: 0, reductions: [], nonfinite: [] };
  let unstretched = computeMs;
  for (const [index, bucket] of b.buckets.entries()) {
    const r0 = performance.now();
    const local = await readBucket(grads, bucket, b.variables);
    const took = performance.now() - r0;
    pass.readback += took;
    if (straggler) {
      pass.slowed += await straggler.after(unstretched + took);
      unstretched = 0;
    }
    const view = b.grad.subarray(bucket.start, bucket.end);
    // The bucket's flat gradient lists parameters in bucket order; the buffer keeps model order.
    fillBucket(view, local, bucket, b.sizes, b.accumulate);
    reduce?.(pass, index, view);
  }
  // No buckets (no trainable weights): the compute alone.
  if (straggler && unstretched > 0) pass.slowed += await straggler.after(unstretched);
  return pass;
}

/** Applies the flat gradients `grad` (the variables' `sizes`, in order) with a TF.js optimizer, on the device. */
export function applyOnDevice(
  optimizer: tf.Optimizer,
  variables: readonly tf.Variable[],
  grad: Float32Array,
  sizes: readonly number[],
): void {
  tf.tidy(() => {
    const named: tf.NamedTensorMap = {};
    let offset = 0;
    variables.forEach((v, i) => {
      named[v.name] = tf.tensor(grad.subarray(offset, offset + sizes[i]), v.shape, 'float32');
      offset += sizes[i];
    });
    optimizer.applyGradients(named);
  });
}
