/**
 * DataParallel (torch.nn.DataParallel; TensorFlow's MirroredStrategy on one machine): one tab
 * uses several devices. Each device is a dedicated Worker with a replica of the model on its own
 * TF.js backend (webgpu where Workers have it, webgl, wasm or cpu: several CPU devices use
 * several cores). Per step, as torch does:
 * - the main replica's weights go to every device before its forward (torch re-replicates the
 *   module every forward);
 * - the batch is scattered along its first dimension (scatter_gather.ts: sizes differ by at
 *   most one);
 * - each device computes the gradients of its chunk's mean loss;
 * - the main thread gathers them, weighted by each chunk's share of the samples, into the
 *   gradient of the whole batch's mean loss, which the optimizer applies to the main replica
 *   (`step`), or DistributedDataParallel averages across ranks first (`ddp.backward(result)`:
 *   torch's DDP with several devices per process, TensorFlow's MultiWorkerMirroredStrategy).
 *
 * The loss is named (DataParallelLoss), since a function cannot travel to a Worker. Non-trainable
 * weights (none in the library's models) are not copied to the devices.
 *
 * The devices sit behind a small interface (`DeviceChannel`): Web Workers in a browser
 * (`webWorkerDevice`), or anything else that carries the protocol's messages (a Node worker
 * thread in the tests).
 */
import * as tf from '@tensorflow/tfjs';
import { DataParallelDeviceError } from '../../wire/errors.ts';
import { flatTrainableWeights } from '../replicas.ts';
import { chunkSizes, gatherMean, scatter } from './scatter_gather.ts';
import {
  DEVICE_BACKENDS,
  parseFromDevice,
  type DataParallelLoss,
  type DeviceBackend,
  type DeviceFault,
  type FromDevice,
  type ToDevice,
} from './protocol.ts';

/** The link to one device. */
export interface DeviceChannel {
  post(message: ToDevice, transfer?: Transferable[]): void;
  /** Every message the device sends (checked by the caller). */
  onMessage(listener: (data: unknown) => void): void;
  /** The device crashed or could not load: the reason in words. */
  onError(listener: (reason: string) => void): void;
  terminate(): void;
}

/**
 * A device as a dedicated Web Worker running worker.ts (its own TF.js and backends). The URL names
 * worker.js so the built package (lib/, where only the .js exists) bundles too: in this clone Vite
 * falls back from the missing .js to the .ts, as it does for imports.
 */
export function webWorkerDevice(device: number): DeviceChannel {
  const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module', name: `data-parallel-device-${device}` });
  return {
    post: (message, transfer = []) => worker.postMessage(message, transfer),
    onMessage: (listener) => worker.addEventListener('message', (e) => listener(e.data)),
    onError: (listener) => {
      worker.addEventListener('error', (e) => {
        // Handled here: not also an uncaught error of the page.
        e.preventDefault();
        listener(e.message ? `the Worker threw: ${e.message}` : 'the Worker failed to load or crashed (the browser gave no message)');
      });
      worker.addEventListener('messageerror', () => listener('a message from the Worker could not be read'));
    },
    terminate: () => worker.terminate(),
  };
}

/** Most devices one DataParallel takes (each is a Worker with its own copy of the model). */
export const MAX_DEVICES = 32;

export interface DataParallelOptions {
  /** How many devices (Workers), 1 .. MAX_DEVICES. */
  devices: number;
  /** The loss each device computes on its chunk (see DataParallelLoss). */
  loss: DataParallelLoss;
  /**
   * The backend each device asks for; a device that cannot run it falls back (webgpu, webgl,
   * wasm, cpu, in that order after it) and says why. Default: the main thread's backend, or
   * cpu when that is not one of these.
   */
  backend?: DeviceBackend;
  /** Makes device `index`'s channel. Default: `webWorkerDevice`. */
  spawn?: (device: number) => DeviceChannel;
  /** How long a device may take to start its backend and build its replica, ms. Default 60 s. */
  startTimeoutMs?: number;
  /** How long a device may take for one step, ms (the first compiles its shaders). Default 120 s. */
  stepTimeoutMs?: number;
}

/** A batch for the devices: `x` is `samples x inputShape` values; `y` labels (softmaxCrossEntropy) or `samples x outputShape` targets. */
export interface DataParallelBatch {
  x: Float32Array;
  y: Int32Array | Float32Array;
}

/** One device, once started. */
export interface DeviceInfo {
  device: number;
  backend: DeviceBackend;
  /** Why it runs another backend than the one asked for. */
  fallbackReason?: string;
}

