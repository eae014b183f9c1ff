/**
 * The trained model in PyTorch: `exportForTorch` writes a safetensors state dict and a Python
 * module; real PyTorch (Debian's python3-torch) loads it strictly and computes what TF.js computes
 * on the same inputs (max abs difference <= 1e-4), for the training job's MLP and CNN and for
 * models with the other exported layers. The reverse: a state dict torch saved loads into the TF.js
 * model and gives torch's outputs. Layers the export cannot map are refused naming the layer.
 * (TF.js cpu backend in Node: the kernels a cpu tab runs. test/e2e/torch_export.spec.ts does it
 * from a real tab's training run.)
 */
import * as tf from '@tensorflow/tfjs';
import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { buildModel } from '../src/nn/models.ts';
import { buildLanguageModel } from '../src/nn/language_model.ts';
import { loadModelWeights, modelArtifacts } from '../src/checkpoint/state_dict.ts';
import { exportForTorch, importTorchStateDict, TorchExportError } from '../src/checkpoint/torch_export.ts';
import { decodeSafetensors, encodeSafetensors, SafetensorsError } from '../src/checkpoint/safetensors.ts';
import { torchTestsBlocked } from './fixtures/torch.ts';
import { errorOf } from './fixtures/errors.ts';

beforeAll(async () => {
  await tf.setBackend('cpu');
});

/** Deterministic, non-trivial weights (a BatchNorm's variances kept positive). */
function randomizeWeights(model: tf.LayersModel, seed: number): void {
  const values = model.weights.map((w, i) => {
    const v = tf.randomUniform(w.shape as number[], -0.5, 0.5, 'float32', seed + i);
    if (!w.name.endsWith('moving_variance')) return v;
    const pos = v.add(1);
    v.dispose();
    return pos;
  });
  model.setWeights(values);
  tf.dispose(values);
}

const MODELS: Array<{ name: string; make: () => tf.LayersModel; input: number[]; ints?: number }> = [
  // An image MLP whose Flatten has 2 channels: the first Dense's columns are reordered.
  {
    name: 'the MLP on [6, 6, 2] images',
    make: () => buildModel({ kind: 'mlp', inputShape: [6, 6, 2], numClasses: 3, seed: 1, hidden: 16 }),
    input: [6, 6, 2],
  },
  // The training job's MNIST CNN with its hidden layer: Flatten of [5, 5, 16].
  {
    name: 'the CNN on MNIST images',
    make: () => buildModel({ kind: 'cnn', inputShape: [28, 28, 1], numClasses: 10, seed: 2, hidden: 32 }),
    input: [28, 28, 1],
  },
  {
    name: "a Keras-style CNN ('same' strided convolutions, batch norm, padded pools, global pooling, softmax)",
    make: () =>
      tf.sequential({
        layers: [
          tf.layers.conv2d({ inputShape: [8, 8, 3], filters: 6, kernelSize: 3, strides: 2, padding: 'same' }), // asymmetric padding
          tf.layers.batchNormalization({ epsilon: 0.001 }),
          tf.layers.leakyReLU({ alpha: 0.1 }),
          tf.layers.conv2d({ filters: 5, kernelSize: 3, padding: 'same', activation: 'elu', useBias: false }),
          tf.layers.maxPooling2d({ poolSize: 3, strides: 2, padding: 'same' }),
          tf.layers.averagePooling2d({ poolSize: 2, strides: 1 }),
          tf.layers.globalAveragePooling2d({}),
          tf.layers.dropout({ rate: 0.5 }),
          tf.layers.dense({ units: 4, activation: 'softmax' }),
        ],
      }),
    input: [8, 8, 3],
  },
  {
    name: 'token ids through an Embedding, a LayerNorm, Dense layers on a sequence and a Flatten',
    make: () =>
      tf.sequential({
        layers: [
          tf.layers.embedding({ inputDim: 20, outputDim: 8, inputLength: 5 }),
          tf.layers.layerNormalization({ epsilon: 1e-5 }),
          tf.layers.dense({ units: 6, activation: 'tanh' }),
          tf.layers.flatten(),
          tf.layers.batchNormalization({}),
          tf.layers.dense({ units: 4 }),
        ],
      }),
    input: [5],
    ints: 20,
  },
  {
    name: 'the language model (token and position embeddings, 2 transformer blocks of causal attention, layer norm, head)',
    make: () => buildLanguageModel({ vocabSize: 20, contextLength: 6, dModel: 16, heads: 2, blocks: 2, seed: 1 }),
    input: [6],
    ints: 20,
  },
];

