/**
 * `distAutograd`: torch.distributed.autograd through this page's RPC agent (`context`, `backward`,
 * `getGradients`); how gradients cross workers is in src/rpc/dist_autograd.ts and docs/rpc.md.
 */
import type * as tf from '@tensorflow/tfjs';
import { distAutograd } from './rpc/api.ts';

/** `with dist_autograd.context() as context_id:` — runs `body` in a new context, then ends it everywhere. */
export function context<T>(body: (contextId: string) => Promise<T>): Promise<T> {
  return distAutograd.context(body);
}

/** dist_autograd.backward(context_id, [loss]), with the loss as a synchronous function of what the context received. */
export function backward(contextId: string, lossFn: () => tf.Scalar): Promise<number> {
  return distAutograd.backward(contextId, lossFn);
}

/** dist_autograd.get_gradients(context_id): this worker's variables and their gradients in the context. */
export function getGradients(contextId: string): Map<tf.Variable, tf.Tensor> {
  return distAutograd.getGradients(contextId);
}
