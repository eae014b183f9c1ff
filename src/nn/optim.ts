/**
 * torch.optim on the host: SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW with
 * torch 1.13's formulas (`_single_tensor_sgd`, `_single_tensor_adam`, `_single_tensor_adamw`),
 * applied by `DistributedDataParallel.step` to a float32 master copy of the weights in plain
 * JavaScript, then uploaded to the device.
 *
 * Why on the host: each TF.js backend (WebGPU, WebGL, wasm, cpu) rounds sqrt, division and fused
 * ops its own way, so the same averaged gradients applied on two backends give weights that differ
 * in the last bits, and the difference grows until the replicas diverge (measured: a WebGPU tab and
 * a WebGL tab, 100 steps). JavaScript's arithmetic is IEEE-754 double on every engine, and every
 * formula below uses only +, -, *, / and Math.sqrt (correctly rounded by the standard) and rounds to
 * float32 with Math.fround where torch stores a float32 tensor: the same bits on Chromium, Firefox
 * and Safari, whatever the device. The bias corrections' beta^t are running products (Math.pow is
 * implementation-approximated), recomputed from the step count when a state is loaded.
 * The shape of ZeRO-Offload's CPU optimizer: devices compute gradients, the host owns the update.
 *
 * They extend `tf.Optimizer` so that TrainState, checkpoints and elastic state transfer carry them
 * as they carry TF.js's optimizers (`optimizerState` reads their state as bytes, with no device
 * round trip). They cannot run inside `tf.Optimizer.minimize`: the gradients are on the device
 * there; use `ddp.step(optimizer)`, or `stepFlat` with gradients on the host.
 *
 * Checked against torch 1.13 (Debian's python3-torch): bench/torch_optim_reference.py writes
 * test/fixtures/torch_optim.json, and test/optim.test.ts holds these classes to it.
 */
import * as tf from '@tensorflow/tfjs';
import type { TensorBundle, WeightSpec } from '../wire/tfjs_artifacts.ts';

const f32 = Math.fround;

/** TF.js's `{ name, tensor }` (not re-exported by @tensorflow/tfjs). */
type NamedTensor = { name: string; tensor: tf.Tensor };

/** Where each parameter lives in the flat buffers `stepFlat` takes (model.trainableWeights order). */
export interface ParamLayout {
  shape: number[];
  offset: number;
  size: number;
}

export class OptimizerStateError extends Error {
  override name = 'OptimizerStateError';
}

/** The host optimizers' common part: the flat state buffers, their layout, and the state dict. */
export abstract class HostOptimizer extends tf.Optimizer {
  /** Steps taken (torch keeps one per parameter; they are always equal here). */
  protected steps = 0;
  protected layout: ParamLayout[] | null = null;
  protected numel = 0;
  /** The per-element state buffers, by name (torch's state keys: exp_avg, exp_avg_sq, momentum_buffer). */
  protected readonly buffers = new Map<string, Float32Array>();
  learningRate: number;

  /** tf.Optimizer's own check says yes to any optimizer (it looks for minimize, applyGradients ...): look at the prototype chain. */
  static override [Symbol.hasInstance](instance: unknown): boolean {
    return typeof instance === 'object' && instance !== null && Object.prototype.isPrototypeOf.call(HostOptimizer.prototype, instance);
  }

  protected constructor(lr: number) {
    super();
    checkNumber('lr', lr, 0);
    this.learningRate = lr;
  }

  /** The names of this optimizer's state buffers, in the order they are saved. */
  protected abstract bufferNames(): string[];
  /** One update of `params` (float32, in place) from `grads`; `this.steps` already counts it. */
  protected abstract update(params: Float32Array, grads: Float32Array): void;

  /** Steps taken so far (torch's `state['step']`). */
  get stepCount(): number {
    return this.steps;
  }

  /**
   * torch's `optimizer.step()` for parameters and gradients on the host: updates `params` in place.
   * `layout` says which parameter each span is (its shape goes into the state dict); it must be the
   * same at every step.
   */
  stepFlat(params: Float32Array, grads: Float32Array, layout: ParamLayout[]): void {
    if (params.length !== grads.length)
      throw new RangeError(`stepFlat: ${params.length} parameter values but ${grads.length} gradient values`);
    this.attach(layout, params.length);
    this.steps++;
    this.update(params, grads);
  }