/** What one device did in one step. */
export interface DeviceStep {
  device: number;
  /** Samples of its chunk (0: it sat this step out, the batch being smaller than the devices). */
  samples: number;
  /** From receiving the step to the gradients on the host, on the device, ms. */
  computeMs: number;
  /** Live tensors on the device after the step. */
  liveTensors: number;
}

/** Gradients computed elsewhere than in `ddp.backward` (here, by the devices), for `DistributedDataParallel.backward`. */
export interface LocalGradients {
  /** The batch's mean loss. */
  loss: number;
  /** Gradients of it, flat, in `model.trainableWeights` order. */
  grads: Float32Array;
  /** How long computing them took, ms (a straggler stretches this). */
  computeMs: number;
}

export interface DataParallelResult extends LocalGradients {
  /** Right predictions in the batch (softmaxCrossEntropy), else null. */
  correct: number | null;
  devices: DeviceStep[];
}

/** A device's figures over the steps so far. */
export interface DeviceStats extends DeviceInfo {
  steps: number;
  samples: number;
  /** Mean compute per step it took part in, ms (null before any). */
  meanComputeMs: number | null;
  /** Live tensors after its steps: equal min and max when nothing leaks. */
  liveTensors: { min: number; max: number } | null;
}

interface Pending {
  id: number;
  resolve(message: FromDevice): void;
  reject(err: Error): void;
  timer: ReturnType<typeof setTimeout>;
}

const sizeOf = (shape: ReadonlyArray<number | null>) => shape.reduce<number>((a, b) => a * (b ?? 1), 1);

export class DataParallel {
  readonly model: tf.LayersModel;
  readonly loss: DataParallelLoss;
  private readonly channels: DeviceChannel[] = [];
  private readonly info: Array<DeviceInfo | undefined> = [];
  private readonly pending = new Map<number, Pending>();
  private readonly stats: Array<{ steps: number; samples: number; ms: number; minTensors: number; maxTensors: number }> = [];
  private readonly perSample: number;
  private readonly perTarget: number;
  private readonly numel: number;
  private readonly stepTimeoutMs: number;
  private nextId = 1;
  private busy = false;
  private failure: DataParallelDeviceError | undefined;
  private closed = false;
  /** `backward`'s gradients until `step` applies them. */
  private grads: Float32Array | undefined;

  private constructor(model: tf.LayersModel, options: DataParallelOptions) {
    this.model = model;
    this.loss = options.loss;
    this.stepTimeoutMs = options.stepTimeoutMs ?? 120_000;
    this.perSample = sizeOf(model.inputs[0]!.shape.slice(1));
    // Labels: one per output position but the class axis (1 for a classifier, T for a language model's [T, V]).
    const outputShape = model.outputs[0]!.shape.slice(1);
    this.perTarget = sizeOf(options.loss.kind === 'softmaxCrossEntropy' ? outputShape.slice(0, -1) : outputShape);
    this.numel = model.trainableWeights.reduce((n, w) => n + sizeOf(w.shape), 0);
  }

  /**
   * Starts `options.devices` devices, each building a replica of `model` on its backend; resolves
   * once all are ready. Throws DataParallelDeviceError naming the first device that could not
   * start (every device is stopped then).
   */
  static async create(model: tf.LayersModel, options: DataParallelOptions): Promise<DataParallel> {
    const k = options.devices;
    if (!Number.isSafeInteger(k) || k < 1 || k > MAX_DEVICES)
      throw new RangeError(`devices must be an integer from 1 to ${MAX_DEVICES}, got ${k}`);
    if (options.loss.kind === 'softmaxCrossEntropy' && !(Number.isSafeInteger(options.loss.numClasses) && options.loss.numClasses >= 1)) {
      throw new RangeError(`softmaxCrossEntropy needs numClasses, a positive integer; got ${options.loss.numClasses}`);
    }
    const running = tf.getBackend();
    const backend = options.backend ?? ((DEVICE_BACKENDS as readonly string[]).includes(running) ? (running as DeviceBackend) : 'cpu');
    if (!(DEVICE_BACKENDS as readonly string[]).includes(backend))
      throw new RangeError(`a device's backend is one of ${DEVICE_BACKENDS.join(', ')}, got "${backend}"`);
    const dp = new DataParallel(model, options);
    const spawn = options.spawn ?? webWorkerDevice;
    const topology = model.toJSON(null, false);
    const shapes = model.trainableWeights.map((w) => w.shape.map((d) => d ?? 1));
    try {
      for (let d = 0; d < k; d++) {
        const channel = spawn(d);
        dp.channels.push(channel);
        dp.info.push(undefined);
        dp.stats.push({ steps: 0, samples: 0, ms: 0, minTensors: Infinity, maxTensors: -Infinity });
        channel.onMessage((data) => dp.receive(d, data));
        channel.onError((reason) => dp.fail(new DataParallelDeviceError(d, dp.info[d]?.backend ?? null, dp.during(d), reason)));
      }
      const startMs = options.startTimeoutMs ?? 60_000;
      await Promise.all(
        dp.channels.map(async (channel, d) => {
          const ready = dp.request(d, -1, startMs, `start its ${backend} backend and build the model`);
          channel.post({ type: 'init', device: d, backend, topology, shapes, loss: options.loss });
          const msg = await ready;
          if (msg.type !== 'ready') throw new DataParallelDeviceError(d, null, 'start', `answered "${msg.type}" where "ready" was due`);
          dp.info[d] = { device: d, backend: msg.backend, ...(msg.fallbackReason ? { fallbackReason: msg.fallbackReason } : {}) };
        }),
      );
    } catch (err) {
      dp.close();
      throw dp.failure ?? err;
    }
    return dp;
  }

