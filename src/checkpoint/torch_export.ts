/**
 * A trained model for PyTorch: the model's weights as a safetensors state dict with torch's names
 * and layouts, and a Python file defining the matching `torch.nn.Module`, so that
 *
 *   from model import Model, load_file
 *   model = Model(); model.load_state_dict(load_file("model.safetensors"))
 *
 * works, and the module computes what the tab's model computes (channels-first inputs).
 * `importTorchStateDict` goes back: a state dict saved by torch into a tab's model.
 *
 * Works from the model's TF.js topology (what a checkpoint or `model.save` holds), with no
 * TF.js at all, so the CLI (`npm run export:torch`) converts a checkpoint file in Node.
 *
 * Layouts: a Dense kernel [in, out] becomes nn.Linear's weight [out, in]; a Conv2D kernel
 * [kh, kw, in, out] becomes nn.Conv2d's [out, in, kh, kw]; images are NHWC in the tab and NCHW in
 * torch, so a Dense after a Flatten of an image gets its input columns reordered (torch flattens
 * C, H, W; TF.js flattens H, W, C) and the module stays a plain nn.Flatten + nn.Linear.
 */
import { pythonTextHelpers, vocabularyProblem } from './torch_export_text.ts';
import { encodeSafetensors, decodeSafetensors, type NamedTensor } from './safetensors.ts';
import { topologyLayers, type LayerJson, type WeightSpec } from './checkpoint_format.ts';

/** What the exporter reads: a model's topology and weights (a checkpoint's `model`, or `modelArtifacts`). */
export interface ModelArtifactsLike {
  modelTopology: unknown;
  weightSpecs: WeightSpec[];
  weightData: ArrayBuffer;
}

/** A layer the export cannot map onto torch: which layer, and why. */
export class TorchExportError extends Error {
  override name = 'TorchExportError';
  constructor(
    /** The TF.js layer's name, when the problem is one layer's. */
    readonly layer: string | undefined,
    readonly reason: string,
  ) {
    super(layer === undefined ? `cannot export to PyTorch: ${reason}` : `cannot export layer "${layer}" to PyTorch: ${reason}`);
  }
}

/**
 * TF.js's own pattern for tensor names (tfjs-layers' `isValidTensorName`); layer names are the
 * first part of their weights' names, so they must match it too. Nothing outside it reaches the
 * Python file: a name is data there, and a newline in one would be code.
 */
export const TFJS_NAME_PATTERN = /^[A-Za-z0-9][-A-Za-z0-9._/]*$/;

/** A layer or weight name outside `TFJS_NAME_PATTERN`: which name, which kind, which file. */
export class TorchExportNameError extends TorchExportError {
  override name = 'TorchExportNameError';
  readonly pattern = TFJS_NAME_PATTERN;
  constructor(
    readonly kind: 'layer' | 'weight',
    /** The refused name, as the file holds it. */
    readonly invalidName: unknown,
    /** The options' `source` (the file the model came from), when given. */
    readonly file: string | undefined,
  ) {
    // JSON: the message shows control characters escaped, on one line, and a long name cut.
    super(undefined, `the ${kind} name ${shown(invalidName)}${file === undefined ? '' : ` in ${shown(file)}`} is not a valid TF.js name (${String(TFJS_NAME_PATTERN)}: a letter or digit, then letters, digits, - . _ /)`);
  }
}

function shown(v: unknown): string {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 200 ? `${s.slice(0, 200)}...` : s;
}

function checkName(kind: 'layer' | 'weight', name: unknown, file: string | undefined): string {
  if (typeof name !== 'string' || !TFJS_NAME_PATTERN.test(name)) throw new TorchExportNameError(kind, name, file);
  return name;
}

/**
 * A Python string literal holding exactly `s`: printable ASCII as it is, `"` and `\` escaped, every
 * other character as \xNN, \uNNNN or \UNNNNNNNN. It cannot end early or span lines, also inside
 * a triple-quoted string, so it is how any string from a file goes into the Python file.
 */
export function pythonString(s: string): string {
  let out = '"';
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (ch === '"' || ch === '\\') out += `\\${ch}`;
    else if (c >= 0x20 && c < 0x7f) out += ch;
    else if (c <= 0xff) out += `\\x${c.toString(16).padStart(2, '0')}`;
    else if (c <= 0xffff) out += `\\u${c.toString(16).padStart(4, '0')}`;
    else out += `\\U${c.toString(16).padStart(8, '0')}`;
  }
  return `${out}"`;
}

