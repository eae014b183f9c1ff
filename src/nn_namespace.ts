/** `nn`: model helpers below the model builders: layer lists for pipeline stages, the LM's defaults, accuracy counts, optimizer layouts. */
export { layerFactoriesOf, modelLayers, sequentialOf, LM_DEFAULTS, type LayerFactory } from './nn/models.ts';
export { languageModelLayers } from './nn/language_model.ts';
export { correctPredictions } from './nn/losses.ts';
export type { ParamLayout } from './nn/optim.ts';
