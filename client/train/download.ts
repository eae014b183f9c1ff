/**
 * Saves a model as TF.js's two files (model.json + weights) through the browser's downloads.
 * Done here with a save handler rather than 'downloads://', whose router the bundler may drop.
 */
import * as tf from '@tensorflow/tfjs';

function clickDownload(name: string, blob: Blob): void {
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
}

export async function downloadModel(model: tf.LayersModel, name = 'browser-ddp-model'): Promise<void> {
  await model.save(
    tf.io.withSaveHandler(async (artifacts) => {
      const weightsFile = `${name}.weights.bin`;
      const weightData = artifacts.weightData === undefined ? new ArrayBuffer(0) : tf.io.CompositeArrayBuffer.join(artifacts.weightData);
      const modelJson = {
        modelTopology: artifacts.modelTopology,
        format: artifacts.format ?? 'layers-model',
        generatedBy: artifacts.generatedBy,
        convertedBy: artifacts.convertedBy ?? null,
        ...(artifacts.trainingConfig ? { trainingConfig: artifacts.trainingConfig } : {}),
        weightsManifest: [{ paths: [`./${weightsFile}`], weights: artifacts.weightSpecs ?? [] }],
      };
      clickDownload(`${name}.json`, new Blob([JSON.stringify(modelJson)], { type: 'application/json' }));
      // Chromium drops a second download started in the same task; give it its own.
      await new Promise((r) => setTimeout(r, 100));
      clickDownload(weightsFile, new Blob([weightData], { type: 'application/octet-stream' }));
      return { modelArtifactsInfo: { dateSaved: new Date(), modelTopologyType: 'JSON', weightDataBytes: weightData.byteLength } };
    }),
  );
}
