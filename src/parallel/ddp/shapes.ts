/**
 * DDP's start-up shape check (torch's `_verify_param_shape_across_processes`): every rank
 * publishes its parameters' shapes in the group's store and compares all of them with rank 0's.
 */
import type * as tf from '@tensorflow/tfjs';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { bytesToString } from '../../wire/protocol.ts';

export class ShapeMismatchError extends Error {
  override name = 'ShapeMismatchError';
}

/**
 * Every rank publishes its parameter shapes; each compares all of them with rank 0's. The keys
 * live in the group's own store, so a later round never reads an earlier one's shapes; the
 * wait fails at once if a rank is lost.
 */
export async function checkShapes(pg: ProcessGroup, model: tf.LayersModel, name: string): Promise<void> {
  const shapes = model.trainableWeights.map((w) => w.shape);
  const store = pg.store;
  await store.set(`ddp/${name}/shapes/${pg.rank}`, JSON.stringify(shapes));
  const keys = Array.from({ length: pg.worldSize }, (_, r) => `ddp/${name}/shapes/${r}`);
  const all = (await pg.failFast(store.multiGet(keys))).map((b) => JSON.parse(bytesToString(b)) as number[][]);
  const reference = all[0];
  for (let r = 1; r < all.length; r++) {
    const other = all[r];
    if (other.length !== reference.length) {
      throw new ShapeMismatchError(
        `model parameters differ between ranks: rank 0 has ${reference.length} parameter tensors, rank ${r} has ${other.length}`,
      );
    }
    for (let i = 0; i < reference.length; i++) {
      if (JSON.stringify(reference[i]) !== JSON.stringify(other[i])) {
        throw new ShapeMismatchError(
          `model parameters differ between ranks: parameter ${i} (${model.trainableWeights[i].originalName}) has shape [${reference[i].join(', ')}] on rank 0 but [${other[i].join(', ')}] on rank ${r}`,
        );
      }
    }
  }
}
