/**
 * The library's public surface (src/index.ts): torch's names at the top, the helpers in
 * namespaces, and every name a script imported before the namespaces (68fd4a3) still there, the
 * moved ones as deprecated aliases of their namespace member. The top-level list is written out
 * here, so that a name added to the top is a choice, not an accident. The types are read from the
 * sources with TypeScript's parser (the entry only re-exports); tsc checks the old types resolve
 * (fixtures/public_types_68fd4a3.ts).
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import * as lib from '../src/index.ts';
import { TYPES_68FD4A3, VALUES_68FD4A3 } from './fixtures/public_surface_68fd4a3.ts';

const SRC = join(import.meta.dirname, '..', 'src');

/** The top level, as torch groups it (values and types alike), then the namespaces. */
const TOP_LEVEL = [
  // torch.distributed
  'initProcessGroup',
  'InitProcessGroupOptions',
  'ProcessGroup',
  'AllReduceOptions',
  'CollectiveOptions',
  'WireDtype',
  'LinkOptions',
  'ProcessGroupEvent',
  'ReduceOpName',
  'StoreClient',
  'TCPStore',
  'PrefixStore',
  'Store',
  'StoreValue',
  'StoreClientOptions',
  'HashStore',
  // its errors
  'StoreError',
  'StoreTimeoutError',
  'RendezvousError',
  'RendezvousClosedError',
  'UnauthorizedError',
  'TokenRotatedError',
  'RemovedByHostError',
  'NotHostError',
  'SessionEndedError',
  'ConnectionClosedError',
  'DistTimeoutError',
  'PeerLostError',
  'RankStalledError',
  'CollectiveMismatchError',
  'CollectiveAbortedError',
  'GroupClosedError',
  'FramingError',
  'ServerMessageError',
  'NonFiniteGradientError',
  'ContributionMismatchError',
  'NonFiniteWeightsError',
  'RoleConflictError',
  'ReplicaDivergenceError',
  'StateTransferError',
  'DeviceLostError',
  'DataParallelDeviceError',
  'isRecoverable',
  'DeviceLostReason',
  // torch.distributed.elastic
  'RendezvousHandler',
  'RendezvousOptions',
  'RendezvousEvent',
  'Round',
  'runAgent',
  'REGROUP',
  'ElasticStrategy',
  'runElastic',
  'ElasticRunOptions',
  'ElasticRunResult',
  'StepContext',
  'RoundContext',
  'StepMetrics',
  'RebuildContext',
  'ElasticEvent',
  // torch.nn.parallel
  'DistributedDataParallel',
  'ShapeMismatchError',
  'DDPOptions',
  'BackwardTimings',
  'BackwardOptions',
  'BackwardResult',
  'verifyReplicas',
  'DataParallel',
  'DataParallelOptions',
  'DataParallelBatch',
  'DataParallelResult',
  'LocalGradients',
  'DeviceBackend',
  'DataParallelLoss',
  // torch.distributed.algorithms.ddp_comm_hooks and model_averaging; DiLoCo; robust aggregation
  'allreduceHook',
  'fp16CompressHook',
  'bf16CompressHook',
  'CommHook',
  'CommHookState',
  'GradBucket',
  'LoadCommHookStateOptions',
  'powerSGD',
  'PowerSGDHook',
  'PowerSGDStateError',
  'PowerSGDOptions',
  'PowerSGDStats',
  'postLocalSGD',
  'PeriodicModelAverager',
  'PostLocalSGDOptions',
  'PeriodicModelAveragerOptions',
  'DiLoCo',
  'diloco',
  'DiLoCoOptions',
  'DiLoCoHeld',
  'DiLoCoRejoin',
  'NoContributionError',
  'AggregationKind',
  'AggregationSpec',
  // torch.distributed.pipelining
  'PipelineStage',
  'ActivationDtype',
  'PipelineStageOptions',
  'ScheduleKind',
  'runPipeline',
  'PipelineRunOptions',
  'PipelineRunResult',
  'PipelineStepContext',
  'PipelineRoundContext',
  // parameter servers
  'ParameterServerShard',
  'ShardStateError',
  'ParameterServerShardOptions',
  'CentralStorageAccumulator',
  'SyncPushError',
  'CentralStorageOptions',
  'runParameterServer',
  'ParameterServerRunOptions',
  'ParameterServerRunResult',
  'PsStrategy',
  'PsRunEvent',
  'WorkerStepContext',
  'WorkerStepResult',
  // torch.optim
  'SGD',
  'Adam',
  'AdamW',
  'HostOptimizer',
  'OptimizerStateError',
  'SGDOptions',
  'AdamOptions',
  // torch.distributed.checkpoint and state dicts
  'TrainState',
  'modelArtifacts',
  'loadModelWeights',
  'optimizerState',
  'loadOptimizerState',
  'TensorBundle',
  'TrainStateDict',
  'TrainStateOptions',
  'Progress',
  'Stateful',
  'Json',
  'saveCheckpoint',
  'loadCheckpoint',
  'listCheckpoints',
  'CheckpointError',
  'CheckpointInfo',
  'LoadedCheckpoint',
  'CheckpointRequestOptions',
  'LoadCheckpointOptions',
  'CheckpointCorruptError',
  'exportForTorch',
  'importTorchStateDict',
  'TorchExportError',
  'TorchExport',
  'TorchExportOptions',
  'ModelArtifactsLike',
  'SafetensorsError',
  // torch.utils.data
  'DistributedSampler',
  'DistributedSamplerOptions',
  'SamplerState',
  'Dataset',
  'InMemoryDataset',
  'Subset',
  'subset',
  'fetchBatch',
  'DatasetError',
  'DatasetFetchError',
  'loadMnist',
  'loadMnistSplits',
  'syntheticDataset',
  'csvDataset',
  'textDatasets',
  'TextDataset',
  'StreamedDataset',
  'StreamedDatasetInit',
  'fetchOffer',
  'loadOfferedDataset',
  'loadOfferedModel',
  'loadOfferedText',
  'StreamMode',
  'OfferInfo',
  'OfferRequest',
  // torch.nn
  'buildModel',
  'ModelKind',
  'ModelSpec',
  'buildLanguageModel',
  'languageModelLoss',
  'generate',
  'CharTokenizer',
  'TokenAndPositionEmbedding',
  'TransformerBlock',
  'LanguageModelSpec',
  'classificationLoss',
  // torch.distributed.rpc, .optim, .nn
  'initRpc',
  'InitRpcOptions',
  'DistributedOptimizer',
  'RemoteModule',
  // torchrun
  'LaunchContext',
  'ScriptMain',
  'intArg',
];
const NAMESPACES = [
  'util',
  'wire',
  'c10d',
  'runtime',
  'data',
  'nn',
  'io',
  'elastic',
  'parallel',
  'pipeline',
  'parameterServer',
  'robust',
  'rpc',
  'distAutograd',
];

