/**
 * The single-tab side of `npm run bench:rpc-ps-accuracy` (bench/rpc_ps_accuracy.ts): the model of
 * the parameter-server port (examples/09: the mlp, seed 0, SGD lr 0.05 with the host optimizer,
 * the classification loss) trained in one tab on the very batches its trainers take, in turn
 * (trainer 1's step s, trainer 2's step s, ...), then measured on MNIST's test split.
 */
import * as tf from '@tensorflow/tfjs';
import { buildModel, classificationLoss, intArg, loadMnistSplits, SGD, type LaunchContext } from '../src/index.ts';

export default async function main(ctx: LaunchContext) {
  const { train, test } = await loadMnistSplits({ baseUrl: new URL('/datasets/mnist/', ctx.url).href });
  const steps = intArg(ctx.args, 'steps', 40);
  const trainers = intArg(ctx.args, 'trainers', 2);
  const batchSize = intArg(ctx.args, 'batch-size', 32);
  const evalSize = Math.min(intArg(ctx.args, 'eval', 10_000), test.length);
  const model = buildModel({ kind: 'mlp', inputShape: train.inputShape, numClasses: train.numClasses, seed: 0 });
  const variables = model.trainableWeights.map((w) => w.read() as tf.Variable);
  const layout = variables.map((v, i, all) => ({
    shape: [...v.shape],
    offset: all.slice(0, i).reduce((n, u) => n + u.size, 0),
    size: v.size,
  }));
  const optimizer = new SGD({ lr: 0.05 });
  let loss = NaN;
  for (let s = 0; s < steps; s++) {
    for (let rank = 1; rank <= trainers; rank++) {
      // examples/09's indices of trainer `rank`, its step s.
      const indices = Array.from({ length: batchSize }, (_, i) => ((s * batchSize + i) * trainers + rank - 1) % train.length);
      const { x, y } = train.batch(indices);
      const xs = tf.tensor(x, [batchSize, ...train.inputShape]);
      const ys = tf.tensor1d(y, 'int32');
      const { value, grads } = tf.variableGrads(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, train.numClasses), variables);
      loss = (await value.data())[0]!;
      const params = new Float32Array(layout.reduce((n, l) => n + l.size, 0));
      const flat = new Float32Array(params.length);
      for (const [i, v] of variables.entries()) {
        params.set((await v.data()) as Float32Array, layout[i]!.offset);
        flat.set((await grads[v.name]!.data()) as Float32Array, layout[i]!.offset);
      }
      optimizer.stepFlat(params, flat, layout);
      for (const [i, v] of variables.entries()) {
        const { offset, size, shape } = layout[i]!;
        tf.tidy(() => v.assign(tf.tensor(params.subarray(offset, offset + size), shape)));
      }
      tf.dispose([xs, ys, value, ...Object.values(grads)]);
    }
  }
  let correct = 0;
  for (let start = 0; start < evalSize; start += 1000) {
    const count = Math.min(1000, evalSize - start);
    const { x, y } = test.batch(Array.from({ length: count }, (_, i) => start + i));
    const predicted = await tf.tidy(() => (model.apply(tf.tensor(x, [count, ...test.inputShape])) as tf.Tensor).argMax(1)).data();
    correct += y.filter((label, i) => predicted[i] === label).length;
  }
  ctx.log(`one tab: final loss ${loss.toFixed(4)}, test accuracy ${((100 * correct) / evalSize).toFixed(2)}%`);
  return { finalLoss: loss, accuracy: correct / evalSize, updates: steps * trainers };
}
