/**
 * The WebGPU device under TF.js, and what to do when it is lost (GPUDevice.lost: a driver reset
 * or crash, a laptop switching graphics cards, the page destroying it). `watchDevice` hears the
 * loss as it happens; `recreateBackend` gives TF.js a new device afterwards (or another backend
 * when WebGPU cannot come back). Every tensor of the lost device is gone: a replica rebuilds its
 * model on the new backend and takes the group's state from a peer (runElastic's `rebuildState`).
 *
 * What was seen on Chromium with SwiftShader (TF.js 4.22): `device.destroy()` resolves
 * `device.lost` (reason 'destroyed') within milliseconds; a readback of a tensor on the lost
 * device rejects with an AbortError ("The Device was lost before mapping was resolved") instead of
 * hanging, while ops on tensors under 1000 elements still "work" (TF.js computes them on the CPU);
 * removing the backend, registering its factory again and `setBackend` give a backend on a new
 * device that computes what the old one did, bit for bit. Tensors of the old device cannot be
 * read or used in ops any more; disposing them is harmless.
 */
import * as tf from '@tensorflow/tfjs';
import { DeviceLostError, type DeviceLostReason } from '../wire/errors.ts';

/** What this module needs of a GPUDevice (no dependency on the WebGPU type definitions). */
export interface GpuDeviceLike {
  readonly lost: Promise<{ reason: string; message: string }>;
  destroy(): void;
}

/** A lost device, as GPUDeviceLostInfo tells it. */
export interface DeviceLostInfo {
  reason: DeviceLostReason;
  message: string;
  /** performance.now() when the loss was heard. */
  at: number;
}

/** A watch over the device of the backend running when it was made. */
export interface DeviceWatch {
  /** The backend watched ('webgpu', or another one, whose watch never fires). */
  readonly backend: string;
  /** Resolves when the device is lost; never, on a backend without a device or after `stop`. */
  readonly lost: Promise<DeviceLostInfo>;
  /** The loss, once it happened. */
  readonly info: DeviceLostInfo | undefined;
  isLost(): boolean;
  /** Calls `listener` once when the device is lost (at once, if it already is); returns a function that unsubscribes. */
  onLost(listener: (info: DeviceLostInfo) => void): () => void;
  /** Stops watching: `lost` and the listeners never fire after this. */
  stop(): void;
}

const WEBGPU = 'webgpu';

/** The webgpu backend's factory and priority, kept from before a loss removes them from TF.js. */
let webgpuFactory: { factory: () => tf.KernelBackend | Promise<tf.KernelBackend>; priority: number } | undefined;

function rememberWebGpuFactory(): void {
  const factory = tf.findBackendFactory(WEBGPU);
  if (!factory) return;
  const priority = tf.engine().registryFactory[WEBGPU]?.priority ?? 3;
  webgpuFactory = { factory, priority };
}

/** The WebGPU device of the running TF.js backend, or undefined on any other backend. */
export function currentDevice(): GpuDeviceLike | undefined {
  if (tf.getBackend() !== WEBGPU) return undefined;
  const device = (tf.backend() as unknown as { device?: unknown }).device;
  if (typeof device !== 'object' || device === null || !('lost' in device) || !('destroy' in device)) return undefined;
  return device as GpuDeviceLike;
}

