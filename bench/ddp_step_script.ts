/**
 * The page side of `npm run bench:ddp-step` (a launcher script, one rank): the same model, batch
 * and data trained three ways on this tab's backend, one after the other, in rounds that
 * alternate so that a slow patch of the machine hits every way alike:
 *   plain:     a plain TF.js loop: optimizer.minimize(loss) with tf.train.adam, the loss read back;
 *   ddp-host:  DistributedDataParallel (world size 1) with the host Adam (src/nn/optim.ts): backward,
 *              the gradients read back, the update on the host's master copy, the weights uploaded;
 *   ddp-device: DDP with tf.train.adam applied on the device (the path before host optimizers).
 * Returns each way's median step time (ms) over the timed steps, and the ratios to plain.
 */
import * as tf from '@tensorflow/tfjs';
import { yieldToEventLoop } from '../src/runtime/ticker.ts';
import {
  Adam,
  DistributedDataParallel,
  buildModel,
  classificationLoss,
  initProcessGroup,
  intArg,
  syntheticDataset,
  type LaunchContext,
} from '../src/index.ts';

export default async function main(ctx: LaunchContext) {
  const batchSize = intArg(ctx.args, 'batch-size', 64);
  const steps = intArg(ctx.args, 'steps', 60);
  const rounds = intArg(ctx.args, 'rounds', 3);
  const hidden = intArg(ctx.args, 'hidden', 128);
  const inputSize = intArg(ctx.args, 'input-size', 784);
  const data = syntheticDataset({ length: batchSize * 8, inputSize, numClasses: 10, seed: 0 });
  const pg = await initProcessGroup({
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    worldSize: ctx.nproc,
    timeoutMs: ctx.timeoutMs,
  });
  const spec = { kind: 'mlp' as const, inputShape: [inputSize], numClasses: 10, seed: 0, hidden };
  const batches = Array.from({ length: 8 }, (_, b) => {
    const { x, y } = data.batch(Array.from({ length: batchSize }, (_, i) => b * batchSize + i));
    return { xs: tf.tensor(x, [batchSize, inputSize]), ys: tf.tensor1d(y, 'int32') };
  });

  const plainModel = buildModel(spec);
  const plainOpt = tf.train.adam(0.003);
  const hostModel = buildModel(spec);
  const hostDdp = await DistributedDataParallel.create(hostModel, pg, { name: 'host' });
  const hostOpt = new Adam({ lr: 0.003 });
  const deviceModel = buildModel(spec);
  const deviceDdp = await DistributedDataParallel.create(deviceModel, pg, { name: 'device' });
  const deviceOpt = tf.train.adam(0.003);

  const ways: Record<string, (s: number) => Promise<void>> = {
    plain: async (s) => {
      const { xs, ys } = batches[s % 8]!;
      const cost = plainOpt.minimize(() => classificationLoss(plainModel.apply(xs) as tf.Tensor, ys, 10), true)!;
      await cost.data();
      cost.dispose();
    },
    'ddp-host': async (s) => {
      const { xs, ys } = batches[s % 8]!;
      await hostDdp.backward(() => classificationLoss(hostModel.apply(xs) as tf.Tensor, ys, 10));
      await hostDdp.step(hostOpt);
    },
    'ddp-device': async (s) => {
      const { xs, ys } = batches[s % 8]!;
      await deviceDdp.backward(() => classificationLoss(deviceModel.apply(xs) as tf.Tensor, ys, 10));
      await deviceDdp.step(deviceOpt);
    },
  };
  const times: Record<string, number[]> = { plain: [], 'ddp-host': [], 'ddp-device': [] };
  // Warm-up: shaders compiled, buffers allocated.
  for (const way of Object.values(ways)) {
    for (let s = 0; s < 5; s++) {
      await way(s);
      await yieldToEventLoop();
    }
  }
  for (let r = 0; r < rounds; r++) {
    for (const [name, way] of Object.entries(ways)) {
      for (let s = 0; s < steps; s++) {
        const t0 = performance.now();
        await way(s);
        times[name]!.push(performance.now() - t0);
        // Between steps (not timed): the page's heartbeat to the server gets its turn, as in a real run.
        await yieldToEventLoop();
      }
    }
  }
  const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;
  const ms = Object.fromEntries(Object.entries(times).map(([k, v]) => [k, median(v)]));
  ctx.log(
    `backend ${ctx.backend}: plain ${ms.plain!.toFixed(2)} ms, ddp-host ${ms['ddp-host']!.toFixed(2)} ms, ddp-device ${ms['ddp-device']!.toFixed(2)} ms`,
  );
  for (const b of batches) tf.dispose([b.xs, b.ys]);
  await pg.barrier();
  pg.destroy();
  return {
    backend: ctx.backend,
    parameters: hostDdp.parameterCount,
    batchSize,
    stepsTimed: steps * rounds,
    medianMs: ms,
    hostOverPlain: ms['ddp-host']! / ms.plain!,
    deviceOverPlain: ms['ddp-device']! / ms.plain!,
  };
}
