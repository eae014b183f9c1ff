/**
 * A loaded model's layers as factories (`layerFactoriesOf`, how a pipeline stage builds its share
 * of a user's own model): rebuilt whole or cut into stages, they compute what the loaded model
 * computes, with its weights, and building them leaks no tensor. (TF.js cpu backend in Node.)
 */
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { layerFactoriesOf, sequentialOf } from '../src/nn/models.ts';
import { describeLayers } from '../src/parallel/pipeline/split.ts';
import { userImageModel } from './fixtures/user_files.ts';

beforeAll(async () => {
  await tf.setBackend('cpu');
});

describe('layerFactoriesOf', () => {
  it("rebuilds a user's model whole and as two stages, with its weights", async () => {
    const loaded = userImageModel(3);
    const x = tf.randomUniform([2, 12, 12, 3], 0, 1, 'float32', 3);
    const want = (await (loaded.predict(x) as tf.Tensor).data()) as Float32Array;
    const layers = layerFactoriesOf(loaded);
    expect(layers).toHaveLength(4);
    const before = tf.memory().numTensors;
    const infos = describeLayers(layers, [12, 12, 3]);
    expect(tf.memory().numTensors).toBe(before);
    expect(infos.map((i) => i.className)).toEqual(['Conv2D', 'MaxPooling2D', 'Flatten', 'Dense']);

    const whole = sequentialOf(layers, [12, 12, 3], 'whole');
    expect(Array.from((await (whole.predict(x) as tf.Tensor).data()) as Float32Array)).toEqual(Array.from(want));
    const first = sequentialOf(layers.slice(0, 2), [12, 12, 3], 'stage0');
    const second = sequentialOf(layers.slice(2), infos[1]!.outputShape, 'stage1');
    const y = second.predict(first.predict(x) as tf.Tensor) as tf.Tensor;
    expect(Array.from((await y.data()) as Float32Array)).toEqual(Array.from(want));
    for (const m of [whole, first, second, loaded]) m.dispose();
  });
});