  private attach(layout: ParamLayout[], numel: number): void {
    const total = layout.reduce((s, p) => s + p.size, 0);
    if (total !== numel) throw new RangeError(`stepFlat: the layout covers ${total} values, the parameters have ${numel}`);
    if (this.layout === null) {
      this.layout = layout.map((p) => ({ shape: [...p.shape], offset: p.offset, size: p.size }));
      this.numel = numel;
      for (const name of this.bufferNames()) if (!this.buffers.has(name)) this.buffers.set(name, new Float32Array(numel));
      return;
    }
    const same =
      this.layout.length === layout.length && this.layout.every((p, i) => p.offset === layout[i]!.offset && p.size === layout[i]!.size);
    if (!same) throw new RangeError('stepFlat: the parameters changed between steps; an optimizer serves one model');
  }

  /** The state as specs and bytes (scalar `step`, then each buffer per parameter), exactly: no device involved. */
  stateBundle(): TensorBundle {
    if (this.layout === null) return { weightSpecs: [], weightData: new ArrayBuffer(0) };
    const names = this.bufferNames();
    const specs: WeightSpec[] = [{ name: 'step', shape: [], dtype: 'float32' }];
    const out = new Float32Array(1 + names.length * this.numel);
    out[0] = this.steps;
    let at = 1;
    for (const name of names) {
      const buf = this.buffers.get(name)!;
      this.layout.forEach((p, i) => {
        specs.push({ name: `${i}/${name}`, shape: [...p.shape], dtype: 'float32' });
      });
      out.set(buf, at);
      at += this.numel;
    }
    return { weightSpecs: specs, weightData: out.buffer };
  }

  /** Restores what `stateBundle` gave (from a checkpoint or another rank: every value is checked). */
  loadStateBundle(state: TensorBundle): void {
    const specs = state.weightSpecs;
    if (specs.length === 0) {
      this.steps = 0;
      this.layout = null;
      this.buffers.clear();
      return;
    }
    const names = this.bufferNames();
    if (names.length === 0) {
      // SGD without momentum keeps only its step count.
      const only = specs[0]!;
      const steps = new Float32Array(state.weightData)[0];
      if (
        specs.length !== 1 ||
        only.name !== 'step' ||
        only.shape.length !== 0 ||
        state.weightData.byteLength !== 4 ||
        !Number.isSafeInteger(steps) ||
        steps! < 0
      ) {
        throw new OptimizerStateError(
          `${this.getClassName()} state: expected only a scalar 'step' count, got ${specs.length} tensors starting with '${String(only.name).slice(0, 40)}'`,
        );
      }
      this.steps = steps!;
      this.layout = null;
      this.buffers.clear();
      return;
    }
    const perBuffer = (specs.length - 1) / names.length;
    if (specs[0]!.name !== 'step' || specs[0]!.shape.length !== 0 || !Number.isInteger(perBuffer)) {
      throw new OptimizerStateError(
        `${this.getClassName()} state: expected a scalar 'step' then ${names.join(', ')} per parameter, got ${specs.length} tensors starting with '${String(specs[0]!.name).slice(0, 40)}'`,
      );
    }
    const layout: ParamLayout[] = [];
    let offset = 0;
    for (let i = 0; i < perBuffer; i++) {
      const shape = specs[1 + i]!.shape;
      const size = shape.reduce((a, b) => a * b, 1);
      layout.push({ shape: [...shape], offset, size });
      offset += size;
    }
    names.forEach((name, b) => {
      for (let i = 0; i < perBuffer; i++) {
        const spec = specs[1 + b * perBuffer + i]!;
        if (spec.name !== `${i}/${name}` || spec.dtype !== 'float32' || spec.shape.join(',') !== layout[i]!.shape.join(',')) {
          throw new OptimizerStateError(
            `${this.getClassName()} state: tensor ${1 + b * perBuffer + i} is '${String(spec.name).slice(0, 40)}' [${spec.shape.join(', ')}], expected '${i}/${name}' [${layout[i]!.shape.join(', ')}]`,
          );
        }
      }
    });
    const values = new Float32Array(state.weightData);
    if (values.length !== 1 + names.length * offset)
      throw new OptimizerStateError(`${this.getClassName()} state: ${values.length} values, its specs need ${1 + names.length * offset}`);
    const steps = values[0]!;
    if (!Number.isSafeInteger(steps) || steps < 0)
      throw new OptimizerStateError(`${this.getClassName()} state: step ${steps} is not a count`);
    for (let i = 1; i < values.length; i++) {
      if (!Number.isFinite(values[i]!))
        throw new OptimizerStateError(`${this.getClassName()} state: value ${i} is ${values[i]}; non-finite state is never loaded`);
    }
    this.steps = steps;
    this.layout = layout;
    this.numel = offset;
    this.buffers.clear();
    names.forEach((name, b) => {
      this.buffers.set(name, values.slice(1 + b * offset, 1 + (b + 1) * offset));
    });
    this.restored();
  }

