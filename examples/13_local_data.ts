/**
 * Data that never leaves its tab: each rank trains on its own samples (a `LocalDataset`), the
 * group trains one model on their union, exactly as one rank would on the union's batches.
 *
 *   npm run launch -- --nproc 3 examples/13_local_data.ts --classes 6 --per-class 120 --epochs 3
 *
 * Each tab makes its own data, as a class whose pupils each photograph their own objects would:
 * here tab t takes the t-th contiguous slice of the synthetic task's classes (3 tabs, 6 classes:
 * 0-1, 2-3, 4-5), keeping a fifth of them as its own held-out set. Each step's global batch is
 * split between the tabs by their samples left in the epoch and each gradient weighed by its
 * share; what travels is gradients, votes and each tab's sample counts, never a sample. At each
 * epoch's end every tab evaluates on its own held-out samples and the group's accuracy is the
 * sample-weighted mean. The summary has `groupAccuracy`, this tab's `ownAccuracy` and classes,
 * `finalLoss` and `weightHash` (the same on every rank).
 */
import * as tf from '@tensorflow/tfjs';
import { Adam, StoreClient, TrainState, buildModel, classificationLoss, data, intArg, runElastic, syntheticDataset } from '../src/index.ts';
import type { LaunchContext } from '../src/index.ts';

export default async function main(ctx: LaunchContext) {
  const { args } = ctx;
  const classes = intArg(args, 'classes', 6, 2);
  const perClass = intArg(args, 'per-class', 120);
  // This tab's number in arrival order (the rank is the group's to give, and may change).
  const store = await StoreClient.connect(ctx.url, { session: ctx.session, token: ctx.token });
  const tab = ((await store.add('example-13-tabs', 1)) - 1) % ctx.nproc;
  store.close();
  const mine = Array.from({ length: classes }, (_, c) => c).filter((c) => Math.floor((c * ctx.nproc) / classes) === tab);
  const local = ownSamples(classes, perClass, mine);
  ctx.log(
    `tab ${tab}: classes [${mine.join(', ')}], ${local.length} samples (per class ${local.countsPerClass().join(', ')}), ${local.heldOut?.length ?? 0} held out`,
  );

  const model = buildModel({ kind: 'mlp', inputShape: local.inputShape, numClasses: classes, seed: 0 });
  const state = new TrainState({ model, optimizer: () => new Adam({ lr: 0.003 }) });
  let finalLoss = Number.NaN;
  const run = await runElastic({
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    min: ctx.min,
    max: ctx.max,
    timeoutMs: ctx.timeoutMs,
    state,
    localData: local,
    datasetLength: local.length,
    batchSize: intArg(args, 'batch-size', 16),
    epochs: intArg(args, 'epochs', 3),
    async step({ indices, ddp, optimizer }) {
      // A tab whose samples are done this epoch trains none: backward then adds zeros.
      const { x, y } = local.batch(indices);
      const xs = tf.tensor(x, [y.length, ...local.inputShape]);
      const ys = tf.tensor1d(y, 'int32');
      const { loss } = await ddp.backward(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, classes));
      await ddp.step(optimizer);
      tf.dispose([xs, ys]);
      return { loss, samples: y.length };
    },
    onStep({ metrics }) {
      // The step's loss over the union: each rank's mean weighed by its samples.
      const n = metrics.reduce((s, m) => s + (m.samples ?? 0), 0);
      finalLoss = metrics.reduce((s, m) => s + (m.loss ?? 0) * (m.samples ?? 0), 0) / n;
    },
    onLocalData(e) {
      if (e.type === 'local-counts')
        ctx.log(
          `epoch ${e.epoch}: samples left per rank [${e.remaining.join(', ')}]${e.left ? `, ${e.left} left with tabs that went` : ''}`,
        );
      if (e.type === 'local-evaluation')
        ctx.log(
          `epoch ${e.epoch}: own held-out accuracy ${pct(e.own.accuracy)}, group ${pct(e.group.accuracy)} (${e.group.count} samples on ${e.ranks.length} tabs)`,
        );
    },
  });
  await run.close();
  const evaluation = run.localEvaluation;
  return {
    finalLoss,
    groupAccuracy: evaluation?.group.accuracy ?? null,
    ownAccuracy: evaluation?.own.accuracy ?? null,
    classes: mine,
    samples: local.length,
    weightHash: run.weightHash,
  };
}

/** This tab's own samples: `perClass` of each of its classes from the synthetic task, a fifth held out. */
function ownSamples(classes: number, perClass: number, mine: number[]): InstanceType<typeof data.LocalDataset> {
  const task = syntheticDataset({ length: classes * perClass * 2, inputSize: 16, numClasses: classes, seed: 0 });
  const picked = Array.from({ length: task.length }, (_, i) => i).filter((i) => mine.includes(task.labels[i]!));
  const keep = picked.slice(0, mine.length * perClass);
  const cut = Math.floor(keep.length * 0.8);
  const train = task.batch(keep.slice(0, cut));
  const held = task.batch(keep.slice(cut));
  return new data.LocalDataset({
    name: `tab samples`,
    inputs: train.x,
    labels: train.y,
    inputShape: [16],
    numClasses: classes,
    heldOut: { inputs: held.x, labels: held.y },
  });
}

const pct = (a: number | null) => (a === null ? 'n/a' : `${(100 * a).toFixed(1)}%`);
