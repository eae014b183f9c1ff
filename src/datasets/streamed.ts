/**
 * A dataset whose samples are loaded as the steps need them instead of all at the start: the
 * host's image folder of tens of thousands of images, which a tab could not hold decoded (100,000
 * RGB images of 64 x 64 are 4.9 GB of float32). The labels are known up front (the server's
 * manifest); each sample's input is loaded by index (`load`), at most `concurrency` at a time, and
 * kept in a bounded cache (least recently used out). `prepare(indices)` loads what a batch needs;
 * the trainers call it for the step's samples, and runElastic's `prefetch` for the next step's
 * while this one computes.
 */
import { DatasetError, product, type Dataset } from './dataset.ts';

export interface StreamedDatasetInit {
  name: string;
  /** One label per sample (the manifest's): the dataset's length. */
  labels: Int32Array;
  inputShape: number[];
  numClasses: number;
  classNames?: readonly string[];
  /** Sample i's input, prod(inputShape) floats; rejects naming the sample's source. */
  load(index: number): Promise<Float32Array>;
  /** Most samples kept decoded (default 4096); the samples of the batch being prepared are never evicted. */
  cacheSamples?: number;
  /** Loads in flight at once (default 6, a browser's connections to one host). */
  concurrency?: number;
}

export class StreamedDataset implements Dataset {
  readonly name: string;
  readonly length: number;
  readonly inputShape: number[];
  readonly numClasses: number;
  readonly classNames?: readonly string[];
  readonly cacheSamples: number;
  private readonly labels: Int32Array;
  private readonly sampleSize: number;
  private readonly load: (index: number) => Promise<Float32Array>;
  private readonly concurrency: number;
  /** Decoded inputs by index, oldest use first (a Map keeps insertion order: a use re-inserts). */
  private readonly cache = new Map<number, Float32Array>();
  private readonly loading = new Map<number, Promise<Float32Array>>();
  private active = 0;
  private readonly waiting: Array<() => void> = [];
  /** Samples loaded so far (a sample evicted and needed again counts again). */
  loads = 0;

  constructor(init: StreamedDatasetInit) {
    this.name = init.name;
    this.labels = init.labels;
    this.length = init.labels.length;
    this.inputShape = [...init.inputShape];
    this.numClasses = init.numClasses;
    if (init.classNames) this.classNames = [...init.classNames];
    this.sampleSize = product(init.inputShape);
    this.load = init.load;
    this.cacheSamples = Math.max(1, init.cacheSamples ?? 4096);
    this.concurrency = Math.max(1, init.concurrency ?? 6);
  }

  /** Loads the samples not in the cache; then every one of them is (until `cacheSamples` newer ones push it out). */
  async prepare(indices: ArrayLike<number>): Promise<void> {
    const wanted = [...new Set(Array.from(indices))];
    for (const [k, i] of wanted.entries()) this.check(i, k);
    if (wanted.length > this.cacheSamples)
      throw new DatasetError(
        `${this.name}: a batch of ${wanted.length} samples does not fit a cache of ${this.cacheSamples}: raise cacheSamples`,
      );
    const loaded = await Promise.all(wanted.map((i) => this.cache.get(i) ?? this.loadOnce(i)));
    // Used now: newest in the cache, and nothing of this batch evicted to make room for it.
    wanted.forEach((i, k) => {
      this.cache.delete(i);
      this.cache.set(i, loaded[k]!);
    });
    const keep = new Set(wanted);
    for (const i of this.cache.keys()) {
      if (this.cache.size <= this.cacheSamples) break;
      if (!keep.has(i)) this.cache.delete(i);
    }
  }

  batch(indices: ArrayLike<number>): { x: Float32Array; y: Int32Array } {
    const size = this.sampleSize;
    const x = new Float32Array(indices.length * size);
    const y = new Int32Array(indices.length);
    for (let k = 0; k < indices.length; k++) {
      const i = indices[k]!;
      this.check(i, k);
      const input = this.cache.get(i);
      if (!input)
        throw new DatasetError(
          `${this.name}: sample ${i} is not loaded: a streamed dataset loads a batch's samples with prepare(indices) (or fetchBatch) before batch()`,
        );
      x.set(input, k * size);
      y[k] = this.labels[i]!;
    }
    return { x, y };
  }

  private check(i: number, position: number): void {
    if (!Number.isInteger(i) || i < 0 || i >= this.length)
      throw new DatasetError(`${this.name}: index ${i} (position ${position}) is out of range for a dataset of length ${this.length}`);
  }

  private loadOnce(i: number): Promise<Float32Array> {
    let p = this.loading.get(i);
    if (!p) {
      p = this.throttled(() => this.load(i))
        .then((input) => {
          if (input.length !== this.sampleSize)
            throw new DatasetError(
              `${this.name}: sample ${i} loaded ${input.length} values, not the ${this.sampleSize} of [${this.inputShape.join(', ')}]`,
            );
          this.loads++;
          return input;
        })
        .finally(() => this.loading.delete(i));
      this.loading.set(i, p);
    }
    return p;
  }

  private async throttled<T>(task: () => Promise<T>): Promise<T> {
    while (this.active >= this.concurrency) await new Promise<void>((resolve) => this.waiting.push(resolve));
    this.active++;
    try {
      return await task();
    } finally {
      this.active--;
      this.waiting.shift()?.();
    }
  }
}
