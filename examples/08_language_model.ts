/**
 * A small language model trained with DDP: a character-level transformer (src/language_model.ts)
 * on the first 20 chapters of Moby-Dick (datasets/), each rank on its share of the text's windows,
 * the gradients averaged as for any model. Rank 0 says the loss, the perplexity and the tokens/s
 * every --log-every steps, and what the model writes after a prompt.
 *
 *   npm run launch -- --nproc 2 examples/08_language_model.ts --steps 300
 *
 * Options: --steps (200), --batch-size (16 windows per rank), --context (64 characters),
 * --width (64), --heads (4), --blocks (2), --lr (0.003), --log-every (50), --prompt ("Call me ").
 */
import * as tf from '@tensorflow/tfjs';
import { Adam, CharTokenizer, DistributedDataParallel, DistributedSampler, buildLanguageModel, generate, initProcessGroup, intArg, languageModelLoss, Mulberry32 } from '../src/index.ts';
import type { LaunchContext } from '../src/index.ts';

/** The same sample text for the same weights: a seeded draw. */
const seeded = (seed: number) => {
  const rng = new Mulberry32(seed);
  return () => rng.nextFloat();
};

export default async function main(ctx: LaunchContext) {
  const steps = intArg(ctx.args, 'steps', 200);
  const batchSize = intArg(ctx.args, 'batch-size', 16);
  const contextLength = intArg(ctx.args, 'context', 64);
  const dModel = intArg(ctx.args, 'width', 64);
  const heads = intArg(ctx.args, 'heads', 4);
  const blocks = intArg(ctx.args, 'blocks', 2);
  const logEvery = intArg(ctx.args, 'log-every', 50);
  const lr = ctx.args.lr === undefined ? 0.003 : Number(ctx.args.lr);
  const prompt = typeof ctx.args.prompt === 'string' ? ctx.args.prompt : 'Call me ';

  const res = await fetch(new URL('/datasets/text/moby-dick-1-20.txt', ctx.url));
  if (!res.ok) throw new Error(`the corpus did not load: HTTP ${res.status} from /datasets/text/moby-dick-1-20.txt`);
  const text = await res.text();
  const tokenizer = CharTokenizer.fromText(text);
  const ids = tokenizer.encode(text);
  // The baseline a model must beat: the entropy of the characters' frequencies (nats per character).
  const counts = new Map<number, number>();
  for (const id of ids) counts.set(id, (counts.get(id) ?? 0) + 1);
  const unigram = -[...counts.values()].reduce((a, c) => a + (c / ids.length) * Math.log(c / ids.length), 0);

  const pg = await initProcessGroup({ url: ctx.url, session: ctx.session, token: ctx.token, worldSize: ctx.nproc, timeoutMs: ctx.timeoutMs });
  const model = buildLanguageModel({ vocabSize: tokenizer.vocabSize, contextLength, dModel, heads, blocks, seed: 0 });
  const parameters = model.countParams();
  const ddp = await DistributedDataParallel.create(model, pg);
  const optimizer = new Adam({ lr });
  // The samples are the text's windows of contextLength + 1 characters, one starting every contextLength.
  const windows = Math.floor((ids.length - 1) / contextLength);
  const sampler = new DistributedSampler(windows, { numReplicas: pg.worldSize, rank: pg.rank, seed: 0 });
  if (pg.rank === 0) ctx.log(`${parameters} parameters, vocabulary ${tokenizer.vocabSize}, ${ids.length} characters in ${windows} windows of ${contextLength}; unigram baseline ${unigram.toFixed(3)} nats`);

  const batch = (indices: number[]) => {
    const x = new Int32Array(indices.length * contextLength);
    const y = new Int32Array(indices.length * contextLength);
    indices.forEach((w, i) => {
      x.set(ids.subarray(w * contextLength, (w + 1) * contextLength), i * contextLength);
      y.set(ids.subarray(w * contextLength + 1, (w + 1) * contextLength + 1), i * contextLength);
    });
    return { xs: tf.tensor2d(x, [indices.length, contextLength], 'int32'), ys: tf.tensor2d(y, [indices.length, contextLength], 'int32') };
  };

  const curve: Array<{ step: number; tokens: number; loss: number }> = [];
  let epoch = 0;
  let order = sampler.indices();
  let at = 0;
  let loss = NaN;
  let started = performance.now();
  let sample = '';
  for (let step = 1; step <= steps; step++) {
    if (at + batchSize > order.length) {
      sampler.setEpoch(++epoch);
      order = sampler.indices();
      at = 0;
    }
    const { xs, ys } = batch(order.slice(at, at + batchSize));
    at += batchSize;
    ({ loss } = await ddp.backward(() => languageModelLoss(model.apply(xs) as tf.Tensor, ys)));
    await ddp.step(optimizer);
    tf.dispose([xs, ys]);
    if (step === 1) started = performance.now(); // the first step compiles; time the rest
    if (step % logEvery === 0 || step === steps) {
      const tokens = step * batchSize * contextLength * pg.worldSize;
      curve.push({ step, tokens, loss });
      const seconds = (performance.now() - started) / 1000;
      const tokensPerSec = step > 1 ? ((step - 1) * batchSize * contextLength * pg.worldSize) / seconds : 0;
      if (pg.rank === 0) {
        sample = tokenizer.decode(await generate(model, tokenizer.encode(prompt), 80, { temperature: 0.8, random: seeded(step) }));
        ctx.log(`step ${step}: loss ${loss.toFixed(3)} (perplexity ${Math.exp(loss).toFixed(1)}), ${Math.round(tokensPerSec)} tokens/s; "${prompt}${sample}"`);
      }
    }
  }
  const seconds = (performance.now() - started) / 1000;
  const weightHash = await ddp.weightsHash(); // equal on every rank
  await pg.barrier();
  pg.destroy();
  return { finalLoss: loss, perplexity: Math.exp(loss), unigram, parameters, vocabSize: tokenizer.vocabSize, tokensPerSec: steps > 1 ? ((steps - 1) * batchSize * contextLength * pg.worldSize) / seconds : 0, curve, sample: `${prompt}${sample}`, weightHash };
}