function inputsFor(spec: (typeof MODELS)[number], n: number): tf.Tensor {
  if (spec.ints) return tf.randomUniform([n, ...spec.input], 0, spec.ints, 'int32', 5);
  return tf.randomUniform([n, ...spec.input], -1, 1, 'float32', 5);
}

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

describe('export to PyTorch: layouts and files', () => {
  it("writes torch's names and layouts: nn.Linear's [out, in], nn.Conv2d's [out, in, kh, kw]", async () => {
    const model = buildModel({ kind: 'cnn', inputShape: [28, 28, 1], numClasses: 10, seed: 3, hidden: 32 });
    const artifacts = await modelArtifacts(model);
    const out = exportForTorch(artifacts, { source: 'a test' });
    const { tensors, metadata } = decodeSafetensors(out.safetensors);
    expect([...tensors.keys()]).toEqual([
      'conv1.weight',
      'conv1.bias',
      'conv2.weight',
      'conv2.bias',
      'fc1.weight',
      'fc1.bias',
      'fc2.weight',
      'fc2.bias',
    ]);
    expect(tensors.get('conv1.weight')!.shape).toEqual([8, 1, 3, 3]);
    expect(tensors.get('conv2.weight')!.shape).toEqual([16, 8, 3, 3]);
    expect(tensors.get('fc1.weight')!.shape).toEqual([32, 400]);
    expect(tensors.get('fc2.weight')!.shape).toEqual([10, 32]);
    expect(metadata.source).toBe('a test');
    expect(out.inputShape).toEqual([1, 28, 28]);
    // fc2 (after no Flatten) is the plain transpose of the kernel.
    const kernel = (await model.weights[6]!.read().data()) as Float32Array;
    const fc2 = new Float32Array(tensors.get('fc2.weight')!.data.buffer);
    expect(fc2[3 * 32 + 5]).toBe(kernel[5 * 10 + 3]);
    expect(out.python).toMatch(
      /\("conv1", +nn\.Conv2d\(1, 8, kernel_size=\(3, 3\), stride=\(1, 1\), padding=0, dilation=\(1, 1\), bias=True\)\), {2}# TF\.js layer "conv2d_Conv2D\d+"/,
    );
    expect(out.python).toMatch(/\("flatten1", +nn\.Flatten\(\)\)/);
    model.dispose();
  });

  it('round trip: the export loaded back into a fresh model gives bit-identical outputs', async () => {
    for (const spec of MODELS) {
      const a = spec.make();
      randomizeWeights(a, 11);
      const b = spec.make();
      const exported = exportForTorch(await modelArtifacts(a));
      loadModelWeights(b, importTorchStateDict(await modelArtifacts(b), exported.safetensors));
      const x = inputsFor(spec, 3);
      const [ya, yb] = [a.predict(x) as tf.Tensor, b.predict(x) as tf.Tensor];
      expect(Array.from(await yb.data()), spec.name).toEqual(Array.from(await ya.data()));
      tf.dispose([x, ya, yb]);
      a.dispose();
      b.dispose();
    }
  });

  it('refuses a layer it cannot map, naming it and saying why', async () => {
    const rnn = tf.sequential({
      layers: [tf.layers.lstm({ units: 4, inputShape: [3, 2], name: 'my_lstm' }), tf.layers.dense({ units: 2 })],
    });
    const refusal = await modelArtifacts(rnn)
      .then(exportForTorch)
      .catch((e: unknown) => e);
    expect(refusal).toBeInstanceOf(TorchExportError);
    expect((refusal as TorchExportError).layer).toBe('my_lstm');
    expect((refusal as TorchExportError).message).toMatch(
      /cannot export layer "my_lstm" to PyTorch: LSTM layers have no mapping to torch here \(exported: Dense, Conv2D/,
    );
    const avg = tf.sequential({
      layers: [
        tf.layers.averagePooling2d({ inputShape: [5, 5, 2], poolSize: 2, padding: 'same', name: 'border_avg' }),
        tf.layers.flatten(),
        tf.layers.dense({ units: 2 }),
      ],
    });
    await expect(modelArtifacts(avg).then(exportForTorch)).rejects.toThrow(
      errorOf(TorchExportError, /cannot export layer "border_avg" to PyTorch: an average pool with 'same' padding/),
    );
    const imageDense = tf.sequential({ layers: [tf.layers.dense({ inputShape: [4, 4, 3], units: 2, name: 'pixelwise' })] });
    await expect(modelArtifacts(imageDense).then(exportForTorch)).rejects.toThrow(
      errorOf(TorchExportError, /layer "pixelwise".*without a Flatten/),
    );
    const afterFlatten = tf.sequential({
      layers: [
        tf.layers.flatten({ inputShape: [4, 4, 3] }),
        tf.layers.batchNormalization({ name: 'bn_flat' }),
        tf.layers.dense({ units: 2 }),
      ],
    });
    await expect(modelArtifacts(afterFlatten).then(exportForTorch)).rejects.toThrow(
      errorOf(TorchExportError, /layer "bn_flat".*follows a Flatten of an image/),
    );
    for (const m of [rnn, avg, imageDense, afterFlatten]) m.dispose();
  });

  it('safetensors: the header is aligned, and damaged files are refused saying what is wrong', () => {
    const file = encodeSafetensors([{ name: 'a', dtype: 'F32', shape: [2], data: new Uint8Array(8) }], { k: 'v' });
    const headerBytes = Number(new DataView(file.buffer).getBigUint64(0, true));
    expect(headerBytes % 8).toBe(0);
    expect(decodeSafetensors(file).metadata).toEqual({ k: 'v' });
    expect(() => decodeSafetensors(file.slice(0, file.byteLength - 1))).toThrow(SafetensorsError);
    expect(() => decodeSafetensors(file.slice(0, 4))).toThrow(errorOf(SafetensorsError, /8-byte header length/));
    const gap = encodeSafetensors([{ name: 'a', dtype: 'F32', shape: [1], data: new Uint8Array(4) }]);
    const grown = new Uint8Array(gap.byteLength + 4);
    grown.set(gap);
    expect(() => decodeSafetensors(grown)).toThrow(errorOf(SafetensorsError, /cover 4 of the 8 data bytes/));
    expect(() => encodeSafetensors([{ name: 'a', dtype: 'F32', shape: [3], data: new Uint8Array(8) }])).toThrow(
      errorOf(SafetensorsError, /takes 12/),
    );
  });
});

// Skipped only on a developer's machine without python3-torch; CI installs it and sets
// DDP_REQUIRE_ALL_TESTS, under which torchTestsBlocked throws instead of skipping.
const blocked = torchTestsBlocked();

describe.skipIf(blocked !== undefined)(`in real PyTorch${blocked ? ` (skipped: ${blocked})` : ''}`, () => {
  for (const spec of MODELS) {
    it(`${spec.name}: torch computes the tab's outputs (max abs difference <= 1e-4), and torch's own weights load back`, async () => {
      const dir = await mkdtemp(join(tmpdir(), 'torch-export-'));
      try {
        const model = spec.make();
        randomizeWeights(model, 100);
        const x = inputsFor(spec, 4);
        const y = model.predict(x) as tf.Tensor;
        const exported = exportForTorch(await modelArtifacts(model), { source: spec.name });
        const xData = spec.ints ? new BigInt64Array(Array.from(await x.data(), (v) => BigInt(v))) : ((await x.data()) as Float32Array);
        await writeFile(join(dir, 'model.safetensors'), exported.safetensors);
        await writeFile(join(dir, 'model.py'), exported.python);
        await writeFile(
          join(dir, 'inputs.safetensors'),
          encodeSafetensors([{ name: 'x', dtype: spec.ints ? 'I64' : 'F32', shape: x.shape, data: new Uint8Array(xData.buffer) }]),
        );
        execFileSync('/usr/bin/python3', [join(import.meta.dirname, 'fixtures', 'torch_forward.py'), dir], {
          stdio: 'pipe',
          timeout: 120_000,
        });

        const torchOut = JSON.parse(await readFile(join(dir, 'outputs.json'), 'utf8')) as {
          shape: number[];
          values: number[];
          names: string[];
        };
        expect(torchOut.shape).toEqual(y.shape);
        expect(maxAbsDiff(torchOut.values, (await y.data()) as Float32Array)).toBeLessThanOrEqual(1e-4);
        expect(torchOut.names).toEqual([...decodeSafetensors(exported.safetensors).tensors.keys()]);

        // The reverse: torch's freshly initialised Model, saved by torch, into the TF.js model.
        const fromTorch = importTorchStateDict(await modelArtifacts(model), await readFile(join(dir, 'torch_init.safetensors')));
        loadModelWeights(model, fromTorch);
        const torchInit = JSON.parse(await readFile(join(dir, 'torch_init.json'), 'utf8')) as { values: number[] };
        const y2 = model.predict(x) as tf.Tensor;
        expect(maxAbsDiff(torchInit.values, (await y2.data()) as Float32Array)).toBeLessThanOrEqual(1e-4);
        tf.dispose([x, y, y2]);
        model.dispose();
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    }, 120_000);
  }
});
