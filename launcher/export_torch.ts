/**
 * A trained model for PyTorch, from the command line:
 *
 *   npm run export:torch -- FILE [--out DIR]
 *
 * FILE is a checkpoint (a .ckpt from the server's --checkpoint-dir: <dir>/<session>/<time>-step-N.ckpt)
 * or a TF.js model.json (the dashboard's "Download model", model.save(), tensorflowjs_converter),
 * its weight files beside it. Writes DIR/model.safetensors (torch's state dict) and DIR/model.py
 * (the matching nn.Module); DIR defaults to FILE's name with "-torch".
 *
 * A language model's file also holds its vocabulary (with encode, decode and generate): from the
 * checkpoint (the training job saves it), from model.json's userDefinedMetadata (the dashboard's
 * download), or rebuilt from the text it trained on with --text FILE (each distinct character, in
 * code-point order, as the tabs' tokenizer does).
 */
import { parseArgs } from 'node:util';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { decodeCheckpoint, type WeightSpec } from '../src/checkpoint/checkpoint_format.ts';
import { exportForTorch, type ModelArtifactsLike } from '../src/checkpoint/torch_export.ts';
import { decodeSafetensors } from '../src/checkpoint/safetensors.ts';
import { CharTokenizer } from '../src/datasets/text.ts';

const USAGE =
  'usage: npm run export:torch -- FILE.ckpt|model.json [--out DIR] [--text CORPUS.txt (a language model: the text it trained on, for its vocabulary)]';

/** The vocabulary a file carries (`vocabulary` in the object), unchecked: exportForTorch checks it against the model. */
function vocabularyIn(holder: unknown): unknown {
  return typeof holder === 'object' && holder !== null && 'vocabulary' in holder
    ? (holder as { vocabulary: unknown }).vocabulary
    : undefined;
}

/** A TF.js model.json and its weight files (paths relative to it, as the manifest names them). */
async function readModelJson(file: string): Promise<{ artifacts: ModelArtifactsLike; vocabulary: unknown }> {
  const json = JSON.parse(await readFile(file, 'utf8')) as {
    modelTopology?: unknown;
    weightsManifest?: Array<{ paths: string[]; weights: WeightSpec[] }>;
    userDefinedMetadata?: unknown;
  };
  if (!json.modelTopology || !Array.isArray(json.weightsManifest))
    throw new Error(`${file} is not a TF.js Layers model.json (it needs modelTopology and weightsManifest)`);
  const specs: WeightSpec[] = [];
  const chunks: Uint8Array[] = [];
  for (const group of json.weightsManifest) {
    specs.push(...group.weights);
    for (const p of group.paths) {
      // Weight files sit beside model.json; a manifest cannot send the reader elsewhere.
      const path = resolve(dirname(file), p);
      if (dirname(path) !== resolve(dirname(file)))
        throw new Error(`${file} names weight file "${p}" outside its folder; weight files must sit beside model.json`);
      chunks.push(new Uint8Array(await readFile(path)));
    }
  }
  const data = new Uint8Array(chunks.reduce((a, c) => a + c.byteLength, 0));
  let at = 0;
  for (const c of chunks) {
    data.set(c, at);
    at += c.byteLength;
  }
  return {
    artifacts: { modelTopology: json.modelTopology, weightSpecs: specs, weightData: data.buffer },
    vocabulary: vocabularyIn(json.userDefinedMetadata),
  };
}

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    options: { out: { type: 'string' }, text: { type: 'string' }, help: { type: 'boolean' } },
    allowPositionals: true,
  });
  if (values.help || positionals.length !== 1) {
    console.log(USAGE);
    process.exit(values.help ? 0 : 2);
  }
  const file = positionals[0]!;
  let artifacts: ModelArtifactsLike;
  let source: string;
  let vocabulary: unknown;
  if (file.endsWith('.json')) {
    ({ artifacts, vocabulary } = await readModelJson(file));
    source = basename(file);
  } else {
    const checkpoint = await decodeCheckpoint(new Uint8Array(await readFile(file)), basename(file));
    artifacts = checkpoint.model;
    vocabulary = vocabularyIn(checkpoint.meta.user);
    const step = checkpoint.meta.step;
    source = `checkpoint ${basename(file)}${typeof step === 'number' ? ` (step ${step})` : ''}`;
  }
  // --text: the tokenizer the tabs built from the corpus; it wins over what the file says.
  if (values.text !== undefined) vocabulary = CharTokenizer.fromText(await readFile(values.text, 'utf8')).chars;
  // Untrusted (the file's): exportForTorch refuses anything that is not one character per token id.
  const out = exportForTorch(artifacts, { source, ...(vocabulary === undefined ? {} : { vocabulary: vocabulary as string[] }) });
  const dir = values.out ?? join(dirname(file), `${basename(file).replace(/\.(ckpt|json)$/, '')}-torch`);
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'model.safetensors'), out.safetensors);
  await writeFile(join(dir, 'model.py'), out.python);
  const { tensors } = decodeSafetensors(out.safetensors);
  console.log(`${source} -> ${join(dir, 'model.safetensors')} (${out.safetensors.byteLength} bytes) and ${join(dir, 'model.py')}`);
  for (const t of tensors.values()) console.log(`  ${t.name.padEnd(28)} ${t.dtype} [${t.shape.join(', ')}]`);
  console.log(`input: ${out.inputDtype} [N, ${out.inputShape.join(', ')}]`);
  console.log(
    `in Python (in ${dir}): from model import Model, load_file; model = Model(); model.load_state_dict(load_file("model.safetensors"))`,
  );
  if (vocabulary !== undefined)
    console.log(
      `text: a vocabulary of ${(vocabulary as string[]).length} characters; from model import encode, decode, generate; print(generate(model.eval(), "Call me ", 200))`,
    );
  else if (out.inputDtype === 'int64')
    console.log(
      'text: this file carries no vocabulary; give the text the model trained on with --text FILE to get encode, decode and generate',
    );
}

main().catch((err: unknown) => {
  console.error(`export:torch: ${(err as Error).message}`);
  process.exit(1);
});
