/** `data`: dataset helpers below torch.utils.data's names (IDX parsing, labels per sample, streaming's threshold). */
export { labelsPerSample } from './datasets/dataset.ts';
export { parseIdx, mnistFromIdx } from './datasets/mnist.ts';
export { STREAM_ABOVE_BYTES } from './datasets/offered.ts';
