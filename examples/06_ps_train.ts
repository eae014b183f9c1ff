/**
 * Parameter-server training (TensorFlow's ParameterServerStrategy): K ranks hold the model's
 * variables, sharded; the other ranks are workers that pull the parameters, compute the
 * gradients of their batch and push them, and nobody waits for anybody: a slow worker only
 * pushes less often, a worker that leaves costs only its batch. `--strategy central` is
 * CentralStorageStrategy instead: one server, and every step waits for every worker.
 *
 *   npm run launch -- --nproc 4 examples/06_ps_train.ts --ps 1 --dataset synthetic \
 *     --batch-size 32 --epochs 2 [--max-staleness 8] [--strategy central] [--slow 3:4]
 */
import * as tf from '@tensorflow/tfjs';
import {
  buildModel,
  classificationLoss,
  intArg,
  loadMnist,
  parameterServer,
  runParameterServer,
  runtime,
  syntheticDataset,
} from '../src/index.ts';
import type { LaunchContext } from '../src/index.ts';

export default async function main(ctx: LaunchContext) {
  const { args } = ctx;
  const data =
    args.dataset === 'mnist'
      ? await loadMnist({ baseUrl: new URL('/datasets/mnist/', ctx.url).href })
      : syntheticDataset({ length: 2048, inputSize: 16, numClasses: 4, seed: 0 });
  const strategy = args.strategy === 'central' ? 'central' : 'async';
  const numServers = strategy === 'central' ? 1 : intArg(args, 'ps', 1);
  // Every rank builds the whole model alike (one seed): servers take their shard of it, workers compute on it.
  const model = buildModel({
    kind: args.dataset === 'mnist' ? 'cnn' : 'mlp',
    inputShape: data.inputShape,
    numClasses: data.numClasses,
    seed: 0,
  });
  let straggler = new runtime.Straggler(1);
  let finalLoss = NaN;

  const run = await runParameterServer({
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    timeoutMs: ctx.timeoutMs,
    strategy,
    numServers,
    max: ctx.nproc,
    model,
    optimizer: () => tf.train.sgd(0.05),
    datasetLength: data.length,
    batchSize: intArg(args, 'batch-size', 32), // per worker
    epochs: intArg(args, 'epochs', 1), // virtual epochs: the dataset's size in samples, over all workers
    steps: args.steps === undefined ? null : intArg(args, 'steps', 1),
    ...(args['max-staleness'] === undefined ? {} : { maxStaleness: intArg(args, 'max-staleness', 0, 0) }),
    checkpointEvery: intArg(args, 'checkpoint-every', 50, 0), // each server saves its shard this often
    async step({ indices, model: m, pg }) {
      const t0 = performance.now();
      const { x, y } = data.batch(indices);
      const xs = tf.tensor(x, [indices.length, ...data.inputShape]);
      const ys = tf.tensor1d(y, 'int32');
      try {
        const { loss, grads } = await parameterServer.flatGradients(m, () =>
          classificationLoss(m.apply(xs) as tf.Tensor, ys, data.numClasses),
        );
        // --slow RANK:FACTOR: this worker that much slower, in proportion to its own compute.
        const factor = runtime.slowFactor(ctx.slow, pg.rank);
        if (straggler.factor !== factor) straggler = new runtime.Straggler(factor);
        await straggler.after(performance.now() - t0);
        finalLoss = loss;
        return { grads, metrics: { loss } };
      } finally {
        tf.dispose([xs, ys]);
      }
    },
    onWorkerStep({ stepId, metrics, staleness }) {
      if (stepId % 20 === 0) ctx.log(`push ${stepId}: loss ${metrics?.loss?.toFixed(4)}, staleness ${staleness ?? '-'}`);
    },
  });
  const role =
    run.role === 'server'
      ? `server ${run.index} (version ${run.versions[run.index]})`
      : `worker ${run.index} (${run.worker!.pushes} pushes)`;
  ctx.log(`${role}; samples applied ${run.samples.applied}, stale ${run.samples.stale}, lost ${run.samples.lost} of ${run.samples.target}`);
  const result = {
    role: run.role,
    index: run.index,
    versions: run.versions,
    samples: run.samples,
    finalLoss: run.role === 'worker' ? finalLoss : null,
    ...(run.shard ? { updatesPerSec: run.shard.updatesPerSec, stalenessHistogram: run.shard.stalenessHistogram } : {}),
  };
  await run.close();
  return result;
}
