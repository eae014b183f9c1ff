/**
 * How each TF.js layer becomes torch modules and parameters (torch_plan.ts walks the layers): one
 * mapper per layer class, each checking what it cannot export and saying why. Pure.
 */
import { TorchExportError } from './torch_export_errors.ts';
import { count, pair, real, type Config, type PlanBuilder } from './torch_plan_builder.ts';
import type { LayerJson } from './checkpoint_format.ts';

/** Where a layer stands in the model: its class, its index, and all the layers. */
export interface LayerAt {
  kind: string;
  index: number;
  layers: readonly LayerJson[];
}

export type LayerMapper = (b: PlanBuilder, c: Config, name: string, at: LayerAt) => void;

/** A weight of layer `name`, as TF.js names it. */
function weightOf(name: string): (w: string) => string {
  return (w) => `${name}/${w}`;
}

/** Image layers are exported in TF.js's channels_last layout only. */
function channelsLast(c: Config, layer: string): void {
  if ((c.data_format ?? 'channels_last') !== 'channels_last')
    throw new TorchExportError(layer, `its data_format is ${String(c.data_format)}; channels_last (TF.js's) is exported`);
}

/** nn.Linear, its kernel transposed (and its input columns reordered after a Flatten of an image). */
function mapDense(b: PlanBuilder, c: Config, name: string): void {
  const weight = weightOf(name);
  if (b.flow.image)
    throw new TorchExportError(name, `it is applied to an image [${b.flow.shape.join(', ')}] without a Flatten; Flatten first`);
  const units = count(c.units, 'units', name);
  const inputs = b.flow.shape[b.flow.shape.length - 1]!;
  const fc = b.add('fc', `nn.Linear(${inputs}, ${units}, bias=${c.use_bias === false ? 'False' : 'True'})`, name);
  b.plan.params.push({
    torch: `${fc}.weight`,
    tf: weight('kernel'),
    shape: [units, inputs],
    gather: denseGather([inputs], units, b.flow.flattened),
  });
  if (c.use_bias !== false) b.plan.params.push({ torch: `${fc}.bias`, tf: weight('bias'), shape: [units] });
  b.flow = { shape: [...b.flow.shape.slice(0, -1), units], image: false };
  b.addActivation(c.activation, name);
}

/** nn.Conv2d, its kernel to [out, in, kh, kw]; TF's uneven 'same' padding as an nn.ZeroPad2d before it. */
function mapConv2D(b: PlanBuilder, c: Config, name: string): void {
  const weight = weightOf(name);
  channelsLast(c, name);
  if (!b.flow.image) throw new TorchExportError(name, `its input [${b.flow.shape.join(', ')}] is not an image [h, w, c]`);
  const [h, w, cin] = b.flow.shape as [number, number, number];
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
    else b.add('pad', `nn.ZeroPad2d((${px.before}, ${px.after}, ${py.before}, ${py.after}))`, name); // TF pads the extra row/column after
  } else if ((c.padding ?? 'valid') === 'valid') {
    oh = Math.floor((h - (kh - 1) * dh - 1) / sh) + 1;
    ow = Math.floor((w - (kw - 1) * dw - 1) / sw) + 1;
  } else throw new TorchExportError(name, `its padding "${String(c.padding)}" is not valid or same`);
  if (c.groups !== undefined && c.groups !== 1) throw new TorchExportError(name, 'grouped convolutions are not exported');
  const conv = b.add(
    'conv',
    `nn.Conv2d(${cin}, ${filters}, kernel_size=(${kh}, ${kw}), stride=(${sh}, ${sw}), padding=${padding}, dilation=(${dh}, ${dw}), bias=${c.use_bias === false ? 'False' : 'True'})`,
    name,
  );
  b.plan.params.push({
    torch: `${conv}.weight`,
    tf: weight('kernel'),
    shape: [filters, cin, kh, kw],
    gather: convGather(kh, kw, cin, filters),
  });
  if (c.use_bias !== false) b.plan.params.push({ torch: `${conv}.bias`, tf: weight('bias'), shape: [filters] });
  b.flow = { shape: [oh, ow, filters], image: true };
  b.addActivation(c.activation, name);
}

