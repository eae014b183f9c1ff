/**
 * The library: torch.distributed for browser tabs. One entry, importable from the browser and
 * from Node (through tsx).
 */
export { StoreClient, PrefixStore, storeSocketUrl, type Store, type StoreValue, type StoreClientOptions } from './store.ts';
export {
  initProcessGroup,
  ProcessGroup,
  reducer,
  type InitProcessGroupOptions,
  type ProcessGroupEvent,
  type ReduceOpName,
} from './process_group.ts';
export type { PeerLink, PeerLinkFactory, LinkState } from './peer_link.ts';
export {
  StoreError,
  StoreTimeoutError,
  RendezvousError,
  ConnectionClosedError,
  DistTimeoutError,
  PeerLostError,
  CollectiveMismatchError,
  FramingError,
} from './errors.ts';
export { ErrorCode, DEFAULT_LIMITS, PROTOCOL_VERSION } from './protocol.ts';
export { DistributedSampler, epochOrder, randperm, Mt19937, type DistributedSamplerOptions } from './sampler.ts';
export { hashFloat32 } from './hash.ts';
export {
  type Dataset,
  InMemoryDataset,
  Subset,
  subset,
  parseIdx,
  mnistFromIdx,
  loadMnist,
  loadMnistSplits,
  syntheticDataset,
  csvDataset,
  DatasetError,
  DatasetFetchError,
} from './datasets.ts';
export { DistributedDataParallel, ShapeMismatchError, assignBuckets, type DDPOptions, type Bucket, type BackwardTimings } from './ddp.ts';
export { buildModel, classificationLoss, type ModelKind, type ModelSpec } from './models.ts';
export {
  encodeCheckpoint,
  decodeCheckpoint,
  saveCheckpoint,
  loadCheckpoint,
  listCheckpoints,
  CheckpointCorruptError,
  CheckpointError,
  DEFAULT_CHECKPOINT_TIMEOUT_MS,
  type Checkpoint,
  type WeightSpec,
  type CheckpointInfo,
  type LoadedCheckpoint,
  type CheckpointRequestOptions,
  type LoadCheckpointOptions,
} from './checkpoint.ts';
export { modelArtifacts, loadModelWeights, optimizerState, loadOptimizerState, type TensorBundle } from './training_state.ts';
export { ElasticAgent, type ElasticOptions, type Generation, type AgentEvent } from './elastic.ts';
