/**
 * A trained model for PyTorch, from the command line:
 *
 *   npm run export:torch -- FILE [--out DIR]
 *
 * FILE is a checkpoint (a .ckpt from the server's --checkpoint-dir: <dir>/<session>/<time>-step-N.ckpt)
 * or a TF.js model.json (the dashboard's "Download model", model.save(), tensorflowjs_converter),
 * its weight files beside it. Writes DIR/model.safetensors (torch's state dict) and DIR/model.py
 * (the matching nn.Module); DIR defaults to FILE's name with "-torch".
 */
import { parseArgs } from 'node:util';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { decodeCheckpoint, type WeightSpec } from '../src/checkpoint/checkpoint_format.ts';
import { exportForTorch, type ModelArtifactsLike } from '../src/checkpoint/torch_export.ts';
import { decodeSafetensors } from '../src/checkpoint/safetensors.ts';

const USAGE = 'usage: npm run export:torch -- FILE.ckpt|model.json [--out DIR]';

/** A TF.js model.json and its weight files (paths relative to it, as the manifest names them). */
async function readModelJson(file: string): Promise<ModelArtifactsLike> {
  const json = JSON.parse(await readFile(file, 'utf8')) as { modelTopology?: unknown; weightsManifest?: Array<{ paths: string[]; weights: WeightSpec[] }> };
  if (!json.modelTopology || !Array.isArray(json.weightsManifest)) throw new Error(`${file} is not a TF.js Layers model.json (it needs modelTopology and weightsManifest)`);
  const specs: WeightSpec[] = [];
  const chunks: Uint8Array[] = [];
  for (const group of json.weightsManifest) {
    specs.push(...group.weights);
    for (const p of group.paths) {
      // Weight files sit beside model.json; a manifest cannot send the reader elsewhere.
      const path = resolve(dirname(file), p);
      if (dirname(path) !== resolve(dirname(file))) throw new Error(`${file} names weight file "${p}" outside its folder; weight files must sit beside model.json`);
      chunks.push(new Uint8Array(await readFile(path)));
    }
  }
  const data = new Uint8Array(chunks.reduce((a, c) => a + c.byteLength, 0));
  let at = 0;
  for (const c of chunks) {
    data.set(c, at);
    at += c.byteLength;
  }
  return { modelTopology: json.modelTopology, weightSpecs: specs, weightData: data.buffer };
}

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({ options: { out: { type: 'string' }, help: { type: 'boolean' } }, allowPositionals: true });
  if (values.help || positionals.length !== 1) {
    console.log(USAGE);
    process.exit(values.help ? 0 : 2);
  }
  const file = positionals[0]!;
  let artifacts: ModelArtifactsLike;
  let source: string;
  if (file.endsWith('.json')) {
    artifacts = await readModelJson(file);
    source = basename(file);
  } else {
    const checkpoint = await decodeCheckpoint(new Uint8Array(await readFile(file)), basename(file));
    artifacts = checkpoint.model;
    const step = checkpoint.meta.step;
    source = `checkpoint ${basename(file)}${typeof step === 'number' ? ` (step ${step})` : ''}`;
  }
  const out = exportForTorch(artifacts, { source });
  const dir = values.out ?? join(dirname(file), `${basename(file).replace(/\.(ckpt|json)$/, '')}-torch`);
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'model.safetensors'), out.safetensors);
  await writeFile(join(dir, 'model.py'), out.python);
  const { tensors } = decodeSafetensors(out.safetensors);
  console.log(`${source} -> ${join(dir, 'model.safetensors')} (${out.safetensors.byteLength} bytes) and ${join(dir, 'model.py')}`);
  for (const t of tensors.values()) console.log(`  ${t.name.padEnd(28)} ${t.dtype} [${t.shape.join(', ')}]`);
  console.log(`input: ${out.inputDtype} [N, ${out.inputShape.join(', ')}]`);
  console.log(`in Python (in ${dir}): from model import Model, load_file; model = Model(); model.load_state_dict(load_file("model.safetensors"))`);
}

main().catch((err: unknown) => {
  console.error(`export:torch: ${(err as Error).message}`);
  process.exit(1);
});
