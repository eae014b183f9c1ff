/**
 * One device of a DataParallel: a replica of the model on this thread's own TF.js backend (a
 * dedicated Worker's). It starts its backend, builds the model from its architecture, and then,
 * for every step, takes the main replica's weights and its chunk of the batch and answers with
 * the gradients of the chunk's mean loss, read back to the host. Nothing of a step stays behind:
 * each answer carries the live tensor count, which must stay flat.
 *
 * The Worker entry (worker.ts) wires this to `self`; a test can wire it to a Node worker thread.
 */
import * as tf from '@tensorflow/tfjs';
import { startBackend } from '../../runtime/device.ts';
import { classificationLoss, correctPredictions } from '../../nn/losses.ts';
// The language model's custom layers, registered so that its architecture builds here too.
import '../../nn/language_model.ts';
import { assignFlatWeights } from '../replicas.ts';
import { DEVICE_BACKENDS, parseToDevice, type DataParallelLoss, type DeviceBackend, type FromDevice, type ToDevice } from './protocol.ts';

/** Sends a message to the main thread, the listed buffers moved rather than copied. */
export type PostToMain = (message: FromDevice, transfer?: Transferable[]) => void;

/** Why this thread cannot run `backend`, before trying it; undefined when it may. */
export type BackendPrecheck = (backend: DeviceBackend) => string | undefined;

/** Whether the model has convolutions, which TF.js's wasm backend cannot train (it has no Conv2DBackpropFilter). */
function hasConvolutions(topology: unknown): boolean {
  return /"class_name":\s*"(Conv|SeparableConv|DepthwiseConv)/.test(JSON.stringify(topology));
}

/**
 * Starts `wanted` or, failing that, the backends after it in DEVICE_BACKENDS order (webgpu,
 * webgl, wasm, cpu), skipping wasm for models with convolutions; says why when it falls back.
 */
export async function startDeviceBackend(
  wanted: DeviceBackend,
  options: { convolutions: boolean; precheck?: BackendPrecheck },
): Promise<{ backend: DeviceBackend; fallbackReason?: string }> {
  const order = DEVICE_BACKENDS.slice(DEVICE_BACKENDS.indexOf(wanted));
  const reasons: string[] = [];
  for (const name of order) {
    let failure = options.precheck?.(name);
    if (failure === undefined && name === 'wasm' && options.convolutions)
      failure = 'the wasm backend cannot train convolutions (it has no Conv2DBackpropFilter kernel)';
    if (failure === undefined && !tf.findBackendFactory(name)) failure = `the ${name} backend is not in this build`;
    if (failure === undefined) failure = await startBackend(name);
    if (failure === undefined)
      return name === wanted ? { backend: name } : { backend: name, fallbackReason: `${reasons.join('; ')}; using ${name} instead` };
    reasons.push(failure);
  }
  throw new Error(`no TF.js backend could start in this worker: ${reasons.join('; ')}`);
}

function describe(err: unknown): string {
  return err instanceof Error ? `${err.name}: ${err.message}` : String(err);
}

export class DeviceReplica {
  private model: tf.LayersModel | undefined;
  private variables: tf.Variable[] = [];
  private inputShape: number[] = [];
  private outputShape: number[] = [];
  private loss: DataParallelLoss = { kind: 'meanSquaredError' };
  /** After a 'hang' fault: nothing is answered any more. */
  private hung = false;
  /** Messages are handled one at a time, in order. */
  private queue: Promise<void> = Promise.resolve();

  constructor(
    private readonly post: PostToMain,
    private readonly precheck?: BackendPrecheck,
  ) {}

  /** Takes a message from the main thread (in order; never throws: failures are answered). */
  receive(data: unknown): Promise<void> {
    this.queue = this.queue.then(() => this.handle(data));
    return this.queue;
  }

  private async handle(data: unknown): Promise<void> {
    if (this.hung) return;
    const msg = parseToDevice(data);
    if (typeof msg === 'string') {
      this.post({ type: 'failed', id: -1, reason: `the device could not read a message from the main thread: ${msg}` });
      return;
    }
    switch (msg.type) {
      case 'init':
        return this.init(msg);
      case 'step':
        return this.step(msg);
      case 'close':
        this.model?.dispose();
        this.model = undefined;
        return;
      case 'fault':
        // Either way nothing is answered any more; a crash also throws from a timer, outside
        // every handler: the Worker's 'error' event, as for a real crash.
        this.hung = true;
        if (msg.kind === 'crash') {
          setTimeout(() => {
            throw new Error('a crash injected by DataParallel.injectFault');
          });
        }
        return;
      default: {
        const unknown: never = msg;
        void unknown;
      }
    }
  }

