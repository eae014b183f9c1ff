/**
 * A pipeline stage (torch.distributed.pipelining's PipelineStage): the layers of a model that
 * one rank holds, and one training step of them over micro-batches under a schedule (GPipe or
 * 1F1B, schedule.ts). Activations go forward to the next stage's rank and their gradients come
 * back, over the pipeline group's send/recv; the last stage computes the loss.
 *
 * A stage keeps only each micro-batch's input between its forward and its backward, and runs the
 * forward again in the backward (GPipe's re-materialisation): TF.js records no tape across calls.
 * The last stage sends nothing forward, so it runs its forward once, in the backward, with the loss.
 * The micro-batches' gradients accumulate on the stage's DistributedDataParallel (under
 * `noSync`); the last backward of the step averages them over the stage's replicas (a group of
 * one without data parallelism). Each micro-batch's loss is scaled by its share of the batch, so
 * the step's gradients are those of the whole batch's mean loss, as on one rank.
 */
import * as tf from '@tensorflow/tfjs';
import type { DistributedDataParallel } from '../ddp/ddp.ts';
import type { Straggler } from '../../runtime/straggler.ts';
import { sequentialOf, type LayerFactory } from '../../nn/models.ts';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { packHalf, unpackHalf } from '../../wire/half.ts';
import { microBatchSizes, peakStashed, scheduleActions, type Action, type ScheduleKind } from './schedule.ts';
import { balancedSplitPoints, checkSplitPoints, countTrainable, describeLayers, stageRanges, type LayerInfo } from './split.ts';

/** float16 on the wire lives in half.ts, shared with the collectives' 16-bit wire; re-exported for the stage's users. */
export { packHalf, unpackHalf };

export type ActivationDtype = 'float32' | 'float16';
export const ACTIVATION_DTYPES: readonly ActivationDtype[] = ['float32', 'float16'];

export interface PipelineStageOptions {
  /** The whole model's layers, in order (see `modelLayers`); only this stage's are built. */
  layers: LayerFactory[];
  /** The model's input shape, without the batch dimension. */
  inputShape: number[];
  /** The pipeline's group: its rank s holds stage s, and its size is the number of stages. */
  group: ProcessGroup;
  /** Where stages 1 .. S-1 start (layer indices). Default: balanced by parameter count. */
  splitPoints?: number[];
  /** The stage model's name. Default `stage<s>`. */
  name?: string;
}

export interface StageStepOptions {
  /** Wraps this stage's model on the stage's data-parallel group (a group of one without replicas). */
  ddp: DistributedDataParallel;
  /** Samples in this replica's batch; every stage of the pipeline gets the same. */
  batchSize: number;
  microBatches: number;
  /** Default 'gpipe'. */
  schedule?: ScheduleKind;
  /** How activations and their gradients travel between stages. Default float32; float16 halves the bytes (and is no longer exact). */
  activationDtype?: ActivationDtype;
  /** First stage: the batch's inputs, `batchSize` samples of the model's input shape, flat. */
  inputs?: Float32Array;
  /**
   * Last stage: the batch's labels, one per output position but the class axis (one per sample
   * for a classifier's [C]; T per sample for a language model's [T, V]), shaped so for `loss`.
   */
  labels?: Int32Array;
  /** Last stage: a micro-batch's mean loss from the model's outputs and its labels. */
  loss?: (outputs: tf.Tensor, labels: tf.Tensor) => tf.Scalar;
  /** Last stage: a figure summed over the batch's micro-batches (correct predictions, say). */
  metric?: (outputs: tf.Tensor, labels: tf.Tensor) => tf.Scalar;
  /**
   * A stage slowed on purpose (see straggler.ts): after each forward and backward pass (readbacks
   * included) it waits in proportion to the pass's compute, before sending its activations or
   * gradients on, so its neighbours wait for it as they would for a slower device.
   */
  straggler?: Pick<Straggler, 'after'>;
}