export interface TorchExport {
  /** The state dict, torch's names and layouts (safetensors). */
  safetensors: Uint8Array<ArrayBuffer>;
  /** A Python file defining `Model` (an nn.Sequential) and `load_file`. */
  python: string;
  /** The module's input shape without the batch dimension, torch's layout (an image: [C, H, W]). */
  inputShape: number[];
  /** 'float32', or 'int64' for a model starting with an Embedding (token ids). */
  inputDtype: 'float32' | 'int64';
  /** Each state-dict entry's torch name and the TF.js weight it comes from. */
  names: Array<{ torch: string; tf: string }>;
}

export interface TorchExportOptions {
  /**
   * Where the weights came from (a checkpoint's file name, for instance): written into the Python
   * file as an escaped string literal and into the safetensors metadata, and named by a refusal of
   * the model's names.
   */
  source?: string;
  /**
   * The files' base name: `<fileName>.safetensors` and `<fileName>.py`, as the Python file's
   * docstring and its `__main__` name them. Default "model". A Python module name: letters,
   * digits and _ (anything else becomes _; nothing left: "model").
   */
  fileName?: string;
  /**
   * A language model's vocabulary: token id i is character `vocabulary[i]` (CharTokenizer's
   * `chars`). The Python file then holds it as data, with `encode`, `decode` and `generate`.
   * Untrusted (a checkpoint's meta): checked against the model's embedding, refused saying why.
   */
  vocabulary?: readonly string[];
}

// ---------------------------------------------------------------------------------------------
// The plan: torch modules, and how each TF.js weight becomes a torch parameter

interface ParamPlan {
  torch: string;
  tf: string;
  /** torch's shape. */
  shape: number[];
  /** torch element j is TF element gather[j]; undefined: the same order. */
  gather?: Int32Array;
  /** A torch-only buffer with no TF.js weight (BatchNorm's num_batches_tracked): an int64 0. */
  counter?: true;
}

interface Plan {
  modules: Array<{ name: string; ctor: string; from?: string }>;
  /** Python classes the modules use beyond torch.nn's (the language model's layers). */
  helpers: Set<keyof typeof PYTHON_HELPERS>;
  /** In torch's state_dict order. */
  params: ParamPlan[];
  inputShape: number[];
  inputDtype: 'float32' | 'int64';
  /** The tab's input shape (TF.js layout), without the batch dimension. */
  tfInputShape: number[];
  /** Token ids the first layer takes (an embedding's rows); undefined: not a token model. */
  vocabSize?: number;
}

type Config = Record<string, unknown>;

/** A tensor between layers: its TF.js shape (no batch), and whether it is an image (NHWC here, NCHW in torch). */
interface Flow {
  shape: number[];
  image: boolean;
  /** A Flatten of an image [h, w, c] whose order the next Dense must undo. */
  flattened?: { h: number; w: number; c: number };
}

/** The model's layers, each layer's name checked against TF.js's pattern before anything uses it. */
function layersOf(topology: unknown, file: string | undefined): LayerJson[] {
  const { className, layers } = topologyLayers(topology);
  if (className === undefined) throw new TorchExportError(undefined, 'the model has no topology (a TF.js Layers model is needed, as model.save() writes it)');
  layers.forEach((layer: unknown, i) => {
    const config = typeof layer === 'object' && layer !== null ? (layer as { config?: unknown }).config : undefined;
    if (typeof config !== 'object' || config === null) throw new TorchExportError(undefined, `layer ${i} of the topology has no config`);
    checkName('layer', (config as { name?: unknown }).name, file);
  });
  if (className === 'Sequential') return layers;
  if (className === 'Model' || className === 'Functional') {
    // A functional model is exported when it is a chain: each layer fed by the one before it.
    layers.forEach((layer, i) => {
      if (i === 0) return;
      const nodes = (layer as unknown as { inbound_nodes?: unknown[][] }).inbound_nodes ?? [];
      const from = nodes.length === 1 && nodes[0]!.length === 1 ? (nodes[0]![0] as unknown[])[0] : undefined;
      const previous = String(layers[i - 1]!.config.name);
      if (from !== previous) throw new TorchExportError(String(layer.config.name), `it is not fed by the layer before it ("${previous}") alone: only a chain of layers (a Sequential) is exported`);
    });
    return layers;
  }
  throw new TorchExportError(undefined, `the model is a ${className}; a Sequential or a chain of layers is exported`);
}

function pair(v: unknown, name: string, layer: string): [number, number] {
  const a = Array.isArray(v) ? v : [v, v];
  if (a.length !== 2 || !a.every((x) => Number.isSafeInteger(x) && (x as number) >= 1)) throw new TorchExportError(layer, `its ${name} ${JSON.stringify(v)} is not one or two integers >= 1`);
  return a as [number, number];
}

/** A size from the topology, written into the Python file: an integer >= 1, never NaN or text. */
function count(v: unknown, what: string, layer: string): number {
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 1) throw new TorchExportError(layer, `its ${what} ${shown(v)} is not an integer >= 1`);
  return n;
}

