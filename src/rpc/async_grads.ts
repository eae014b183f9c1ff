/**
 * Gradients through a function that awaits before it computes (distributed autograd's recompute of
 * a served call that fetched an RRef with toHere(), as torch's pipeline tutorial's shards do).
 * tf.variableGrads records only what its function computes synchronously; here the engine's tape is
 * opened before the function runs and stays open while it awaits, so every op it runs is recorded,
 * and tf.variableGrads, run inside that open tape, takes the gradients through all of them.
 *
 * The tape is the engine's (one per page): other ops that run meanwhile are recorded too, and left
 * out of the gradients (only ops on a path from a variable to the output count); their saved
 * tensors are freed when the tape closes. One such recompute runs at a time per page. This reads
 * TF.js's engine internals (startTape, endTape, state.activeTape; tfjs-core 4.x), checked first.
 */
import * as tf from '@tensorflow/tfjs';

interface TapeEngine {
  startTape(): void;
  endTape(): void;
  state: { gradientDepth: number; activeTape: Array<{ saved?: tf.Tensor[] }> | null };
}

let last: Promise<unknown> = Promise.resolve();

function tapeEngine(): TapeEngine {
  const e = tf.engine() as unknown as Partial<TapeEngine>;
  if (typeof e.startTape !== 'function' || typeof e.endTape !== 'function' || typeof e.state?.gradientDepth !== 'number')
    throw new TypeError(
      "this TF.js engine has no tape to keep open across an await: make the function compute its result synchronously (fetch RRefs before the context's calls)",
    );
  return e as TapeEngine;
}

/**
 * The gradients of every trainable variable with respect to `loss(out)`, where `out` is what `run`
 * resolves to: like tf.variableGrads, for an asynchronous forward. Resolves with the same map;
 * the caller disposes it. `dispose` receives `out` once the gradients are taken.
 */
export function asyncVariableGrads<T>(
  run: () => Promise<T>,
  loss: (out: T) => tf.Scalar,
  dispose: (out: T) => void,
): Promise<tf.NamedTensorMap> {
  const turn = last.then(async () => {
    const engine = tapeEngine();
    engine.startTape();
    let out: T | undefined;
    try {
      out = await run();
      const produced = out;
      return tf.variableGrads(() => loss(produced)).grads;
    } finally {
      engine.endTape();
      // The outermost tape closed: free what it saved (tf.variableGrads does so for its own).
      if (engine.state.gradientDepth === 0 && engine.state.activeTape) {
        for (const node of engine.state.activeTape) for (const t of node.saved ?? []) t.dispose();
        engine.state.activeTape = null;
      }
      if (out !== undefined) dispose(out);
    }
  });
  last = turn.catch(() => {});
  return turn;
}
