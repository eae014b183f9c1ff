/**
 * Text as a dataset for next-token prediction: a corpus cut into windows of `contextLength + 1`
 * tokens, one starting every `contextLength` (nanoGPT's blocks without the random offsets, so a
 * `DistributedSampler` can shard them by index like any other samples). Sample w's input is
 * tokens [wT, wT + T), its labels the tokens one position later: `targetShape` is [T].
 *
 * The tokenizer is character-level (`CharTokenizer`): a class's corpus is small, and a vocabulary
 * of the characters seen keeps the model's embedding and head small.
 */
import { DatasetError, type Dataset } from './dataset.ts';

/** A character-level tokenizer: each distinct character of the corpus is a token, in code-point order. */
export class CharTokenizer {
  readonly chars: string[];
  private readonly ids: Map<string, number>;

  constructor(chars: string[]) {
    this.chars = chars;
    this.ids = new Map(chars.map((c, i) => [c, i]));
  }

  static fromText(text: string): CharTokenizer {
    return new CharTokenizer([...new Set(Array.from(text))].sort((a, b) => a.codePointAt(0)! - b.codePointAt(0)!));
  }

  get vocabSize(): number {
    return this.chars.length;
  }

  /** Ids of `text`; a character outside the vocabulary throws, naming it and where. */
  encode(text: string): Int32Array {
    const chars = Array.from(text);
    return Int32Array.from(chars, (c, i) => {
      const id = this.ids.get(c);
      if (id === undefined) throw new RangeError(`character ${JSON.stringify(c)} at ${i} is not in the vocabulary of ${this.vocabSize}`);
      return id;
    });
  }

  decode(ids: ArrayLike<number>): string {
    return Array.from(ids, (i) => this.chars[i] ?? '').join('');
  }
}

/** Windows of a token sequence as samples: inputs [T] (the ids as floats, exact below 2^24), labels [T]. */
export class TextDataset implements Dataset {
  readonly name: string;
  readonly length: number;
  readonly inputShape: number[];
  readonly numClasses: number;
  readonly targetShape: number[];

  constructor(
    name: string,
    readonly ids: Int32Array,
    readonly contextLength: number,
    vocabSize: number,
  ) {
    if (!Number.isSafeInteger(contextLength) || contextLength < 1)
      throw new DatasetError(`${name}: the context length must be a positive integer, got ${contextLength}`);
    if (ids.length < contextLength + 1)
      throw new DatasetError(
        `${name}: ${ids.length} tokens make no window of ${contextLength} + 1: use a longer text or a shorter context`,
      );
    for (let i = 0; i < ids.length; i++) {
      if (ids[i]! < 0 || ids[i]! >= vocabSize)
        throw new DatasetError(`${name}: token ${ids[i]} at ${i} is outside the vocabulary [0, ${vocabSize})`);
    }
    this.name = name;
    this.length = Math.floor((ids.length - 1) / contextLength);
    this.inputShape = [contextLength];
    this.numClasses = vocabSize;
    this.targetShape = [contextLength];
  }

  batch(indices: ArrayLike<number>): { x: Float32Array; y: Int32Array } {
    const t = this.contextLength;
    const x = new Float32Array(indices.length * t);
    const y = new Int32Array(indices.length * t);
    for (let k = 0; k < indices.length; k++) {
      const w = indices[k]!;
      if (!Number.isInteger(w) || w < 0 || w >= this.length)
        throw new DatasetError(`${this.name}: window ${w} (position ${k}) is out of range for ${this.length} windows`);
      x.set(this.ids.subarray(w * t, (w + 1) * t), k * t);
      y.set(this.ids.subarray(w * t + 1, (w + 1) * t + 1), k * t);
    }
    return { x, y };
  }
}

/**
 * A corpus as a training and a test set of windows: the first 90% of its characters train, the
 * last 10% test (nanoGPT's split: held-out text, not held-out windows of the same passages), with
 * one tokenizer from the whole text. `unigram` is the entropy of the training text's characters,
 * in nats: the loss of a model that learnt only their frequencies, the baseline to beat.
 */
export function textDatasets(
  text: string,
  options: { contextLength: number; name?: string; testFraction?: number },
): { train: TextDataset; test: TextDataset; tokenizer: CharTokenizer; unigram: number } {
  const name = options.name ?? 'text';
  const tokenizer = CharTokenizer.fromText(text);
  const ids = tokenizer.encode(text);
  const cut = Math.floor(ids.length * (1 - (options.testFraction ?? 0.1)));
  const train = ids.subarray(0, cut);
  const counts = new Map<number, number>();
  for (const id of train) counts.set(id, (counts.get(id) ?? 0) + 1);
  const unigram = -[...counts.values()].reduce((a, c) => a + (c / train.length) * Math.log(c / train.length), 0);
  return {
    train: new TextDataset(`${name}-train`, train, options.contextLength, tokenizer.vocabSize),
    test: new TextDataset(`${name}-test`, ids.subarray(cut), options.contextLength, tokenizer.vocabSize),
    tokenizer,
    unigram,
  };
}
