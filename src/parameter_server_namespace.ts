/**
 * `parameterServer`: below runParameterServer and the shards: how parameters are sharded, a
 * shard's pushes and state, its checkpoints, the workers' leases and roles.
 */
export { shardParameters, splitByShard, joinShards, type ShardLayout } from './parallel/parameter_server/sharding.ts';
export {
  MAX_STEP_JUMP,
  REFUSAL_REASONS,
  type Push,
  type ApplyResult,
  type RefusalReason,
  type ShardStats,
  type ShardStateDict,
} from './parallel/parameter_server/shard.ts';
export type { SyncResult, SyncRefusal } from './parallel/parameter_server/central_storage.ts';
export {
  psPart,
  saveShard,
  restoreShard,
  shardCheckpoint,
  shardStateFromCheckpoint,
  type ShardCheckpointOptions,
} from './parallel/parameter_server/checkpoint.ts';
export { flatGradients } from './parallel/parameter_server/worker.ts';
export { LeaseBook, leaseIndices, type LeaseOptions, type LeaseSnapshot } from './parallel/parameter_server/leases.ts';
export { assignPlaces, rolesOf, type RoleClaim } from './parallel/parameter_server/roles.ts';
export type { PsStatus, PsSampleCounts, PsServerSlot, Lease } from './parallel/parameter_server/runner.ts';