/** A hyperparameter from the topology, written into the Python file: a finite number (JS prints it as a Python float). */
function real(v: unknown, what: string, layer: string): number {
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
  if (!Object.hasOwn(ACTIVATIONS, name)) throw new TorchExportError(layer, `its activation "${name}" has no torch module here (${Object.keys(ACTIVATIONS).join(', ')} are mapped)`);
  const a = ACTIVATIONS[name]!;
  return a?.kind === 'softmax' && image ? { kind: 'softmax', ctor: 'nn.Softmax(dim=1)' } : a;
}

/** A Python module name from a file name: letters, digits and _, not starting with a digit. */
export function pythonModuleName(name: string): string {
  return name.replace(/[^A-Za-z0-9_]/g, '_').replace(/^(?=\d)/, '_');
}

/** tf [in, out] -> torch [out, in]; `rows` maps a TF input row to torch's (a Flatten's reordering). */
function denseGather(inputs: number[], units: number, flattened?: { h: number; w: number; c: number }): Int32Array {
  const n = inputs.reduce((a, b) => a * b, 1);
  const g = new Int32Array(n * units);
  for (let i = 0; i < n; i++) {
    let t = i;
    if (flattened) {
      // tf row i = (y * w + x) * c + ch; torch column = (ch * h + y) * w + x
      const { h, w, c } = flattened;
      const ch = i % c;
      const yx = (i - ch) / c;
      t = ch * h * w + yx;
    }
    for (let o = 0; o < units; o++) g[o * n + t] = i * units + o;
  }
  return g;
}

/** tf [kh, kw, in, out] -> torch [out, in, kh, kw]. */
function convGather(kh: number, kw: number, cin: number, cout: number): Int32Array {
  const g = new Int32Array(kh * kw * cin * cout);
  for (let o = 0; o < cout; o++)
    for (let c = 0; c < cin; c++)
      for (let y = 0; y < kh; y++) for (let x = 0; x < kw; x++) g[((o * cin + c) * kh + y) * kw + x] = ((y * kw + x) * cin + c) * cout + o;
  return g;
}

/** TF's 'same' padding along one axis: [before, after] and the output size. */
function samePadding(size: number, k: number, s: number, d: number): { before: number; after: number; out: number } {
  const out = Math.ceil(size / s);
  const total = Math.max((out - 1) * s + (k - 1) * d + 1 - size, 0);
  const before = Math.floor(total / 2);
  return { before, after: total - before, out };
}

function lastAxis(axis: unknown, rank: number): boolean {
  const a = Array.isArray(axis) ? (axis.length === 1 ? axis[0] : undefined) : (axis ?? -1);
  return a === -1 || a === rank; // rank counts the batch axis out; Keras counts it in
}