  /** Called after a state is loaded (Adam recomputes its beta powers from the step count). */
  protected restored(): void {}

  /** The gradients are on the device here: a host optimizer takes them through `ddp.step(optimizer)`. */
  applyGradients(): void {
    throw new Error(
      `${this.getClassName()} is a host optimizer (src/nn/optim.ts): apply it with ddp.step(optimizer), or stepFlat(params, grads, layout) with gradients on the host; it cannot run inside tf.Optimizer.minimize`,
    );
  }

  override async getWeights(): Promise<NamedTensor[]> {
    const bundle = this.stateBundle();
    const values = new Float32Array(bundle.weightData);
    let at = 0;
    return bundle.weightSpecs.map((s) => {
      const size = s.shape.reduce((a, b) => a * b, 1);
      const tensor = tf.tensor(values.slice(at, at + size), s.shape, 'float32');
      at += size;
      return { name: s.name, tensor };
    });
  }

  override async setWeights(weightValues: NamedTensor[]): Promise<void> {
    const specs: WeightSpec[] = weightValues.map((w) => ({ name: w.name, shape: [...w.tensor.shape], dtype: 'float32' }));
    const total = weightValues.reduce((s, w) => s + w.tensor.size, 0);
    const data = new Float32Array(total);
    let at = 0;
    for (const w of weightValues) {
      data.set((await w.tensor.data()) as Float32Array, at);
      at += w.tensor.size;
    }
    this.loadStateBundle({ weightSpecs: specs, weightData: data.buffer });
  }

  override dispose(): void {
    this.buffers.clear();
  }
}

export interface SGDOptions {
  lr: number;
  momentum?: number;
  dampening?: number;
  weightDecay?: number;
  nesterov?: boolean;
}

/** torch.optim.SGD (torch 1.13 `_single_tensor_sgd`). */
export class SGD extends HostOptimizer {
  static className = 'HostSGD';
  readonly momentum: number;
  readonly dampening: number;
  readonly weightDecay: number;
  readonly nesterov: boolean;

  constructor(o: SGDOptions) {
    super(o.lr);
    this.momentum = o.momentum ?? 0;
    this.dampening = o.dampening ?? 0;
    this.weightDecay = o.weightDecay ?? 0;
    this.nesterov = o.nesterov ?? false;
    checkNumber('momentum', this.momentum, 0);
    checkNumber('dampening', this.dampening, 0);
    checkNumber('weightDecay', this.weightDecay, 0);
    if (this.nesterov && (this.momentum <= 0 || this.dampening !== 0))
      throw new RangeError('SGD: Nesterov momentum requires a momentum and zero dampening (as torch)');
  }

  protected bufferNames(): string[] {
    return this.momentum !== 0 ? ['momentum_buffer'] : [];
  }

  protected update(p: Float32Array, g: Float32Array): void {
    // torch casts Python scalars to the tensor's float32 before the kernel.
    const wd = f32(this.weightDecay);
    const mom = f32(this.momentum);
    const keep = f32(1 - this.dampening);
    const negLr = f32(-this.learningRate);
    const buf = this.momentum !== 0 ? this.buffers.get('momentum_buffer')! : null;
    const first = this.steps === 1;
    for (let i = 0; i < p.length; i++) {
      let d = g[i]!;
      if (wd !== 0) d = f32(d + wd * p[i]!);
      if (buf) {
        const b = first ? d : f32(f32(buf[i]! * mom) + keep * d);
        buf[i] = b;
        d = this.nesterov ? f32(d + mom * b) : b;
      }
      p[i] = f32(p[i]! + negLr * d);
    }
  }