/** nn.MaxPool2d or nn.AvgPool2d; a max pool's uneven 'same' padding as -inf padding before it. */
function mapPooling2D(b: PlanBuilder, c: Config, name: string, at: LayerAt): void {
  channelsLast(c, name);
  if (!b.flow.image) throw new TorchExportError(name, `its input [${b.flow.shape.join(', ')}] is not an image [h, w, c]`);
  const [h, w, ch] = b.flow.shape as [number, number, number];
  const [kh, kw] = pair(c.pool_size ?? 2, 'pool_size', name);
  const [sh, sw] = pair(c.strides ?? [kh, kw], 'strides', name);
  const max = at.kind === 'MaxPooling2D';
  let oh = Math.floor((h - kh) / sh) + 1;
  let ow = Math.floor((w - kw) / sw) + 1;
  if (c.padding === 'same') {
    const py = samePadding(h, kh, sh, 1);
    const px = samePadding(w, kw, sw, 1);
    [oh, ow] = [py.out, px.out];
    if (py.before + py.after + px.before + px.after > 0) {
      // TF's padded pool ignores the padding; a max pool does so with -inf padding, an average pool cannot here.
      if (!max)
        throw new TorchExportError(
          name,
          "an average pool with 'same' padding averages over fewer elements at the border, which torch's AvgPool2d does not do for this padding; use 'valid'",
        );
      b.add('pad', `nn.ConstantPad2d((${px.before}, ${px.after}, ${py.before}, ${py.after}), float('-inf'))`, name);
    }
  }
  b.add(
    'pool',
    max
      ? `nn.MaxPool2d(kernel_size=(${kh}, ${kw}), stride=(${sh}, ${sw}))`
      : `nn.AvgPool2d(kernel_size=(${kh}, ${kw}), stride=(${sh}, ${sw}))`,
    name,
  );
  b.flow = { shape: [oh, ow, ch], image: true };
}

/** An adaptive pool to 1 x 1 and a Flatten. */
function mapGlobalPooling2D(b: PlanBuilder, c: Config, name: string, at: LayerAt): void {
  channelsLast(c, name);
  if (!b.flow.image) throw new TorchExportError(name, `its input [${b.flow.shape.join(', ')}] is not an image [h, w, c]`);
  b.add('pool', at.kind === 'GlobalMaxPooling2D' ? 'nn.AdaptiveMaxPool2d(1)' : 'nn.AdaptiveAvgPool2d(1)', name);
  b.add('flatten', 'nn.Flatten()', name);
  b.flow = { shape: [b.flow.shape[2]!], image: false };
}

/** nn.Flatten; an image's flatten order (H, W, C against torch's C, H, W) is left to the next Dense. */
function mapFlatten(b: PlanBuilder, _c: Config, name: string): void {
  const size = b.flow.shape.reduce((x, y) => x * y, 1);
  const [h, w, ch] = b.flow.shape as [number, number, number];
  const reorder = b.flow.image && ch > 1 && h * w > 1;
  b.add('flatten', 'nn.Flatten()', name);
  b.flow = { shape: [size], image: false, ...(reorder ? { flattened: { h, w, c: ch } } : {}) };
}

/** nn.Dropout. */
function mapDropout(b: PlanBuilder, c: Config, name: string): void {
  b.add('dropout', `nn.Dropout(p=${real(c.rate ?? 0, 'rate', name)})`, name);
}

/** The activation's own module. */
function mapActivation(b: PlanBuilder, c: Config, name: string): void {
  b.addActivation(c.activation, name);
}

/** nn.ReLU (without a max_value). */
function mapReLU(b: PlanBuilder, c: Config, name: string): void {
  if (c.max_value !== undefined && c.max_value !== null) throw new TorchExportError(name, 'a ReLU with max_value is not exported');
  b.add('relu', 'nn.ReLU()', name);
}

/** nn.LeakyReLU. */
function mapLeakyReLU(b: PlanBuilder, c: Config, name: string): void {
  b.add('leaky_relu', `nn.LeakyReLU(negative_slope=${real(c.alpha ?? 0.3, 'alpha', name)})`, name);
}

/** nn.ELU. */
function mapELU(b: PlanBuilder, c: Config, name: string): void {
  b.add('elu', `nn.ELU(alpha=${real(c.alpha ?? 1, 'alpha', name)})`, name);
}

/** nn.Softmax over the last axis (the channels of an image). */
function mapSoftmax(b: PlanBuilder, c: Config, name: string): void {
  if (!lastAxis(c.axis, b.flow.shape.length))
    throw new TorchExportError(name, 'a softmax over an axis other than the last is not exported');
  b.add('softmax', `nn.Softmax(dim=${b.flow.image ? 1 : -1})`, name);
}

