/**
 * DDP's gradient buckets (torch's Reducer buckets): which parameters' gradients are reduced
 * together, where each lies in the flat gradient buffer, and the bucket as a communication hook
 * sees it. The flat buffer keeps the model's order; a bucket lists its parameters in reverse
 * order (gradients are ready last-layer first) and spans them, contiguous, in the buffer.
 */
import type { GradBucket } from '../comm_hooks/types.ts';
import { allFinite } from '../../wire/finite.ts';

export interface Bucket {
  /** Indices into `model.trainableWeights`. */
  params: number[];
  /** Where each parameter's gradient starts in the flat gradient buffer (elements). */
  offsets: number[];
  /** The bucket's span of the flat buffer. */
  start: number;
  end: number;
}

/**
 * torch's bucketing: parameters in reverse order (gradients are ready last-layer first), whole
 * parameters per bucket, a new bucket once the cap is reached; the first cap is small so that
 * communication starts early.
 */
export function assignBuckets(sizes: number[], firstCapBytes: number, capBytes: number): Bucket[] {
  // Flat layout follows model order, so the flat buffer is the weights' natural order.
  const offsets: number[] = [];
  let total = 0;
  for (const s of sizes) {
    offsets.push(total);
    total += s;
  }
  const buckets: Bucket[] = [];
  let current: number[] = [];
  let bytes = 0;
  const close = () => {
    if (current.length === 0) return;
    // Reverse-order parameters are contiguous in the flat buffer; the bucket spans them.
    const start = Math.min(...current.map((i) => offsets[i]));
    const end = Math.max(...current.map((i) => offsets[i] + sizes[i]));
    buckets.push({ params: current, offsets: current.map((i) => offsets[i]), start, end });
    current = [];
    bytes = 0;
  };
  for (let i = sizes.length - 1; i >= 0; i--) {
    current.push(i);
    bytes += sizes[i] * 4;
    if (bytes >= (buckets.length === 0 ? firstCapBytes : capBytes)) close();
  }
  close();
  return buckets;
}

/** `bucket`'s parameters as hooks see them (`GradBucket.parameters`): offsets within the bucket. */
export function bucketParameters(bucket: Bucket, shapes: number[][], sizes: number[]): GradBucket['parameters'] {
  return bucket.params.map((index, k) => ({
    index,
    shape: shapes[index]!,
    offset: bucket.offsets[k]! - bucket.start,
    size: sizes[index]!,
  }));
}

/**
 * Puts a bucket's gradients, read back as one flat array in bucket order (`local`), into `view`,
 * the bucket's span of the flat buffer, which keeps model order: added to what `view` holds when
 * `accumulate` (gradients accumulated under noSync), else copied over it.
 */
export function fillBucket(view: Float32Array, local: Float32Array, bucket: Bucket, sizes: number[], accumulate: boolean): void {
  let at = 0;
  for (let k = 0; k < bucket.params.length; k++) {
    const offset = bucket.offsets[k] - bucket.start;
    const size = sizes[bucket.params[k]];
    const src = local.subarray(at, at + size);
    if (accumulate) for (let j = 0; j < size; j++) view[offset + j] += src[j];
    else view.set(src, offset);
    at += size;
  }
}

/** The first parameter of `buckets`, in model order, with a NaN or an infinity in its gradient in `grad` (the flat buffer). */
export function firstNonfinite(buckets: Bucket[], grad: Float32Array, sizes: number[]): number {
  const params = buckets.flatMap((b) => b.params.map((index, k) => ({ index, offset: b.offsets[k] }))).sort((a, b) => a.index - b.index);
  for (const { index, offset } of params) {
    if (!allFinite(grad.subarray(offset, offset + sizes[index]))) return index;
  }
  return params[0]!.index;
}
