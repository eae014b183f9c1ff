/**
 * A model as a list of layer factories (see models.ts): what the models make, what a pipeline
 * stage builds its share from, and a loaded model's layers as factories. Below models.ts and
 * language_model.ts, which both make them.
 */
import * as tf from '@tensorflow/tfjs';

/**
 * Makes one layer of a model. `inputShape` (without the batch dimension) is given to the first
 * layer of a model or of a pipeline stage; other layers get undefined.
 */
export type LayerFactory = (inputShape?: number[]) => tf.layers.Layer;

/** `layers` as one Sequential model taking inputs of `inputShape` (a whole model, or one pipeline stage). */
export function sequentialOf(layers: LayerFactory[], inputShape: number[], name: string): tf.Sequential {
  const model = tf.sequential({ name });
  layers.forEach((make, i) => {
    model.add(make(i === 0 ? inputShape : undefined));
  });
  return model;
}

/**
 * A loaded model's layers as factories (a user's own model: `tf.loadLayersModel`, the host's
 * offered one), so that a pipeline stage builds only its share of them, each layer made anew from
 * its config with the loaded model's weights as its initial weights (the same on every rank).
 * The loaded model must stay alive while stages are built from it.
 */
export function layerFactoriesOf(model: tf.LayersModel): LayerFactory[] {
  type LayerClass = tf.serialization.SerializableConstructor<tf.layers.Layer> & {
    fromConfig(cls: unknown, config: tf.serialization.ConfigDict): tf.layers.Layer;
  };
  return model.layers
    .filter((layer) => layer.getClassName() !== 'InputLayer')
    .map((layer) => {
      const cls = layer.constructor as unknown as LayerClass;
      return (inputShape?: number[]) => {
        const config: tf.serialization.ConfigDict = {
          ...layer.getConfig(),
          weights: layer.getWeights() as unknown as tf.serialization.ConfigDictValue,
        };
        delete config.batchInputShape;
        delete config.inputShape;
        if (inputShape) config.batchInputShape = [null, ...inputShape];
        return cls.fromConfig(cls, config);
      };
    });
}
