/**
 * A tab's own samples (a class's pictures from its camera or files), which never leave the tab:
 * `LocalDataset`. The tabs train one model on the union of their samples with runElastic's
 * `localData` option:
 *
 *   const mine = new LocalDataset({ name: 'mine', inputs, labels, inputShape: [32, 32, 3], numClasses: 3 });
 *   mine.add(picture, 2);                 // grow (or `remove(i)`) before the run starts
 *   await runElastic({ ...group, state, localData: mine, datasetLength: mine.length, batchSize: 16,
 *     step: (ctx) => ... mine.batch(ctx.indices) ..., onLocalData: (e) => show(e) });
 *
 * `localData` (ElasticRunOptions, parallel/ddp/runner_types.ts): every rank samples only its own
 * LocalDataset; `ctx.indices` index it. An epoch is over the union: each rank's own samples once
 * each, in its own seeded order (`order(epoch, seed)`); each step's `batchSize * worldSize`
 * samples are split between the ranks in proportion to their samples left in the epoch, so a tab
 * with 20 beside one with 200 finishes the epoch with it, and a rank whose samples are done takes
 * part with none. Each rank's gradient is weighed by its share (`ddp.setBatchShare`): the step's
 * gradient is the mean over the union of the step's batches. The ranks agree on the split from one
 * tiny exchange through the server per epoch and round (each rank's own count, placed at its rank
 * by the server: elastic/local_epoch.ts); only counts, gradients, votes and signals travel.
 * `heldOut`: this tab's own evaluation samples; runElastic then reports, at each epoch's end,
 * this tab's accuracy on them and the group's (the sample-weighted mean: elastic/local_eval.ts).
 *
 * Runs in the browser and in Node: typed arrays only, no TF.js.
 */
import { DatasetError, InMemoryDataset, product, type Dataset, type InMemoryDatasetInit } from './dataset.ts';
import { randpermWithGenerator, Mt19937 } from './sampler.ts';

/** The most samples one rank may hold (and claim to hold in the counts exchange): 16 M. */
export const MAX_LOCAL_SAMPLES = 1 << 24;

/** An in-memory set's fields (no samples yet: empty arrays), and this tab's held-out samples. */
export interface LocalDatasetInit extends InMemoryDatasetInit {
  /** This tab's own evaluation samples (never trained on, never sent). */
  heldOut?: { inputs: Float32Array; labels: Int32Array };
}

/** A rank's own samples, grown and shrunk before training (see the top of this file). */
export class LocalDataset implements Dataset {
  readonly name: string;
  readonly inputShape: number[];
  readonly numClasses: number;
  readonly classNames?: readonly string[];
  /** Floats per sample: prod(inputShape). */
  readonly sampleSize: number;
  /** This tab's evaluation samples, or null. */
  readonly heldOut: InMemoryDataset | null;
  private data: Float32Array;
  private targets: Int32Array;
  private count = 0;
  /** Set while a run trains on it: the epoch's order is fixed then. */
  private trainingBy: string | null = null;

  constructor(init: LocalDatasetInit) {
    const { name, inputs, labels, inputShape, numClasses } = init;
    // The in-memory set checks shapes, lengths and labels alike, with the same messages.
    const checked = new InMemoryDataset(init);
    if (labels.length > MAX_LOCAL_SAMPLES)
      throw new DatasetError(`${name}: ${labels.length} samples is more than one rank may hold (${MAX_LOCAL_SAMPLES})`);
    this.name = name;
    this.inputShape = checked.inputShape;
    this.numClasses = numClasses;
    if (checked.classNames) this.classNames = checked.classNames;
    this.sampleSize = product(inputShape);
    const capacity = Math.max(16, labels.length);
    this.data = new Float32Array(capacity * this.sampleSize);
    this.targets = new Int32Array(capacity);
    this.data.set(inputs);
    this.targets.set(labels);
    this.count = labels.length;
    this.heldOut = init.heldOut
      ? new InMemoryDataset({
          name: `${name} (held out)`,
          ...init.heldOut,
          inputShape,
          numClasses,
          ...(this.classNames ? { classNames: this.classNames } : {}),
        })
      : null;
  }

  get length(): number {
    return this.count;
  }

  /** Adds one sample (prod(inputShape) floats) of class `label`; returns its index. */
  add(input: Float32Array, label: number): number {
    this.checkIdle('add a sample');
    if (!(input instanceof Float32Array) || input.length !== this.sampleSize)
      throw new DatasetError(
        `${this.name}: a sample of ${input?.length} floats, expected ${this.sampleSize} (inputShape [${this.inputShape.join(', ')}]): resize it to the session's input size first`,
      );
    if (!Number.isInteger(label) || label < 0 || label >= this.numClasses)
      throw new DatasetError(`${this.name}: label ${label} is not a class of this dataset (0..${this.numClasses - 1}${this.namesNote()})`);
    if (this.count >= MAX_LOCAL_SAMPLES) throw new DatasetError(`${this.name}: already ${this.count} samples, the most one rank may hold`);
    if (this.count === this.targets.length) this.grow();
    this.data.set(input, this.count * this.sampleSize);
    this.targets[this.count] = label;
    return this.count++;
  }