/** One forward or backward pass in a step, in ms from the step's start. */
export interface TimelineEntry extends Action {
  start: number;
  end: number;
}

export interface StageStepResult {
  /** Last stage: the batch's mean loss; NaN on other stages. */
  loss: number;
  /** Last stage: `metric` summed over the micro-batches; NaN on other stages. */
  metric: number;
  /** Where the step's time went, ms. */
  timings: {
    /** Forward and backward passes, readbacks included. */
    compute: number;
    /** Waiting for activations from the stage before. */
    waitActivations: number;
    /** Waiting for activation gradients from the stage after. */
    waitGradients: number;
    /** Waiting for the replicas' all-reduce after the last backward. */
    allreduce: number;
    /** Waited by `straggler` (a stage slowed on purpose), 0 without one. */
    slowed: number;
    /** The whole step on this stage, up to the last send. */
    total: number;
  };
  /** Idle share of this stage's step: 1 - (compute + slowed) / total (a slowed stage is busy while it waits). */
  bubble: number;
  timeline: TimelineEntry[];
  /** Most micro-batch inputs held at once. */
  peakStashed: number;
  /** Most live tensors during the step. */
  peakTensors: number;
}

/** One training step's state on this stage, shared by its forward and backward passes. */
interface StepRun {
  o: StageStepOptions;
  sizes: number[];
  /** Each micro-batch's first sample in the batch. */
  starts: number[];
  /** float16 activations: 16-bit values on the wire. */
  half: boolean;
  /** Each micro-batch's input, from its forward to its backward. */
  stash: Map<number, tf.Tensor>;
  /** Last stage: `metric` of each micro-batch, read once at the end. */
  metrics: tf.Tensor[];
  loss: number;
  sends: Array<Promise<void>>;
  t: Omit<StageStepResult['timings'], 'total'>;
}

/** Reads `t` back and disposes it, even when the readback fails. */
async function readAndDispose(t: tf.Tensor): Promise<Float32Array> {
  try {
    return (await t.data()) as Float32Array;
  } finally {
    t.dispose();
  }
}

export class PipelineStage {
  readonly stage: number;
  readonly numStages: number;
  /** This stage's layers only. */
  readonly model: tf.Sequential;
  /** Every layer of the model, and which stage holds it. */
  readonly allLayers: Array<LayerInfo & { stage: number }>;
  readonly splitPoints: number[];
  /** This stage's input and output shapes, without the batch dimension. */
  readonly inputShape: number[];
  readonly outputShape: number[];
  readonly group: ProcessGroup;
  private readonly inElems: number;
  private readonly outElems: number;

  constructor(o: PipelineStageOptions) {
    this.group = o.group;
    this.stage = o.group.rank;
    this.numStages = o.group.worldSize;
    const infos = describeLayers(o.layers, o.inputShape);
    const points =
      o.splitPoints ??
      balancedSplitPoints(
        infos.map((l) => l.parameters),
        this.numStages,
      );
    checkSplitPoints(points, infos.length, this.numStages);
    this.splitPoints = points;
    const ranges = stageRanges(points, infos.length);
    this.allLayers = infos.map((l) => ({ ...l, stage: ranges.findIndex((r) => l.index >= r.start && l.index < r.end) }));
    const { start, end } = ranges[this.stage]!;
    this.inputShape = infos[start]!.inputShape;
    this.outputShape = infos[end - 1]!.outputShape;
    this.model = sequentialOf(o.layers.slice(start, end), this.inputShape, o.name ?? `stage${this.stage}`);
    this.inElems = this.inputShape.reduce((a, b) => a * b, 1);
    this.outElems = this.outputShape.reduce((a, b) => a * b, 1);
  }

  get isFirst(): boolean {
    return this.stage === 0;
  }

  get isLast(): boolean {
    return this.stage === this.numStages - 1;
  }

  /** This stage's layers (indices into the model). */
  get layers(): Array<LayerInfo & { stage: number }> {
    return this.allLayers.filter((l) => l.stage === this.stage);
  }

