/**
 * The pipeline's pure parts: schedules (GPipe, 1F1B), micro-batch sizes, the bubble formula,
 * balanced split points, and float16 packing. The training itself is tested in
 * test/pipeline.test.ts (Node) and test/e2e/pipeline.spec.ts (real pages).
 */
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  bubbleFraction,
  microBatchSizes,
  peakStashed,
  scheduleActions,
  type Action,
  type ScheduleKind,
} from '../src/parallel/pipeline/schedule.ts';
import { balancedSplitPoints, checkSplitPoints, describeLayers, stageRanges } from '../src/parallel/pipeline/split.ts';
import { packHalf, unpackHalf } from '../src/parallel/pipeline/stage.ts';
import { buildModel, modelLayers } from '../src/nn/models.ts';
import { errorOf } from './fixtures/errors.ts';

beforeAll(async () => {
  await tf.setBackend('cpu');
});

const show = (actions: Action[]) => actions.map((a) => `${a.phase}${a.microBatch}`).join(' ');

/**
 * Runs every stage's actions with blocking receives and buffered sends (as send/recv behave over
 * the links) and returns the order passes completed in, or throws on a deadlock.
 */
function simulate(kind: ScheduleKind, stages: number, m: number): string[] {
  const queues = Array.from({ length: stages }, (_, s) => scheduleActions(kind, s, stages, m));
  const fwdDone = Array.from({ length: stages }, () => new Set<number>());
  const bwdDone = Array.from({ length: stages }, () => new Set<number>());
  const order: string[] = [];
  for (let progress = true; progress; ) {
    progress = false;
    for (let s = 0; s < stages; s++) {
      const a = queues[s]![0];
      if (!a) continue;
      // A forward needs the activation from the stage before; a backward, the gradient from the stage after.
      const ready = a.phase === 'F' ? s === 0 || fwdDone[s - 1]!.has(a.microBatch) : s === stages - 1 || bwdDone[s + 1]!.has(a.microBatch);
      if (!ready) continue;
      if (a.phase === 'B' && !fwdDone[s]!.has(a.microBatch)) throw new Error(`stage ${s} runs B${a.microBatch} before its forward`);
      (a.phase === 'F' ? fwdDone : bwdDone)[s]!.add(a.microBatch);
      order.push(`${s}:${a.phase}${a.microBatch}`);
      queues[s]!.shift();
      progress = true;
    }
  }
  const stuck = queues.map((q, s) => (q.length ? `stage ${s} at ${q[0]!.phase}${q[0]!.microBatch}` : '')).filter(Boolean);
  if (stuck.length) throw new Error(`deadlock: ${stuck.join(', ')}`);
  return order;
}

describe('schedules', () => {
  it('GPipe runs every forward, then every backward in micro-batch order', () => {
    expect(show(scheduleActions('gpipe', 0, 2, 4))).toBe('F0 F1 F2 F3 B0 B1 B2 B3');
    expect(show(scheduleActions('gpipe', 1, 2, 4))).toBe('F0 F1 F2 F3 B0 B1 B2 B3');
  });

  it('1F1B warms up with S-1-s forwards, alternates, then drains; backwards stay in order', () => {
    expect(show(scheduleActions('1f1b', 0, 2, 4))).toBe('F0 F1 B0 F2 B1 F3 B2 B3');
    expect(show(scheduleActions('1f1b', 1, 2, 4))).toBe('F0 B0 F1 B1 F2 B2 F3 B3');
    expect(show(scheduleActions('1f1b', 0, 4, 2))).toBe('F0 F1 B0 B1');
  });

  it('both schedules finish without deadlock for many shapes, each pass once', () => {
    for (const kind of ['gpipe', '1f1b'] as const) {
      for (const stages of [1, 2, 3, 4, 6]) {
        for (const m of [1, 2, 3, 4, 8]) {
          const order = simulate(kind, stages, m);
          expect(order.length).toBe(2 * stages * m);
          for (let s = 0; s < stages; s++) {
            const bs = scheduleActions(kind, s, stages, m)
              .filter((a) => a.phase === 'B')
              .map((a) => a.microBatch);
            expect(bs).toEqual(Array.from({ length: m }, (_, i) => i));
          }
        }
      }
    }
  });

  it('1F1B keeps at most S - s micro-batches on stage s; GPipe keeps all M', () => {
    for (let s = 0; s < 4; s++) {
      expect(peakStashed(scheduleActions('1f1b', s, 4, 8))).toBe(4 - s);
      expect(peakStashed(scheduleActions('gpipe', s, 4, 8))).toBe(8);
    }
  });

  it('refuses bad shapes with what was wrong', () => {
    expect(() => scheduleActions('gpipe', 2, 2, 4)).toThrow(errorOf(RangeError, /stage must be in 0..1, got 2/));
    expect(() => scheduleActions('gpipe', 0, 2, 0)).toThrow(errorOf(RangeError, /microBatches must be a positive integer, got 0/));
    expect(() => scheduleActions('zigzag' as ScheduleKind, 0, 2, 2)).toThrow(errorOf(RangeError, /unknown schedule "zigzag"/));
  });
});