  /** Removes sample `index`; the samples after it move down by one. */
  remove(index: number): void {
    this.checkIdle('remove a sample');
    this.checkIndex(index, 0);
    const s = this.sampleSize;
    this.data.copyWithin(index * s, (index + 1) * s, this.count * s);
    this.targets.copyWithin(index, index + 1, this.count);
    this.count--;
  }

  /** Samples of each class, 0..numClasses-1. */
  countsPerClass(): number[] {
    const counts = new Array<number>(this.numClasses).fill(0);
    for (let i = 0; i < this.count; i++) counts[this.targets[i]!]!++;
    return counts;
  }

  /** Sample `index`'s label. */
  labelOf(index: number): number {
    this.checkIndex(index, 0);
    return this.targets[index]!;
  }

  batch(indices: ArrayLike<number>): { x: Float32Array; y: Int32Array } {
    const n = indices.length;
    const s = this.sampleSize;
    const x = new Float32Array(n * s);
    const y = new Int32Array(n);
    for (let k = 0; k < n; k++) {
      const i = indices[k]!;
      this.checkIndex(i, k);
      x.set(this.data.subarray(i * s, (i + 1) * s), k * s);
      y[k] = this.targets[i]!;
    }
    return { x, y };
  }

  /**
   * This rank's order of its own samples in `epoch`: randperm(length, seed + epoch) (torch's
   * generator, as DistributedSampler shuffles), or 0..length-1 without `shuffle`.
   */
  order(epoch: number, seed = 0, shuffle = true): Uint32Array {
    if (!shuffle) return Uint32Array.from({ length: this.count }, (_, i) => i);
    const s = seed + epoch;
    if (!Number.isSafeInteger(s)) throw new RangeError(`${this.name}: seed + epoch (${seed} + ${epoch}) must be a safe integer`);
    return randpermWithGenerator(this.count, new Mt19937(s));
  }

  /**
   * A new LocalDataset of these samples with `fraction` of each class held out (seeded: the same
   * split for the same samples and seed; a class of 2 or more samples keeps at least one on each
   * side) as its `heldOut`, replacing any it had: what a page does with a tab's pictures before
   * training, so that each tab's accuracy is on pictures it did not train on.
   */
  withHeldOut(fraction: number, seed = 0): LocalDataset {
    if (!(Number.isFinite(fraction) && fraction >= 0 && fraction < 1))
      throw new DatasetError(`${this.name}: the held-out fraction must be in [0, 1), got ${fraction}`);
    const order = this.order(0, seed);
    const seen = new Array<number>(this.numClasses).fill(0);
    const counts = this.countsPerClass();
    const held: number[] = [];
    const kept: number[] = [];
    for (const i of order) {
      const c = this.targets[i]!;
      const want = counts[c]! >= 2 && fraction > 0 ? Math.min(counts[c]! - 1, Math.max(1, Math.floor(fraction * counts[c]!))) : 0;
      (seen[c]!++ < want ? held : kept).push(i);
    }
    const sorted = (a: number[]) => a.sort((x, y) => x - y);
    const train = this.batch(sorted(kept));
    const test = this.batch(sorted(held));
    return new LocalDataset({
      name: this.name,
      inputs: train.x,
      labels: train.y,
      inputShape: this.inputShape,
      numClasses: this.numClasses,
      ...(this.classNames ? { classNames: this.classNames } : {}),
      heldOut: { inputs: test.x, labels: test.y },
    });
  }

  /**
   * Marks the dataset as trained on by `by` (runElastic) until the returned function is called:
   * add and remove throw meanwhile, since the epoch's order and counts are fixed.
   */
  beginTraining(by: string): () => void {
    if (this.trainingBy !== null)
      throw new DatasetError(`${this.name}: already trained on by ${this.trainingBy}; one run at a time per LocalDataset`);
    this.trainingBy = by;
    return () => {
      this.trainingBy = null;
    };
  }

  /** Whether a run trains on it now. */
  get training(): boolean {
    return this.trainingBy !== null;
  }

  private grow(): void {
    const capacity = Math.min(MAX_LOCAL_SAMPLES, this.targets.length * 2);
    const data = new Float32Array(capacity * this.sampleSize);
    data.set(this.data.subarray(0, this.count * this.sampleSize));
    const targets = new Int32Array(capacity);
    targets.set(this.targets.subarray(0, this.count));
    this.data = data;
    this.targets = targets;
  }

  private checkIdle(what: string): void {
    if (this.trainingBy !== null)
      throw new DatasetError(
        `${this.name}: cannot ${what} while ${this.trainingBy} trains on it; add or remove samples before the run starts or after it ends`,
      );
  }

  private checkIndex(i: number, position: number): void {
    if (!Number.isInteger(i) || i < 0 || i >= this.count)
      throw new DatasetError(`${this.name}: index ${i} (position ${position}) is out of range for ${this.count} samples`);
  }

  private namesNote(): string {
    return this.classNames ? `: ${this.classNames.join(', ')}` : '';
  }
}
