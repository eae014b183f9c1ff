/**
 * Saves a model as TF.js's two files (model.json + weights) through the browser's downloads.
 * Done here rather than with 'downloads://', whose router the bundler may drop.
 */
import type * as tf from '@tensorflow/tfjs';
import { exportForTorch, modelArtifacts } from '../../src/index.ts';
import { pythonModuleName } from '../../src/checkpoint/torch_export.ts';

/** A file name, whatever the caller passed: no path separators or odd characters. */
function fileName(baseName: string): string {
  return baseName.replace(/[^A-Za-z0-9_.-]/g, '_').replace(/^\.+/, '') || 'browser-ddp-model';
}

function clickDownload(name: string, blob: Blob): void {
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
}

/**
 * Saves `model` as `<baseName>.json` + `<baseName>.weights.bin`. The dashboard names them after
 * the session and the step (`my-run-step-938`, its `onDownload` argument), so downloads from
 * several runs do not overwrite each other or all read "model".
 */
export async function downloadModel(model: tf.LayersModel, baseName = 'browser-ddp-model', vocabulary?: readonly string[]): Promise<void> {
  const name = fileName(baseName);
  const artifacts = await modelArtifacts(model);
  const weightsFile = `${name}.weights.bin`;
  const modelJson = {
    modelTopology: artifacts.modelTopology,
    format: 'layers-model',
    generatedBy: 'browser-ddp',
    convertedBy: null,
    weightsManifest: [{ paths: [`./${weightsFile}`], weights: artifacts.weightSpecs }],
    // A language model's tokenizer (TF.js keeps userDefinedMetadata; npm run export:torch reads it).
    ...(vocabulary ? { userDefinedMetadata: { vocabulary } } : {}),
  };
  clickDownload(`${name}.json`, new Blob([JSON.stringify(modelJson)], { type: 'application/json' }));
  // Chromium drops a second download started in the same task; give it its own.
  await new Promise((r) => setTimeout(r, 100));
  clickDownload(weightsFile, new Blob([artifacts.weightData], { type: 'application/octet-stream' }));
}

/**
 * Saves `model` for PyTorch: `<name>.safetensors` (torch's state dict) and `<name>.py` (the
 * nn.Module that loads it), `name` being the base name as a Python module name
 * (`my_run_step_938`), so that `from my_run_step_938 import Model, load_file` works.
 * A language model's `vocabulary` goes into the .py (encode, decode, generate).
 * Throws TorchExportError, naming the layer, for a model with a layer torch has no match for.
 */
export async function downloadTorchModel(
  model: tf.LayersModel,
  baseName = 'browser-ddp-model',
  vocabulary?: readonly string[],
): Promise<void> {
  const name = pythonModuleName(fileName(baseName));
  const exported = exportForTorch(await modelArtifacts(model), {
    source: `${baseName}, downloaded from the dashboard`,
    fileName: name,
    ...(vocabulary ? { vocabulary } : {}),
  });
  clickDownload(`${name}.safetensors`, new Blob([exported.safetensors], { type: 'application/octet-stream' }));
  await new Promise((r) => setTimeout(r, 100));
  clickDownload(`${name}.py`, new Blob([exported.python], { type: 'text/x-python' }));
}