describe('micro-batches and the bubble', () => {
  it('cuts a batch as torch.tensor_split does, and a short batch one sample each', () => {
    expect(microBatchSizes(32, 4)).toEqual([8, 8, 8, 8]);
    expect(microBatchSizes(10, 4)).toEqual([3, 3, 2, 2]);
    expect(microBatchSizes(3, 4)).toEqual([1, 1, 1]);
    expect(() => microBatchSizes(0, 4)).toThrow(errorOf(RangeError, /batch size must be a positive integer/));
  });

  it('is (S-1)/(M+S-1)', () => {
    expect(bubbleFraction(2, 4)).toBeCloseTo(1 / 5);
    expect(bubbleFraction(4, 8)).toBeCloseTo(3 / 11);
    expect(bubbleFraction(1, 4)).toBe(0);
  });
});

describe('splitting a model', () => {
  it('balances parameter counts over contiguous stages, each at least one layer', () => {
    expect(balancedSplitPoints([10, 10, 10, 10], 2)).toEqual([2]);
    expect(balancedSplitPoints([100, 1, 1, 1], 2)).toEqual([1]);
    expect(balancedSplitPoints([0, 100480, 1290], 2)).toEqual([2]);
    expect(balancedSplitPoints([5, 5, 5], 3)).toEqual([1, 2]);
    expect(() => balancedSplitPoints([1, 2], 3)).toThrow(errorOf(RangeError, /cannot be split into 3 stages/));
  });

  it('checks explicit split points', () => {
    expect(() => checkSplitPoints([2, 1], 4, 3)).toThrow(errorOf(RangeError, /increasing layer indices in 1..3/));
    expect(() => checkSplitPoints([0], 4, 2)).toThrow(errorOf(RangeError, /increasing/));
    expect(() => checkSplitPoints([1, 2], 4, 2)).toThrow(errorOf(RangeError, /2 stages need 1 split point/));
    expect(stageRanges([1, 3], 5)).toEqual([
      { start: 0, end: 1 },
      { start: 1, end: 3 },
      { start: 3, end: 5 },
    ]);
  });

  it("describes layers one at a time, with the whole model's parameter counts, and frees them", () => {
    const spec = { kind: 'cnn' as const, inputShape: [28, 28, 1], numClasses: 10, seed: 3 };
    const before = tf.memory().numTensors;
    const infos = describeLayers(modelLayers(spec), spec.inputShape);
    expect(tf.memory().numTensors).toBe(before);
    const model = buildModel(spec);
    expect(infos.map((l) => l.parameters)).toEqual(model.layers.map((l) => l.countParams()));
    expect(infos.at(-1)!.outputShape).toEqual([10]);
    model.dispose();
  });

  it('the cnn with a hidden layer (the usual MNIST CNN) keeps the default cnn’s other weights', async () => {
    const spec = { kind: 'cnn' as const, inputShape: [28, 28, 1], numClasses: 10, seed: 3 };
    const plain = buildModel(spec);
    const wide = buildModel({ ...spec, hidden: 128 });
    expect(plain.countParams()).toBe(5258);
    expect(wide.countParams()).toBe(53_866);
    expect(wide.layers.map((l) => l.getClassName())).toEqual([
      'Conv2D',
      'MaxPooling2D',
      'Conv2D',
      'MaxPooling2D',
      'Flatten',
      'Dense',
      'Dense',
    ]);
    // The convolutions start from the same weights with or without the hidden layer.
    const conv = (m: tf.LayersModel) => m.layers[0]!.getWeights()[0]!.data();
    expect(Array.from(await conv(wide))).toEqual(Array.from(await conv(plain)));
    expect(() => buildModel({ ...spec, hidden: -1 })).toThrow(/cnn's hidden layer must be a width >= 0/);
    expect(() => buildModel({ ...spec, kind: 'mlp', inputShape: [16], hidden: 0 })).toThrow(/mlp's hidden layer must be a width >= 1/);
    plain.dispose();
    wide.dispose();
  });
});

describe('float16 on the wire', () => {
  it('round-trips values within half precision, and exactly for halves', () => {
    const values = Float32Array.from([0, -0, 1, -2.5, 65504, 1e-8, Math.PI, -1234.5678, 6.1e-5, Infinity, -Infinity]);
    const back = unpackHalf(packHalf(values), values.length);
    for (let i = 0; i < values.length; i++) {
      const v = values[i]!;
      if (!Number.isFinite(v)) expect(back[i]).toBe(v);
      else expect(Math.abs(back[i]! - v)).toBeLessThanOrEqual(Math.max(Math.abs(v) * 2 ** -11, 2 ** -24));
    }
    expect(back[3]).toBe(-2.5);
    expect(Number.isNaN(unpackHalf(packHalf(Float32Array.of(NaN)), 1)[0])).toBe(true);
    expect(unpackHalf(packHalf(Float32Array.of(1e6)), 1)[0]).toBe(Infinity);
    // Odd lengths pack into ceil(n/2) float32 slots.
    expect(packHalf(new Float32Array(5)).length).toBe(3);
  });
});
