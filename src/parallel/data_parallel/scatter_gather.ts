/**
 * Scattering a batch over devices and gathering their gradients back (torch's
 * nn/parallel/scatter_gather.py), with no TF.js and no Workers: plain arrays, tested exhaustively.
 *
 * The batch is cut along its first dimension into chunks whose sizes differ by at most one, the
 * larger first (torch.tensor_split's rule; torch.chunk's ceil-sized chunks can leave a device
 * idle: 10 samples over 4 devices are 3, 3, 3, 1 there and 3, 3, 2, 2 here). A batch smaller
 * than the devices leaves the last ones without work for that step.
 *
 * Each device returns the gradient of its chunk's mean loss; the gradient of the whole batch's
 * mean loss is their sum weighted by each chunk's share of the samples. It is summed in float64,
 * in device order, so the result does not depend on which device answered first.
 */

/** Sizes of `samples` split over `devices`: differ by at most one, larger first; zeros for devices left without samples. */
export function chunkSizes(samples: number, devices: number): number[] {
  if (!Number.isSafeInteger(samples) || samples < 0) throw new RangeError(`a batch has a whole number of samples >= 0, got ${samples}`);
  if (!Number.isSafeInteger(devices) || devices < 1) throw new RangeError(`devices must be a positive integer, got ${devices}`);
  const base = Math.floor(samples / devices);
  const extra = samples % devices;
  return Array.from({ length: devices }, (_, i) => base + (i < extra ? 1 : 0));
}

/** One device's part of a batch: samples `start .. start + samples - 1`. */
export interface Chunk<T extends Float32Array | Int32Array> {
  device: number;
  start: number;
  samples: number;
  /** A copy (it is transferred to the device), `samples x perSample` values. */
  values: T;
}

/**
 * Cuts `values` (`samples x perSample`, sample-major) into the chunks of `sizes`, each a copy of
 * its own; devices with no samples get none.
 */
export function scatter<T extends Float32Array | Int32Array>(values: T, perSample: number, sizes: number[]): Array<Chunk<T>> {
  const samples = sizes.reduce((a, b) => a + b, 0);
  if (values.length !== samples * perSample) {
    throw new RangeError(`the batch has ${values.length} values, but ${samples} samples of ${perSample} need ${samples * perSample}`);
  }
  const chunks: Array<Chunk<T>> = [];
  let start = 0;
  sizes.forEach((n, device) => {
    if (n > 0) chunks.push({ device, start, samples: n, values: values.slice(start * perSample, (start + n) * perSample) as T });
    start += n;
  });
  return chunks;
}

/**
 * The whole batch's mean-loss gradient from the chunks' ones: sum over chunks of
 * (samples_k / total) x grads_k, in float64, in the order given. Also the loss, weighted alike.
 */
export function gatherMean(parts: ReadonlyArray<{ samples: number; loss: number; grads: Float32Array }>): {
  loss: number;
  grads: Float32Array;
} {
  if (parts.length === 0) throw new RangeError('nothing to gather: no device computed a chunk');
  const total = parts.reduce((a, p) => a + p.samples, 0);
  const length = parts[0]!.grads.length;
  const sum = new Float64Array(length);
  let loss = 0;
  for (const p of parts) {
    if (p.grads.length !== length)
      throw new RangeError(`a device returned ${p.grads.length} gradient values where the others returned ${length}`);
    const w = p.samples / total;
    const g = p.grads;
    for (let i = 0; i < length; i++) sum[i] += w * g[i]!;
    loss += w * p.loss;
  }
  return { loss, grads: Float32Array.from(sum) };
}
