/**
 * Text as a dataset (src/datasets/text.ts): windows and their next-character labels, the split,
 * the bad inputs named; the losses of a language model's [B, T, V] logits count every position
 * (src/nn/losses.ts); the job's lm builds from its spec (src/nn/models.ts).
 */
import * as tf from '@tensorflow/tfjs';
import { describe, expect, it } from 'vitest';
import { CharTokenizer, TextDataset, textDatasets } from '../src/datasets/text.ts';
import { labelsPerSample, subset } from '../src/datasets/dataset.ts';
import { classificationLoss, correctPredictions } from '../src/nn/losses.ts';
import { buildModel } from '../src/nn/models.ts';
import { languageModelLoss } from '../src/nn/language_model.ts';
import { errorOf } from './fixtures/errors.ts';
import { DatasetError } from '../src/datasets/dataset.ts';

describe('TextDataset', () => {
  const tokenizer = CharTokenizer.fromText('abcdefghij');
  const ids = tokenizer.encode('abcdefghij'); // 0..9

  it('cuts windows of T + 1 tokens, one every T: inputs are the window, labels the same shifted by one', () => {
    const d = new TextDataset('t', ids, 3, tokenizer.vocabSize);
    // 10 tokens: windows at 0, 3, 6 (the last needs token 9, the 10th).
    expect(d.length).toBe(3);
    expect(d.inputShape).toEqual([3]);
    expect(d.targetShape).toEqual([3]);
    expect(d.numClasses).toBe(10);
    expect(labelsPerSample(d)).toBe(3);
    const { x, y } = d.batch([2, 0]);
    expect(Array.from(x)).toEqual([6, 7, 8, 0, 1, 2]);
    expect(Array.from(y)).toEqual([7, 8, 9, 1, 2, 3]);
    // A subset keeps the labels' shape.
    const s = subset(d, [1]);
    expect(s.targetShape).toEqual([3]);
    expect(Array.from(s.batch([0]).y)).toEqual([4, 5, 6]);
  });

  it('names what is wrong: a text too short for one window, a token outside the vocabulary, a window out of range', () => {
    expect(() => new TextDataset('t', ids.subarray(0, 3), 3, 10)).toThrow(errorOf(DatasetError, /3 tokens make no window of 3 \+ 1/));
    expect(() => new TextDataset('t', Int32Array.of(0, 1, 12, 3), 2, 10)).toThrow(
      errorOf(DatasetError, /token 12 at 2 is outside the vocabulary \[0, 10\)/),
    );
    expect(() => new TextDataset('t', ids, 3, 10).batch([3])).toThrow(
      errorOf(DatasetError, /window 3 \(position 0\) is out of range for 3 windows/),
    );
    expect(() => new TextDataset('t', ids, 0, 10)).toThrow(errorOf(DatasetError, /context length must be a positive integer/));
  });

  it("splits a corpus: the first 90% trains, the last 10% tests, one tokenizer; unigram is the training text's character entropy", () => {
    const text = 'ab'.repeat(450) + 'c'.repeat(100);
    const { train, test, tokenizer: tok, unigram } = textDatasets(text, { contextLength: 10 });
    expect(tok.chars).toEqual(['a', 'b', 'c']);
    expect(train.ids.length).toBe(900);
    expect(test.ids.length).toBe(100);
    expect(Array.from(new Set(test.ids))).toEqual([2]);
    expect(unigram).toBeCloseTo(Math.log(2), 12);
    expect(train.length).toBe(89);
    expect(test.length).toBe(9);
  });
});

describe('losses over positions', () => {
  it("classificationLoss of [B, T, V] logits is the mean over every position, as torch's cross_entropy of the flattened logits", async () => {
    const logits = tf.tensor3d([
      [
        [1, 2, 0],
        [0, 0, 3],
      ],
      [
        [2, 1, 1],
        [0.5, 0.5, 0],
      ],
    ]);
    const labels = tf.tensor2d(
      [
        [1, 2],
        [0, 1],
      ],
      undefined,
      'int32',
    );
    const rows = [
      [1, 2, 0],
      [0, 0, 3],
      [2, 1, 1],
      [0.5, 0.5, 0],
    ];
    const want = [1, 2, 0, 1].map((c, i) => {
      const r = rows[i]!;
      return Math.log(r.reduce((s, v) => s + Math.exp(v), 0)) - r[c]!;
    });
    const mean = want.reduce((a, b) => a + b, 0) / 4;
    expect((await classificationLoss(logits, labels, 3).data())[0]).toBeCloseTo(mean, 5);
    expect((await languageModelLoss(logits, labels).data())[0]).toBeCloseTo(mean, 5);
    // argmax per position: [1, 2], [0, 0] against [1, 2], [0, 1]: 3 right.
    expect((await correctPredictions(logits, labels).data())[0]).toBe(3);
    tf.dispose([logits, labels]);
  });

  it("a classifier's [B, C] logits and [B] labels: the same loss as before", async () => {
    const logits = tf.tensor2d([
      [1, 2, 0],
      [0, 0, 3],
    ]);
    const labels = tf.tensor1d([1, 0], 'int32');
    const direct = tf.losses.softmaxCrossEntropy(tf.oneHot(labels, 3), logits);
    expect((await classificationLoss(logits, labels, 3).data())[0]).toBe((await direct.data())[0]);
    tf.dispose([logits, labels, direct]);
  });
});

describe("the job's language model (ModelSpec kind lm)", () => {
  it('takes windows [T] of token ids to logits [T, vocabulary]; its width is `hidden`', () => {
    const model = buildModel({ kind: 'lm', inputShape: [16], numClasses: 20, seed: 1, hidden: 32 });
    expect(model.outputs[0]!.shape).toEqual([null, 16, 20]);
    // Embeddings 20 x 32 + 16 x 32, 2 blocks of 12 d^2 + 13 d, the final norm and the head.
    expect(model.countParams()).toBe(20 * 32 + 16 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32 + 32 * 20 + 20);
    expect(() => buildModel({ kind: 'lm', inputShape: [16], numClasses: 20, seed: 1, hidden: 30 })).toThrow(/multiple of its 4 heads/);
    model.dispose();
  });
});