  /** The devices: index, backend and why it fell back (every one has started: `create` resolves only then). */
  get devices(): DeviceInfo[] {
    return this.info.map((i) => i!);
  }

  /** Each device's figures over the steps so far. */
  deviceStats(): DeviceStats[] {
    return this.devices.map((info, d) => {
      const s = this.stats[d]!;
      return {
        ...info,
        steps: s.steps,
        samples: s.samples,
        meanComputeMs: s.steps > 0 ? s.ms / s.steps : null,
        liveTensors: s.steps > 0 ? { min: s.minTensors, max: s.maxTensors } : null,
      };
    });
  }

  /**
   * Scatters `batch` over the devices with the main replica's current weights and gathers the
   * gradient of the whole batch's mean loss. One call at a time. Throws DataParallelDeviceError
   * when a device fails (and from then on).
   */
  async computeGradients(batch: DataParallelBatch): Promise<DataParallelResult> {
    if (this.closed) throw new Error('this DataParallel is closed: its devices were stopped');
    if (this.failure) throw this.failure;
    if (this.busy) throw new Error('computeGradients is already running: await it before the next call');
    const samples = batch.x.length / this.perSample;
    if (!Number.isSafeInteger(samples) || samples < 1) {
      throw new RangeError(
        `the batch's inputs have ${batch.x.length} values, not a positive multiple of the ${this.perSample} each sample of the model's input has`,
      );
    }
    if (batch.y.length !== samples * this.perTarget) {
      throw new RangeError(
        `the batch has ${samples} samples but ${batch.y.length} ${this.loss.kind === 'softmaxCrossEntropy' ? 'labels' : 'target values'} (${samples * this.perTarget} expected)`,
      );
    }
    this.busy = true;
    const t0 = performance.now();
    try {
      const weights = await flatTrainableWeights(this.model);
      const sizes = chunkSizes(samples, this.channels.length);
      const xs = scatter(batch.x, this.perSample, sizes);
      const ys = scatter(batch.y, this.perTarget, sizes);
      const id = this.nextId++;
      const answers = await Promise.all(
        xs.map(async (chunk, j) => {
          const d = chunk.device;
          const w = weights.slice();
          const y = ys[j]!.values;
          const answer = this.request(d, id, this.stepTimeoutMs, `step ${id} (${chunk.samples} samples)`);
          this.channels[d]!.post({ type: 'step', id, weights: w, x: chunk.values, y, samples: chunk.samples }, [
            w.buffer,
            chunk.values.buffer,
            y.buffer,
          ]);
          const msg = await answer;
          if (msg.type !== 'grads')
            throw this.fail(
              new DataParallelDeviceError(
                d,
                this.info[d]?.backend ?? null,
                `step ${id}`,
                `answered "${msg.type}" where gradients were due`,
              ),
            );
          if (msg.grads.length !== this.numel) {
            throw this.fail(
              new DataParallelDeviceError(
                d,
                this.info[d]?.backend ?? null,
                `step ${id}`,
                `returned ${msg.grads.length} gradient values; the model has ${this.numel}`,
              ),
            );
          }
          return { device: d, samples: chunk.samples, msg };
        }),
      );
      const { loss, grads } = gatherMean(answers.map((a) => ({ samples: a.samples, loss: a.msg.loss, grads: a.msg.grads })));
      const devices: DeviceStep[] = sizes.map((n, d) => ({ device: d, samples: n, computeMs: 0, liveTensors: -1 }));
      for (const a of answers) {
        devices[a.device] = { device: a.device, samples: a.samples, computeMs: a.msg.computeMs, liveTensors: a.msg.liveTensors };
        const s = this.stats[a.device]!;
        s.steps++;
        s.samples += a.samples;
        s.ms += a.msg.computeMs;
        s.minTensors = Math.min(s.minTensors, a.msg.liveTensors);
        s.maxTensors = Math.max(s.maxTensors, a.msg.liveTensors);
      }
      const correct = this.loss.kind === 'softmaxCrossEntropy' ? answers.reduce((n, a) => n + a.msg.correct, 0) : null;
      return { loss, grads, correct, devices, computeMs: performance.now() - t0 };
    } finally {
      this.busy = false;
    }
  }

