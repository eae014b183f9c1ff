/**
 * The library: torch.distributed for browser tabs. One entry, importable from the browser and
 * from Node (through tsx).
 *
 * torch's names are at the top, grouped as torch groups them; the helpers below them live in
 * namespaces, as tfjs-core's `util` and `io` do (`util.hashFloat32`, `wire.toFloat16Bits`).
 * A name that moved into a namespace stays importable from the top as a deprecated alias
 * (./deprecated.ts). test/public_surface.test.ts holds the list: a new top-level name is a choice.
 */

// torch.distributed: the process group, its store, its collectives (methods of ProcessGroup: allReduce, broadcast,
// allGather, reduceScatter, send/recv, barrier, newGroup, destroy).
export { initProcessGroup, type InitProcessGroupOptions } from './c10d/init_process_group.ts';
export {
  ProcessGroup,
  type AllReduceOptions,
  type CollectiveOptions,
  type WireDtype,
  type LinkOptions,
  type ProcessGroupEvent,
  type ReduceOpName,
} from './c10d/process_group.ts';
// The store client that talks to the server is torch's TCPStore; HashStore is torch's, in memory.
export { StoreClient, StoreClient as TCPStore, PrefixStore, type Store, type StoreValue, type StoreClientOptions } from './c10d/store.ts';
export { HashStore } from './c10d/hash_store.ts';
export {
  StoreError,
  StoreTimeoutError,
  RendezvousError,
  RendezvousClosedError,
  UnauthorizedError,
  TokenRotatedError,
  RemovedByHostError,
  NotHostError,
  SessionEndedError,
  ConnectionClosedError,
  DistTimeoutError,
  PeerLostError,
  RankStalledError,
  CollectiveMismatchError,
  CollectiveAbortedError,
  GroupClosedError,
  FramingError,
  ServerMessageError,
  NonFiniteGradientError,
  ContributionMismatchError,
  NonFiniteWeightsError,
  RoleConflictError,
  ReplicaDivergenceError,
  StateTransferError,
  DeviceLostError,
  DataParallelDeviceError,
  isRecoverable,
  type DeviceLostReason,
} from './wire/errors.ts';

// torch.distributed.elastic: the rendezvous handler, the agent's round loop, and DDP's elastic run on it.
export { RendezvousHandler, type RendezvousOptions, type RendezvousEvent, type Round } from './c10d/rendezvous.ts';
export { runAgent, REGROUP, type ElasticStrategy } from './elastic/agent.ts';
export {
  runElastic,
  type ElasticRunOptions,
  type ElasticRunResult,
  type StepContext,
  type RoundContext,
  type StepMetrics,
  type RebuildContext,
} from './parallel/ddp/runner.ts';
export type { ElasticEvent } from './parallel/events.ts';

// torch.nn.parallel: DistributedDataParallel, DataParallel.
export {
  DistributedDataParallel,
  ShapeMismatchError,
  type DDPOptions,
  type BackwardTimings,
  type BackwardOptions,
  type BackwardResult,
} from './parallel/ddp/ddp.ts';
export { verifyReplicas } from './parallel/replicas.ts';
export {
  DataParallel,
  type DataParallelOptions,
  type DataParallelBatch,
  type DataParallelResult,
  type LocalGradients,
} from './parallel/data_parallel/data_parallel.ts';
export type { DeviceBackend, DataParallelLoss } from './parallel/data_parallel/protocol.ts';

// torch.distributed.algorithms.ddp_comm_hooks and model_averaging; DiLoCo; robust aggregation (DDPOptions.aggregation).
export { allreduceHook, fp16CompressHook, bf16CompressHook } from './parallel/comm_hooks/default_hooks.ts';
export type { CommHook, CommHookState, GradBucket, LoadCommHookStateOptions } from './parallel/comm_hooks/types.ts';
export { powerSGD, PowerSGDHook, PowerSGDStateError, type PowerSGDOptions, type PowerSGDStats } from './parallel/comm_hooks/powersgd.ts';
export {
  postLocalSGD,
  PeriodicModelAverager,
  type PostLocalSGDOptions,
  type PeriodicModelAveragerOptions,
} from './parallel/comm_hooks/local_sgd.ts';
export { DiLoCo, diloco, type DiLoCoOptions, type DiLoCoHeld, type DiLoCoRejoin } from './parallel/diloco/diloco.ts';
export { NoContributionError, type AggregationKind, type AggregationSpec } from './parallel/robust/aggregators.ts';

// torch.distributed.pipelining.
export { PipelineStage, type ActivationDtype, type PipelineStageOptions } from './parallel/pipeline/stage.ts';
export type { ScheduleKind } from './parallel/pipeline/schedule.ts';
export {
  runPipeline,
  type PipelineRunOptions,
  type PipelineRunResult,
  type PipelineStepContext,
  type PipelineRoundContext,
} from './parallel/pipeline/runner.ts';

