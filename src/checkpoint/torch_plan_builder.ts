/**
 * The plan of a PyTorch export (torch_export.ts): the torch modules in order, and how each TF.js
 * weight becomes a torch parameter. PlanBuilder is what each layer's mapper (torch_layers.ts)
 * adds to, with the checks of the numbers a topology gives.
 */
import { TorchExportError, shown } from './torch_export_errors.ts';

/** The Python classes the file may define beyond torch.nn's (the language model's layers). */
export type PythonHelper = 'TokenAndPositionEmbedding' | 'TransformerBlock';

export interface ParamPlan {
  torch: string;
  tf: string;
  /** torch's shape. */
  shape: number[];
  /** torch element j is TF element gather[j]; undefined: the same order. */
  gather?: Int32Array;
  /** A torch-only buffer with no TF.js weight (BatchNorm's num_batches_tracked): an int64 0. */
  counter?: true;
}

export interface Plan {
  modules: Array<{ name: string; ctor: string; from?: string }>;
  /** Python classes the modules use beyond torch.nn's (the language model's layers). */
  helpers: Set<PythonHelper>;
  /** In torch's state_dict order. */
  params: ParamPlan[];
  inputShape: number[];
  inputDtype: 'float32' | 'int64';
  /** The tab's input shape (TF.js layout), without the batch dimension. */
  tfInputShape: number[];
  /** Token ids the first layer takes (an embedding's rows); undefined: not a token model. */
  vocabSize?: number;
}

export type Config = Record<string, unknown>;

/** A tensor between layers: its TF.js shape (no batch), and whether it is an image (NHWC here, NCHW in torch). */
export interface Flow {
  shape: number[];
  image: boolean;
  /** A Flatten of an image [h, w, c] whose order the next Dense must undo. */
  flattened?: { h: number; w: number; c: number };
}

/** The plan as the layers add to it, and the tensor flowing between them. */
export class PlanBuilder {
  readonly plan: Plan;
  flow: Flow;
  /** Modules of each kind so far: they are named fc1, fc2, conv1, ... */
  private readonly counts = new Map<string, number>();

  constructor(tfInputShape: number[]) {
    this.plan = { modules: [], helpers: new Set(), params: [], inputShape: [], inputDtype: 'float32', tfInputShape };
    this.flow = { shape: tfInputShape, image: tfInputShape.length === 3 };
    this.plan.inputShape = this.flow.image ? [tfInputShape[2]!, tfInputShape[0]!, tfInputShape[1]!] : tfInputShape;
  }

  /** Adds a module of `kind` made by `ctor` for TF.js layer `from`; its name. */
  add(kind: string, ctor: string, from: string): string {
    const n = (this.counts.get(kind) ?? 0) + 1;
    this.counts.set(kind, n);
    const name = `${kind}${n}`;
    this.plan.modules.push({ name, ctor, from });
    return name;
  }

  /** Adds the module of a Keras activation (none for 'linear'). */
  addActivation(activation: unknown, layer: string): void {
    const a = activationModule(activation, this.flow.image, layer);
    if (a) this.add(a.kind, a.ctor, layer);
  }
}

export function pair(v: unknown, name: string, layer: string): [number, number] {
  const a = Array.isArray(v) ? v : [v, v];
  if (a.length !== 2 || !a.every((x) => Number.isSafeInteger(x) && (x as number) >= 1))
    throw new TorchExportError(layer, `its ${name} ${JSON.stringify(v)} is not one or two integers >= 1`);
  return a as [number, number];
}

/** A size from the topology, written into the Python file: an integer >= 1, never NaN or text. */
export function count(v: unknown, what: string, layer: string): number {
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 1) throw new TorchExportError(layer, `its ${what} ${shown(v)} is not an integer >= 1`);
  return n;
}

/** A hyperparameter from the topology, written into the Python file: a finite number (JS prints it as a Python float). */
export function real(v: unknown, what: string, layer: string): number {
  const n = Number(v);
  if (!Number.isFinite(n)) throw new TorchExportError(layer, `its ${what} ${shown(v)} is not a finite number`);
  return n;
}

/** Keras activations and their torch modules (softmax's axis is set per input below). */
const ACTIVATIONS: Readonly<Record<string, { kind: string; ctor: string } | null>> = {
  linear: null,
  relu: { kind: 'relu', ctor: 'nn.ReLU()' },
  relu6: { kind: 'relu', ctor: 'nn.ReLU6()' },
  sigmoid: { kind: 'sigmoid', ctor: 'nn.Sigmoid()' },
  tanh: { kind: 'tanh', ctor: 'nn.Tanh()' },
  softmax: { kind: 'softmax', ctor: 'nn.Softmax(dim=-1)' },
  elu: { kind: 'elu', ctor: 'nn.ELU()' },
  selu: { kind: 'selu', ctor: 'nn.SELU()' },
  softplus: { kind: 'softplus', ctor: 'nn.Softplus()' },
  softsign: { kind: 'softsign', ctor: 'nn.Softsign()' },
  swish: { kind: 'silu', ctor: 'nn.SiLU()' },
  mish: { kind: 'mish', ctor: 'nn.Mish()' },
  gelu: { kind: 'gelu', ctor: 'nn.GELU()' },
  gelu_new: { kind: 'gelu', ctor: "nn.GELU(approximate='tanh')" },
};

/** The torch module for a Keras activation; null for 'linear'. `image` puts softmax on the channel axis. */
function activationModule(activation: unknown, image: boolean, layer: string): { kind: string; ctor: string } | null {
  const name = String(activation ?? 'linear');
  if (!Object.hasOwn(ACTIVATIONS, name))
    throw new TorchExportError(
      layer,
      `its activation "${name}" has no torch module here (${Object.keys(ACTIVATIONS).join(', ')} are mapped)`,
    );
  const a = ACTIVATIONS[name]!;
  return a?.kind === 'softmax' && image ? { kind: 'softmax', ctor: 'nn.Softmax(dim=1)' } : a;
}
