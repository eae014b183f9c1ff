/**
 * A small decoder-only transformer (GPT-2's shape, nanoGPT's size) built from TF.js ops, for
 * character-level language modelling in the tabs: token and position embeddings, pre-norm
 * blocks of causal multi-head self-attention and a GELU MLP with residual connections, a final
 * layer norm and a linear head over the vocabulary. It is a Sequential of layers, so DDP,
 * pipelines (split by blocks) and checkpoints take it as they take the other models, and
 * `exportForTorch` writes it as a torch module of the same names.
 *
 * The two custom layers are registered with TF.js's serialization, so a saved model (a
 * checkpoint, the dashboard's download) loads again with `tf.loadLayersModel`.
 */
import * as tf from '@tensorflow/tfjs';
import type { LayerFactory } from './layer_factory.ts';
import { classificationLoss } from './losses.ts';
import { yieldToEventLoop } from '../runtime/ticker.ts';

type Kwargs = Record<string, unknown>;
/** TF.js's LayerArgs (name, inputShape, dtype, trainable, ...). */
type LayerArgs = NonNullable<ConstructorParameters<typeof tf.layers.Layer>[0]>;
type Initializer = ReturnType<typeof tf.initializers.zeros>;

/** Token ids [batch, T] (int32) to vectors [batch, T, d]: a token embedding plus a learned position embedding. */
export class TokenAndPositionEmbedding extends tf.layers.Layer {
  static className = 'TokenAndPositionEmbedding';
  readonly vocabSize: number;
  readonly contextLength: number;
  readonly dModel: number;
  private readonly seed: number | undefined;
  private tokens!: tf.LayerVariable;
  private positions!: tf.LayerVariable;

  constructor(args: { vocabSize: number; contextLength: number; dModel: number; seed?: number } & LayerArgs) {
    super(args);
    this.vocabSize = args.vocabSize;
    this.contextLength = args.contextLength;
    this.dModel = args.dModel;
    this.seed = args.seed;
  }

  override build(): void {
    // GPT-2's initialisation: normal, standard deviation 0.02.
    const init = (k: number) =>
      tf.initializers.randomNormal({ mean: 0, stddev: 0.02, ...(this.seed === undefined ? {} : { seed: this.seed + k }) });
    this.tokens = this.addWeight('token_embeddings', [this.vocabSize, this.dModel], 'float32', init(0));
    this.positions = this.addWeight('position_embeddings', [this.contextLength, this.dModel], 'float32', init(1));
    this.built = true;
  }

  override computeOutputShape(inputShape: tf.Shape | tf.Shape[]): tf.Shape {
    const s = inputShape as tf.Shape;
    return [s[0]!, s[1]!, this.dModel];
  }

  override call(inputs: tf.Tensor | tf.Tensor[], _kwargs: Kwargs): tf.Tensor {
    return tf.tidy(() => {
      const ids = (Array.isArray(inputs) ? inputs[0]! : inputs).toInt();
      const t = ids.shape[1]!;
      const tok = tf.gather(this.tokens.read(), ids); // [B, T, d]
      return tf.add(tok, this.positions.read().slice([0, 0], [t, this.dModel]));
    });
  }

  override getConfig(): tf.serialization.ConfigDict {
    return {
      ...super.getConfig(),
      vocabSize: this.vocabSize,
      contextLength: this.contextLength,
      dModel: this.dModel,
      ...(this.seed === undefined ? {} : { seed: this.seed }),
    };
  }
}

/** torch's layer norm over the last axis, with this layer's weight (gamma) and bias (beta). */
function layerNorm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, epsilon: number): tf.Tensor {
  const { mean, variance } = tf.moments(x, -1, true);
  return tf.add(tf.mul(tf.div(tf.sub(x, mean), tf.sqrt(tf.add(variance, epsilon))), gamma), beta);
}

/** GELU, the tanh approximation (GPT-2's; torch's `gelu(approximate='tanh')`). */
function gelu(x: tf.Tensor): tf.Tensor {
  const inner = tf.mul(Math.sqrt(2 / Math.PI), tf.add(x, tf.mul(0.044715, tf.pow(x, 3))));
  return tf.mul(tf.mul(0.5, x), tf.add(1, tf.tanh(inner)));
}

