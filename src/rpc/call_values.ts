/**
 * What the agent (agent.ts) does with a call's values: a remote failure as it crosses, the methods
 * an RRef's value may have called, the tensors of a call and which of them it disposes, and its
 * bounded waits.
 */
import * as tf from '@tensorflow/tfjs';
import { RpcError } from './errors.ts';
import type { RemoteFailure } from './messages.ts';
import { RRef } from './rref.ts';

export function failure(err: unknown): RemoteFailure {
  const e = err instanceof Error ? err : new Error(String(err));
  return { error: { type: e.name || 'Error', message: e.message } };
}

/** Calls a method of an owned value by name: only the value's own functions, never Object's. */
export function callMethod(value: unknown, method: string, args: unknown[]): unknown {
  if (value === null || typeof value !== 'object' || method in Object.prototype || method.startsWith('_'))
    throw new TypeError(`"${method}" is not a method that may be called on this RRef's value`);
  const f = (value as Record<string, unknown>)[method];
  if (typeof f !== 'function') throw new TypeError(`the RRef's value has no method "${method}"`);
  return (f as (...a: unknown[]) => unknown).apply(value, args);
}

/** The RRefs in a value (arrays and plain objects walked). */
export function rrefsIn(v: unknown, out: RRef[] = [], depth = 0): RRef[] {
  if (depth > 64) return out;
  if (v instanceof RRef) out.push(v);
  else if (Array.isArray(v)) for (const x of v) rrefsIn(x, out, depth + 1);
  else if (v !== null && typeof v === 'object' && Object.getPrototypeOf(v) === Object.prototype)
    for (const x of Object.values(v)) rrefsIn(x, out, depth + 1);
  return out;
}

export function tensorsIn(v: unknown, out: tf.Tensor[] = [], depth = 0): tf.Tensor[] {
  if (depth > 64) return out;
  if (v instanceof tf.Tensor) out.push(v);
  else if (Array.isArray(v)) for (const x of v) tensorsIn(x, out, depth + 1);
  else if (v !== null && typeof v === 'object' && Object.getPrototypeOf(v) === Object.prototype)
    for (const x of Object.values(v)) tensorsIn(x, out, depth + 1);
  return out;
}

/** Disposes a call's tensors, except variables, tensors kept with tf.keep, and what an RRef now holds. */
export function disposeAfterCall(tensors: tf.Tensor[], kept: unknown): void {
  const keep = new Set(tensorsIn(kept));
  for (const t of new Set(tensors)) if (!(t instanceof tf.Variable) && !t.kept && !t.isDisposed && !keep.has(t)) t.dispose();
}

/** Waits until `done()` holds, woken by `waiters`; past `timeoutMs` throws an RpcError naming `what()`. */
export async function waitUntil(
  worker: string,
  done: () => boolean,
  waiters: Array<() => void>,
  timeoutMs: number,
  what: () => string,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!done()) {
    const left = deadline - Date.now();
    if (left <= 0) throw new RpcError(`timed out after ${timeoutMs} ms waiting for ${what()}`, worker, 'wait');
    await new Promise<void>((r) => {
      const t = setTimeout(r, left);
      waiters.push(() => {
        clearTimeout(t);
        r();
      });
    });
  }
}
