/**
 * Datasets in the style of torch.utils.data: map-style `Dataset`s addressed by index, so a
 * `DistributedSampler` can hand each rank its own indices and every rank reads the same data.
 * This module has the interface, in-memory datasets and `subset` (torch.utils.data.Subset); one
 * module per source beside it: mnist.ts (IDX files), synthetic.ts, csv.ts, text.ts.
 *
 * Runs in the browser (bundled by Vite) and in Node: no Node-only imports and no TF.js, only
 * typed arrays.
 */

/** A map-style dataset (torch.utils.data.Dataset): samples addressed by index. */
export interface Dataset {
  readonly name: string;
  readonly length: number;
  /** Shape of one input sample, e.g. [28, 28, 1] for MNIST images or [n] for tabular rows. */
  readonly inputShape: number[];
  readonly numClasses: number;
  /**
   * Shape of one sample's labels: absent or [] for one label per sample (classification); [T] for
   * one per position (a language model's next tokens, see text.ts). Losses and accuracies count
   * every label.
   */
  readonly targetShape?: number[];
  /** Inputs of the given samples, concatenated row-major (indices.length * prod(inputShape) floats), and their integer labels (indices.length * prod(targetShape)). */
  batch(indices: ArrayLike<number>): { x: Float32Array; y: Int32Array };
  /**
   * A streamed dataset (samples loaded as steps need them, e.g. the host's images, see
   * streamed.ts) loads these samples; `batch` of samples not prepared throws. In-memory datasets
   * have none. `fetchBatch` does both.
   */
  prepare?(indices: ArrayLike<number>): Promise<void>;
}

/** `dataset.batch(indices)`, after loading them where the dataset streams. */
export async function fetchBatch(dataset: Dataset, indices: ArrayLike<number>): Promise<{ x: Float32Array; y: Int32Array }> {
  await dataset.prepare?.(indices);
  return dataset.batch(indices);
}

/** Labels per sample: prod(targetShape), 1 for a classification set. */
export function labelsPerSample(dataset: Pick<Dataset, 'targetShape'>): number {
  return product(dataset.targetShape ?? []);
}

/** Bad data or bad arguments: a malformed file, a label out of range, an index out of range. */
export class DatasetError extends Error {
  override name = 'DatasetError';
}

/** A download failed. `status` is the HTTP status, or undefined when no response arrived. */
export class DatasetFetchError extends DatasetError {
  override name = 'DatasetFetchError';
  constructor(
    message: string,
    readonly url: string,
    readonly status?: number,
  ) {
    super(message);
  }
}

export interface InMemoryDatasetInit {
  name: string;
  /** All inputs, row-major: length * prod(inputShape) floats. */
  inputs: Float32Array;
  /** One label per sample, each in [0, numClasses). */
  labels: Int32Array;
  inputShape: number[];
  numClasses: number;
  /** Names of classes 0..numClasses-1, when the source had names. */
  classNames?: readonly string[];
}

/**
 * A dataset held fully in memory (like torch.utils.data.TensorDataset, over plain typed arrays).
 * Everything is decoded once up front, so `batch` only copies slices.
 */
export class InMemoryDataset implements Dataset {
  readonly name: string;
  readonly length: number;
  readonly inputShape: number[];
  readonly numClasses: number;
  readonly classNames?: readonly string[];
  /** Floats per sample: prod(inputShape). */
  readonly sampleSize: number;
  readonly inputs: Float32Array;
  readonly labels: Int32Array;

