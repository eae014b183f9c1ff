/**
 * DataParallel (torch.nn.DataParallel): each rank splits its batch over K devices, dedicated
 * Workers that each hold a replica of the model on their own TF.js backend, and DDP averages the
 * gathered gradients across ranks (torch's DDP over a multi-device module). On the cpu and wasm
 * backends, every device is another CPU core at work.
 *
 *   npm run launch -- --nproc 1 --backend cpu examples/04_dataparallel_train.ts --devices 2 --dataset synthetic --epochs 1
 *   npm run launch -- --nproc 2 --backend cpu examples/04_dataparallel_train.ts --devices 2
 */
import {
  DataParallel,
  DistributedDataParallel,
  DistributedSampler,
  buildModel,
  initProcessGroup,
  intArg,
  loadMnist,
  syntheticDataset,
  type DeviceBackend,
  Adam,
} from '../src/index.ts';
import type { LaunchContext } from '../src/index.ts';

export default async function main(ctx: LaunchContext) {
  const dataset =
    ctx.args.dataset === 'mnist'
      ? await loadMnist({ baseUrl: new URL('/datasets/mnist/', ctx.url).href })
      : syntheticDataset({ length: 2048, inputSize: 16, numClasses: 4, seed: 0 });
  const batchSize = intArg(ctx.args, 'batch-size', 64);
  const epochs = intArg(ctx.args, 'epochs', 1);

  const model = buildModel({ kind: 'mlp', inputShape: dataset.inputShape, numClasses: dataset.numClasses, seed: 0 });
  // K Workers, each a replica on the page's backend (the launcher's --backend), started before joining the group.
  const dp = await DataParallel.create(model, {
    devices: intArg(ctx.args, 'devices', 2),
    backend: ctx.backend as DeviceBackend,
    loss: { kind: 'softmaxCrossEntropy', numClasses: dataset.numClasses },
  });
  ctx.log(`devices: ${dp.devices.map((d) => `${d.device} on ${d.backend}${d.fallbackReason ? ` (${d.fallbackReason})` : ''}`).join(', ')}`);

  const pg = await initProcessGroup({
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    worldSize: ctx.nproc,
    timeoutMs: ctx.timeoutMs,
  });
  const ddp = await DistributedDataParallel.create(model, pg); // rank 0's weights everywhere
  const optimizer = new Adam({ lr: 0.003 });
  const sampler = new DistributedSampler(dataset.length, { numReplicas: pg.worldSize, rank: pg.rank, seed: 0 });

  let loss = NaN;
  for (let epoch = 0; epoch < epochs; epoch++) {
    sampler.setEpoch(epoch);
    const indices = sampler.indices();
    for (let i = 0; i < indices.length; i += batchSize) {
      const batch = dataset.batch(indices.slice(i, i + batchSize));
      const local = await dp.computeGradients(batch); // scattered over the devices, gathered here
      ({ loss } = await ddp.backward(local)); // averaged across ranks
      await ddp.step(optimizer);
    }
    ctx.log(`epoch ${epoch}: loss ${loss.toFixed(4)}`);
  }
  const devices = dp.deviceStats();
  dp.close();
  const weightHash = await ddp.verifyReplicas(); // every rank's the same, or ReplicaDivergenceError
  await pg.barrier();
  pg.destroy();
  return { finalLoss: loss, weightHash, devices };
}
