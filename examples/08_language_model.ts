/**
 * A small language model trained with DDP: a character-level transformer (src/nn/language_model.ts)
 * on the first 20 chapters of Moby-Dick (datasets/), each rank on its share of the text's windows
 * (src/datasets/text.ts),
 * the gradients averaged as for any model. Rank 0 says the loss, the perplexity and the tokens/s
 * every --log-every steps, and what the model writes after a prompt.
 *
 *   npm run launch -- --nproc 2 examples/08_language_model.ts --steps 300
 *
 * Options: --steps (200), --batch-size (16 windows per rank), --context (64 characters),
 * --width (64), --heads (4), --blocks (2), --lr (0.003), --log-every (50), --prompt ("Call me ").
 */
import * as tf from '@tensorflow/tfjs';
import {
  Adam,
  DistributedDataParallel,
  DistributedSampler,
  buildLanguageModel,
  generate,
  initProcessGroup,
  intArg,
  languageModelLoss,
  textDatasets,
  util,
} from '../src/index.ts';
import type { LaunchContext } from '../src/index.ts';

/** The same sample text for the same weights: a seeded draw. */
const seeded = (seed: number) => {
  const rng = new util.Mulberry32(seed);
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
  // The text's windows of contextLength + 1 characters (one starting every contextLength): the
  // first 90% of the text trains, the rest is held out; the unigram baseline is the loss a model
  // that knows only the characters' frequencies gets (nats per character).
  const { train, tokenizer, unigram } = textDatasets(await res.text(), { contextLength, name: 'moby-dick' });

  const pg = await initProcessGroup({
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    worldSize: ctx.nproc,
    timeoutMs: ctx.timeoutMs,
  });
  const model = buildLanguageModel({ vocabSize: tokenizer.vocabSize, contextLength, dModel, heads, blocks, seed: 0 });
  const parameters = model.countParams();
  const ddp = await DistributedDataParallel.create(model, pg);
  const optimizer = new Adam({ lr });
  const sampler = new DistributedSampler(train.length, { numReplicas: pg.worldSize, rank: pg.rank, seed: 0 });
  if (pg.rank === 0)
    ctx.log(
      `${parameters} parameters, vocabulary ${tokenizer.vocabSize}, ${train.length} windows of ${contextLength} characters to train on; unigram baseline ${unigram.toFixed(3)} nats`,
    );

  const batch = (indices: number[]) => {
    const { x, y } = train.batch(indices);
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
        ctx.log(
          `step ${step}: loss ${loss.toFixed(3)} (perplexity ${Math.exp(loss).toFixed(1)}), ${Math.round(tokensPerSec)} tokens/s; "${prompt}${sample}"`,
        );
      }
    }
  }
  const seconds = (performance.now() - started) / 1000;
  const weightHash = await ddp.weightsHash(); // equal on every rank
  await pg.barrier();
  pg.destroy();
  return {
    finalLoss: loss,
    perplexity: Math.exp(loss),
    unigram,
    parameters,
    vocabSize: tokenizer.vocabSize,
    tokensPerSec: steps > 1 ? ((steps - 1) * batchSize * contextLength * pg.worldSize) / seconds : 0,
    curve,
    sample: `${prompt}${sample}`,
    weightHash,
  };
}