  constructor(init: InMemoryDatasetInit) {
    const { name, inputs, labels, inputShape, numClasses, classNames } = init;
    for (const d of inputShape) {
      if (!Number.isSafeInteger(d) || d < 1) {
        throw new DatasetError(`${name}: inputShape [${inputShape.join(', ')}] must hold positive integers`);
      }
    }
    if (!Number.isSafeInteger(numClasses) || numClasses < 1) {
      throw new DatasetError(`${name}: numClasses must be a positive integer, got ${numClasses}`);
    }
    if (classNames !== undefined && classNames.length !== numClasses) {
      throw new DatasetError(`${name}: ${classNames.length} class names for ${numClasses} classes`);
    }
    const sampleSize = product(inputShape);
    if (inputs.length !== labels.length * sampleSize) {
      throw new DatasetError(
        `${name}: ${inputs.length} input floats for ${labels.length} labels of ${sampleSize} floats each ` +
          `(expected ${labels.length * sampleSize})`,
      );
    }
    for (let i = 0; i < labels.length; i++) {
      const label = labels[i]!;
      if (label < 0 || label >= numClasses) {
        throw new DatasetError(`${name}: label ${label} of sample ${i} is outside [0, ${numClasses})`);
      }
    }
    this.name = name;
    this.length = labels.length;
    this.inputShape = [...inputShape];
    this.numClasses = numClasses;
    if (classNames !== undefined) this.classNames = [...classNames];
    this.sampleSize = sampleSize;
    this.inputs = inputs;
    this.labels = labels;
  }

  batch(indices: ArrayLike<number>): { x: Float32Array; y: Int32Array } {
    const n = indices.length;
    const size = this.sampleSize;
    const x = new Float32Array(n * size);
    const y = new Int32Array(n);
    for (let k = 0; k < n; k++) {
      const i = indices[k]!;
      checkIndex(this, i, k);
      x.set(this.inputs.subarray(i * size, (i + 1) * size), k * size);
      y[k] = this.labels[i]!;
    }
    return { x, y };
  }
}

/** A view of some samples of another dataset, in the given order (torch.utils.data.Subset). */
export class Subset implements Dataset {
  readonly name: string;
  readonly length: number;
  readonly inputShape: number[];
  readonly numClasses: number;
  readonly targetShape?: number[];
  /** Indices into `dataset`; sample i of the subset is sample indices[i] of the dataset. */
  readonly indices: Int32Array;

  constructor(
    readonly dataset: Dataset,
    indices: ArrayLike<number>,
    name?: string,
  ) {
    this.indices = new Int32Array(indices.length);
    for (let k = 0; k < indices.length; k++) {
      const i = indices[k]!;
      checkIndex(dataset, i, k);
      this.indices[k] = i;
    }
    this.name = name ?? `${dataset.name}[${indices.length}]`;
    this.length = indices.length;
    this.inputShape = [...dataset.inputShape];
    this.numClasses = dataset.numClasses;
    if (dataset.targetShape) this.targetShape = [...dataset.targetShape];
    // A view of a streamed dataset streams too: its samples are the dataset's.
    if (dataset.prepare) this.prepare = (indices) => dataset.prepare!(this.map(indices));
  }

  readonly prepare?: (indices: ArrayLike<number>) => Promise<void>;

  batch(indices: ArrayLike<number>): { x: Float32Array; y: Int32Array } {
    return this.dataset.batch(this.map(indices));
  }

  private map(indices: ArrayLike<number>): Int32Array {
    const mapped = new Int32Array(indices.length);
    for (let k = 0; k < indices.length; k++) {
      const i = indices[k]!;
      checkIndex(this, i, k);
      mapped[k] = this.indices[i]!;
    }
    return mapped;
  }
}

/** torch.utils.data.Subset: the samples of `dataset` at `indices`, e.g. a short CI run's first 1000. */
export function subset(dataset: Dataset, indices: ArrayLike<number>, name?: string): Subset {
  return new Subset(dataset, indices, name);
}

function checkIndex(dataset: Dataset, i: number, position: number): void {
  if (!Number.isInteger(i) || i < 0 || i >= dataset.length) {
    throw new DatasetError(`${dataset.name}: index ${i} (position ${position}) is out of range for a dataset of length ${dataset.length}`);
  }
}

export function product(dims: readonly number[]): number {
  let p = 1;
  for (const d of dims) p *= d;
  return p;
}