interface Exported {
  name: string;
  typeOnly: boolean;
}

function parse(file: string): { text: string; source: ts.SourceFile } {
  const text = readFileSync(join(SRC, file), 'utf8');
  return { text, source: ts.createSourceFile(file, text, ts.ScriptTarget.ES2022, true) };
}

/** A statement of the entry that is not one of its three forms, said so that the test fails on it. */
function unexpected(st: ts.Statement, file: string): never {
  throw new Error(`${file}: only re-exports belong here, found: ${st.getText().slice(0, 120)}`);
}

/** The entry's names: its own re-exports, its namespaces (by module) and the module `export *` takes in. */
function readEntry() {
  const { source } = parse('index.ts');
  const names: Exported[] = [];
  const namespaces = new Map<string, string>();
  const starFrom: string[] = [];
  for (const st of source.statements) {
    if (!ts.isExportDeclaration(st) || !st.moduleSpecifier || !ts.isStringLiteral(st.moduleSpecifier)) unexpected(st, 'index.ts');
    const from = st.moduleSpecifier.text;
    const clause = st.exportClause;
    if (!clause) starFrom.push(from);
    else if (ts.isNamespaceExport(clause)) namespaces.set(from, clause.name.text);
    else for (const e of clause.elements) names.push({ name: e.name.text, typeOnly: st.isTypeOnly || e.isTypeOnly });
  }
  return { names, namespaces, starFrom };
}