// Parameter servers (torch.distributed.rpc's classic use; central storage is TF's CentralStorageStrategy).
export { ParameterServerShard, ShardStateError, type ParameterServerShardOptions } from './parallel/parameter_server/shard.ts';
export { CentralStorageAccumulator, SyncPushError, type CentralStorageOptions } from './parallel/parameter_server/central_storage.ts';
export {
  runParameterServer,
  type ParameterServerRunOptions,
  type ParameterServerRunResult,
  type PsStrategy,
  type PsRunEvent,
  type WorkerStepContext,
  type WorkerStepResult,
} from './parallel/parameter_server/runner.ts';

// torch.optim.
export { SGD, Adam, AdamW, HostOptimizer, OptimizerStateError, type SGDOptions, type AdamOptions } from './nn/optim.ts';

// torch.distributed.checkpoint and state dicts (get/set_model_state_dict, get/set_optimizer_state_dict); torch interchange.
export {
  TrainState,
  modelArtifacts,
  loadModelWeights,
  optimizerState,
  loadOptimizerState,
  type TensorBundle,
  type TrainStateDict,
  type TrainStateOptions,
  type Progress,
  type Stateful,
  type Json,
} from './checkpoint/state_dict.ts';
export {
  saveCheckpoint,
  loadCheckpoint,
  listCheckpoints,
  CheckpointError,
  type CheckpointInfo,
  type LoadedCheckpoint,
  type CheckpointRequestOptions,
  type LoadCheckpointOptions,
} from './checkpoint/checkpoint.ts';
export { CheckpointCorruptError } from './checkpoint/checkpoint_format.ts';
export {
  exportForTorch,
  importTorchStateDict,
  TorchExportError,
  type TorchExport,
  type TorchExportOptions,
  type ModelArtifactsLike,
} from './checkpoint/torch_export.ts';
export { SafetensorsError } from './checkpoint/safetensors.ts';

// torch.utils.data (and torchvision's MNIST): datasets, DistributedSampler, the host's offered data.
export { DistributedSampler, type DistributedSamplerOptions, type SamplerState } from './datasets/sampler.ts';
export { type Dataset, InMemoryDataset, Subset, subset, fetchBatch, DatasetError, DatasetFetchError } from './datasets/dataset.ts';
export { loadMnist, loadMnistSplits } from './datasets/mnist.ts';
export { syntheticDataset } from './datasets/synthetic.ts';
export { csvDataset } from './datasets/csv.ts';
export { textDatasets, TextDataset } from './datasets/text.ts';
export { StreamedDataset, type StreamedDatasetInit } from './datasets/streamed.ts';
export {
  fetchOffer,
  loadOfferedDataset,
  loadOfferedModel,
  loadOfferedText,
  type StreamMode,
  type OfferInfo,
  type OfferRequest,
} from './datasets/offered.ts';

// torch.nn: the models, the language model, the loss.
export { buildModel, type ModelKind, type ModelSpec } from './nn/models.ts';
export {
  buildLanguageModel,
  languageModelLoss,
  generate,
  CharTokenizer,
  TokenAndPositionEmbedding,
  TransformerBlock,
  type LanguageModelSpec,
} from './nn/language_model.ts';
export { classificationLoss } from './nn/losses.ts';

// torch.distributed.rpc, .optim and .nn: the RPC framework's entry and its two classes (the rest in `rpc`).
export { initRpc, type InitRpcOptions } from './rpc/api.ts';
export { DistributedOptimizer } from './rpc/distributed_optimizer.ts';
export { RemoteModule } from './rpc/remote_module.ts';

// torchrun: what the launcher hands a script, and its arguments read as integers.
export { intArg, type LaunchContext, type ScriptMain } from './jobs/launch_context.ts';

// The helpers, by namespace.
export * as util from './util_namespace.ts';
export * as wire from './wire_namespace.ts';
export * as c10d from './c10d_namespace.ts';
export * as runtime from './runtime_namespace.ts';
export * as data from './data_namespace.ts';
export * as nn from './nn_namespace.ts';
export * as io from './io_namespace.ts';
export * as elastic from './elastic_namespace.ts';
export * as parallel from './parallel_namespace.ts';
export * as pipeline from './pipeline_namespace.ts';
export * as parameterServer from './parameter_server_namespace.ts';
export * as robust from './robust_namespace.ts';
export * as rpc from './rpc_namespace.ts';
export * as distAutograd from './dist_autograd_namespace.ts';

// The names that moved into the namespaces, kept as deprecated aliases for existing scripts.
export * from './deprecated.ts';