function makePlan(topology: unknown, file: string | undefined): Plan {
  const layers = layersOf(topology, file);
  if (layers.length === 0) throw new TorchExportError(undefined, 'the model has no layers');
  const first = layers[0]!.config;
  const batchShape = (first.batch_input_shape ?? first.batchInputShape) as Array<number | null> | undefined;
  if (!Array.isArray(batchShape) || batchShape.length < 2 || !batchShape.slice(1).every((d) => Number.isSafeInteger(d) && (d as number) >= 1)) {
    throw new TorchExportError(String(first.name), 'the first layer has no fixed input shape (batch_input_shape [null, ...]); build the model with inputShape');
  }
  const tfInputShape = batchShape.slice(1) as number[];
  const counts = new Map<string, number>();
  const next = (kind: string) => {
    const n = (counts.get(kind) ?? 0) + 1;
    counts.set(kind, n);
    return `${kind}${n}`;
  };
  const plan: Plan = { modules: [], helpers: new Set(), params: [], inputShape: [], inputDtype: 'float32', tfInputShape };
  let flow: Flow = { shape: tfInputShape, image: tfInputShape.length === 3 };
  plan.inputShape = flow.image ? [tfInputShape[2]!, tfInputShape[0]!, tfInputShape[1]!] : tfInputShape;
  const add = (kind: string, ctor: string, from: string) => {
    const name = next(kind);
    plan.modules.push({ name, ctor, from });
    return name;
  };
  const addActivation = (activation: unknown, layer: string) => {
    const a = activationModule(activation, flow.image, layer);
    if (a) add(a.kind, a.ctor, layer);
  };
  const channelsLast = (c: Config, layer: string) => {
    if ((c.data_format ?? 'channels_last') !== 'channels_last') throw new TorchExportError(layer, `its data_format is ${String(c.data_format)}; channels_last (TF.js's) is exported`);
  };

  for (const [index, { class_name: kind, config: c }] of layers.entries()) {
    const name = c.name as string; // checked in layersOf
    const weight = (w: string) => `${name}/${w}`;
    // A Flatten of an image may pass element-wise layers on its way to its Dense; nothing else.
    if (flow.flattened && !['Dense', 'Dropout', 'Activation', 'ReLU', 'LeakyReLU', 'ELU'].includes(kind)) {
      throw new TorchExportError(name, 'it follows a Flatten of an image [h, w, c] before any Dense layer; only a Dense (after element-wise layers) can take the reordering to torch\'s channels-first flatten');
    }
    switch (kind) {
      case 'InputLayer':
        break;
      case 'Dense': {
        if (flow.image) throw new TorchExportError(name, `it is applied to an image [${flow.shape.join(', ')}] without a Flatten; Flatten first`);
        const units = count(c.units, 'units', name);
        const inputs = flow.shape[flow.shape.length - 1]!;
        const fc = add('fc', `nn.Linear(${inputs}, ${units}, bias=${c.use_bias === false ? 'False' : 'True'})`, name);
        plan.params.push({ torch: `${fc}.weight`, tf: weight('kernel'), shape: [units, inputs], gather: denseGather([inputs], units, flow.flattened) });
        if (c.use_bias !== false) plan.params.push({ torch: `${fc}.bias`, tf: weight('bias'), shape: [units] });
        flow = { shape: [...flow.shape.slice(0, -1), units], image: false };
        addActivation(c.activation, name);
        break;
      }
      case 'Conv2D': {
        channelsLast(c, name);
        if (!flow.image) throw new TorchExportError(name, `its input [${flow.shape.join(', ')}] is not an image [h, w, c]`);
        const [h, w, cin] = flow.shape as [number, number, number];
        const [kh, kw] = pair(c.kernel_size, 'kernel_size', name);
        const [sh, sw] = pair(c.strides ?? 1, 'strides', name);
        const [dh, dw] = pair(c.dilation_rate ?? 1, 'dilation_rate', name);
        const filters = count(c.filters, 'filters', name);
        let padding = '0';
        let oh: number;
        let ow: number;
        if (c.padding === 'same') {
          const py = samePadding(h, kh, sh, dh);
          const px = samePadding(w, kw, sw, dw);
          [oh, ow] = [py.out, px.out];
          if (py.before === py.after && px.before === px.after) padding = `(${py.before}, ${px.before})`;
          else add('pad', `nn.ZeroPad2d((${px.before}, ${px.after}, ${py.before}, ${py.after}))`, name); // TF pads the extra row/column after
        } else if ((c.padding ?? 'valid') === 'valid') {
          oh = Math.floor((h - (kh - 1) * dh - 1) / sh) + 1;
          ow = Math.floor((w - (kw - 1) * dw - 1) / sw) + 1;
        } else throw new TorchExportError(name, `its padding "${String(c.padding)}" is not valid or same`);
        if (c.groups !== undefined && c.groups !== 1) throw new TorchExportError(name, 'grouped convolutions are not exported');
        const conv = add('conv', `nn.Conv2d(${cin}, ${filters}, kernel_size=(${kh}, ${kw}), stride=(${sh}, ${sw}), padding=${padding}, dilation=(${dh}, ${dw}), bias=${c.use_bias === false ? 'False' : 'True'})`, name);
        plan.params.push({ torch: `${conv}.weight`, tf: weight('kernel'), shape: [filters, cin, kh, kw], gather: convGather(kh, kw, cin, filters) });
        if (c.use_bias !== false) plan.params.push({ torch: `${conv}.bias`, tf: weight('bias'), shape: [filters] });
        flow = { shape: [oh, ow, filters], image: true };
        addActivation(c.activation, name);
        break;
      }
      case 'MaxPooling2D':
      case 'AveragePooling2D': {
        channelsLast(c, name);
        if (!flow.image) throw new TorchExportError(name, `its input [${flow.shape.join(', ')}] is not an image [h, w, c]`);
        const [h, w, ch] = flow.shape as [number, number, number];
        const [kh, kw] = pair(c.pool_size ?? 2, 'pool_size', name);
        const [sh, sw] = pair(c.strides ?? [kh, kw], 'strides', name);
        const max = kind === 'MaxPooling2D';
        let oh = Math.floor((h - kh) / sh) + 1;
        let ow = Math.floor((w - kw) / sw) + 1;
        if (c.padding === 'same') {
          const py = samePadding(h, kh, sh, 1);
          const px = samePadding(w, kw, sw, 1);
          [oh, ow] = [py.out, px.out];
          if (py.before + py.after + px.before + px.after > 0) {
            // TF's padded pool ignores the padding; a max pool does so with -inf padding, an average pool cannot here.
            if (!max) throw new TorchExportError(name, "an average pool with 'same' padding averages over fewer elements at the border, which torch's AvgPool2d does not do for this padding; use 'valid'");
            add('pad', `nn.ConstantPad2d((${px.before}, ${px.after}, ${py.before}, ${py.after}), float('-inf'))`, name);
          }
        }
        add('pool', max ? `nn.MaxPool2d(kernel_size=(${kh}, ${kw}), stride=(${sh}, ${sw}))` : `nn.AvgPool2d(kernel_size=(${kh}, ${kw}), stride=(${sh}, ${sw}))`, name);
        flow = { shape: [oh, ow, ch], image: true };
        break;
      }
      case 'GlobalAveragePooling2D':
      case 'GlobalMaxPooling2D': {
        channelsLast(c, name);
        if (!flow.image) throw new TorchExportError(name, `its input [${flow.shape.join(', ')}] is not an image [h, w, c]`);
        add('pool', kind === 'GlobalMaxPooling2D' ? 'nn.AdaptiveMaxPool2d(1)' : 'nn.AdaptiveAvgPool2d(1)', name);
        add('flatten', 'nn.Flatten()', name);
        flow = { shape: [flow.shape[2]!], image: false };
        break;
      }
      case 'Flatten': {
        const size = flow.shape.reduce((a, b) => a * b, 1);
        const [h, w, ch] = flow.shape as [number, number, number];
        const reorder = flow.image && ch > 1 && h * w > 1;
        add('flatten', 'nn.Flatten()', name);
        flow = { shape: [size], image: false, ...(reorder ? { flattened: { h, w, c: ch } } : {}) };
        break;
      }
      case 'Dropout':
        add('dropout', `nn.Dropout(p=${real(c.rate ?? 0, 'rate', name)})`, name);
        break;
      case 'Activation':
        addActivation(c.activation, name);
        break;
      case 'ReLU':
        if (c.max_value !== undefined && c.max_value !== null) throw new TorchExportError(name, 'a ReLU with max_value is not exported');
        add('relu', 'nn.ReLU()', name);
        break;
      case 'LeakyReLU':
        add('leaky_relu', `nn.LeakyReLU(negative_slope=${real(c.alpha ?? 0.3, 'alpha', name)})`, name);
        break;
      case 'ELU':
        add('elu', `nn.ELU(alpha=${real(c.alpha ?? 1, 'alpha', name)})`, name);
        break;
      case 'Softmax':
        if (!lastAxis(c.axis, flow.shape.length)) throw new TorchExportError(name, 'a softmax over an axis other than the last is not exported');
        add('softmax', `nn.Softmax(dim=${flow.image ? 1 : -1})`, name);
        break;
      case 'BatchNormalization': {
        if (!lastAxis(c.axis, flow.shape.length)) throw new TorchExportError(name, 'a batch norm over an axis other than the last (the channels) is not exported');
        if (flow.shape.length === 2) throw new TorchExportError(name, "a batch norm of a sequence [t, d] has no torch module of the same layout (BatchNorm1d wants [N, C, L])");
        const scale = c.scale !== false;
        const center = c.center !== false;
        if (scale !== center) throw new TorchExportError(name, "torch's batch norm has a weight and a bias or neither; this layer has only one (center and scale differ)");
        const features = flow.shape[flow.shape.length - 1]!;
        const bn = add('bn', `nn.BatchNorm${flow.image ? '2d' : '1d'}(${features}, eps=${real(c.epsilon ?? 1e-3, 'epsilon', name)}, momentum=${1 - real(c.momentum ?? 0.99, 'momentum', name)}, affine=${scale ? 'True' : 'False'})`, name);
        if (scale) {
          plan.params.push({ torch: `${bn}.weight`, tf: weight('gamma'), shape: [features] });
          plan.params.push({ torch: `${bn}.bias`, tf: weight('beta'), shape: [features] });
        }
        plan.params.push({ torch: `${bn}.running_mean`, tf: weight('moving_mean'), shape: [features] });
        plan.params.push({ torch: `${bn}.running_var`, tf: weight('moving_variance'), shape: [features] });
        plan.params.push({ torch: `${bn}.num_batches_tracked`, tf: '', shape: [], counter: true });
        break;
      }
      case 'LayerNormalization': {
        if (flow.image) throw new TorchExportError(name, "a layer norm of an image's channels is not exported (torch's LayerNorm normalises the last axes, which are H and W there)");
        if (!lastAxis(c.axis, flow.shape.length)) throw new TorchExportError(name, 'a layer norm over an axis other than the last is not exported');
        const scale = c.scale !== false;
        const center = c.center !== false;
        if (scale !== center) throw new TorchExportError(name, "torch's LayerNorm has a weight and a bias or neither; this layer has only one (center and scale differ)");
        const d = flow.shape[flow.shape.length - 1]!;
        const ln = add('ln', `nn.LayerNorm(${d}, eps=${real(c.epsilon ?? 1e-3, 'epsilon', name)}, elementwise_affine=${scale ? 'True' : 'False'})`, name);
        if (scale) {
          plan.params.push({ torch: `${ln}.weight`, tf: weight('gamma'), shape: [d] });
          plan.params.push({ torch: `${ln}.bias`, tf: weight('beta'), shape: [d] });
        }
        break;
      }
      case 'Embedding': {
        if (index !== 0 && !(index === 1 && layers[0]!.class_name === 'InputLayer')) throw new TorchExportError(name, 'an Embedding is exported as the first layer (it takes token ids)');
        const inputDim = count(c.input_dim, 'input_dim', name);
        const outputDim = count(c.output_dim, 'output_dim', name);
        if (c.mask_zero === true) throw new TorchExportError(name, 'mask_zero has no torch equivalent in nn.Embedding');
        const emb = add('embedding', `nn.Embedding(${inputDim}, ${outputDim})`, name);
        plan.params.push({ torch: `${emb}.weight`, tf: weight('embeddings'), shape: [inputDim, outputDim] });
        plan.inputDtype = 'int64';
        plan.vocabSize = inputDim;
        flow = { shape: [...flow.shape, outputDim], image: false };
        break;
      }
      case 'TokenAndPositionEmbedding': {
        if (index !== 0 && !(index === 1 && layers[0]!.class_name === 'InputLayer')) throw new TorchExportError(name, 'a TokenAndPositionEmbedding is exported as the first layer (it takes token ids)');
        const vocab = count(c.vocab_size ?? c.vocabSize, 'vocab_size', name);
        const context = count(c.context_length ?? c.contextLength, 'context_length', name);
        const d = count(c.d_model ?? c.dModel, 'd_model', name);
        if (flow.shape.length !== 1 || flow.shape[0]! > context) throw new TorchExportError(name, `it takes token ids [T] with T <= ${context}, not [${flow.shape.join(', ')}]`);
        plan.helpers.add('TokenAndPositionEmbedding');
        const emb = add('embed', `TokenAndPositionEmbedding(${vocab}, ${context}, ${d})`, name);
        plan.params.push({ torch: `${emb}.tok.weight`, tf: weight('token_embeddings'), shape: [vocab, d] });
        plan.params.push({ torch: `${emb}.pos.weight`, tf: weight('position_embeddings'), shape: [context, d] });
        plan.inputDtype = 'int64';
        plan.vocabSize = vocab;
        flow = { shape: [flow.shape[0]!, d], image: false };
        break;
      }
      case 'TransformerBlock': {
        if (flow.shape.length !== 2) throw new TorchExportError(name, `a transformer block takes a sequence [T, d], not [${flow.shape.join(', ')}]`);
        const d = count(c.d_model ?? c.dModel, 'd_model', name);
        const heads = count(c.heads, 'heads', name);
        const hidden = count(c.hidden ?? 4 * d, 'hidden', name);
        const eps = real(c.epsilon ?? 1e-5, 'epsilon', name);
        plan.helpers.add('TransformerBlock');
        const block = add('block', `TransformerBlock(${d}, ${heads}, ${hidden}, eps=${eps})`, name);
        const norm = (n: string) => {
          plan.params.push({ torch: `${block}.${n}.weight`, tf: weight(`${n}_gamma`), shape: [d] });
          plan.params.push({ torch: `${block}.${n}.bias`, tf: weight(`${n}_beta`), shape: [d] });
        };
        const linear = (n: string, inputs: number, outputs: number) => {
          plan.params.push({ torch: `${block}.${n}.weight`, tf: weight(`${n}_kernel`), shape: [outputs, inputs], gather: denseGather([inputs], outputs) });
          plan.params.push({ torch: `${block}.${n}.bias`, tf: weight(`${n}_bias`), shape: [outputs] });
        };
        norm('ln1');
        linear('qkv', d, 3 * d);
        linear('proj', d, d);
        norm('ln2');
        linear('fc1', d, hidden);
        linear('fc2', hidden, d);
        break;
      }
      default:
        throw new TorchExportError(name, `${kind} layers have no mapping to torch here (exported: Dense, Conv2D, MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D, GlobalMaxPooling2D, Flatten, Dropout, Activation, ReLU, LeakyReLU, ELU, Softmax, BatchNormalization, LayerNormalization, Embedding, and the language model's TokenAndPositionEmbedding and TransformerBlock)`);
    }
  }
  if (flow.flattened) throw new TorchExportError(undefined, 'the model ends with a Flatten of an image: its output order would differ between TF.js (H, W, C) and torch (C, H, W)');
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Weights

function tfWeights(artifacts: ModelArtifactsLike, file: string | undefined): Map<string, { spec: WeightSpec; values: Float32Array }> {
  const out = new Map<string, { spec: WeightSpec; values: Float32Array }>();
  let offset = 0;
  for (const spec of artifacts.weightSpecs) checkName('weight', spec.name, file);
  for (const spec of artifacts.weightSpecs) {
    if ((spec as WeightSpec & { quantization?: unknown }).quantization) throw new TorchExportError(spec.name.split('/')[0], 'its weights are quantized; export the model without quantization');
    if (spec.dtype !== 'float32') throw new TorchExportError(spec.name.split('/')[0], `its weight ${spec.name} is ${spec.dtype}; float32 weights are exported`);
    const n = spec.shape.reduce((a, b) => a * b, 1);
    if (offset + n * 4 > artifacts.weightData.byteLength) throw new TorchExportError(undefined, `the weights end before ${spec.name}: the weight data is truncated`);
    out.set(spec.name, { spec, values: new Float32Array(artifacts.weightData.slice(offset, offset + n * 4)) });
    offset += n * 4;
  }
  return out;
}

function findWeight(weights: Map<string, { spec: WeightSpec; values: Float32Array }>, name: string, size: number): Float32Array {
  const w = weights.get(name);
  if (!w) throw new TorchExportError(name.split('/')[0], `its weight ${name} is not in the saved weights`);
  if (w.values.length !== size) throw new TorchExportError(name.split('/')[0], `its weight ${name} has ${w.values.length} values; the topology says ${size}`);
  return w.values;
}

function bytesOf(values: Float32Array | BigInt64Array): Uint8Array {
  return new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
}

/** The model as a torch state dict (safetensors) and the Python module that loads it. */
export function exportForTorch(artifacts: ModelArtifactsLike, options: TorchExportOptions = {}): TorchExport {
  // Every name is checked (makePlan, tfWeights) before any output is made.
  const plan = makePlan(artifacts.modelTopology, options.source);
  const weights = tfWeights(artifacts, options.source);
  if (options.vocabulary !== undefined) {
    const problem = vocabularyProblem(options.vocabulary, plan.vocabSize);
    if (problem !== undefined) throw new TorchExportError(undefined, problem);
  }
  const tensors: NamedTensor[] = [];
  for (const p of plan.params) {
    if (p.counter) {
      tensors.push({ name: p.torch, dtype: 'I64', shape: [], data: bytesOf(new BigInt64Array(1)) });
      continue;
    }
    const size = p.shape.reduce((a, b) => a * b, 1);
    const src = findWeight(weights, p.tf, size);
    const out = p.gather ? Float32Array.from(p.gather, (i) => src[i]!) : src;
    tensors.push({ name: p.torch, dtype: 'F32', shape: p.shape, data: bytesOf(out) });
  }
  const metadata: Record<string, string> = {
    format: 'pt',
    generated_by: 'browser-ddp',
    tfjs_names: JSON.stringify(Object.fromEntries(plan.params.filter((p) => !p.counter).map((p) => [p.torch, p.tf]))),
    ...(options.source ? { source: options.source } : {}),
  };
  return {
    safetensors: encodeSafetensors(tensors, metadata),
    python: pythonModule(plan, options.source, pythonModuleName(options.fileName ?? 'model') || 'model', options.vocabulary),
    inputShape: plan.inputShape,
    inputDtype: plan.inputDtype,
    names: plan.params.filter((p) => !p.counter).map((p) => ({ torch: p.torch, tf: p.tf })),
  };
}

/**
 * The reverse: a torch state dict (safetensors, names and layouts as `exportForTorch` writes
 * them) as TF.js weights for a model of `artifacts.modelTopology`, in the artifacts' weight
 * order (give them to `loadModelWeights`). Every parameter must be there with its shape.
 */
export function importTorchStateDict(artifacts: Pick<ModelArtifactsLike, 'modelTopology' | 'weightSpecs'>, safetensors: Uint8Array): { weightSpecs: WeightSpec[]; weightData: ArrayBuffer } {
  const plan = makePlan(artifacts.modelTopology, undefined);
  for (const spec of artifacts.weightSpecs) checkName('weight', spec.name, undefined);
  const { tensors } = decodeSafetensors(safetensors);
  const byTf = new Map<string, Float32Array>();
  for (const p of plan.params) {
    if (p.counter) continue;
    const t = tensors.get(p.torch);
    if (!t) throw new TorchExportError(p.tf.split('/')[0], `the state dict has no "${p.torch}"`);
    if (t.dtype !== 'F32') throw new TorchExportError(p.tf.split('/')[0], `"${p.torch}" is ${t.dtype}; float32 is loaded`);
    if (t.shape.join(',') !== p.shape.join(',')) throw new TorchExportError(p.tf.split('/')[0], `"${p.torch}" has shape [${t.shape.join(', ')}]; this model's is [${p.shape.join(', ')}]`);
    const values = new Float32Array(t.data.buffer, t.data.byteOffset, t.data.byteLength / 4);
    let out = values;
    if (p.gather) {
      out = new Float32Array(values.length);
      p.gather.forEach((from, j) => (out[from] = values[j]!));
    }
    byTf.set(p.tf, out);
  }
  const parts: Float32Array[] = [];
  for (const spec of artifacts.weightSpecs) {
    const v = byTf.get(spec.name);
    if (!v) throw new TorchExportError(spec.name.split('/')[0], `its weight ${spec.name} has no torch parameter in the export's plan`);
    parts.push(v);
  }
  const data = new Float32Array(parts.reduce((a, p) => a + p.length, 0));
  let at = 0;
  for (const p of parts) {
    data.set(p, at);
    at += p.length;
  }
  return { weightSpecs: artifacts.weightSpecs, weightData: data.buffer };
}

// ---------------------------------------------------------------------------------------------
// The Python file

/** torch modules for the language model's layers (src/nn/language_model.ts), computing what they compute. */
const PYTHON_HELPERS = {
  TokenAndPositionEmbedding: `

class TokenAndPositionEmbedding(nn.Module):
    \"\"\"Token ids [N, T] to a token embedding plus a learned position embedding, [N, T, d].\"\"\"

    def __init__(self, vocab_size, context_length, d_model):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(context_length, d_model)

    def forward(self, ids):
        return self.tok(ids) + self.pos.weight[: ids.shape[1]]
`,
  TransformerBlock: `

class TransformerBlock(nn.Module):
    \"\"\"Pre-norm block: x + causal self-attention(ln1(x)), then + MLP(ln2(x)) with GELU (tanh).\"\"\"

    def __init__(self, d_model, heads, hidden, eps=1e-5):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model, eps=eps)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model, eps=eps)
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(n, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(n, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
`,
} as const;

/**
 * The Python file. Strings from the model's file (layer names, `source`) go in only through
 * `pythonString`, also in comments and the docstring, where a newline or a closing quote would
 * otherwise be code; `file` is a `pythonModuleName` (letters, digits, _); the rest is ours.
 */
function pythonModule(plan: Plan, source: string | undefined, file: string, vocabulary: readonly string[] | undefined): string {
  const width = Math.max(...plan.modules.map((m) => m.name.length));
  const modules = plan.modules.map((m) => `            (${pythonString(m.name)},${' '.repeat(width - m.name.length + 1)}${m.ctor}),${m.from === undefined ? '' : `  # TF.js layer ${pythonString(m.from)}`}`).join('\n');
  const layout = plan.tfInputShape.length === 3 ? `images [N, ${plan.inputShape.join(', ')}] (channels first; the tab's were [N, ${plan.tfInputShape.join(', ')}])` : plan.inputDtype === 'int64' ? `token ids, int64 [N, ${plan.inputShape.join(', ')}]` : `float32 [N, ${plan.inputShape.join(', ')}]`;
  return `"""A model trained in browser tabs (browser-ddp), for PyTorch.${source ? `\n\nWeights: ${pythonString(source)}` : ''}

    from ${file} import Model, load_file
    model = Model()
    model.load_state_dict(load_file(${pythonString(`${file}.safetensors`)}))
    model.eval()

Input: ${layout}. Output: what the tab's model gave (logits for the training job's models).${vocabulary ? `

Text: encode("...") gives token ids, decode(ids) the text back, and
generate(model, "Call me ", 200) the prompt and 200 characters the model writes.` : ''}
"""
import json
import math
import struct
from collections import OrderedDict

import torch
from torch import nn
${[...plan.helpers].map((h) => PYTHON_HELPERS[h]).join('')}

class Model(nn.Sequential):
    input_shape = (${plan.inputShape.join(', ')}${plan.inputShape.length === 1 ? ',' : ''})
    input_dtype = torch.${plan.inputDtype}

    def __init__(self):
        super().__init__(OrderedDict([
${modules}
        ]))
${vocabulary ? pythonTextHelpers(vocabulary.map(pythonString)) : ''}

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32}


def load_file(path):
    """safetensors.torch.load_file, or the same read here where the safetensors package is not installed."""
    try:
        from safetensors.torch import load_file as load
        return load(path)
    except ImportError:
        pass
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=_DTYPES[t["dtype"]]).reshape(t["shape"]).clone()
    return out


if __name__ == "__main__":
    import sys

    model = Model()
    model.load_state_dict(load_file(sys.argv[1] if len(sys.argv) > 1 else ${pythonString(`${file}.safetensors`)}))
    print(model)${vocabulary ? `
    model.eval()
    print(generate(model, VOCABULARY[0], 80))` : ''}
`;
}