/** One pre-norm transformer block: x + attention(ln1(x)), then + mlp(ln2(x)). Shape [B, T, d] in and out. */
export class TransformerBlock extends tf.layers.Layer {
  static className = 'TransformerBlock';
  readonly dModel: number;
  readonly heads: number;
  readonly hidden: number;
  readonly epsilon: number;
  /** The number of blocks in the model: the residual projections start smaller (GPT-2: 0.02 / sqrt(2 x blocks)). */
  readonly blocks: number;
  private readonly seed: number | undefined;
  private w!: Record<
    | 'ln1Gamma'
    | 'ln1Beta'
    | 'qkvKernel'
    | 'qkvBias'
    | 'projKernel'
    | 'projBias'
    | 'ln2Gamma'
    | 'ln2Beta'
    | 'fc1Kernel'
    | 'fc1Bias'
    | 'fc2Kernel'
    | 'fc2Bias',
    tf.LayerVariable
  >;

  constructor(args: { dModel: number; heads: number; hidden?: number; epsilon?: number; blocks?: number; seed?: number } & LayerArgs) {
    super(args);
    this.dModel = args.dModel;
    this.heads = args.heads;
    this.hidden = args.hidden ?? 4 * args.dModel;
    this.epsilon = args.epsilon ?? 1e-5;
    this.blocks = args.blocks ?? 1;
    this.seed = args.seed;
    if (!Number.isSafeInteger(this.dModel) || !Number.isSafeInteger(this.heads) || this.heads < 1 || this.dModel % this.heads !== 0) {
      throw new RangeError(`a transformer block's width (${this.dModel}) must be a multiple of its heads (${this.heads})`);
    }
  }

  override build(): void {
    const d = this.dModel;
    let k = 0;
    const normal = (stddev: number) =>
      tf.initializers.randomNormal({ mean: 0, stddev, ...(this.seed === undefined ? {} : { seed: this.seed + k++ }) });
    const residual = 0.02 / Math.sqrt(2 * this.blocks);
    const add = (name: string, shape: number[], init: Initializer) => this.addWeight(name, shape, 'float32', init);
    this.w = {
      ln1Gamma: add('ln1_gamma', [d], tf.initializers.ones()),
      ln1Beta: add('ln1_beta', [d], tf.initializers.zeros()),
      qkvKernel: add('qkv_kernel', [d, 3 * d], normal(0.02)),
      qkvBias: add('qkv_bias', [3 * d], tf.initializers.zeros()),
      projKernel: add('proj_kernel', [d, d], normal(residual)),
      projBias: add('proj_bias', [d], tf.initializers.zeros()),
      ln2Gamma: add('ln2_gamma', [d], tf.initializers.ones()),
      ln2Beta: add('ln2_beta', [d], tf.initializers.zeros()),
      fc1Kernel: add('fc1_kernel', [d, this.hidden], normal(0.02)),
      fc1Bias: add('fc1_bias', [this.hidden], tf.initializers.zeros()),
      fc2Kernel: add('fc2_kernel', [this.hidden, d], normal(residual)),
      fc2Bias: add('fc2_bias', [d], tf.initializers.zeros()),
    };
    this.built = true;
  }

  override computeOutputShape(inputShape: tf.Shape | tf.Shape[]): tf.Shape {
    return inputShape as tf.Shape;
  }

  override call(inputs: tf.Tensor | tf.Tensor[], _kwargs: Kwargs): tf.Tensor {
    return tf.tidy(() => {
      const x = Array.isArray(inputs) ? inputs[0]! : inputs;
      const [b, t, d] = x.shape as [number, number, number];
      const h = this.heads;
      const hd = d / h;
      const w = Object.fromEntries(Object.entries(this.w).map(([name, v]) => [name, v.read()])) as Record<keyof typeof this.w, tf.Tensor>;
      const linear = (v: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor) =>
        tf.add(tf.matMul(v.reshape([b * t, v.shape[2]!]), kernel), bias).reshape([b, t, kernel.shape[1]!]);
      // Attention: every head sees positions up to its own (the causal mask), scaled by 1/sqrt(head width).
      const qkv = linear(layerNorm(x, w.ln1Gamma, w.ln1Beta, this.epsilon), w.qkvKernel, w.qkvBias);
      const [q, k, v] = tf.split(qkv, 3, 2).map((p) => p.reshape([b, t, h, hd]).transpose([0, 2, 1, 3]));
      const scores = tf.div(tf.matMul(q!, k!, false, true), Math.sqrt(hd));
      const future = tf.sub(1, tf.linalg.bandPart(tf.ones([t, t]), -1, 0)); // 1 above the diagonal
      const att = tf.softmax(tf.add(scores, tf.mul(future, -1e9)), -1);
      const y = tf.matMul(att, v!).transpose([0, 2, 1, 3]).reshape([b, t, d]);
      const x1 = tf.add(x, linear(y, w.projKernel, w.projBias));
      const m = linear(gelu(linear(layerNorm(x1, w.ln2Gamma, w.ln2Beta, this.epsilon), w.fc1Kernel, w.fc1Bias)), w.fc2Kernel, w.fc2Bias);
      return tf.add(x1, m);
    });
  }