/** Watches the running backend's WebGPU device for loss; a no-op watch on other backends. */
export function watchDevice(): DeviceWatch {
  rememberWebGpuFactory();
  const backend = tf.getBackend() ?? 'none';
  const device = currentDevice();
  const listeners = new Set<(info: DeviceLostInfo) => void>();
  let info: DeviceLostInfo | undefined;
  let stopped = false;
  let resolveLost!: (info: DeviceLostInfo) => void;
  const lost = new Promise<DeviceLostInfo>((r) => (resolveLost = r));
  device?.lost.then(
    (i) => {
      if (stopped) return;
      info = { reason: i.reason === 'destroyed' ? 'destroyed' : 'unknown', message: String(i.message ?? ''), at: performance.now() };
      resolveLost(info);
      for (const l of [...listeners]) l(info);
      listeners.clear();
    },
    () => {},
  );
  return {
    backend,
    lost,
    get info() {
      return info;
    },
    isLost: () => info !== undefined,
    onLost(listener) {
      if (stopped) return () => {};
      if (info) {
        listener(info);
        return () => {};
      }
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    stop() {
      stopped = true;
      listeners.clear();
    },
  };
}

/**
 * Destroys the running backend's WebGPU device, which loses it as a driver reset would (reason
 * 'destroyed'): for testing what a page does then. Returns false when no WebGPU device runs.
 */
export function destroyDevice(): boolean {
  const device = currentDevice();
  if (!device) return false;
  device.destroy();
  return true;
}

export interface RecreatedBackend {
  /** The backend now running: 'webgpu' on a new device, or the fallback. */
  backend: string;
  /** Why it is not webgpu, when it is not. */
  fallbackReason?: string;
  /** How long re-creating took. */
  ms: number;
}

export interface RecreateBackendOptions {
  /** Backends to try, in order, when WebGPU cannot come back (only registered ones are tried). Default: webgl, then cpu. */
  fallbacks?: readonly string[];
  /** Filled into the DeviceLostError thrown when nothing starts. */
  rank?: number;
  during?: string;
}

/**
 * Gives TF.js a working backend after the WebGPU device was lost: removes the dead webgpu
 * backend, registers its factory again (kept from before the loss), and starts it, which asks
 * the browser for a new adapter and device; a computation large enough to run on the GPU proves
 * it works. When it does not (the GPU is gone), the fallbacks are tried as the page does at
 * start. Tensors of the old backend are abandoned: rebuild models and optimizers afterwards.
 * Throws DeviceLostError, saying why, when no backend starts.
 */
export async function recreateBackend(options: RecreateBackendOptions = {}): Promise<RecreatedBackend> {
  const started = performance.now();
  rememberWebGpuFactory();
  const reasons: string[] = [];
  if (!webgpuFactory) {
    reasons.push('the webgpu backend was never registered (import @tensorflow/tfjs-backend-webgpu)');
  } else {
    try {
      // Disposing the dead backend frees its buffers; on a lost device that may throw: it is gone either way.
      tf.removeBackend(WEBGPU);
    } catch {
      // not registered any more, or its dispose failed
    }
    tf.registerBackend(WEBGPU, webgpuFactory.factory, webgpuFactory.priority);
    const failure = await startBackend(WEBGPU);
    if (failure === undefined) return { backend: WEBGPU, ms: performance.now() - started };
    reasons.push(failure);
  }
  for (const name of options.fallbacks ?? ['webgl', 'cpu']) {
    if (name === WEBGPU || !tf.findBackendFactory(name)) continue;
    const failure = await startBackend(name);
    if (failure === undefined)
      return {
        backend: name,
        fallbackReason: `WebGPU did not come back: ${reasons.join('; ')}; using ${name} instead`,
        ms: performance.now() - started,
      };
    reasons.push(failure);
  }
  throw new DeviceLostError(
    options.rank ?? -1,
    'unknown',
    'no backend could start after the loss',
    options.during ?? 'the re-creation of the backend',
    `No TF.js backend could start again: ${reasons.join('; ')}. Reload the page; if WebGPU stays unavailable, open the session with backend=webgl.`,
  );
}

/** Starts TF.js backend `name` and checks it computes; undefined when it works, else why not. */
export async function startBackend(name: string): Promise<string | undefined> {
  try {
    if (!(await tf.setBackend(name))) return `the ${name} backend failed to start`;
    await tf.ready();
    return await probeBackend(name);
  } catch (err) {
    return `the ${name} backend failed: ${(err as Error).message}`;
  }
}

/**
 * A computation on 4096 elements, read back: big enough that the webgpu backend runs it on the
 * GPU (it computes inputs under 1000 elements on the CPU, which would prove nothing).
 */
export async function probeBackend(name = tf.getBackend()): Promise<string | undefined> {
  const t = tf.tidy(() => tf.ones([4096]).mul(tf.scalar(2)).sum());
  try {
    const v = (await t.data())[0];
    return v === 8192 ? undefined : `the ${name} backend computed a sum of 4096 twos as ${v}`;
  } finally {
    t.dispose();
  }
}

/** Disposes tensors that may belong to a lost device, where disposing can throw: they are gone either way. */
export function disposeQuietly(...disposables: Array<{ dispose(): void } | undefined>): void {
  for (const d of disposables) {
    try {
      d?.dispose();
    } catch {
      // the backend that held it is gone
    }
  }
}