interface Alias extends Exported {
  namespace: string | undefined;
  comment: string;
}

/** The deprecated aliases: each with the namespace of the module it comes from and its JSDoc. */
function readAliases(namespaces: Map<string, string>): Alias[] {
  const { text, source } = parse('deprecated.ts');
  return source.statements.flatMap((st) => {
    if (
      !ts.isExportDeclaration(st) ||
      !st.exportClause ||
      !ts.isNamedExports(st.exportClause) ||
      !st.moduleSpecifier ||
      !ts.isStringLiteral(st.moduleSpecifier)
    ) {
      return unexpected(st, 'deprecated.ts');
    }
    const namespace = namespaces.get(st.moduleSpecifier.text);
    return st.exportClause.elements.map((e) => {
      const comments = ts.getLeadingCommentRanges(text, e.pos) ?? [];
      const comment = comments.map((r) => text.slice(r.pos, r.end)).join('\n');
      return { name: e.name.text, typeOnly: st.isTypeOnly || e.isTypeOnly, namespace, comment };
    });
  });
}

const entry = readEntry();
const aliases = readAliases(entry.namespaces);
const sorted = (names: Iterable<string>) => [...new Set(names)].sort();

describe('the public surface', () => {
  it('the top level is the curated list: torch names, then the namespaces', () => {
    expect(entry.starFrom).toEqual(['./deprecated.ts']);
    expect(sorted(entry.names.map((n) => n.name))).toEqual(sorted(TOP_LEVEL));
    expect(sorted(entry.namespaces.values())).toEqual(sorted(NAMESPACES));
    const values = entry.names.filter((n) => !n.typeOnly).map((n) => n.name);
    const moved = aliases.filter((a) => !a.typeOnly).map((a) => a.name);
    expect(sorted(Object.keys(lib))).toEqual(sorted([...values, ...NAMESPACES, ...moved]));
  });

  it('every name exported at 68fd4a3 still resolves at the top', () => {
    const keys = new Set(Object.keys(lib));
    expect(VALUES_68FD4A3.filter((n) => !keys.has(n))).toEqual([]);
    const types = new Set([...entry.names, ...aliases].map((n) => n.name));
    expect(TYPES_68FD4A3.filter((n) => !types.has(n))).toEqual([]);
  });

  it('each moved name is a deprecated alias of its namespace member, the same binding', () => {
    const before = new Set([...VALUES_68FD4A3, ...TYPES_68FD4A3]);
    const top = new Set(TOP_LEVEL);
    for (const a of aliases) {
      expect(a.namespace, `${a.name} comes from a namespace module`).toBeDefined();
      expect(a.comment, `${a.name}'s JSDoc`).toContain(`@deprecated use \`${a.namespace}.${a.name}\``);
      expect(before.has(a.name), `${a.name} was public before: a new name goes to the top list or a namespace, not here`).toBe(true);
      expect(top.has(a.name), `${a.name} is both curated and deprecated`).toBe(false);
      if (a.typeOnly) continue;
      const ns = (lib as unknown as Record<string, Record<string, unknown>>)[a.namespace!]!;
      expect(ns[a.name], `${a.namespace}.${a.name}`).toBeDefined();
      expect((lib as unknown as Record<string, unknown>)[a.name], a.name).toBe(ns[a.name]);
    }
    // Every old name is at the top or an alias: none went without one.
    const kept = new Set([...top, ...aliases.map((a) => a.name)]);
    expect([...before].filter((n) => !kept.has(n))).toEqual([]);
  });

  it('TCPStore is the store client that talks to the server', () => {
    expect(lib.TCPStore).toBe(lib.StoreClient);
  });
});
