/**
 * The library: torch.distributed for browser tabs. One entry, importable from the browser and
 * from Node (through tsx).
 */
export { StoreClient, PrefixStore, storeSocketUrl, type Store, type StoreValue, type StoreClientOptions } from './c10d/store.ts';
export { HashStore } from './c10d/hash_store.ts';
export { initProcessGroup, type InitProcessGroupOptions } from './c10d/init_process_group.ts';
export { RendezvousHandler, type RendezvousOptions, type RendezvousEvent, type Round } from './c10d/rendezvous.ts';
export { ProcessGroup, type AllReduceOptions, type CollectiveOptions, type WireDtype, type LinkOptions, type ProcessGroupEvent, type ReduceOpName, type LinkDetails, type LinkPath, type LinkStats } from './c10d/process_group.ts';
export { reducer } from './c10d/ring.ts';
export { chooseAlgorithm, DEFAULT_LATENCY_THRESHOLD_BYTES, type CollectiveAlgorithm } from './c10d/latency_collectives.ts';
export { allReduceBytes, meshAllGatherBytes, messageBytes, type CollectiveBytesOptions } from './c10d/collective_bytes.ts';
export type { PeerLink, PeerLinkFactory, LinkState, CandidateType, PathSample } from './transport/peer_link.ts';
export { selectedPath } from './transport/link_stats.ts';
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
export {
  watchDevice,
  recreateBackend,
  destroyDevice,
  currentDevice,
  probeBackend,
  startBackend,
  disposeQuietly,
  type DeviceWatch,
  type DeviceLostInfo,
  type GpuDeviceLike,
  type RecreatedBackend,
  type RecreateBackendOptions,
} from './runtime/device.ts';
export { ErrorCode, CloseCode, DEFAULT_LIMITS, PROTOCOL_VERSION, type ControlAction, type ControlEvent, type HostAction, type TokenEvent } from './wire/protocol.ts';
export { newSessionToken, isSessionToken, withToken, tokenFromFragment } from './wire/session_token.ts';
export { DistributedSampler, epochOrder, randperm, Mt19937, type DistributedSamplerOptions, type SamplerState } from './datasets/sampler.ts';
export { hashFloat32 } from './wire/hash.ts';
export { type Dataset, InMemoryDataset, Subset, subset, fetchBatch, labelsPerSample, DatasetError, DatasetFetchError } from './datasets/dataset.ts';
export { parseIdx, mnistFromIdx, loadMnist, loadMnistSplits } from './datasets/mnist.ts';
export { fetchOffer, loadOfferedDataset, loadOfferedModel, loadOfferedText, STREAM_ABOVE_BYTES, type StreamMode, type OfferInfo, type OfferRequest } from './datasets/offered.ts';
export { syntheticDataset, Mulberry32 } from './datasets/synthetic.ts';
export { csvDataset } from './datasets/csv.ts';
export { textDatasets, TextDataset } from './datasets/text.ts';
export { StreamedDataset, type StreamedDatasetInit } from './datasets/streamed.ts';
export { DistributedDataParallel, ShapeMismatchError, assignBuckets, type DDPOptions, type Bucket, type BackwardTimings, type BackwardOptions, type BackwardResult } from './parallel/ddp/ddp.ts';
export { SGD, Adam, AdamW, HostOptimizer, OptimizerStateError, type SGDOptions, type AdamOptions, type ParamLayout } from './nn/optim.ts';
export { allreduceHook, fp16CompressHook, bf16CompressHook } from './parallel/comm_hooks/default_hooks.ts';
export type { CommHook, CommHookState, GradBucket, LoadCommHookStateOptions } from './parallel/comm_hooks/types.ts';
export {
  WIRE_DTYPES,
  wireBytes,
  wirePayloadBytes,
  encode16,
  decode16,
  roundToWire,
  toFloat16Bits,
  fromFloat16Bits,
  toBfloat16Bits,
  fromBfloat16Bits,
  type HalfDtype,
} from './wire/half.ts';
export { encodeInt8, decodeInt8, int8Bytes, roundToInt8, INT8_BLOCK } from './wire/int8_wire.ts';
export { verifyReplicas, weightsHash, flatTrainableWeights, assignFlatWeights, hostWeights } from './parallel/replicas.ts';
export { buildLanguageModel, languageModelLayers, languageModelLoss, generate, CharTokenizer, TokenAndPositionEmbedding, TransformerBlock, type LanguageModelSpec } from './nn/language_model.ts';
export { buildModel, layerFactoriesOf, modelLayers, sequentialOf, LM_DEFAULTS, type ModelKind, type ModelSpec, type LayerFactory } from './nn/models.ts';
export { classificationLoss, correctPredictions } from './nn/losses.ts';
export { scheduleActions, microBatchSizes, bubbleFraction, peakStashed, SCHEDULES, type ScheduleKind, type Action } from './parallel/pipeline/schedule.ts';
export { describeLayers, balancedSplitPoints, checkSplitPoints, stageRanges, type LayerInfo } from './parallel/pipeline/split.ts';
export { PipelineStage, packHalf, unpackHalf, ACTIVATION_DTYPES, type ActivationDtype, type PipelineStageOptions, type StageStepOptions, type StageStepResult, type TimelineEntry } from './parallel/pipeline/stage.ts';
export {
  runPipeline,
  pipelineMesh,
  meshRank,
  stagePart,
  describeMeshFailure,
  type PipelineMesh,
  type PipelineRunOptions,
  type PipelineRunResult,
  type PipelineStepContext,
  type PipelineRoundContext,
} from './parallel/pipeline/runner.ts';
export { encodeCheckpoint, decodeCheckpoint, CheckpointCorruptError, CHECKPOINT_PART, type Checkpoint, type WeightSpec } from './checkpoint/checkpoint_format.ts';
export { exportForTorch, importTorchStateDict, pythonModuleName, TorchExportError, type TorchExport, type TorchExportOptions, type ModelArtifactsLike } from './checkpoint/torch_export.ts';
export { encodeSafetensors, decodeSafetensors, SafetensorsError, type NamedTensor, type SafetensorsDtype, type DecodedSafetensors } from './checkpoint/safetensors.ts';
export {
  saveCheckpoint,
  loadCheckpoint,
  listCheckpoints,
  CheckpointError,
  DEFAULT_CHECKPOINT_TIMEOUT_MS,
  type CheckpointInfo,
  type LoadedCheckpoint,
  type CheckpointRequestOptions,
  type LoadCheckpointOptions,
} from './checkpoint/checkpoint.ts';
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
export { stepVote, stepsVote, type StepVote, type StepsVote } from './elastic/vote.ts';
export { runElastic, type ElasticRunOptions, type ElasticRunResult, type StepContext, type RoundContext, type StepMetrics, type RebuildContext } from './parallel/ddp/runner.ts';
export { setEventHandler, type ElasticEvent } from './parallel/events.ts';
export { type StepBalance } from './elastic/balance.ts';
export { judgedOf, tallyContributions, summarizeContributions, rankMeans, MAX_REPORTED_RANKS, type AggregationJudged, type ContributionOf, type ContributionSummary, type ContributionTally, type RankContribution, type RankTally } from './parallel/ddp/contributions.ts';
export type { StepTimeline } from './elastic/timeline.ts';
export { saveState, restoreStatePart, type Restored } from './elastic/checkpoints.ts';
export type { RunRecord } from './elastic/run_record.ts';
export { appendCommHookState, splitCommHookState } from './elastic/hook_state.ts';
export { Straggler, StragglerSpecError, parseSlow, formatSlow, slowFactor, SLOW_SPEC_RULE } from './runtime/straggler.ts';
export { parseScriptArgs, intArg, type LaunchContext, type ScriptMain } from './jobs/launch_context.ts';
export { shardParameters, splitByShard, joinShards, type ShardLayout } from './parallel/parameter_server/sharding.ts';
export {
  ParameterServerShard,
  MAX_STEP_JUMP,
  ShardStateError,
  REFUSAL_REASONS,
  type Push,
  type ApplyResult,
  type RefusalReason,
  type ShardStats,
  type ShardStateDict,
  type ParameterServerShardOptions,
} from './parallel/parameter_server/shard.ts';
export { CentralStorageAccumulator, SyncPushError, type SyncResult, type SyncRefusal, type CentralStorageOptions } from './parallel/parameter_server/central_storage.ts';
export { psPart, saveShard, restoreShard, shardCheckpoint, shardStateFromCheckpoint, type ShardCheckpointOptions } from './parallel/parameter_server/checkpoint.ts';
export { flatGradients } from './parallel/parameter_server/worker.ts';
export { LeaseBook, leaseIndices, type LeaseOptions, type LeaseSnapshot } from './parallel/parameter_server/leases.ts';
export { assignPlaces, rolesOf, type RoleClaim } from './parallel/parameter_server/roles.ts';
export {
  runParameterServer,
  type ParameterServerRunOptions,
  type ParameterServerRunResult,
  type PsStrategy,
  type PsStatus,
  type PsRunEvent,
  type PsSampleCounts,
  type PsServerSlot,
  type Lease,
  type WorkerStepContext,
  type WorkerStepResult,
} from './parallel/parameter_server/runner.ts';
export {
  DataParallel,
  webWorkerDevice,
  MAX_DEVICES,
  type DataParallelOptions,
  type DataParallelBatch,
  type DataParallelResult,
  type DeviceChannel,
  type DeviceInfo,
  type DeviceStep,
  type DeviceStats,
  type LocalGradients,
} from './parallel/data_parallel/data_parallel.ts';
export { chunkSizes, scatter, gatherMean, type Chunk } from './parallel/data_parallel/scatter_gather.ts';
export { DEVICE_BACKENDS, type DeviceBackend, type DataParallelLoss, type DeviceFault } from './parallel/data_parallel/protocol.ts';
export { powerSGD, PowerSGDHook, PowerSGDStateError, type PowerSGDOptions, type PowerSGDStats } from './parallel/comm_hooks/powersgd.ts';
export { postLocalSGD, PeriodicModelAverager, type PostLocalSGDOptions, type PeriodicModelAveragerOptions } from './parallel/comm_hooks/local_sgd.ts';
export { DiLoCo, diloco, type DiLoCoOptions, type DiLoCoHeld, type DiLoCoRejoin } from './parallel/diloco/diloco.ts';
// Robust aggregation (opt-in per session): DDPOptions.aggregation / DiLoCoOptions.aggregation; attacks are for measuring defences.
export { aggregate, checkAggregationSpec, NoContributionError, DEFAULT_CLIP_ITERATIONS, type Aggregation, type AggregationKind, type AggregationSpec, type RankJudgment } from './parallel/robust/aggregators.ts';
export { RobustReducer, isRobust, describeAggregation, type AggregationReport } from './parallel/robust/reducer.ts';
export { gatherContributions, type GatheredContributions } from './parallel/robust/exchange.ts';
export { applyAttack, isAttacker, ATTACK_KINDS, type AttackKind, type AttackSpec, type AttackPlan, type AttackContext } from './parallel/robust/attacks.ts';
