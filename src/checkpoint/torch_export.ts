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
import type { WeightSpec } from './checkpoint_format.ts';
import { TorchExportError, checkName } from './torch_export_errors.ts';
import type { Plan, PythonHelper } from './torch_plan_builder.ts';
import { makePlan } from './torch_plan.ts';

// The errors live beside the export (torch_export_errors.ts); scripts import them from here.
export { TFJS_NAME_PATTERN, TorchExportError, TorchExportNameError } from './torch_export_errors.ts';

/** What the exporter reads: a model's topology and weights (a checkpoint's `model`, or `modelArtifacts`). */
export interface ModelArtifactsLike {
  modelTopology: unknown;
  weightSpecs: WeightSpec[];
  weightData: ArrayBuffer;
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

/** A Python module name from a file name: letters, digits and _, not starting with a digit. */
export function pythonModuleName(name: string): string {
  return name.replace(/[^A-Za-z0-9_]/g, '_').replace(/^(?=\d)/, '_');
}

// ---------------------------------------------------------------------------------------------
// Weights

function tfWeights(artifacts: ModelArtifactsLike, file: string | undefined): Map<string, { spec: WeightSpec; values: Float32Array }> {
  const out = new Map<string, { spec: WeightSpec; values: Float32Array }>();
  let offset = 0;
  for (const spec of artifacts.weightSpecs) checkName('weight', spec.name, file);
  for (const spec of artifacts.weightSpecs) {
    if ((spec as WeightSpec & { quantization?: unknown }).quantization)
      throw new TorchExportError(spec.name.split('/')[0], 'its weights are quantized; export the model without quantization');
    if (spec.dtype !== 'float32')
      throw new TorchExportError(spec.name.split('/')[0], `its weight ${spec.name} is ${spec.dtype}; float32 weights are exported`);
    const n = spec.shape.reduce((a, b) => a * b, 1);
    if (offset + n * 4 > artifacts.weightData.byteLength)
      throw new TorchExportError(undefined, `the weights end before ${spec.name}: the weight data is truncated`);
    out.set(spec.name, { spec, values: new Float32Array(artifacts.weightData.slice(offset, offset + n * 4)) });
    offset += n * 4;
  }
  return out;
}

function findWeight(weights: Map<string, { spec: WeightSpec; values: Float32Array }>, name: string, size: number): Float32Array {
  const w = weights.get(name);
  if (!w) throw new TorchExportError(name.split('/')[0], `its weight ${name} is not in the saved weights`);
  if (w.values.length !== size)
    throw new TorchExportError(name.split('/')[0], `its weight ${name} has ${w.values.length} values; the topology says ${size}`);
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
export function importTorchStateDict(
  artifacts: Pick<ModelArtifactsLike, 'modelTopology' | 'weightSpecs'>,
  safetensors: Uint8Array,
): { weightSpecs: WeightSpec[]; weightData: ArrayBuffer } {
  const plan = makePlan(artifacts.modelTopology, undefined);
  for (const spec of artifacts.weightSpecs) checkName('weight', spec.name, undefined);
  const { tensors } = decodeSafetensors(safetensors);
  const byTf = new Map<string, Float32Array>();
  for (const p of plan.params) {
    if (p.counter) continue;
    const t = tensors.get(p.torch);
    if (!t) throw new TorchExportError(p.tf.split('/')[0], `the state dict has no "${p.torch}"`);
    if (t.dtype !== 'F32') throw new TorchExportError(p.tf.split('/')[0], `"${p.torch}" is ${t.dtype}; float32 is loaded`);
    if (t.shape.join(',') !== p.shape.join(','))
      throw new TorchExportError(
        p.tf.split('/')[0],
        `"${p.torch}" has shape [${t.shape.join(', ')}]; this model's is [${p.shape.join(', ')}]`,
      );
    const values = new Float32Array(t.data.buffer, t.data.byteOffset, t.data.byteLength / 4);
    let out = values;
    if (p.gather) {
      out = new Float32Array(values.length);
      p.gather.forEach((from, j) => {
        out[from] = values[j]!;
      });
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
const PYTHON_HELPERS: Readonly<Record<PythonHelper, string>> = {
  TokenAndPositionEmbedding: `

class TokenAndPositionEmbedding(nn.Module):
    """Token ids [N, T] to a token embedding plus a learned position embedding, [N, T, d]."""

    def __init__(self, vocab_size, context_length, d_model):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(context_length, d_model)

    def forward(self, ids):
        return self.tok(ids) + self.pos.weight[: ids.shape[1]]
`,
  TransformerBlock: `

class TransformerBlock(nn.Module):
    """Pre-norm block: x + causal self-attention(ln1(x)), then + MLP(ln2(x)) with GELU (tanh)."""

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
  const modules = plan.modules
    .map(
      (m) =>
        `            (${pythonString(m.name)},${' '.repeat(width - m.name.length + 1)}${m.ctor}),${m.from === undefined ? '' : `  # TF.js layer ${pythonString(m.from)}`}`,
    )
    .join('\n');
  const layout =
    plan.tfInputShape.length === 3
      ? `images [N, ${plan.inputShape.join(', ')}] (channels first; the tab's were [N, ${plan.tfInputShape.join(', ')}])`
      : plan.inputDtype === 'int64'
        ? `token ids, int64 [N, ${plan.inputShape.join(', ')}]`
        : `float32 [N, ${plan.inputShape.join(', ')}]`;
  return `"""A model trained in browser tabs (browser-ddp), for PyTorch.${source ? `\n\nWeights: ${pythonString(source)}` : ''}

    from ${file} import Model, load_file
    model = Model()
    model.load_state_dict(load_file(${pythonString(`${file}.safetensors`)}))
    model.eval()

Input: ${layout}. Output: what the tab's model gave (logits for the training job's models).${
    vocabulary
      ? `

Text: encode("...") gives token ids, decode(ids) the text back, and
generate(model, "Call me ", 200) the prompt and 200 characters the model writes.`
      : ''
  }
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
    print(model)${
      vocabulary
        ? `
    model.eval()
    print(generate(model, VOCABULARY[0], 80))`
        : ''
    }
`;
}
