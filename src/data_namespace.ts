/** `data`: dataset helpers below torch.utils.data's names (IDX parsing, labels per sample, streaming's threshold), and each tab's own samples (LocalDataset, for runElastic's `localData`). */
export { labelsPerSample } from './datasets/dataset.ts';
export { parseIdx, mnistFromIdx } from './datasets/mnist.ts';
export { STREAM_ABOVE_BYTES } from './datasets/offered.ts';
export { LocalDataset, MAX_LOCAL_SAMPLES, type LocalDatasetInit } from './datasets/local.ts';
export { evaluateLocal, countCorrect, type Accuracy, type LocalEvaluation } from './elastic/local_eval.ts';
export { splitByRemaining, type LocalCounts } from './elastic/local_epoch.ts';
export type { LocalDataEvent } from './parallel/ddp/local_data.ts';