/** nn.BatchNorm1d or 2d with its running statistics, and torch's num_batches_tracked counter. */
function mapBatchNormalization(b: PlanBuilder, c: Config, name: string): void {
  const weight = weightOf(name);
  if (!lastAxis(c.axis, b.flow.shape.length))
    throw new TorchExportError(name, 'a batch norm over an axis other than the last (the channels) is not exported');
  if (b.flow.shape.length === 2)
    throw new TorchExportError(
      name,
      'a batch norm of a sequence [t, d] has no torch module of the same layout (BatchNorm1d wants [N, C, L])',
    );
  const scale = c.scale !== false;
  const center = c.center !== false;
  if (scale !== center)
    throw new TorchExportError(
      name,
      "torch's batch norm has a weight and a bias or neither; this layer has only one (center and scale differ)",
    );
  const features = b.flow.shape[b.flow.shape.length - 1]!;
  const bn = b.add(
    'bn',
    `nn.BatchNorm${b.flow.image ? '2d' : '1d'}(${features}, eps=${real(c.epsilon ?? 1e-3, 'epsilon', name)}, momentum=${1 - real(c.momentum ?? 0.99, 'momentum', name)}, affine=${scale ? 'True' : 'False'})`,
    name,
  );
  if (scale) {
    b.plan.params.push({ torch: `${bn}.weight`, tf: weight('gamma'), shape: [features] });
    b.plan.params.push({ torch: `${bn}.bias`, tf: weight('beta'), shape: [features] });
  }
  b.plan.params.push({ torch: `${bn}.running_mean`, tf: weight('moving_mean'), shape: [features] });
  b.plan.params.push({ torch: `${bn}.running_var`, tf: weight('moving_variance'), shape: [features] });
  b.plan.params.push({ torch: `${bn}.num_batches_tracked`, tf: '', shape: [], counter: true });
}

/** nn.LayerNorm over the last axis. */
function mapLayerNormalization(b: PlanBuilder, c: Config, name: string): void {
  const weight = weightOf(name);
  if (b.flow.image)
    throw new TorchExportError(
      name,
      "a layer norm of an image's channels is not exported (torch's LayerNorm normalises the last axes, which are H and W there)",
    );
  if (!lastAxis(c.axis, b.flow.shape.length))
    throw new TorchExportError(name, 'a layer norm over an axis other than the last is not exported');
  const scale = c.scale !== false;
  const center = c.center !== false;
  if (scale !== center)
    throw new TorchExportError(
      name,
      "torch's LayerNorm has a weight and a bias or neither; this layer has only one (center and scale differ)",
    );
  const d = b.flow.shape[b.flow.shape.length - 1]!;
  const ln = b.add(
    'ln',
    `nn.LayerNorm(${d}, eps=${real(c.epsilon ?? 1e-3, 'epsilon', name)}, elementwise_affine=${scale ? 'True' : 'False'})`,
    name,
  );
  if (scale) {
    b.plan.params.push({ torch: `${ln}.weight`, tf: weight('gamma'), shape: [d] });
    b.plan.params.push({ torch: `${ln}.bias`, tf: weight('beta'), shape: [d] });
  }
}

/** nn.Embedding, the first layer: the model takes token ids. */
function mapEmbedding(b: PlanBuilder, c: Config, name: string, at: LayerAt): void {
  const weight = weightOf(name);
  if (at.index !== 0 && !(at.index === 1 && at.layers[0]!.class_name === 'InputLayer'))
    throw new TorchExportError(name, 'an Embedding is exported as the first layer (it takes token ids)');
  const inputDim = count(c.input_dim, 'input_dim', name);
  const outputDim = count(c.output_dim, 'output_dim', name);
  if (c.mask_zero === true) throw new TorchExportError(name, 'mask_zero has no torch equivalent in nn.Embedding');
  const emb = b.add('embedding', `nn.Embedding(${inputDim}, ${outputDim})`, name);
  b.plan.params.push({ torch: `${emb}.weight`, tf: weight('embeddings'), shape: [inputDim, outputDim] });
  b.plan.inputDtype = 'int64';
  b.plan.vocabSize = inputDim;
  b.flow = { shape: [...b.flow.shape, outputDim], image: false };
}

