/**
 * 02_ddp_train.ts's training made elastic: tabs may close, freeze or join mid-run and the rest go on.
 * The library carries the rounds, recovery from a surviving replica, re-sharding,
 * the votes at step boundaries and checkpoints; the script gives it a plain training step.
 *
 *   npm run launch -- --nproc 4 --min 2 --max 4 --kill 2@8 examples/03_elastic_train.ts \
 *     --dataset synthetic --train-size 2048 --batch-size 32 --epochs 1 [--powersgd 2 | --local-sgd 4 | --diloco 16 [--stream 4]]
 *
 * Communication hooks (torch's register_comm_hook) go through runElastic, which keeps their state
 * across regroups, in checkpoints and for joiners: --powersgd R sends each step's gradients as
 * rank-R PowerSGD factors after 10 plain steps; --local-sgd H steps locally after 10 averaged
 * steps and averages the models every H steps. --diloco H trains H inner steps on each rank with
 * no communication, then takes DiLoCo's outer step (the averaged change of the weights, Nesterov
 * SGD); --stream P cuts the model into P fragments whose outer steps are staggered, each
 * all-reduce overlapped with the next inner step (streaming DiLoCo). The ranks then vote at outer
 * steps only.
 */
import * as tf from '@tensorflow/tfjs';
import {
  TrainState,
  buildModel,
  classificationLoss,
  intArg,
  loadMnist,
  postLocalSGD,
  powerSGD,
  runElastic,
  runtime,
  subset,
  syntheticDataset,
  Adam,
} from '../src/index.ts';
import type { LaunchContext } from '../src/index.ts';

export default async function main(ctx: LaunchContext) {
  const { args } = ctx;
  const trainSize = intArg(args, 'train-size', 0, 0);
  const full =
    args.dataset === 'mnist'
      ? await loadMnist({ baseUrl: new URL('/datasets/mnist/', ctx.url).href })
      : syntheticDataset({ length: trainSize || 4096, inputSize: 16, numClasses: 4, seed: 0 });
  const data =
    trainSize > 0 && trainSize < full.length
      ? subset(
          full,
          Array.from({ length: trainSize }, (_, i) => i),
        )
      : full;

  const model = buildModel({ kind: 'mlp', inputShape: data.inputShape, numClasses: data.numClasses, seed: 0 });
  const state = new TrainState({ model, optimizer: () => new Adam({ lr: 0.003 }) });
  let finalLoss = NaN;
  const powerSGDRank = intArg(args, 'powersgd', 0, 0);
  const localSGDPeriod = intArg(args, 'local-sgd', 0, 0);
  const dilocoEvery = intArg(args, 'diloco', 0, 0);
  const fragments = intArg(args, 'stream', 0, 0);
  const run = await runElastic({
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    min: ctx.min,
    max: ctx.max,
    timeoutMs: ctx.timeoutMs,
    state,
    datasetLength: data.length,
    batchSize: intArg(args, 'batch-size', 32),
    epochs: intArg(args, 'epochs', 1),
    steps: args.steps === undefined ? null : intArg(args, 'steps', 1),
    commHook:
      powerSGDRank > 0
        ? () => powerSGD({ matrixApproximationRank: powerSGDRank, startIter: 10 })
        : localSGDPeriod > 0
          ? () => postLocalSGD({ startStep: 10 })
          : undefined,
    modelAverager: localSGDPeriod > 0 ? { period: localSGDPeriod, warmupSteps: 10 } : undefined,
    diloco: dilocoEvery > 0 ? { syncEvery: dilocoEvery, fragments: Math.max(1, fragments), overlap: fragments > 0 ? 1 : 0 } : undefined,
    voteEvery: dilocoEvery > 0 ? dilocoEvery : 1,
    async step({ indices, ddp, optimizer, pg }) {
      const { x, y } = data.batch(indices);
      const xs = tf.tensor(x, [y.length, ...data.inputShape]);
      const ys = tf.tensor1d(y, 'int32');
      // --slow RANK:FACTOR names the rank of the current round: a tab's rank can change when the group does.
      const straggler = new runtime.Straggler(runtime.slowFactor(ctx.slow, pg.rank));
      const { loss } = await ddp.backward(() => classificationLoss(model.apply(xs, { training: true }) as tf.Tensor, ys, data.numClasses), {
        straggler,
      });
      await ddp.step(optimizer);
      tf.dispose([xs, ys]);
      return { loss };
    },
    onStep({ step, metrics, pg }) {
      finalLoss = metrics.reduce((s, m) => s + m.loss, 0) / metrics.length; // every rank's, from the step's vote
      if (step % 10 === 0) ctx.log(`step ${step} on ${pg.worldSize} ranks: loss ${finalLoss.toFixed(4)}`);
    },
  });
  await run.close(); // after every rank is done
  return { finalLoss, bytesPerStep: run.ddp.bytesPerStep };
}
