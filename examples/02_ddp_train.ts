/**
 * Plain data-parallel training, as a torch DDP script does it: join a group of fixed size, take
 * this rank's shard with DistributedSampler, average gradients with DistributedDataParallel.
 *
 *   npm run launch -- --nproc 2 examples/02_ddp_train.ts --dataset synthetic --epochs 2
 *
 * With the host's own model and data (a TF.js model folder; images in a folder per class, or a
 * CSV), the script trains those: the launcher offers them, `ctx.offer` says what they are.
 *
 *   npm run launch -- --nproc 2 --model-dir my_model --data-dir my_images examples/02_ddp_train.ts
 */
import * as tf from '@tensorflow/tfjs';
import {
  DistributedDataParallel,
  DistributedSampler,
  buildModel,
  classificationLoss,
  fetchBatch,
  initProcessGroup,
  intArg,
  loadMnist,
  loadOfferedDataset,
  loadOfferedModel,
  runtime,
  syntheticDataset,
  Adam,
} from '../src/index.ts';
import type { Dataset, LaunchContext } from '../src/index.ts';

/** The host's model, else an MLP for the data. */
async function modelFor(ctx: LaunchContext, inputShape: number[], numClasses: number): Promise<tf.LayersModel> {
  if (!ctx.offer.model) return buildModel({ kind: 'mlp', inputShape, numClasses, seed: 0 });
  const { model, note } = await loadOfferedModel(ctx);
  if (note) ctx.log(note);
  return model;
}

/** The host's data, else MNIST or a synthetic set (--dataset). */
async function datasetFor(ctx: LaunchContext): Promise<Dataset> {
  if (ctx.offer.data) return loadOfferedDataset(ctx, ctx.offer.model?.inputShape ?? ctx.offer.data.inputShape ?? [28, 28, 1]);
  if (ctx.args.dataset === 'mnist') return loadMnist({ baseUrl: new URL('/datasets/mnist/', ctx.url).href });
  return syntheticDataset({ length: 2048, inputSize: 16, numClasses: 4, seed: 0 });
}

export default async function main(ctx: LaunchContext) {
  const dataset = await datasetFor(ctx);
  const batchSize = intArg(ctx.args, 'batch-size', 32);
  const epochs = intArg(ctx.args, 'epochs', 1);

  const pg = await initProcessGroup({
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    worldSize: ctx.nproc,
    timeoutMs: ctx.timeoutMs,
  });
  const model = await modelFor(ctx, dataset.inputShape, dataset.numClasses);
  if (ctx.offer.model || ctx.offer.data)
    ctx.log(`training ${ctx.offer.model?.name ?? 'an MLP'} on ${dataset.name} (${dataset.length} samples, ${dataset.numClasses} classes)`);
  const ddp = await DistributedDataParallel.create(model, pg); // same shapes everywhere, rank 0's weights
  const optimizer = new Adam({ lr: 0.003 });
  const sampler = new DistributedSampler(dataset.length, { numReplicas: pg.worldSize, rank: pg.rank, seed: 0 });
  const straggler = new runtime.Straggler(runtime.slowFactor(ctx.slow, pg.rank)); // the launcher's --slow RANK:FACTOR (factor 1: never waits)

  let loss = NaN;
  for (let epoch = 0; epoch < epochs; epoch++) {
    sampler.setEpoch(epoch);
    const indices = sampler.indices();
    for (let i = 0; i < indices.length; i += batchSize) {
      const { x, y } = await fetchBatch(dataset, indices.slice(i, i + batchSize));
      const xs = tf.tensor(x, [y.length, ...dataset.inputShape]);
      const ys = tf.tensor1d(y, 'int32');
      ({ loss } = await ddp.backward(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, dataset.numClasses), { straggler }));
      await ddp.step(optimizer); // optimizer.step() + zero_grad() with the averaged gradients
      tf.dispose([xs, ys]);
    }
    ctx.log(`epoch ${epoch}: loss ${loss.toFixed(4)}`);
  }
  const weightHash = await ddp.weightsHash(); // equal on every rank
  await pg.barrier();
  pg.destroy();
  return { finalLoss: loss, weightHash };
}