  private async init(msg: Extract<ToDevice, { type: 'init' }>): Promise<void> {
    try {
      const started = await startDeviceBackend(msg.backend, {
        convolutions: hasConvolutions(msg.topology),
        ...(this.precheck ? { precheck: this.precheck } : {}),
      });
      const model = await tf.models.modelFromJSON({ modelTopology: msg.topology as tf.io.ModelJSON['modelTopology'] });
      const shapes = model.trainableWeights.map((w) => w.shape.map((d) => d ?? 1));
      if (JSON.stringify(shapes) !== JSON.stringify(msg.shapes)) {
        model.dispose();
        throw new Error(
          `the replica built from the architecture has weights of shapes ${JSON.stringify(shapes)}, the main model ${JSON.stringify(msg.shapes)}`,
        );
      }
      this.model = model;
      this.variables = model.trainableWeights.map((w) => w.read() as tf.Variable);
      this.inputShape = model.inputs[0]!.shape.slice(1).map((d) => d ?? 1);
      this.outputShape = model.outputs[0]!.shape.slice(1).map((d) => d ?? 1);
      this.loss = msg.loss;
      this.post({
        type: 'ready',
        backend: started.backend,
        ...(started.fallbackReason ? { fallbackReason: started.fallbackReason } : {}),
        liveTensors: tf.memory().numTensors,
      });
    } catch (err) {
      this.post({ type: 'failed', id: -1, reason: describe(err) });
    }
  }

  private async step(msg: Extract<ToDevice, { type: 'step' }>): Promise<void> {
    const t0 = performance.now();
    try {
      if (!this.model) throw new Error('a step before the replica was built');
      const perSample = this.inputShape.reduce((a, b) => a * b, 1);
      if (msg.x.length !== msg.samples * perSample)
        throw new Error(
          `the chunk's inputs have ${msg.x.length} values, ${msg.samples} samples of shape [${this.inputShape.join(', ')}] need ${msg.samples * perSample}`,
        );
      const perTarget = this.targetShape().reduce((a, b) => a * b, 1);
      if (msg.y.length !== msg.samples * perTarget)
        throw new Error(`the chunk has ${msg.y.length} labels or targets for ${msg.samples} samples`);
      // Re-replicate: the main replica's weights before this forward.
      assignFlatWeights(this.model, msg.weights);
      const { loss, grads, correct } = await this.gradients(msg);
      this.post(
        { type: 'grads', id: msg.id, loss, grads, correct, computeMs: performance.now() - t0, liveTensors: tf.memory().numTensors },
        [grads.buffer],
      );
    } catch (err) {
      this.post({ type: 'failed', id: msg.id, reason: describe(err) });
    }
  }

  /** One sample's labels (all but the class axis of the output: [] for a classifier, [T] for a language model) or targets. */
  private targetShape(): number[] {
    return this.loss.kind === 'softmaxCrossEntropy' ? this.outputShape.slice(0, -1) : this.outputShape;
  }

  /** The chunk's mean loss, its gradients (flat, trainableWeights order) and the right predictions; every tensor disposed. */
  private async gradients(msg: Extract<ToDevice, { type: 'step' }>): Promise<{ loss: number; grads: Float32Array; correct: number }> {
    const model = this.model!;
    const loss = this.loss;
    const xs = tf.tensor(msg.x, [msg.samples, ...this.inputShape], 'float32');
    const ys = tf.tensor(msg.y, [msg.samples, ...this.targetShape()], loss.kind === 'softmaxCrossEntropy' ? 'int32' : 'float32');
    let correctT: tf.Tensor | undefined;
    let value: tf.Scalar | undefined;
    let named: tf.NamedTensorMap = {};
    let flat: tf.Tensor | undefined;
    try {
      ({ value, grads: named } = tf.variableGrads(() => {
        const out = model.apply(xs, { training: true }) as tf.Tensor;
        if (loss.kind === 'meanSquaredError') return tf.losses.meanSquaredError(ys, out) as tf.Scalar;
        correctT = tf.keep(correctPredictions(out, ys));
        return classificationLoss(out, ys, loss.numClasses);
      }, this.variables));
      flat = tf.tidy(() => tf.concat(this.variables.map((v) => named[v.name]!.reshape([-1]))));
      const [lossValue, gradValues, correctValue] = await Promise.all([
        value.data(),
        flat.data(),
        correctT ? correctT.data() : Promise.resolve(Int32Array.of(-1)),
      ]);
      return { loss: lossValue[0]!, grads: gradValues as Float32Array, correct: correctValue[0]! };
    } finally {
      tf.dispose([xs, ys, ...(correctT ? [correctT] : []), ...(value ? [value] : []), ...Object.values(named), ...(flat ? [flat] : [])]);
    }
  }
}