/** The language model's token and position embedding (a Python class of the file), the first layer. */
function mapTokenAndPositionEmbedding(b: PlanBuilder, c: Config, name: string, at: LayerAt): void {
  const weight = weightOf(name);
  if (at.index !== 0 && !(at.index === 1 && at.layers[0]!.class_name === 'InputLayer'))
    throw new TorchExportError(name, 'a TokenAndPositionEmbedding is exported as the first layer (it takes token ids)');
  const vocab = count(c.vocab_size ?? c.vocabSize, 'vocab_size', name);
  const context = count(c.context_length ?? c.contextLength, 'context_length', name);
  const d = count(c.d_model ?? c.dModel, 'd_model', name);
  if (b.flow.shape.length !== 1 || b.flow.shape[0]! > context)
    throw new TorchExportError(name, `it takes token ids [T] with T <= ${context}, not [${b.flow.shape.join(', ')}]`);
  b.plan.helpers.add('TokenAndPositionEmbedding');
  const emb = b.add('embed', `TokenAndPositionEmbedding(${vocab}, ${context}, ${d})`, name);
  b.plan.params.push({ torch: `${emb}.tok.weight`, tf: weight('token_embeddings'), shape: [vocab, d] });
  b.plan.params.push({ torch: `${emb}.pos.weight`, tf: weight('position_embeddings'), shape: [context, d] });
  b.plan.inputDtype = 'int64';
  b.plan.vocabSize = vocab;
  b.flow = { shape: [b.flow.shape[0]!, d], image: false };
}

/** The language model's transformer block (a Python class of the file): its norms and linears. */
function mapTransformerBlock(b: PlanBuilder, c: Config, name: string): void {
  const weight = weightOf(name);
  if (b.flow.shape.length !== 2)
    throw new TorchExportError(name, `a transformer block takes a sequence [T, d], not [${b.flow.shape.join(', ')}]`);
  const d = count(c.d_model ?? c.dModel, 'd_model', name);
  const heads = count(c.heads, 'heads', name);
  const hidden = count(c.hidden ?? 4 * d, 'hidden', name);
  const eps = real(c.epsilon ?? 1e-5, 'epsilon', name);
  b.plan.helpers.add('TransformerBlock');
  const block = b.add('block', `TransformerBlock(${d}, ${heads}, ${hidden}, eps=${eps})`, name);
  const norm = (n: string) => {
    b.plan.params.push({ torch: `${block}.${n}.weight`, tf: weight(`${n}_gamma`), shape: [d] });
    b.plan.params.push({ torch: `${block}.${n}.bias`, tf: weight(`${n}_beta`), shape: [d] });
  };
  const linear = (n: string, inputs: number, outputs: number) => {
    b.plan.params.push({
      torch: `${block}.${n}.weight`,
      tf: weight(`${n}_kernel`),
      shape: [outputs, inputs],
      gather: denseGather([inputs], outputs),
    });
    b.plan.params.push({ torch: `${block}.${n}.bias`, tf: weight(`${n}_bias`), shape: [outputs] });
  };
  norm('ln1');
  linear('qkv', d, 3 * d);
  linear('proj', d, d);
  norm('ln2');
  linear('fc1', d, hidden);
  linear('fc2', hidden, d);
}

/** The layer classes exported, each with its mapper (a Map: a class name from a file is never an object's own key). */
export const LAYER_MAPPERS: ReadonlyMap<string, LayerMapper> = new Map<string, LayerMapper>([
  // The input itself: no module.
  ['InputLayer', () => {}],
  ['Dense', mapDense],
  ['Conv2D', mapConv2D],
  ['MaxPooling2D', mapPooling2D],
  ['AveragePooling2D', mapPooling2D],
  ['GlobalAveragePooling2D', mapGlobalPooling2D],
  ['GlobalMaxPooling2D', mapGlobalPooling2D],
  ['Flatten', mapFlatten],
  ['Dropout', mapDropout],
  ['Activation', mapActivation],
  ['ReLU', mapReLU],
  ['LeakyReLU', mapLeakyReLU],
  ['ELU', mapELU],
  ['Softmax', mapSoftmax],
  ['BatchNormalization', mapBatchNormalization],
  ['LayerNormalization', mapLayerNormalization],
  ['Embedding', mapEmbedding],
  ['TokenAndPositionEmbedding', mapTokenAndPositionEmbedding],
  ['TransformerBlock', mapTransformerBlock],
]);

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
