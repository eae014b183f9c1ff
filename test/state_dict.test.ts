/**
 * TrainState: a state dict holds the model, the optimizer's moments, the progress and the user's
 * extras; loading it into another replica makes the two train on bit-identically, and loading
 * again and again leaks no tensor. (TF.js cpu backend in Node.)
 */
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { hashFloat32 } from '../src/wire/hash.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { TrainState, type Json } from '../src/checkpoint/state_dict.ts';
import { NonFiniteWeightsError } from '../src/wire/errors.ts';
import { assignFlatWeights, flatTrainableWeights } from '../src/parallel/replicas.ts';
import { errorOf } from './fixtures/errors.ts';

beforeAll(async () => {
  await tf.setBackend('cpu');
});

const data = syntheticDataset({ length: 64, inputSize: 16, numClasses: 4, seed: 2 });

/** An Adam step on samples [from, from + 8), applied to `state`'s model. */
function adamStep(state: TrainState, from: number): void {
  const idx = Array.from({ length: 8 }, (_, i) => from + i);
  const { x, y } = data.batch(idx);
  tf.tidy(() => {
    const xs = tf.tensor(x, [8, 16]);
    const ys = tf.tensor1d(y, 'int32');
    state.optimizer.minimize(() => classificationLoss(state.model.apply(xs) as tf.Tensor, ys, 4));
  });
}

async function weightsHash(model: tf.LayersModel): Promise<string> {
  const flat = tf.tidy(() => tf.concat(model.getWeights().map((w) => w.reshape([-1]))));
  const h = hashFloat32((await flat.data()) as Float32Array);
  flat.dispose();
  return h;
}

/** A schedule the user keeps: the kind of extra state a state dict carries. */
class Schedule {
  warmup = 3;
  stateDict(): Json {
    return { warmup: this.warmup };
  }
  loadStateDict(s: Json): void {
    this.warmup = (s as { warmup: number }).warmup;
  }
}

describe('TrainState', () => {
  it('a replica that loads the state dict trains on bit-identically to the one it came from', async () => {
    const make = (seed: number, extras = new Schedule()) =>
      new TrainState({
        model: buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed }),
        optimizer: () => tf.train.adam(0.01),
        extras,
      });
    const sourceExtras = new Schedule();
    const source = make(1, sourceExtras);
    for (let s = 0; s < 3; s++) adamStep(source, s * 8);
    source.progress = { step: 3, epoch: 0, position: 24 };
    const extras = new Schedule();
    const replica = make(2, extras); // other initial weights, a fresh optimizer
    const sd = await source.stateDict();
    expect(sd.progress).toEqual({ step: 3, epoch: 0, position: 24 });
    expect(sd.optimizer.weightSpecs.length).toBeGreaterThan(0); // Adam's iterations and moments
    sourceExtras.warmup = 7;
    await replica.loadStateDict(await source.stateDict());
    expect(replica.progress).toEqual({ step: 3, epoch: 0, position: 24 });
    expect(extras.warmup).toBe(7);
    expect(await weightsHash(replica.model)).toBe(await weightsHash(source.model));
    // The source restores the same bytes too (a restored Adam recomputes its powers): then both
    // take the same steps and stay identical.
    await source.loadStateDict(await source.stateDict());
    for (let s = 3; s < 6; s++) {
      adamStep(source, s * 8);
      adamStep(replica, s * 8);
    }
    expect(await weightsHash(replica.model)).toBe(await weightsHash(source.model));
  });

  it('refuses weights with a NaN or an infinity, and progress no run can be at, leaving the model as it was', async () => {
    const state = new TrainState({
      model: buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 1 }),
      optimizer: () => tf.train.adam(0.01),
    });
    const before = await weightsHash(state.model);
    const sd = await state.stateDict();
    const poisoned = { ...sd, model: { ...sd.model, weightData: sd.model.weightData.slice(0) } };
    new Float32Array(poisoned.model.weightData)[5] = Number.NaN;
    await expect(state.loadStateDict(poisoned)).rejects.toThrow(NonFiniteWeightsError);
    await expect(state.loadStateDict(poisoned)).rejects.toThrow(
      errorOf(NonFiniteWeightsError, /the loaded training state: parameter 0 \(.*kernel.*\) holds a NaN or an infinity/),
    );
    for (const progress of [
      { step: -1, epoch: 0, position: 0 },
      { step: 1, epoch: 2 ** 40, position: 0 },
      { step: 1, epoch: 0, position: 0.5 },
    ]) {
      await expect(state.loadStateDict({ ...sd, progress })).rejects.toThrow(errorOf(RangeError, /progress\.(step|epoch|position)/));
    }
    const flat = await flatTrainableWeights(state.model);
    flat[flat.length - 1] = Number.POSITIVE_INFINITY;
    expect(() => assignFlatWeights(state.model, flat, 'the model averaging')).toThrow(
      errorOf(NonFiniteWeightsError, /^the model averaging: parameter \d+ \(.*\) holds a NaN or an infinity/),
    );
    expect(await weightsHash(state.model)).toBe(before);
    state.dispose();
  });

  it('loading a state again and again leaks no tensor', async () => {
    const state = new TrainState({
      model: buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 3 }),
      optimizer: () => tf.train.adam(0.01),
    });
    adamStep(state, 0);
    const sd = await state.stateDict();
    await state.loadStateDict(sd);
    const before = tf.memory().numTensors;
    for (let i = 0; i < 5; i++) await state.loadStateDict(sd);
    expect(tf.memory().numTensors).toBe(before);
  });

  it('taking the state dict again and again leaks no tensor (a checkpoint, a recovery source)', async () => {
    const state = new TrainState({
      model: buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 3 }),
      optimizer: () => tf.train.adam(0.01),
    });
    adamStep(state, 0);
    const before = tf.memory().numTensors;
    for (let i = 0; i < 5; i++) await state.stateDict();
    expect(tf.memory().numTensors).toBe(before);
    adamStep(state, 8); // the optimizer's own variables are still there
  });
});