  get parameterCount(): number {
    return countTrainable(this.model);
  }

  /**
   * One training step of this stage: every stage of the pipeline calls it with the same batch
   * size, micro-batches and schedule. Leaves the batch's gradients, averaged over the replicas,
   * on `ddp`: apply them with `ddp.step(optimizer)`.
   */
  async step(o: StageStepOptions): Promise<StageStepResult> {
    const t0 = performance.now();
    const sizes = microBatchSizes(o.batchSize, o.microBatches);
    checkMicroBatches(sizes.length);
    const starts = sizes.map((_, i) => sizes.slice(0, i).reduce((a, b) => a + b, 0));
    const actions = scheduleActions(o.schedule ?? 'gpipe', this.stage, this.numStages, sizes.length);
    const half = (o.activationDtype ?? 'float32') === 'float16';
    this.checkStepInputs(o);
    const t = { compute: 0, waitActivations: 0, waitGradients: 0, allreduce: 0, slowed: 0 };
    const run: StepRun = { o, sizes, starts, half, stash: new Map(), metrics: [], loss: 0, sends: [], t };
    const timeline: TimelineEntry[] = [];
    let peakTensors = tf.memory().numTensors;
    try {
      for (const a of actions) {
        const start = performance.now() - t0;
        if (a.phase === 'F') await this.forwardPass(run, a.microBatch);
        else await this.backwardPass(run, a.microBatch);
        timeline.push({ ...a, start, end: performance.now() - t0 });
        peakTensors = Math.max(peakTensors, tf.memory().numTensors);
      }
      await Promise.all(run.sends);
      let metric = NaN;
      if (this.isLast && o.metric) {
        metric = 0;
        for (const v of await Promise.all(run.metrics.map((m) => m.data()))) metric += v[0]!;
      }
      const total = performance.now() - t0;
      return {
        loss: this.isLast ? run.loss : NaN,
        metric,
        timings: { ...t, total },
        bubble: total > 0 ? Math.max(0, 1 - (t.compute + t.slowed) / total) : 0,
        timeline,
        peakStashed: peakStashed(actions),
        peakTensors,
      };
    } finally {
      for (const x of run.stash.values()) x.dispose();
      for (const m of run.metrics) m.dispose();
    }
  }

  /**
   * Micro-batch i's forward: its input (the batch's, or the activations of the stage before) is
   * stashed for its backward, and its activations are sent to the stage after.
   */
  private async forwardPass(run: StepRun, i: number): Promise<void> {
    const n = run.sizes[i]!;
    let x: tf.Tensor;
    if (this.isFirst) {
      x = tf.tensor(run.o.inputs!.subarray(run.starts[i]! * this.inElems, (run.starts[i]! + n) * this.inElems), [n, ...this.inputShape]);
    } else {
      const w0 = performance.now();
      const values = await this.recvFrom(run, n * this.inElems, this.stage - 1);
      run.t.waitActivations += performance.now() - w0;
      x = tf.tensor(values, [n, ...this.inputShape]);
    }
    run.stash.set(i, x);
    // The last stage's forward waits for its backward, which computes the loss once with
    // its gradients: a forward here would only be computed again.
    if (this.isLast) return;
    const c0 = performance.now();
    const values = await readAndDispose(tf.tidy(() => this.model.apply(x, { training: true }) as tf.Tensor));
    const took = performance.now() - c0;
    run.t.compute += took;
    await this.stretch(run, took);
    this.sendTo(run, values, this.stage + 1);
  }