  getConfig(): tf.serialization.ConfigDict {
    return {
      lr: this.learningRate,
      momentum: this.momentum,
      dampening: this.dampening,
      weightDecay: this.weightDecay,
      nesterov: this.nesterov,
    };
  }
}

export interface AdamOptions {
  lr?: number;
  betas?: [number, number];
  eps?: number;
  weightDecay?: number;
}

/** torch.optim.Adam (torch 1.13 `_single_tensor_adam`, without amsgrad); `decoupled` makes it AdamW. */
export class Adam extends HostOptimizer {
  static className = 'HostAdam';
  readonly beta1: number;
  readonly beta2: number;
  readonly eps: number;
  readonly weightDecay: number;
  /** beta^t as running products in double, so that every engine computes the same bits. */
  private beta1Power = 1;
  private beta2Power = 1;

  constructor(
    o: AdamOptions = {},
    protected readonly decoupled = false,
  ) {
    super(o.lr ?? 1e-3);
    [this.beta1, this.beta2] = o.betas ?? [0.9, 0.999];
    this.eps = o.eps ?? 1e-8;
    this.weightDecay = o.weightDecay ?? (decoupled ? 1e-2 : 0);
    checkNumber('betas[0]', this.beta1, 0, 1);
    checkNumber('betas[1]', this.beta2, 0, 1);
    checkNumber('eps', this.eps, 0);
    checkNumber('weightDecay', this.weightDecay, 0);
  }

  protected bufferNames(): string[] {
    return ['exp_avg', 'exp_avg_sq'];
  }

  protected override restored(): void {
    this.beta1Power = 1;
    this.beta2Power = 1;
    for (let t = 0; t < this.steps; t++) {
      this.beta1Power *= this.beta1;
      this.beta2Power *= this.beta2;
    }
  }

  protected update(p: Float32Array, g: Float32Array): void {
    const lr = this.learningRate;
    this.beta1Power *= this.beta1;
    this.beta2Power *= this.beta2;
    // Python floats (double) as torch computes them, cast to float32 where they enter a kernel.
    const stepSize = lr / (1 - this.beta1Power);
    const bc2Sqrt = f32(Math.sqrt(1 - this.beta2Power));
    const negStep = f32(-stepSize);
    const b1 = f32(this.beta1);
    const b2 = f32(this.beta2);
    const a1 = f32(1 - this.beta1);
    const a2 = f32(1 - this.beta2);
    const eps = f32(this.eps);
    const wd = f32(this.weightDecay);
    const decay = f32(1 - lr * this.weightDecay);
    const m = this.buffers.get('exp_avg')!;
    const v = this.buffers.get('exp_avg_sq')!;
    for (let i = 0; i < p.length; i++) {
      let gi = g[i]!;
      let pi = p[i]!;
      if (this.decoupled) pi = f32(pi * decay);
      else if (wd !== 0) gi = f32(gi + wd * pi);
      const mi = f32(f32(m[i]! * b1) + a1 * gi);
      const vi = f32(f32(v[i]! * b2) + f32(a2 * gi) * gi);
      m[i] = mi;
      v[i] = vi;
      const denom = f32(f32(f32(Math.sqrt(vi)) / bc2Sqrt) + eps);
      p[i] = f32(pi + f32(f32(negStep * mi) / denom));
    }
  }

  getConfig(): tf.serialization.ConfigDict {
    return {
      lr: this.learningRate,
      betas: [this.beta1, this.beta2],
      eps: this.eps,
      weightDecay: this.weightDecay,
      decoupled: this.decoupled,
    };
  }
}

/** torch.optim.AdamW (torch 1.13 `_single_tensor_adamw`: decoupled weight decay, default 1e-2). */
export class AdamW extends Adam {
  static override className = 'HostAdamW';
  constructor(o: AdamOptions = {}) {
    super(o, true);
  }
}

function checkNumber(name: string, v: number, min: number, maxExclusive?: number): void {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || (maxExclusive !== undefined && v >= maxExclusive)) {
    throw new RangeError(
      `optimizer option ${name} must be a finite number >= ${min}${maxExclusive !== undefined ? ` and < ${maxExclusive}` : ''}, got ${String(v)}`,
    );
  }
}