  override getConfig(): tf.serialization.ConfigDict {
    return {
      ...super.getConfig(),
      dModel: this.dModel,
      heads: this.heads,
      hidden: this.hidden,
      epsilon: this.epsilon,
      blocks: this.blocks,
      ...(this.seed === undefined ? {} : { seed: this.seed }),
    };
  }
}

tf.serialization.registerClass(TokenAndPositionEmbedding);
tf.serialization.registerClass(TransformerBlock);

export interface LanguageModelSpec {
  vocabSize: number;
  /** Tokens the model sees at once (T). */
  contextLength: number;
  /** Width of the residual stream (d). */
  dModel: number;
  heads: number;
  /** Transformer blocks. */
  blocks: number;
  /** Initial weights come from the seed alone (every rank starts alike). */
  seed: number;
}

/** The model's layers, in order, as factories: a pipeline stage builds its own share (split by blocks). */
export function languageModelLayers(spec: LanguageModelSpec): LayerFactory[] {
  const { vocabSize, contextLength, dModel, heads, blocks, seed } = spec;
  const shape = (s: number[] | undefined) => (s ? { inputShape: s } : {});
  return [
    (s?: number[]) => new TokenAndPositionEmbedding({ vocabSize, contextLength, dModel, seed: seed * 1000, ...shape(s) }),
    ...Array.from(
      { length: blocks },
      (_, i) => (s?: number[]) => new TransformerBlock({ dModel, heads, blocks, seed: seed * 1000 + 100 * (i + 1), ...shape(s) }),
    ),
    (s?: number[]) => tf.layers.layerNormalization({ epsilon: 1e-5, ...shape(s) }),
    (s?: number[]) =>
      tf.layers.dense({
        units: vocabSize,
        kernelInitializer: tf.initializers.randomNormal({ mean: 0, stddev: 0.02, seed: seed * 1000 + 99 }),
        ...shape(s),
      }),
  ];
}

/** The whole model: token ids [batch, T] in, logits [batch, T, vocab] out. */
export function buildLanguageModel(spec: LanguageModelSpec): tf.Sequential {
  const model = tf.sequential({ name: `gpt-${spec.blocks}x${spec.dModel}-seed${spec.seed}` });
  languageModelLayers(spec).forEach((make, i) => {
    model.add(make(i === 0 ? [spec.contextLength] : undefined));
  });
  return model;
}

/** Mean cross-entropy of next-token logits [B, T, V] against targets [B, T] (in nats; perplexity is its exp). */
export function languageModelLoss(logits: tf.Tensor, targets: tf.Tensor): tf.Scalar {
  return classificationLoss(logits, targets, logits.shape[logits.shape.length - 1]!);
}

// The tokenizer lives with the text dataset (no TF.js there); importable from here as before.
export { CharTokenizer } from '../datasets/text.ts';

/**
 * Samples `count` tokens after `prompt` (ids), one at a time, from the model's last-position
 * distribution at `temperature` (0: the most likely token). `random` draws in [0, 1).
 */
export async function generate(
  model: tf.LayersModel,
  prompt: ArrayLike<number>,
  count: number,
  options: { temperature?: number; random?: () => number } = {},
): Promise<number[]> {
  const contextLength = (model.inputs[0]!.shape[1] as number) ?? 1;
  const temperature = options.temperature ?? 0.8;
  const random = options.random ?? Math.random;
  const ids = Array.from(prompt);
  const out: number[] = [];
  for (let n = 0; n < count; n++) {
    // The last contextLength tokens; a shorter window is padded on the right and read at its last
    // real position, which the causal mask keeps from seeing the padding.
    const window = ids.slice(-contextLength);
    const at = window.length - 1;
    while (window.length < contextLength) window.push(0);
    const probs = tf.tidy(() => {
      const logits = model.predict(tf.tensor2d([window], [1, contextLength], 'int32')) as tf.Tensor;
      const last = logits.slice([0, at, 0], [1, 1, -1]).reshape([-1]);
      return temperature > 0 ? tf.softmax(tf.div(last, temperature)) : last;
    });
    const p = (await probs.data()) as Float32Array;
    probs.dispose();
    // On the cpu backend each token's forward runs on the page's thread: let the page's heartbeats
    // and links through between tokens, or a long sample gets the tab evicted as frozen.
    await yieldToEventLoop();
    let next = 0;
    if (temperature > 0) {
      let r = random();
      for (next = 0; next < p.length - 1; next++) {
        r -= p[next]!;
        if (r < 0) break;
      }
    } else for (let i = 1; i < p.length; i++) if (p[i]! > p[next]!) next = i;
    ids.push(next);
    out.push(next);
  }
  return out;
}
