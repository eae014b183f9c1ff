/** A seeded synthetic classification task, identical on every rank and every engine. */
import { DatasetError, InMemoryDataset } from './dataset.ts';
import { hash32 } from '../wire/hash.ts';

export interface SyntheticDatasetOptions {
  length: number;
  /** Features per sample; inputShape is [inputSize]. */
  inputSize: number;
  numClasses: number;
  /** Any safe integer. The same seed gives bit-identical data on every rank and platform. */
  seed: number;
  /** Standard deviation of the per-feature noise around the class centroid. Default 0.5. */
  noise?: number;
  name?: string;
}

// Tags keep the centroid, label and per-sample random streams independent of each other.
const CENTROID_STREAM = 0x63656e74;
const LABEL_STREAM = 0x6c61626c;
const SAMPLE_STREAM = 0x73616d70;
const TWO_POW_32 = 0x1_0000_0000;
/** sqrt(3) as a literal, so no engine's Math.sqrt is involved. */
const SQRT3 = 1.7320508075688772;

/**
 * A learnable classification task generated from a seed: `numClasses` centroids drawn uniformly
 * from [-1, 1)^inputSize, and each sample is its class centroid plus noise.
 *
 * Labels are balanced: each consecutive block of `numClasses` indices holds a seeded permutation
 * of all classes, so every class appears once length >= numClasses. Sample i depends only on
 * (seed, i), so a shorter dataset is a prefix of a longer one with the same seed.
 *
 * Determinism across engines: only integer ops (Math.imul, shifts) and IEEE-754 +, *, / (which
 * every engine rounds identically) are used, no Math.sin/log/exp. Noise is a sum of four
 * uniforms (Irwin–Hall), scaled to unit variance, instead of Box–Muller.
 */
export function syntheticDataset(options: SyntheticDatasetOptions): InMemoryDataset {
  const { length, inputSize, numClasses, seed } = options;
  const noise = options.noise ?? 0.5;
  const name = options.name ?? `synthetic-${seed}`;
  checkCount(name, 'length', length, 0);
  checkCount(name, 'inputSize', inputSize, 1);
  checkCount(name, 'numClasses', numClasses, 1);
  if (!Number.isSafeInteger(seed)) throw new DatasetError(`${name}: seed must be a safe integer, got ${seed}`);
  if (!Number.isFinite(noise) || noise < 0) {
    throw new DatasetError(`${name}: noise must be a finite number >= 0, got ${noise}`);
  }
  const seedLo = seed >>> 0;
  const seedHi = Math.floor(seed / TWO_POW_32) >>> 0;
  const streamSeed = (tag: number, index: number): number => hash32(hash32(hash32(hash32(seedLo) ^ seedHi) ^ tag) ^ index);

  const centroids = new Float64Array(numClasses * inputSize);
  const centroidRng = new Mulberry32(streamSeed(CENTROID_STREAM, 0));
  for (let j = 0; j < centroids.length; j++) centroids[j] = 2 * centroidRng.nextFloat() - 1;

  const labels = new Int32Array(length);
  const perm = new Int32Array(numClasses);
  for (let block = 0; block * numClasses < length; block++) {
    // Fisher–Yates over the classes, seeded per block so labels stay random-access by index.
    const rng = new Mulberry32(streamSeed(LABEL_STREAM, block));
    for (let c = 0; c < numClasses; c++) perm[c] = c;
    for (let j = numClasses - 1; j > 0; j--) {
      const k = Math.floor(rng.nextFloat() * (j + 1));
      const t = perm[j]!;
      perm[j] = perm[k]!;
      perm[k] = t;
    }
    const start = block * numClasses;
    for (let c = 0; c < numClasses && start + c < length; c++) labels[start + c] = perm[c]!;
  }

  const inputs = new Float32Array(length * inputSize);
  const scale = noise * SQRT3; // Sum of 4 uniforms minus 2 has variance 4/12 = 1/3.
  for (let i = 0; i < length; i++) {
    const rng = new Mulberry32(streamSeed(SAMPLE_STREAM, i));
    const centroid = labels[i]! * inputSize;
    for (let d = 0; d < inputSize; d++) {
      const u = rng.nextFloat() + rng.nextFloat() + rng.nextFloat() + rng.nextFloat() - 2;
      inputs[i * inputSize + d] = centroids[centroid + d]! + scale * u;
    }
  }
  return new InMemoryDataset({ name, inputs, labels, inputShape: [inputSize], numClasses });
}

function checkCount(name: string, what: string, value: number, min: number): void {
  if (!Number.isSafeInteger(value) || value < min) {
    throw new DatasetError(`${name}: ${what} must be an integer >= ${min}, got ${value}`);
  }
}

/** mulberry32: a tiny 32-bit PRNG, all integer arithmetic, so identical on every engine. */
export class Mulberry32 {
  constructor(private state: number) {}

  nextUint32(): number {
    this.state = (this.state + 0x6d2b79f5) | 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }

  /** Uniform in [0, 1); the division by 2^32 is exact. */
  nextFloat(): number {
    return this.nextUint32() / TWO_POW_32;
  }
}
