/** `io`: the bytes of checkpoints and model files (as tfjs-core's `tf.io`): the checkpoint format, safetensors, torch's module names. */
export { encodeCheckpoint, decodeCheckpoint, CHECKPOINT_PART, type Checkpoint, type WeightSpec } from './checkpoint/checkpoint_format.ts';
export {
  encodeSafetensors,
  decodeSafetensors,
  type NamedTensor,
  type SafetensorsDtype,
  type DecodedSafetensors,
} from './checkpoint/safetensors.ts';
export { pythonModuleName } from './checkpoint/torch_export.ts';
export { DEFAULT_CHECKPOINT_TIMEOUT_MS } from './checkpoint/checkpoint.ts';
