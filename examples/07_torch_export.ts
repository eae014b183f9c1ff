/**
 * Train in tabs, then hand the model to PyTorch: DDP on MNIST, a checkpoint saved on the server,
 * and that checkpoint exported as a torch state dict (safetensors) and the matching nn.Module.
 *
 *   npm start -- --checkpoint-dir ckpt      (or let the launcher start its own server)
 *   npm run launch -- --nproc 2 examples/07_torch_export.ts --model cnn --steps 20
 *   npm run export:torch -- ckpt/<session>/<name>.ckpt --out my-model
 *   python3 -c 'from model import Model, load_file; m = Model(); m.load_state_dict(load_file("model.safetensors"))'   (in my-model)
 *
 * The result carries the tab's logits for the first test images, so that a caller can check what
 * torch computes from the export on the same images (test/e2e/torch_export.spec.ts does).
 */
import * as tf from '@tensorflow/tfjs';
import {
  DistributedDataParallel,
  DistributedSampler,
  buildModel,
  classificationLoss,
  initProcessGroup,
  intArg,
  loadMnist,
  modelArtifacts,
  saveCheckpoint,
  Adam,
} from '../src/index.ts';
import type { LaunchContext } from '../src/index.ts';

export default async function main(ctx: LaunchContext) {
  const kind = ctx.args.model === 'mlp' ? 'mlp' : 'cnn';
  const steps = intArg(ctx.args, 'steps', 20);
  const batchSize = intArg(ctx.args, 'batch-size', 32);
  const evalImages = intArg(ctx.args, 'eval-images', 4);
  const baseUrl = new URL('/datasets/mnist/', ctx.url).href;
  const [train, test] = await Promise.all([loadMnist({ baseUrl }), loadMnist({ baseUrl, split: 'test' })]);

  const pg = await initProcessGroup({
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    worldSize: ctx.nproc,
    timeoutMs: ctx.timeoutMs,
  });
  const model = buildModel({
    kind,
    inputShape: train.inputShape,
    numClasses: train.numClasses,
    seed: 0,
    hidden: kind === 'cnn' ? 32 : undefined,
  });
  const ddp = await DistributedDataParallel.create(model, pg);
  const optimizer = new Adam({ lr: 0.003 });
  const sampler = new DistributedSampler(train.length, { numReplicas: pg.worldSize, rank: pg.rank, seed: 0 });
  const indices = sampler.indices();
  let loss = NaN;
  for (let step = 0; step < steps; step++) {
    const { x, y } = train.batch(indices.slice(step * batchSize, (step + 1) * batchSize));
    const xs = tf.tensor(x, [y.length, ...train.inputShape]);
    const ys = tf.tensor1d(y, 'int32');
    ({ loss } = await ddp.backward(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, train.numClasses)));
    await ddp.step(optimizer);
    tf.dispose([xs, ys]);
  }
  ctx.log(`${steps} steps of ${kind}: loss ${loss.toFixed(4)}`);

  let checkpoint: string | undefined;
  if (pg.rank === 0) {
    // Only the model: an optimizer's state has no use in torch (a run resuming here would want it; see runElastic).
    const saved = await saveCheckpoint(
      ctx.url,
      ctx.session,
      {
        meta: { step: steps, model: kind },
        model: await modelArtifacts(model),
        optimizer: { weightSpecs: [], weightData: new ArrayBuffer(0) },
      },
      { token: ctx.token },
    );
    checkpoint = saved.name;
    ctx.log(
      `checkpoint ${saved.name} saved (${saved.bytes} bytes): npm run export:torch -- <the server's --checkpoint-dir>/${ctx.session}/${saved.name}.ckpt`,
    );
  }
  const images = Array.from({ length: evalImages }, (_, i) => i);
  const { x } = test.batch(images);
  const logits = tf.tidy(() => model.predict(tf.tensor(x, [images.length, ...test.inputShape])) as tf.Tensor);
  // `rank`: the launcher's summary is rank 0's result, and ranks go by arrival, not by page.
  const result = {
    rank: pg.rank,
    checkpoint,
    model: kind,
    finalLoss: loss,
    inputShape: test.inputShape,
    inputs: Array.from(x),
    logits: Array.from(await logits.data()),
    weightHash: await ddp.weightsHash(),
  };
  logits.dispose();
  await pg.barrier();
  pg.destroy();
  return result;
}