  /** Single-process use: computes the batch's gradients (computeGradients) and keeps them for `step`. */
  async backward(batch: DataParallelBatch): Promise<DataParallelResult> {
    const result = await this.computeGradients(batch);
    this.grads = result.grads;
    return result;
  }

  /** Applies `backward`'s gradients to the main replica with `optimizer` (optimizer.step + zero_grad). */
  step(optimizer: tf.Optimizer): void {
    const grads = this.grads;
    if (!grads) throw new Error('step() before backward(): there are no gradients to apply');
    this.grads = undefined;
    tf.tidy(() => {
      const named: tf.NamedTensorMap = {};
      let offset = 0;
      for (const w of this.model.trainableWeights) {
        const size = sizeOf(w.shape);
        named[(w.read() as tf.Variable).name] = tf.tensor(grads.subarray(offset, offset + size), w.shape as number[], 'float32');
        offset += size;
      }
      optimizer.applyGradients(named);
    });
  }

  /**
   * A test hook: makes device `device` crash (throw outside any handler, as a crashing Worker does)
   * or hang (answer nothing more; its next step times out). The next or current step fails with a
   * DataParallelDeviceError naming it.
   */
  injectFault(device: number, kind: DeviceFault): void {
    const channel = this.channels[device];
    if (!channel)
      throw new RangeError(
        `there is no device ${device}: this DataParallel has ${this.channels.length} (0 to ${this.channels.length - 1})`,
      );
    channel.post({ type: 'fault', kind });
  }

  /** Stops every device. Pending steps fail. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const [d, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new DataParallelDeviceError(d, this.info[d]?.backend ?? null, this.during(d), 'the DataParallel was closed'));
    }
    this.pending.clear();
    for (const channel of this.channels) {
      try {
        channel.post({ type: 'close' });
      } catch {
        // a device that is gone already
      }
      channel.terminate();
    }
  }

  /** What device `d` is waited for, in words. */
  private during(d: number): string {
    const p = this.pending.get(d);
    return p === undefined ? 'its run' : p.id < 0 ? 'start' : `step ${p.id}`;
  }

  /** Waits for device `d`'s answer to request `id` (-1: its start), at most `timeoutMs`. */
  private request(d: number, id: number, timeoutMs: number, what: string): Promise<FromDevice> {
    return new Promise<FromDevice>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.fail(
          new DataParallelDeviceError(
            d,
            this.info[d]?.backend ?? null,
            id < 0 ? 'start' : `step ${id}`,
            `it did not ${id < 0 ? what : `answer ${what}`} within ${Math.round(timeoutMs / 100) / 10} s`,
          ),
        );
      }, timeoutMs);
      this.pending.set(d, { id, resolve, reject, timer });
    });
  }

  /** A message from device `d`: it answers its pending request, or fails the DataParallel. */
  private receive(d: number, data: unknown): void {
    const msg = parseFromDevice(data);
    const backend = this.info[d]?.backend ?? null;
    if (typeof msg === 'string') {
      this.fail(new DataParallelDeviceError(d, backend, this.during(d), `it sent ${msg}`));
      return;
    }
    const p = this.pending.get(d);
    if (msg.type === 'failed') {
      this.fail(new DataParallelDeviceError(d, backend, msg.id < 0 ? 'start' : `step ${msg.id}`, msg.reason));
      return;
    }
    const id = msg.type === 'ready' ? -1 : msg.id;
    // An answer nobody waits for (after a timeout, or to another request): not this step's.
    if (!p || p.id !== id) return;
    clearTimeout(p.timer);
    this.pending.delete(d);
    p.resolve(msg);
  }

  /** The DataParallel is failed: every pending request rejects with `err` (the first failure wins). Returns the failure. */
  private fail(err: DataParallelDeviceError): DataParallelDeviceError {
    this.failure ??= err;
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(this.failure);
    }
    this.pending.clear();
    return this.failure;
  }
}
