/**
 * The small language model (src/nn/language_model.ts): causal (a position never sees the ones after
 * it), saved and loaded like any Layers model, split by blocks into pipeline stages that compute
 * the same, and trained below the unigram baseline of its text; the character tokenizer round
 * trips and names what it cannot encode. (TF.js cpu backend in Node; in PyTorch: torch_export.test.ts.)
 */
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  buildLanguageModel,
  CharTokenizer,
  generate,
  languageModelLayers,
  languageModelLoss,
  type LanguageModelSpec,
} from '../src/nn/language_model.ts';
import { sequentialOf } from '../src/nn/models.ts';
import { modelArtifacts } from '../src/checkpoint/state_dict.ts';
import { errorOf } from './fixtures/errors.ts';

beforeAll(async () => {
  await tf.setBackend('cpu');
});

const SPEC: LanguageModelSpec = { vocabSize: 12, contextLength: 8, dModel: 16, heads: 2, blocks: 2, seed: 3 };

async function values(t: tf.Tensor): Promise<number[]> {
  const v = Array.from((await t.data()) as Float32Array);
  t.dispose();
  return v;
}

describe('the language model', () => {
  it('is causal: changing the tokens after position t leaves the logits up to t as they were', async () => {
    const model = buildLanguageModel(SPEC);
    const a = [1, 2, 3, 4, 5, 6, 7, 8];
    const b = [1, 2, 3, 4, 11, 0, 9, 10];
    const [la, lb] = [a, b].map((ids) => model.predict(tf.tensor2d([ids], [1, 8], 'int32')) as tf.Tensor);
    const [va, vb] = [await values(la!), await values(lb!)];
    const upTo4 = 4 * SPEC.vocabSize;
    expect(vb.slice(0, upTo4)).toEqual(va.slice(0, upTo4));
    expect(vb.slice(upTo4)).not.toEqual(va.slice(upTo4));
    model.dispose();
  });

  it('saves and loads as a Layers model, and two stages split by blocks compute what the whole does', async () => {
    const model = buildLanguageModel(SPEC);
    const x = tf.tensor2d([[3, 1, 4, 1, 5, 9, 2, 6]], [1, 8], 'int32');
    const want = await values(model.predict(x) as tf.Tensor);
    const a = await modelArtifacts(model);
    const loaded = await tf.loadLayersModel(
      tf.io.fromMemory({
        modelTopology: a.modelTopology as object,
        weightSpecs: a.weightSpecs as tf.io.WeightsManifestEntry[],
        weightData: a.weightData,
      }),
    );
    expect(await values(loaded.predict(x) as tf.Tensor)).toEqual(want);
    // Same seed, same weights: stage 0 = embedding + block 1, stage 1 = block 2 + norm + head.
    const layers = languageModelLayers(SPEC);
    const first = sequentialOf(layers.slice(0, 2), [SPEC.contextLength], 's0');
    const second = sequentialOf(layers.slice(2), [SPEC.contextLength, SPEC.dModel], 's1');
    const staged = await values(second.predict(first.predict(x) as tf.Tensor) as tf.Tensor);
    expect(staged.map((v, i) => Math.abs(v - want[i]!)).every((d) => d < 1e-6)).toBe(true);
    for (const m of [model, loaded, first, second]) m.dispose();
    x.dispose();
  });

  it('learns a text: after 60 Adam steps its loss is well below the unigram baseline, and it writes in its vocabulary', async () => {
    const text = 'the cat sat on the mat. the rat ate the hat. '.repeat(20);
    const tok = CharTokenizer.fromText(text);
    const ids = tok.encode(text);
    const counts = new Map<number, number>();
    for (const i of ids) counts.set(i, (counts.get(i) ?? 0) + 1);
    const unigram = -[...counts.values()].reduce((a, c) => a + (c / ids.length) * Math.log(c / ids.length), 0);
    const spec = { ...SPEC, vocabSize: tok.vocabSize, contextLength: 16, dModel: 32, blocks: 1 };
    const model = buildLanguageModel(spec);
    const optimizer = tf.train.adam(0.01);
    const before = tf.memory().numTensors;
    let loss = Infinity;
    for (let step = 0; step < 60; step++) {
      const starts = Array.from({ length: 8 }, (_, k) => (step * 37 + k * 101) % (ids.length - spec.contextLength - 1));
      const x = tf.tensor2d(
        starts.map((s) => Array.from(ids.subarray(s, s + spec.contextLength))),
        [8, spec.contextLength],
        'int32',
      );
      const y = tf.tensor2d(
        starts.map((s) => Array.from(ids.subarray(s + 1, s + spec.contextLength + 1))),
        [8, spec.contextLength],
        'int32',
      );
      const l = optimizer.minimize(() => languageModelLoss(model.apply(x) as tf.Tensor, y), true)!;
      loss = (await l.data())[0]!;
      tf.dispose([x, y, l]);
    }
    // The optimizer's moments are made once, at the first step.
    expect(tf.memory().numTensors).toBeLessThanOrEqual(before + 2 * model.trainableWeights.length + 2);
    expect(loss).toBeLessThan(unigram * 0.6);
    const written = await generate(model, tok.encode('the '), 12, { temperature: 0 });
    expect(written).toHaveLength(12);
    expect(tok.decode(written)).toMatch(/^[a-z .]+$/);
    model.dispose();
    optimizer.dispose();
  }, 60_000);

  it('tokenizes by character and names a character it does not know', () => {
    const tok = CharTokenizer.fromText('hello, world');
    expect(tok.decode(tok.encode('low, old'))).toBe('low, old');
    expect(() => tok.encode('hi!')).toThrow(errorOf(RangeError, /character "i" at 1 is not in the vocabulary of 9/));
  });
});
