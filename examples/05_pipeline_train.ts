/**
 * Model parallelism: the model's layers split into stages over the ranks (a pipeline), micro-
 * batches flowing through it under GPipe or 1F1B, optionally several replicas of the pipeline
 * with each stage's gradients averaged over its replicas (DDP x pipeline). As with
 * torch.distributed.pipelining: each rank builds and holds only its stage; the last stage
 * computes the loss; each stage steps its own optimizer. A lost rank stops every rank, naming
 * its stage, and the run resumes from every stage's checkpoint once the group is complete again.
 *
 *   npm run launch -- --nproc 4 examples/05_pipeline_train.ts --stages 2 --micro-batches 4 \
 *     --dataset synthetic --batch-size 32 --epochs 1   (or --steps N)
 */
import type * as tf from '@tensorflow/tfjs';
import { classificationLoss, intArg, loadMnist, nn, pipeline, runPipeline, runtime, syntheticDataset, SGD } from '../src/index.ts';
import type { LaunchContext } from '../src/index.ts';

export default async function main(ctx: LaunchContext) {
  const { args } = ctx;
  const data =
    args.dataset === 'mnist'
      ? await loadMnist({ baseUrl: new URL('/datasets/mnist/', ctx.url).href })
      : syntheticDataset({ length: 2048, inputSize: 16, numClasses: 4, seed: 0 });
  const stages = intArg(args, 'stages', 2);
  if (ctx.nproc % stages !== 0)
    throw new Error(`--nproc ${ctx.nproc} is not a multiple of --stages ${stages}: the world is stages x replicas`);
  const microBatches = intArg(args, 'micro-batches', 4);
  const schedule = args.schedule === '1f1b' ? '1f1b' : 'gpipe';
  const loss = (out: tf.Tensor, labels: tf.Tensor) => classificationLoss(out, labels, data.numClasses);

  let finalLoss = NaN;
  let bubble = 0;
  let timed = 0;
  const run = await runPipeline({
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    timeoutMs: ctx.timeoutMs,
    stages,
    replicas: ctx.nproc / stages,
    // The whole model as a list of layers; this rank builds only its stage's.
    layers: nn.modelLayers({
      kind: args.dataset === 'mnist' ? 'cnn' : 'mlp',
      inputShape: data.inputShape,
      numClasses: data.numClasses,
      seed: 0,
    }),
    inputShape: data.inputShape,
    optimizer: () => new SGD({ lr: 0.05 }),
    datasetLength: data.length,
    batchSize: intArg(args, 'batch-size', 32), // per replica
    epochs: intArg(args, 'epochs', 1),
    steps: args.steps === undefined ? null : intArg(args, 'steps', 1),
    checkpointEvery: intArg(args, 'checkpoint-every', 0, 0),
    async step({ indices, stage, ddp, optimizer, mesh }) {
      const { x, y } = data.batch(indices);
      const r = await stage.step({
        ddp,
        batchSize: indices.length,
        microBatches,
        schedule,
        straggler: new runtime.Straggler(runtime.slowFactor(ctx.slow, mesh.world.rank)), // --slow RANK:FACTOR: this stage's passes that much slower
        ...(stage.isFirst ? { inputs: x } : {}), // the first stage reads the data
        ...(stage.isLast ? { labels: Int32Array.from(y), loss } : {}), // the last computes the loss
      });
      await ddp.step(optimizer); // each stage steps its own optimizer, with gradients averaged over its replicas
      return { loss: r.loss, bubble: r.bubble, stage: stage.stage };
    },
    onStep({ step, metrics, mesh }) {
      const last = metrics.filter((m) => m.stage === mesh.stages - 1);
      finalLoss = last.reduce((s, m) => s + m.loss, 0) / last.length;
      if (step > 1) {
        bubble += metrics[mesh.world.rank]!.bubble;
        timed++;
      }
      if (step % 10 === 0) ctx.log(`step ${step}: loss ${finalLoss.toFixed(4)}`);
    },
  });
  const { stage, mesh } = run;
  ctx.log(
    `stage ${stage.stage} of ${stage.numStages} (replica ${mesh.replica}): layers ${stage.layers.map((l) => `${l.index} ${l.className}`).join(', ')}, ${stage.parameterCount} parameters`,
  );
  const weightHash = await run.ddp.weightsHash();
  await run.close();
  return {
    finalLoss,
    stage: stage.stage,
    parameters: stage.parameterCount,
    bubble: { measured: timed > 0 ? bubble / timed : null, formula: pipeline.bubbleFraction(stages, microBatches) },
    weightHash,
  };
}
