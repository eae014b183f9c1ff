/**
 * Splitting a model into pipeline stages (torch.distributed.pipelining's split points): a stage
 * is a contiguous run of layers. Split points are given, or chosen so that the stage with the
 * most parameters has as few as possible. Finding each layer's shape and parameter count builds
 * one layer at a time and frees it at once, so no rank ever holds the whole model.
 */
import type * as tf from '@tensorflow/tfjs';
import type { LayerFactory } from '../../nn/models.ts';

export interface LayerInfo {
  /** The layer's place in the model. */
  index: number;
  /** Its class (Dense, Conv2D, ...). */
  className: string;
  parameters: number;
  /** Input and output shapes without the batch dimension. */
  inputShape: number[];
  outputShape: number[];
}

/** Each layer's class, parameter count and shapes, building (and freeing) one layer at a time. */
export function describeLayers(layers: LayerFactory[], inputShape: number[]): LayerInfo[] {
  let shape = inputShape;
  return layers.map((make, index) => {
    const layer = make(shape);
    const batchShape = [null, ...shape];
    const out = layer.computeOutputShape(batchShape) as Array<number | null>;
    layer.build(batchShape);
    const parameters = layer.countParams();
    for (const w of layer.weights) w.dispose();
    const info: LayerInfo = {
      index,
      className: layer.getClassName(),
      parameters,
      inputShape: shape,
      outputShape: out.slice(1).map((d) => d ?? 0),
    };
    shape = info.outputShape;
    return info;
  });
}

/**
 * Where stages 1 .. S-1 start (layer indices, increasing), so that the largest stage's parameter
 * count is as small as it can be; ties go to the split with earlier points. Every stage gets at
 * least one layer.
 */
export function balancedSplitPoints(parameters: number[], stages: number): number[] {
  const n = parameters.length;
  if (!Number.isSafeInteger(stages) || stages < 1) throw new RangeError(`stages must be a positive integer, got ${stages}`);
  if (stages > n) throw new RangeError(`a model of ${n} layers cannot be split into ${stages} stages: each stage needs at least one layer`);
  const prefix = [0];
  for (const p of parameters) prefix.push(prefix.at(-1)! + p);
  const sum = (a: number, b: number) => prefix[b]! - prefix[a]!;
  // best[k][i]: the smallest possible largest stage when the first i layers form k stages.
  const best: number[][] = Array.from({ length: stages + 1 }, () => new Array<number>(n + 1).fill(Infinity));
  const cut: number[][] = Array.from({ length: stages + 1 }, () => new Array<number>(n + 1).fill(0));
  best[0]![0] = 0;
  for (let k = 1; k <= stages; k++) {
    for (let i = k; i <= n; i++) {
      for (let j = k - 1; j < i; j++) {
        const v = Math.max(best[k - 1]![j]!, sum(j, i));
        if (v < best[k]![i]!) {
          best[k]![i] = v;
          cut[k]![i] = j;
        }
      }
    }
  }
  const points: number[] = [];
  for (let k = stages, i = n; k > 1; k--) {
    i = cut[k]![i]!;
    points.unshift(i);
  }
  return points;
}

/** Checks explicit split points against a model of `numLayers` layers; throws RangeError saying what is wrong. */
export function checkSplitPoints(points: number[], numLayers: number, stages: number): void {
  if (points.length !== stages - 1)
    throw new RangeError(`${stages} stages need ${stages - 1} split point(s), got ${points.length} ([${points.join(', ')}])`);
  let prev = 0;
  for (const p of points) {
    if (!Number.isSafeInteger(p) || p <= prev || p >= numLayers) {
      throw new RangeError(
        `split points must be increasing layer indices in 1..${numLayers - 1} (every stage at least one layer), got [${points.join(', ')}]`,
      );
    }
    prev = p;
  }
}

/** The layer ranges [start, end) of each stage, from split points. */
export function stageRanges(points: number[], numLayers: number): Array<{ start: number; end: number }> {
  const starts = [0, ...points];
  return starts.map((start, s) => ({ start, end: starts[s + 1] ?? numLayers }));
}

/** The parameter count of a list of layers' weights (for a stage's model). */
export function countTrainable(model: tf.LayersModel): number {
  return model.trainableWeights.reduce((n, w) => n + w.shape.reduce<number>((a, b) => a * (b ?? 1), 1), 0);
}