  /**
   * Micro-batch i's backward, through DDP (the last micro-batch's synchronises the replicas):
   * the loss on the last stage, else the gradients from the stage after; the input's gradients
   * go to the stage before.
   */
  private async backwardPass(run: StepRun, i: number): Promise<void> {
    const { o, t } = run;
    const n = run.sizes[i]!;
    const x = run.stash.get(i)!;
    run.stash.delete(i);
    let dy: tf.Tensor | undefined;
    let ys: tf.Tensor | undefined;
    const xv = this.isFirst ? undefined : tf.variable(x, true);
    try {
      if (!this.isLast) {
        const w0 = performance.now();
        const values = await this.recvFrom(run, n * this.outElems, this.stage + 1);
        t.waitGradients += performance.now() - w0;
        dy = tf.tensor(values, [n, ...this.outputShape]);
      } else {
        ys = this.labelsOf(run, i);
      }
      const input = xv ?? x;
      // The gradient of sum(outputs * dy) is the chain rule's product with dy: the same
      // gradients as backpropagating through the whole model.
      const lossFn = this.isLast
        ? () => {
            const out = this.model.apply(input, { training: true }) as tf.Tensor;
            // The step's figure from the same forward, kept past the gradient computation.
            if (o.metric) run.metrics.push(tf.keep(o.metric(out, ys!)));
            return o.loss!(out, ys!).mul(n / o.batchSize) as tf.Scalar;
          }
        : () => tf.sum(tf.mul(this.model.apply(input, { training: true }) as tf.Tensor, dy!)) as tf.Scalar;
      const last = i === run.sizes.length - 1;
      // The straggler stretches the backward inside DDP, before the replicas' all-reduce.
      const backward = () =>
        o.ddp.backward(lossFn, { ...(xv ? { inputs: [xv] } : {}), ...(o.straggler ? { straggler: o.straggler } : {}) });
      const r = last ? await backward() : await o.ddp.noSync(backward);
      t.allreduce += r.timings.allreduce;
      t.compute += r.timings.compute + r.timings.readback;
      t.slowed += r.timings.slowed;
      // Each micro-batch's loss is scaled by its share of the batch: they add up to the batch's mean.
      run.loss += r.loss;
      const [dx] = r.inputGrads;
      if (dx) {
        const r0 = performance.now();
        const values = await readAndDispose(dx);
        const took = performance.now() - r0;
        t.compute += took;
        await this.stretch(run, took);
        this.sendTo(run, values, this.stage - 1);
      }
    } finally {
      x.dispose();
      xv?.dispose();
      dy?.dispose();
      ys?.dispose();
    }
  }

  /** The labels of micro-batch i (last stage). */
  private labelsOf(run: StepRun, i: number): tf.Tensor {
    const labelShape = this.outputShape.slice(0, -1);
    const perSample = labelShape.reduce((a, b) => a * b, 1);
    const { starts, sizes } = run;
    return tf.tensor(
      run.o.labels!.subarray(starts[i]! * perSample, (starts[i]! + sizes[i]!) * perSample),
      [sizes[i]!, ...labelShape],
      'int32',
    );
  }

  /** Stretches a pass's compute (--slow) before what follows it is sent. */
  private async stretch(run: StepRun, computeMs: number): Promise<void> {
    if (run.o.straggler) run.t.slowed += await run.o.straggler.after(computeMs);
  }

  /** Sends `values` to stage `peer` without waiting (packed to 16 bits with float16 activations). */
  private sendTo(run: StepRun, values: Float32Array, peer: number): void {
    const p = this.group.send(run.half ? packHalf(values) : values, peer);
    p.catch(() => {}); // the group breaks, and the next receive says why
    run.sends.push(p);
  }

  /** The next `elems` values from stage `peer`. */
  private async recvFrom(run: StepRun, elems: number, peer: number): Promise<Float32Array> {
    const buf = await this.group.recv(new Float32Array(run.half ? Math.ceil(elems / 2) : elems), peer);
    return run.half ? unpackHalf(buf, elems) : buf;
  }

