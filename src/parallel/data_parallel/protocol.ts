/**
 * The messages between DataParallel (the tab's main thread) and its devices (dedicated Workers,
 * each with its own TF.js backend), and their validation. Both ends import this module and
 * switch on the type exhaustively. A device is code of our own bundle, but what it answers is
 * still checked before use: a wrong length or a missing field becomes a DataParallelDeviceError
 * naming the device, never a silent wrong gradient.
 */

/** The backends a device can run (TF.js names). */
export const DEVICE_BACKENDS = ['webgpu', 'webgl', 'wasm', 'cpu'] as const;
export type DeviceBackend = (typeof DEVICE_BACKENDS)[number];

/**
 * The loss each device computes on its chunk, reduced by the mean over the chunk's samples, so
 * that the main thread's sample-weighted sum of the devices' gradients is the gradient of the
 * whole batch's mean loss (as TensorFlow's MirroredStrategy scales per-replica losses by the
 * global batch). A function cannot travel to a Worker, so the loss is named.
 * - softmaxCrossEntropy: logits against integer labels (the library's `classificationLoss`);
 * - meanSquaredError: outputs against float targets of the output's shape.
 */
export type DataParallelLoss = { kind: 'softmaxCrossEntropy'; numClasses: number } | { kind: 'meanSquaredError' };

/** Main thread -> device. */
export type ToDevice =
  | {
      type: 'init';
      device: number;
      /** The backend asked for; the device falls back (webgpu -> wasm -> cpu) and says why. */
      backend: DeviceBackend;
      /** The model's architecture: `model.toJSON(null, false)` (weights come with every step). */
      topology: unknown;
      /** Every trainable weight's shape, in `model.trainableWeights` order: the replica must match. */
      shapes: number[][];
      loss: DataParallelLoss;
    }
  | {
      type: 'step';
      id: number;
      /** The main replica's trainable weights, flat, in `trainableWeights` order (torch re-replicates every forward). */
      weights: Float32Array;
      /** This device's chunk of the batch: `samples` inputs, flat. */
      x: Float32Array;
      /** Labels (softmaxCrossEntropy) or targets (meanSquaredError) of the chunk. */
      y: Int32Array | Float32Array;
      samples: number;
    }
  | { type: 'close' }
  /**
   * A test hook (as destroyDevice is for a lost GPU): 'crash' makes the device throw outside any
   * handler, as a Worker that crashes does; 'hang' makes it answer nothing from then on.
   */
  | { type: 'fault'; kind: DeviceFault };

/** What `DataParallel.injectFault` makes a device do. */
export type DeviceFault = 'crash' | 'hang';

/** Device -> main thread. */
export type FromDevice =
  | {
      type: 'ready';
      backend: DeviceBackend;
      /** Why the backend running is not the one asked for. */
      fallbackReason?: string;
      /** Live tensors once the replica is built (the baseline for the leak check). */
      liveTensors: number;
    }
  | {
      type: 'grads';
      id: number;
      /** The chunk's mean loss. */
      loss: number;
      /** Gradients of the chunk's mean loss, flat, in `trainableWeights` order. */
      grads: Float32Array;
      /** Samples whose prediction was right (softmaxCrossEntropy), else -1. */
      correct: number;
      /** From taking the step to the gradients on the host, ms. */
      computeMs: number;
      /** Live tensors after the step: flat across steps when nothing leaks. */
      liveTensors: number;
    }
  | {
      type: 'failed';
      /** The step that failed, or -1 while starting. */
      id: number;
      /** What went wrong, in the device's words (the error's name and message). */
      reason: string;
    };

const isInt = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v);
const isNumber = (v: unknown): v is number => typeof v === 'number' && !Number.isNaN(v);

/** Checks a device's message; returns it typed, or a sentence saying what is wrong with it. */
export function parseFromDevice(data: unknown): FromDevice | string {
  if (typeof data !== 'object' || data === null) return `a ${data === null ? 'null' : typeof data} instead of a message object`;
  const m = data as Record<string, unknown>;
  const type = m.type as FromDevice['type'];
  switch (type) {
    case 'ready':
      if (!(DEVICE_BACKENDS as readonly unknown[]).includes(m.backend)) return `"ready" names an unknown backend ${String(m.backend)}`;
      if (m.fallbackReason !== undefined && typeof m.fallbackReason !== 'string') return '"ready" has a fallbackReason that is not text';
      if (!isInt(m.liveTensors)) return '"ready" has no tensor count';
      return m as FromDevice;
    case 'grads':
      if (
        !isInt(m.id) ||
        !(m.grads instanceof Float32Array) ||
        !isNumber(m.loss) ||
        !isInt(m.correct) ||
        !isNumber(m.computeMs) ||
        !isInt(m.liveTensors)
      ) {
        return '"grads" lacks one of id, grads (a Float32Array), loss, correct, computeMs, liveTensors';
      }
      return m as FromDevice;
    case 'failed':
      if (!isInt(m.id) || typeof m.reason !== 'string') return '"failed" lacks its id or reason';
      return m as FromDevice;
    default: {
      const unknown: never = type;
      return `an unknown message type ${JSON.stringify(unknown)}`;
    }
  }
}

/** Checks a message from the main thread (the device's side). */
export function parseToDevice(data: unknown): ToDevice | string {
  if (typeof data !== 'object' || data === null) return 'not a message object';
  const m = data as Record<string, unknown>;
  const type = m.type as ToDevice['type'];
  switch (type) {
    case 'init': {
      if (!isInt(m.device) || !(DEVICE_BACKENDS as readonly unknown[]).includes(m.backend))
        return '"init" lacks its device index or names an unknown backend';
      if (!Array.isArray(m.shapes) || !m.shapes.every((s) => Array.isArray(s) && s.every((d) => isInt(d) && d >= 0)))
        return '"init" lacks the weights\' shapes';
      const loss = m.loss as Record<string, unknown> | null;
      const lossOk =
        typeof loss === 'object' &&
        loss !== null &&
        (loss.kind === 'meanSquaredError' || (loss.kind === 'softmaxCrossEntropy' && isInt(loss.numClasses) && loss.numClasses >= 1));
      if (!lossOk) return '"init" names an unknown loss';
      return m as ToDevice;
    }
    case 'step':
      if (
        !isInt(m.id) ||
        !(m.weights instanceof Float32Array) ||
        !(m.x instanceof Float32Array) ||
        !(m.y instanceof Int32Array || m.y instanceof Float32Array) ||
        !isInt(m.samples) ||
        m.samples < 1
      ) {
        return '"step" lacks one of id, weights, x, y, samples';
      }
      return m as ToDevice;
    case 'close':
      return m as ToDevice;
    case 'fault':
      if (m.kind !== 'crash' && m.kind !== 'hang') return '"fault" names an unknown kind';
      return m as ToDevice;
    default: {
      const unknown: never = type;
      return `an unknown message type ${JSON.stringify(unknown)}`;
    }
  }
}
