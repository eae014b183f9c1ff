/**
 * Checking that data-parallel replicas still hold the same weights. DDP keeps them bit-identical
 * (same averaged gradients, same update), so a difference means a rank went wrong: a bug, a bad
 * device, or a member that trains on something else. Each rank hashes its weights; one small
 * all-gather compares them.
 */
import * as tf from '@tensorflow/tfjs';
import { NonFiniteWeightsError } from '../wire/errors.ts';
import { allFinite } from '../wire/finite.ts';
import { ReplicaDivergenceError } from '../wire/errors.ts';
import { hashFloat32 } from '../wire/hash.ts';
import type { ProcessGroup } from '../c10d/process_group.ts';

/** All trainable weights of `model`, flattened in `model.trainableWeights` order (one readback). */
export async function flatTrainableWeights(model: tf.LayersModel): Promise<Float32Array> {
  const flat = tf.tidy(() => tf.concat(model.trainableWeights.map((w) => w.read().reshape([-1]))));
  // data(), not dataSync(): dataSync can return stale data on TF.js's WebGPU backend.
  const data = (await flat.data()) as Float32Array;
  flat.dispose();
  return data;
}

function sizeOf(shape: readonly (number | null)[]): number {
  return shape.reduce<number>((a, b) => a * (b ?? 1), 1);
}

/**
 * The float32 master copy of each model's trainable weights on the host, as last written by
 * `assignFlatWeights` (DDP's host optimizers update it, then upload it): valid while every
 * trainable variable still holds the tensor written from it. TF.js gives a variable a new dataId
 * on every assign, so a write by anything else (setWeights, a loaded state) shows, and the copy is
 * read back from the device instead.
 */
const masters = new WeakMap<tf.LayersModel, { values: Float32Array; ids: readonly object[] }>();

/** `model`'s host master copy (see `masters`), or null when the device's weights were written since. */
export function hostWeights(model: tf.LayersModel): Float32Array | null {
  const m = masters.get(model);
  if (!m) return null;
  const weights = model.trainableWeights;
  if (weights.length !== m.ids.length || weights.some((w, i) => w.read().dataId !== m.ids[i])) return null;
  return m.values;
}

/**
 * Sets `model`'s trainable weights from one flat buffer in `model.trainableWeights` order, and keeps
 * it as their host master copy. Refuses (NonFiniteWeightsError, nothing set) a buffer with a NaN or
 * an infinity: a model is never made non-finite by what a peer sent. `source` names where the
 * values came from, for that error.
 */
export function assignFlatWeights(model: tf.LayersModel, flat: Float32Array, source = 'the new weights'): void {
  const weights = model.trainableWeights;
  const total = weights.reduce((n, w) => n + sizeOf(w.shape), 0);
  if (flat.length !== total) throw new RangeError(`the flat weights have ${flat.length} elements, the model's trainable weights ${total}`);
  let at = 0;
  for (const [index, w] of weights.entries()) {
    const end = at + sizeOf(w.shape);
    if (!allFinite(flat.subarray(at, end))) throw new NonFiniteWeightsError(w.originalName, index, source);
    at = end;
  }
  let offset = 0;
  for (const w of weights) {
    const size = sizeOf(w.shape);
    const t = tf.tensor(flat.subarray(offset, offset + size), w.shape as number[], 'float32');
    (w.read() as tf.Variable).assign(t);
    t.dispose();
    offset += size;
  }
  masters.set(model, { values: flat === masters.get(model)?.values ? flat : flat.slice(), ids: weights.map((w) => w.read().dataId) });
}

/** A fingerprint of `model`'s trainable weights: equal on every rank while replicas are identical. */
export async function weightsHash(model: tf.LayersModel): Promise<string> {
  return hashFloat32(await flatTrainableWeights(model));
}

/**
 * Collective: every rank of `pg` calls it at the same point. Compares the ranks' weights hashes
 * and throws ReplicaDivergenceError on every rank, naming the ranks whose hash differs from the
 * majority's (from rank 0's when no hash is held by more than half). Resolves with the common
 * hash when all agree.
 */
export async function verifyReplicas(pg: ProcessGroup, model: tf.LayersModel): Promise<string> {
  const mine = await weightsHash(model);
  // 32 bits as two 16-bit halves: float32 holds each exactly.
  const word = parseInt(mine, 16);
  const all = await pg.allGather(Float32Array.of(Math.floor(word / 0x10000), word % 0x10000));
  const hashes = Array.from({ length: pg.worldSize }, (_, r) => {
    const hi = all[2 * r]!;
    const lo = all[2 * r + 1]!;
    // Whatever a peer sent, it becomes some 8-digit hash (a garbled one simply differs).
    const ok = (v: number) => Number.isInteger(v) && v >= 0 && v < 0x10000;
    return ok(hi) && ok(lo) ? (hi * 0x10000 + lo).toString(16).padStart(8, '0') : 'invalid';
  });
  const counts = new Map<string, number>();
  for (const h of hashes) counts.set(h, (counts.get(h) ?? 0) + 1);
  const [top, topCount] = [...counts].reduce((a, b) => (b[1] > a[1] ? b : a));
  const byMajority = topCount * 2 > pg.worldSize;
  const reference = byMajority ? top : hashes[0]!;
  const diverged = hashes.flatMap((h, r) => (h === reference ? [] : [r]));
  if (diverged.length > 0) throw new ReplicaDivergenceError(diverged, hashes, reference, byMajority);
  return reference;
}
