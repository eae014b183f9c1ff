/**
 * The names that moved from the top level into a namespace (2026-11, issue 53), kept so that
 * existing scripts go on working: each is the namespace's own binding, marked deprecated so an
 * editor points at the new name. A closed list (test/public_surface.test.ts): new names go to a namespace or the top.
 */
export {
  /** @deprecated use `util.Mt19937` */
  Mt19937,
  /** @deprecated use `util.randperm` */
  randperm,
  /** @deprecated use `util.epochOrder` */
  epochOrder,
  /** @deprecated use `util.Mulberry32` */
  Mulberry32,
  /** @deprecated use `util.hashFloat32` */
  hashFloat32,
  /** @deprecated use `util.newSessionToken` */
  newSessionToken,
  /** @deprecated use `util.isSessionToken` */
  isSessionToken,
  /** @deprecated use `util.withToken` */
  withToken,
  /** @deprecated use `util.tokenFromFragment` */
  tokenFromFragment,
  /** @deprecated use `util.parseScriptArgs` */
  parseScriptArgs,
} from './util_namespace.ts';
export {
  /** @deprecated use `wire.ErrorCode` */
  ErrorCode,
  /** @deprecated use `wire.CloseCode` */
  CloseCode,
  /** @deprecated use `wire.DEFAULT_LIMITS` */
  DEFAULT_LIMITS,
  /** @deprecated use `wire.PROTOCOL_VERSION` */
  PROTOCOL_VERSION,
  /** @deprecated use `wire.ControlAction` */
  type ControlAction,
  /** @deprecated use `wire.ControlEvent` */
  type ControlEvent,
  /** @deprecated use `wire.HostAction` */
  type HostAction,
  /** @deprecated use `wire.TokenEvent` */
  type TokenEvent,
  /** @deprecated use `wire.WIRE_DTYPES` */
  WIRE_DTYPES,
  /** @deprecated use `wire.wireBytes` */
  wireBytes,
  /** @deprecated use `wire.wirePayloadBytes` */
  wirePayloadBytes,
  /** @deprecated use `wire.encode16` */
  encode16,
  /** @deprecated use `wire.decode16` */
  decode16,
  /** @deprecated use `wire.roundToWire` */
  roundToWire,
  /** @deprecated use `wire.toFloat16Bits` */
  toFloat16Bits,
  /** @deprecated use `wire.fromFloat16Bits` */
  fromFloat16Bits,
  /** @deprecated use `wire.toBfloat16Bits` */
  toBfloat16Bits,
  /** @deprecated use `wire.fromBfloat16Bits` */
  fromBfloat16Bits,
  /** @deprecated use `wire.packHalf` */
  packHalf,
  /** @deprecated use `wire.unpackHalf` */
  unpackHalf,
  /** @deprecated use `wire.HalfDtype` */
  type HalfDtype,
  /** @deprecated use `wire.encodeInt8` */
  encodeInt8,
  /** @deprecated use `wire.decodeInt8` */
  decodeInt8,
  /** @deprecated use `wire.int8Bytes` */
  int8Bytes,
  /** @deprecated use `wire.roundToInt8` */
  roundToInt8,
  /** @deprecated use `wire.INT8_BLOCK` */
  INT8_BLOCK,
} from './wire_namespace.ts';
export {
  /** @deprecated use `c10d.reducer` */
  reducer,
  /** @deprecated use `c10d.chooseAlgorithm` */
  chooseAlgorithm,
  /** @deprecated use `c10d.DEFAULT_LATENCY_THRESHOLD_BYTES` */
  DEFAULT_LATENCY_THRESHOLD_BYTES,
  /** @deprecated use `c10d.CollectiveAlgorithm` */
  type CollectiveAlgorithm,
  /** @deprecated use `c10d.allReduceBytes` */
  allReduceBytes,
  /** @deprecated use `c10d.meshAllGatherBytes` */
  meshAllGatherBytes,
  /** @deprecated use `c10d.messageBytes` */
  messageBytes,
  /** @deprecated use `c10d.CollectiveBytesOptions` */
  type CollectiveBytesOptions,
  /** @deprecated use `c10d.storeSocketUrl` */
  storeSocketUrl,
  /** @deprecated use `c10d.LinkDetails` */
  type LinkDetails,
  /** @deprecated use `c10d.LinkPath` */
  type LinkPath,
  /** @deprecated use `c10d.LinkStats` */
  type LinkStats,
  /** @deprecated use `c10d.PeerLink` */
  type PeerLink,
  /** @deprecated use `c10d.PeerLinkFactory` */
  type PeerLinkFactory,
  /** @deprecated use `c10d.LinkState` */
  type LinkState,
  /** @deprecated use `c10d.CandidateType` */
  type CandidateType,
  /** @deprecated use `c10d.PathSample` */
  type PathSample,
  /** @deprecated use `c10d.selectedPath` */
  selectedPath,
} from './c10d_namespace.ts';
export {
  /** @deprecated use `runtime.watchDevice` */
  watchDevice,
  /** @deprecated use `runtime.recreateBackend` */
  recreateBackend,
  /** @deprecated use `runtime.destroyDevice` */
  destroyDevice,
  /** @deprecated use `runtime.currentDevice` */
  currentDevice,
  /** @deprecated use `runtime.probeBackend` */
  probeBackend,
  /** @deprecated use `runtime.startBackend` */
  startBackend,
  /** @deprecated use `runtime.disposeQuietly` */
  disposeQuietly,
  /** @deprecated use `runtime.DeviceWatch` */
  type DeviceWatch,
  /** @deprecated use `runtime.DeviceLostInfo` */
  type DeviceLostInfo,
  /** @deprecated use `runtime.GpuDeviceLike` */
  type GpuDeviceLike,
  /** @deprecated use `runtime.RecreatedBackend` */
  type RecreatedBackend,
  /** @deprecated use `runtime.RecreateBackendOptions` */
  type RecreateBackendOptions,
  /** @deprecated use `runtime.Straggler` */
  Straggler,
  /** @deprecated use `runtime.StragglerSpecError` */
  StragglerSpecError,
  /** @deprecated use `runtime.parseSlow` */
  parseSlow,
  /** @deprecated use `runtime.formatSlow` */
  formatSlow,
  /** @deprecated use `runtime.slowFactor` */
  slowFactor,
  /** @deprecated use `runtime.SLOW_SPEC_RULE` */
  SLOW_SPEC_RULE,
} from './runtime_namespace.ts';
export {
  /** @deprecated use `data.labelsPerSample` */
  labelsPerSample,
  /** @deprecated use `data.parseIdx` */
  parseIdx,
  /** @deprecated use `data.mnistFromIdx` */
  mnistFromIdx,
  /** @deprecated use `data.STREAM_ABOVE_BYTES` */
  STREAM_ABOVE_BYTES,
} from './data_namespace.ts';
export {
  /** @deprecated use `nn.layerFactoriesOf` */
  layerFactoriesOf,
  /** @deprecated use `nn.modelLayers` */
  modelLayers,
  /** @deprecated use `nn.sequentialOf` */
  sequentialOf,
  /** @deprecated use `nn.LM_DEFAULTS` */
  LM_DEFAULTS,
  /** @deprecated use `nn.LayerFactory` */
  type LayerFactory,
  /** @deprecated use `nn.languageModelLayers` */
  languageModelLayers,
  /** @deprecated use `nn.correctPredictions` */
  correctPredictions,
  /** @deprecated use `nn.ParamLayout` */
  type ParamLayout,
} from './nn_namespace.ts';
export {
  /** @deprecated use `io.encodeCheckpoint` */
  encodeCheckpoint,
  /** @deprecated use `io.decodeCheckpoint` */
  decodeCheckpoint,
  /** @deprecated use `io.CHECKPOINT_PART` */
  CHECKPOINT_PART,
  /** @deprecated use `io.Checkpoint` */
  type Checkpoint,
  /** @deprecated use `io.WeightSpec` */
  type WeightSpec,
  /** @deprecated use `io.encodeSafetensors` */
  encodeSafetensors,
  /** @deprecated use `io.decodeSafetensors` */
  decodeSafetensors,
  /** @deprecated use `io.NamedTensor` */
  type NamedTensor,
  /** @deprecated use `io.SafetensorsDtype` */
  type SafetensorsDtype,
  /** @deprecated use `io.DecodedSafetensors` */
  type DecodedSafetensors,
  /** @deprecated use `io.pythonModuleName` */
  pythonModuleName,
  /** @deprecated use `io.DEFAULT_CHECKPOINT_TIMEOUT_MS` */
  DEFAULT_CHECKPOINT_TIMEOUT_MS,
} from './io_namespace.ts';
export {
  /** @deprecated use `elastic.stepVote` */
  stepVote,
  /** @deprecated use `elastic.stepsVote` */
  stepsVote,
  /** @deprecated use `elastic.StepVote` */
  type StepVote,
  /** @deprecated use `elastic.StepsVote` */
  type StepsVote,
  /** @deprecated use `elastic.saveState` */
  saveState,
  /** @deprecated use `elastic.restoreStatePart` */
  restoreStatePart,
  /** @deprecated use `elastic.appendCommHookState` */
  appendCommHookState,
  /** @deprecated use `elastic.splitCommHookState` */
  splitCommHookState,
  /** @deprecated use `elastic.RunRecord` */
  type RunRecord,
  /** @deprecated use `elastic.Restored` */
  type Restored,
  /** @deprecated use `elastic.setEventHandler` */
  setEventHandler,
  /** @deprecated use `elastic.StepBalance` */
  type StepBalance,
  /** @deprecated use `elastic.StepTimeline` */
  type StepTimeline,
} from './elastic_namespace.ts';
export {
  /** @deprecated use `parallel.assignBuckets` */
  assignBuckets,
  /** @deprecated use `parallel.Bucket` */
  type Bucket,
  /** @deprecated use `parallel.weightsHash` */
  weightsHash,
  /** @deprecated use `parallel.flatTrainableWeights` */
  flatTrainableWeights,
  /** @deprecated use `parallel.assignFlatWeights` */
  assignFlatWeights,
  /** @deprecated use `parallel.hostWeights` */
  hostWeights,
  /** @deprecated use `parallel.webWorkerDevice` */
  webWorkerDevice,
  /** @deprecated use `parallel.MAX_DEVICES` */
  MAX_DEVICES,
  /** @deprecated use `parallel.DeviceChannel` */
  type DeviceChannel,
  /** @deprecated use `parallel.DeviceInfo` */
  type DeviceInfo,
  /** @deprecated use `parallel.DeviceStep` */
  type DeviceStep,
  /** @deprecated use `parallel.DeviceStats` */
  type DeviceStats,
  /** @deprecated use `parallel.DEVICE_BACKENDS` */
  DEVICE_BACKENDS,
  /** @deprecated use `parallel.DeviceFault` */
  type DeviceFault,
  /** @deprecated use `parallel.chunkSizes` */
  chunkSizes,
  /** @deprecated use `parallel.scatter` */
  scatter,
  /** @deprecated use `parallel.gatherMean` */
  gatherMean,
  /** @deprecated use `parallel.Chunk` */
  type Chunk,
} from './parallel_namespace.ts';
export {
  /** @deprecated use `pipeline.scheduleActions` */
  scheduleActions,
  /** @deprecated use `pipeline.microBatchSizes` */
  microBatchSizes,
  /** @deprecated use `pipeline.bubbleFraction` */
  bubbleFraction,
  /** @deprecated use `pipeline.peakStashed` */
  peakStashed,
  /** @deprecated use `pipeline.SCHEDULES` */
  SCHEDULES,
  /** @deprecated use `pipeline.Action` */
  type Action,
  /** @deprecated use `pipeline.describeLayers` */
  describeLayers,
  /** @deprecated use `pipeline.balancedSplitPoints` */
  balancedSplitPoints,
  /** @deprecated use `pipeline.checkSplitPoints` */
  checkSplitPoints,
  /** @deprecated use `pipeline.stageRanges` */
  stageRanges,
  /** @deprecated use `pipeline.LayerInfo` */
  type LayerInfo,
  /** @deprecated use `pipeline.ACTIVATION_DTYPES` */
  ACTIVATION_DTYPES,
  /** @deprecated use `pipeline.StageStepOptions` */
  type StageStepOptions,
  /** @deprecated use `pipeline.StageStepResult` */
  type StageStepResult,
  /** @deprecated use `pipeline.TimelineEntry` */
  type TimelineEntry,
  /** @deprecated use `pipeline.pipelineMesh` */
  pipelineMesh,
  /** @deprecated use `pipeline.meshRank` */
  meshRank,
  /** @deprecated use `pipeline.stagePart` */
  stagePart,
  /** @deprecated use `pipeline.describeMeshFailure` */
  describeMeshFailure,
  /** @deprecated use `pipeline.PipelineMesh` */
  type PipelineMesh,
} from './pipeline_namespace.ts';
export {
  /** @deprecated use `parameterServer.shardParameters` */
  shardParameters,
  /** @deprecated use `parameterServer.splitByShard` */
  splitByShard,
  /** @deprecated use `parameterServer.joinShards` */
  joinShards,
  /** @deprecated use `parameterServer.ShardLayout` */
  type ShardLayout,
  /** @deprecated use `parameterServer.MAX_STEP_JUMP` */
  MAX_STEP_JUMP,
  /** @deprecated use `parameterServer.REFUSAL_REASONS` */
  REFUSAL_REASONS,
  /** @deprecated use `parameterServer.Push` */
  type Push,
  /** @deprecated use `parameterServer.ApplyResult` */
  type ApplyResult,
  /** @deprecated use `parameterServer.RefusalReason` */
  type RefusalReason,
  /** @deprecated use `parameterServer.ShardStats` */
  type ShardStats,
  /** @deprecated use `parameterServer.ShardStateDict` */
  type ShardStateDict,
  /** @deprecated use `parameterServer.SyncResult` */
  type SyncResult,
  /** @deprecated use `parameterServer.SyncRefusal` */
  type SyncRefusal,
  /** @deprecated use `parameterServer.psPart` */
  psPart,
  /** @deprecated use `parameterServer.saveShard` */
  saveShard,
  /** @deprecated use `parameterServer.restoreShard` */
  restoreShard,
  /** @deprecated use `parameterServer.shardCheckpoint` */
  shardCheckpoint,
  /** @deprecated use `parameterServer.shardStateFromCheckpoint` */
  shardStateFromCheckpoint,
  /** @deprecated use `parameterServer.ShardCheckpointOptions` */
  type ShardCheckpointOptions,
  /** @deprecated use `parameterServer.flatGradients` */
  flatGradients,
  /** @deprecated use `parameterServer.LeaseBook` */
  LeaseBook,
  /** @deprecated use `parameterServer.leaseIndices` */
  leaseIndices,
  /** @deprecated use `parameterServer.LeaseOptions` */
  type LeaseOptions,
  /** @deprecated use `parameterServer.LeaseSnapshot` */
  type LeaseSnapshot,
  /** @deprecated use `parameterServer.assignPlaces` */
  assignPlaces,
  /** @deprecated use `parameterServer.rolesOf` */
  rolesOf,
  /** @deprecated use `parameterServer.RoleClaim` */
  type RoleClaim,
  /** @deprecated use `parameterServer.PsStatus` */
  type PsStatus,
  /** @deprecated use `parameterServer.PsSampleCounts` */
  type PsSampleCounts,
  /** @deprecated use `parameterServer.PsServerSlot` */
  type PsServerSlot,
  /** @deprecated use `parameterServer.Lease` */
  type Lease,
} from './parameter_server_namespace.ts';
export {
  /** @deprecated use `robust.aggregate` */
  aggregate,
  /** @deprecated use `robust.checkAggregationSpec` */
  checkAggregationSpec,
  /** @deprecated use `robust.DEFAULT_CLIP_ITERATIONS` */
  DEFAULT_CLIP_ITERATIONS,
  /** @deprecated use `robust.Aggregation` */
  type Aggregation,
  /** @deprecated use `robust.RankJudgment` */
  type RankJudgment,
  /** @deprecated use `robust.RobustReducer` */
  RobustReducer,
  /** @deprecated use `robust.isRobust` */
  isRobust,
  /** @deprecated use `robust.describeAggregation` */
  describeAggregation,
  /** @deprecated use `robust.AggregationReport` */
  type AggregationReport,
  /** @deprecated use `robust.gatherContributions` */
  gatherContributions,
  /** @deprecated use `robust.GatheredContributions` */
  type GatheredContributions,
  /** @deprecated use `robust.applyAttack` */
  applyAttack,
  /** @deprecated use `robust.isAttacker` */
  isAttacker,
  /** @deprecated use `robust.ATTACK_KINDS` */
  ATTACK_KINDS,
  /** @deprecated use `robust.AttackKind` */
  type AttackKind,
  /** @deprecated use `robust.AttackSpec` */
  type AttackSpec,
  /** @deprecated use `robust.AttackPlan` */
  type AttackPlan,
  /** @deprecated use `robust.AttackContext` */
  type AttackContext,
  /** @deprecated use `robust.judgedOf` */
  judgedOf,
  /** @deprecated use `robust.tallyContributions` */
  tallyContributions,
  /** @deprecated use `robust.summarizeContributions` */
  summarizeContributions,
  /** @deprecated use `robust.rankMeans` */
  rankMeans,
  /** @deprecated use `robust.MAX_REPORTED_RANKS` */
  MAX_REPORTED_RANKS,
  /** @deprecated use `robust.AggregationJudged` */
  type AggregationJudged,
  /** @deprecated use `robust.ContributionOf` */
  type ContributionOf,
  /** @deprecated use `robust.ContributionSummary` */
  type ContributionSummary,
  /** @deprecated use `robust.ContributionTally` */
  type ContributionTally,
  /** @deprecated use `robust.RankContribution` */
  type RankContribution,
  /** @deprecated use `robust.RankTally` */
  type RankTally,
} from './robust_namespace.ts';