  /**
   * Inference through the pipeline (no gradients): every stage calls it with the same batch
   * size. The first stage takes `inputs`; the last returns the model's outputs for the batch
   * (the caller disposes them); the others return null.
   */
  async forward(o: {
    batchSize: number;
    inputs?: Float32Array;
    microBatches?: number;
    activationDtype?: ActivationDtype;
  }): Promise<tf.Tensor | null> {
    if (this.isFirst && (!o.inputs || o.inputs.length !== o.batchSize * this.inElems)) {
      throw new RangeError(
        `stage 0 needs ${o.batchSize} samples of [${this.inputShape.join(', ')}] (${o.batchSize * this.inElems} floats), got ${o.inputs ? o.inputs.length : 'none'}`,
      );
    }
    const half = (o.activationDtype ?? 'float32') === 'float16';
    const sizes = microBatchSizes(o.batchSize, o.microBatches ?? 1);
    checkMicroBatches(sizes.length);
    const outs: tf.Tensor[] = [];
    const sends: Array<Promise<void>> = [];
    let at = 0;
    try {
      for (const n of sizes) {
        let x: tf.Tensor;
        if (this.isFirst) {
          x = tf.tensor(o.inputs!.subarray(at * this.inElems, (at + n) * this.inElems), [n, ...this.inputShape]);
        } else {
          const buf = await this.group.recv(new Float32Array(half ? Math.ceil((n * this.inElems) / 2) : n * this.inElems), this.stage - 1);
          x = tf.tensor(half ? unpackHalf(buf, n * this.inElems) : buf, [n, ...this.inputShape]);
        }
        at += n;
        const out = tf.tidy(() => this.model.predict(x) as tf.Tensor);
        x.dispose();
        if (this.isLast) {
          outs.push(out);
          continue;
        }
        let values: Float32Array;
        try {
          values = (await out.data()) as Float32Array;
        } finally {
          out.dispose();
        }
        const p = this.group.send(half ? packHalf(values) : values, this.stage + 1);
        p.catch(() => {});
        sends.push(p);
      }
      await Promise.all(sends);
      // The stages end a call together, the last first: across many calls (an evaluation), a
      // stage never runs more than one call's micro-batches ahead of the stage that takes them
      // (the receiver keeps at most maxSeqAhead messages waiting).
      if (!this.isLast) await this.group.recv(new Float32Array(1), this.stage + 1);
      if (!this.isFirst) await this.group.send(Float32Array.of(1), this.stage - 1);
      if (!this.isLast) return null;
      return outs.length === 1 ? outs.pop()! : tf.concat(outs);
    } finally {
      for (const t of outs) t.dispose();
    }
  }

  private checkStepInputs(o: StageStepOptions): void {
    if (this.isFirst) {
      const want = o.batchSize * this.inElems;
      if (!o.inputs || o.inputs.length !== want)
        throw new RangeError(
          `stage 0 needs the batch's inputs: ${o.batchSize} samples of [${this.inputShape.join(', ')}] (${want} floats), got ${o.inputs ? o.inputs.length : 'none'}`,
        );
    }
    if (this.isLast) {
      const want = o.batchSize * this.outputShape.slice(0, -1).reduce((a, b) => a * b, 1);
      if (!o.labels || o.labels.length !== want)
        throw new RangeError(
          `the last stage (${this.stage}) needs ${want} labels (${o.batchSize} samples of output [${this.outputShape.join(', ')}]), got ${o.labels ? o.labels.length : 'none'}`,
        );
      if (!o.loss) throw new RangeError(`the last stage (${this.stage}) needs a loss function`);
    }
  }
}

/**
 * Most micro-batches in one call. A stage sends a call's activations (and its gradients) without
 * waiting for the stage that takes them, and a receiver keeps at most `maxSeqAhead` (64) messages
 * from one peer waiting for receives it has not posted: more would fail the group.
 */
export const MAX_MICRO_BATCHES = 64;

function checkMicroBatches(count: number): void {
  if (count > MAX_MICRO_BATCHES)
    throw new RangeError(
      `at most ${MAX_MICRO_BATCHES} micro-batches per call, got ${count}: a stage sends them all before the next one takes any, and a receiver keeps at most ${MAX_MICRO_BATCHES} waiting`,
    );
}
