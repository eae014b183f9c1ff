/** Turns the ranks' results into the launcher's one-line JSON summary, per job or script. */
import type { ElasticEvent } from '../src/elastic/events.ts';
import type { PsSampleCounts } from '../src/parameter_server/leases.ts';
import { samplesSeen } from './samples_seen.ts';

export type RankResult = Record<string, unknown> & { rank: number };

/** `events`: every elastic event the ranks reported (empty for jobs that do not train elastically). */
export function summarize(job: string, worldSize: number, results: RankResult[], events: ElasticEvent[] = []): Record<string, unknown> {
  const ranks = [...results].sort((a, b) => a.rank - b.rank);
  switch (job) {
    case 'rendezvous':
      return { job, worldSize, ranks: ranks.map((r) => ({ rank: r.rank, adapter: r.adapter, webgpu: r.webgpu, ...(r.reason ? { reason: r.reason } : {}) })) };
    case 'allreduce':
      return { ...summarizeAllreduce(job, worldSize, ranks), ...linksOf(ranks) };
    case 'train': {
      const train = summarizeTrain(job, worldSize, ranks);
      // The ranks of a pipeline's stages hold different layers: its verdict compares each stage's replicas, not every rank's weights.
      const verdict = train.pipeline ? { identical: train.identical } : {};
      return { ...train, ...elasticFigures(events), ...linksOf(ranks), ...verdict };
    }
    default:
      return { job, worldSize, ranks };
  }
}

/** A user script: rank 0's result, and the library's own figures when it trained elastically. */
export function summarizeScript(script: string, worldSize: number, results: RankResult[], events: ElasticEvent[]): Record<string, unknown> {
  const r0 = [...results].sort((a, b) => a.rank - b.rank)[0] ?? { rank: 0 };
  const { rank: _rank, ...returned } = r0;
  const figures = elasticFigures(events);
  return { script, worldSize: figures.worldSize ?? worldSize, ...returned, ...figures };
}

/**
 * What the ranks' elastic events say about the run: its final ranks (from their 'end' events),
 * the rounds it trained in, the steps redone, the final weights of every final rank, and per
 * epoch which samples were trained on (from the reported sample indices).
 */
export function elasticFigures(events: ElasticEvent[]): Record<string, unknown> {
  const ends = events.filter((e): e is Extract<ElasticEvent, { type: 'end' }> => e.type === 'end').sort((a, b) => a.rank - b.rank);
  if (ends.length === 0) return {};
  const last = ends[0]!;
  const finalRanks = ends.filter((e) => e.round === last.round);
  return {
    worldSize: last.worldSize,
    steps: last.steps,
    generations: last.generations,
    stepsRedone: last.stepsRedone,
    weightHashes: finalRanks.map((e) => e.weightHash),
    identical: finalRanks.length === last.worldSize && finalRanks.every((e) => e.weightHash === last.weightHash),
    // Parameter-server runs report no batches (server 0's leases account for the samples).
    ...(events.some((e) => e.type === 'batch') ? { samplesSeen: samplesSeen(events) } : {}),
  };
}

interface AllreduceRow {
  elements: number;
  bytes: number;
  ms: number;
  meshMs: number | null;
  maxAbsErr: number;
  hash: string;
}

/**
 * nccl-tests' figures: algbw = bytes / time, busbw = algbw * 2(n-1)/n. A collective is done when
 * its slowest rank is, so the time is the largest of the ranks' medians.
 */
function summarizeAllreduce(job: string, worldSize: number, ranks: RankResult[]): Record<string, unknown> {
  const rows = ranks.map((r) => r.results as AllreduceRow[]);
  const results = rows[0].map((first, i) => {
    const at = rows.map((rs) => rs[i]);
    const ms = Math.max(...at.map((r) => r.ms));
    const meshTimes = at.map((r) => r.meshMs).filter((m): m is number => m !== null);
    const algbwMBps = ms > 0 ? first.bytes / 1e6 / (ms / 1000) : 0;
    return {
      elements: first.elements,
      bytes: first.bytes,
      ms: round(ms),
      algbwMBps: round(algbwMBps),
      busbwMBps: round((algbwMBps * 2 * (worldSize - 1)) / worldSize),
      maxAbsErr: Math.max(...at.map((r) => r.maxAbsErr)),
      identical: at.every((r) => r.hash === first.hash),
      meshMs: meshTimes.length ? round(Math.max(...meshTimes)) : null,
    };
  });
  const rank0 = ranks.find((r) => r.rank === 0);
  const figure = (x: unknown) => (typeof x === 'number' ? round(x) : null);
  return {
    job,
    worldSize,
    op: ranks[0].op,
    iters: ranks[0].iters,
    linkMBps: figure(rank0?.linkMBps),
    duplexMBps: figure(rank0?.duplexMBps),
    results,
  };
}

const round = (x: number) => Math.round(x * 100) / 100;

/** One link seen from one end, in the summary. */
export interface LinkSummary {
  rank: number;
  peer: number;
  /** This end's ICE candidate type of the selected pair: host, srflx, prflx, relay (null: unknown). */
  local: string | null;
  remote: string | null;
  protocol: string | null;
  rttMs: number | null;
}

const CANDIDATE = /^(host|srflx|prflx|relay)$/;

/**
 * `links`: every rank's links as it reported them (each link twice, once from each end), so a run
 * says whether its bytes went directly or through a relay. Fields are checked: a page's result is
 * its own to fill.
 */
export function linksOf(ranks: RankResult[]): { links?: LinkSummary[] } {
  const out: LinkSummary[] = [];
  for (const r of ranks) {
    if (!Array.isArray(r.links)) continue;
    for (const l of r.links.slice(0, 1024) as unknown[]) {
      if (typeof l !== 'object' || l === null) continue;
      const o = l as Record<string, unknown>;
      if (!Number.isInteger(o.peer)) continue;
      const type = (v: unknown) => (typeof v === 'string' && CANDIDATE.test(v) ? v : null);
      out.push({
        rank: r.rank,
        peer: o.peer as number,
        local: type(o.local),
        remote: type(o.remote),
        protocol: o.protocol === 'udp' || o.protocol === 'tcp' ? o.protocol : null,
        rttMs: typeof o.rttMs === 'number' && Number.isFinite(o.rttMs) ? o.rttMs : null,
      });
    }
  }
  return out.length > 0 ? { links: out.sort((a, b) => a.rank - b.rank || a.peer - b.peer) } : {};
}

/**
 * Training: the figures every rank agrees on from rank 0, and every rank's weight hash. A
 * pipeline run adds `pipeline` (see pipelineSummary), and its `identical` means every stage's
 * replicas ended with the same weights.
 */
function summarizeTrain(job: string, worldSize: number, ranks: RankResult[]): Record<string, unknown> {
  const r0 = ranks[0];
  const breakdown = typeof r0.breakdownMs === 'object' && r0.breakdownMs !== null ? (r0.breakdownMs as Record<string, number | null>) : {};
  const pipeline = pipelineSummary(ranks);
  const parameterServer = parameterServerSummary(ranks);
  // The loss is the last stage's to compute: rank 0 of a pipeline may not know it. In a
  // parameter-server run rank 0 may be a server: the lowest rank that has it says it.
  const lastStage = pipeline ? ranks.find((r) => r.rank === pipeline.summary.stages.at(-1)?.ranks[0]) : undefined;
  const fromLastStage = (key: string) => {
    if (typeof r0[key] === 'number') return r0[key];
    if (lastStage && typeof lastStage[key] === 'number') return lastStage[key];
    return parameterServer ? (ranks.find((r) => typeof r[key] === 'number')?.[key] ?? r0[key]) : r0[key];
  };
  return {
    job,
    // The final generation's size (it differs from --nproc after an elastic run lost or gained ranks).
    worldSize: typeof r0.worldSize === 'number' ? r0.worldSize : worldSize,
    backend: r0.backend,
    model: r0.model,
    ...(typeof r0.hiddenUnits === 'number' ? { hiddenUnits: r0.hiddenUnits } : {}),
    // A DDP run's model, whole on every rank (a pipeline's rank 0 holds only its stage: see pipeline.stages).
    ...(typeof r0.parameters === 'number' && !pipeline ? { parameters: r0.parameters } : {}),
    dataset: r0.dataset,
    steps: r0.steps,
    epochs: r0.epochs,
    samplesPerSec: typeof r0.samplesPerSec === 'number' ? round(r0.samplesPerSec) : null,
    // Parameter-server runs: samples processed over the whole training time (every rank says the same).
    ...(typeof r0.samplesPerSecWall === 'number' ? { samplesPerSecWall: round(r0.samplesPerSecWall) } : {}),
    finalLoss: pipeline || parameterServer ? fromLastStage('finalLoss') : r0.finalLoss,
    testAccuracy: pipeline || parameterServer ? fromLastStage('testAccuracy') : r0.testAccuracy,
    weightHashes: ranks.map((r) => r.weightHash),
    identical: pipeline ? pipeline.identical : ranks.every((r) => r.weightHash === r0.weightHash),
    breakdownMs: Object.fromEntries(Object.entries(breakdown).map(([k, v]) => [k, v === null ? null : round(v)])),
    seconds: round(Math.max(...ranks.map((r) => r.seconds as number))),
    pausedGenerations: Math.max(0, ...ranks.map((r) => (typeof r.pausedGenerations === 'number' ? r.pausedGenerations : 0))),
    ...(Array.isArray(r0.resumes) && r0.resumes.length > 0 ? { resumes: r0.resumes } : {}),
    ...(r0.identicalEveryStep !== undefined ? { identicalEveryStep: ranks.every((r) => r.identicalEveryStep === true) } : {}),
    ...(r0.stoppedBy !== undefined ? { stoppedBy: r0.stoppedBy } : {}),
    backends: [...new Set(ranks.map((r) => r.backend))],
    ...stragglers(ranks),
    ...commSummary(ranks),
    ...devicesSummary(ranks),
    ...(pipeline ? { pipeline: pipeline.summary } : {}),
    ...(parameterServer ? { parameterServer } : {}),
  };
}

/**
 * --slow: the ranks that were slowed on purpose, each with its factor and the ms it waited per
 * step on average (`slowedMs`, null if unknown); present whenever the ranks report a `slowFactor`.
 */
export function stragglers(ranks: RankResult[]): { stragglers?: Array<{ rank: number; slowFactor: number; slowedMs: number | null }> } {
  if (!ranks.some((r) => typeof r.slowFactor === 'number')) return {};
  return {
    stragglers: ranks
      .filter((r) => typeof r.slowFactor === 'number' && Number.isFinite(r.slowFactor) && r.slowFactor > 1)
      .map((r) => ({ rank: r.rank, slowFactor: r.slowFactor as number, slowedMs: typeof r.slowedMs === 'number' && Number.isFinite(r.slowedMs) ? round(r.slowedMs) : null })),
  };
}

/** One rank's `pipeline` part of its result, checked field by field (null when it has none or it is malformed). */
interface RankPipeline {
  rank: number;
  stage: number;
  stages: number;
  replica: number;
  replicas: number;
  schedule: string | null;
  microBatches: number | null;
  activationDtype: string | null;
  layers: number[];
  layerClasses: string[];
  parameters: number | null;
  peakLiveTensors: number | null;
  peakStashedMicroBatches: number | null;
  bubble: { measured: number | null; formula: number | null };
  breakdownMs: Record<(typeof PIPELINE_BREAKDOWN)[number], number | null>;
  weightHash: string | null;
}

/** One stage of a pipeline run in the summary (figures from its replica 0, or its lowest replica that reported). */
export interface PipelineStageSummary {
  stage: number;
  /** The global ranks holding the stage, in replica order. */
  ranks: number[];
  /** Indices of the model's layers it holds, and their classes. */
  layers: number[];
  layerClasses: string[];
  parameters: number | null;
  peakLiveTensors: number | null;
  peakStashedMicroBatches: number | null;
  /** This stage's measured idle share of a step. */
  bubble: number | null;
  breakdownMs: Record<(typeof PIPELINE_BREAKDOWN)[number], number | null>;
  /** One per replica, in replica order (null: that replica did not report one). */
  weightHashes: Array<string | null>;
  /** Every replica reported a hash and they are all equal. */
  replicasIdentical: boolean;
}

/**
 * `pipeline` in a pipeline run's summary. The number of stages is `stages.length` (rank results
 * say it as `stages`, a number; here the key holds the stages themselves).
 */
export interface PipelineSummary {
  replicas: number;
  microBatches: number | null;
  schedule: string | null;
  activationDtype: string | null;
  /** measured: the mean of the stages' own (replica 0's), null unless every stage reported one; formula: (S-1)/(M+S-1). */
  bubble: { measured: number | null; formula: number | null };
  stages: PipelineStageSummary[];
}

const PIPELINE_BREAKDOWN = ['compute', 'waitActivations', 'waitGradients', 'allreduce', 'apply'] as const;
const SCHEDULE_NAMES = new Set(['gpipe', '1f1b']);
const ACTIVATION_DTYPES = new Set(['float32', 'float16']);
/** More layers or stages than any page makes: a result claiming more is not believed. */
const MAX_PIPELINE_ITEMS = 4096;

const finite = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);
const count = (v: unknown): number | null => (Number.isSafeInteger(v) && (v as number) >= 0 ? (v as number) : null);
const round4 = (x: number) => Math.round(x * 10_000) / 10_000;

function rankPipeline(r: RankResult): RankPipeline | null {
  const p = r.pipeline;
  if (typeof p !== 'object' || p === null || Array.isArray(p)) return null;
  const o = p as Record<string, unknown>;
  const stages = count(o.stages);
  const replicas = count(o.replicas);
  const stage = count(o.stage);
  const replica = count(o.replica);
  if (stages === null || replicas === null || stage === null || replica === null) return null;
  if (stages < 1 || replicas < 1 || stages > MAX_PIPELINE_ITEMS || replicas > MAX_PIPELINE_ITEMS || stage >= stages || replica >= replicas) return null;
  const layers = Array.isArray(o.layers) ? o.layers.slice(0, MAX_PIPELINE_ITEMS) : [];
  const classes = Array.isArray(o.layerClasses) ? o.layerClasses.slice(0, MAX_PIPELINE_ITEMS) : [];
  const bubble = typeof o.bubble === 'object' && o.bubble !== null ? (o.bubble as Record<string, unknown>) : {};
  const breakdown = typeof o.breakdownMs === 'object' && o.breakdownMs !== null ? (o.breakdownMs as Record<string, unknown>) : {};
  const measured = finite(bubble.measured);
  const formula = finite(bubble.formula);
  return {
    rank: r.rank,
    stage,
    stages,
    replica,
    replicas,
    schedule: typeof o.schedule === 'string' && SCHEDULE_NAMES.has(o.schedule) ? o.schedule : null,
    microBatches: count(o.microBatches) || null,
    activationDtype: typeof o.activationDtype === 'string' && ACTIVATION_DTYPES.has(o.activationDtype) ? o.activationDtype : null,
    layers: layers.every((l) => count(l) !== null) ? (layers as number[]) : [],
    layerClasses: classes.every((c) => typeof c === 'string' && c.length <= 64) ? (classes as string[]) : [],
    parameters: count(o.parameters),
    peakLiveTensors: count(o.peakLiveTensors),
    peakStashedMicroBatches: count(o.peakStashedMicroBatches),
    bubble: { measured: measured !== null && measured >= 0 && measured <= 1 ? measured : null, formula: formula !== null && formula >= 0 && formula <= 1 ? formula : null },
    breakdownMs: Object.fromEntries(PIPELINE_BREAKDOWN.map((k) => [k, finite(breakdown[k]) === null ? null : round(breakdown[k] as number)])) as RankPipeline['breakdownMs'],
    weightHash: typeof o.weightHash === 'string' && o.weightHash.length > 0 && o.weightHash.length <= 128 ? o.weightHash : null,
  };
}

/**
 * A pipeline run's shape and, per stage, what its replica 0 reported plus every replica's weight
 * hash; null when no rank's result has a (well-formed) `pipeline`. The shape is the one most of
 * the ranks report, rank 0's first; a rank that reports another shape, a stage or replica twice,
 * is left out, so its stage cannot count as identical.
 */
export function pipelineSummary(ranks: RankResult[]): { summary: PipelineSummary; identical: boolean } | null {
  const reported = ranks.map(rankPipeline).filter((p): p is RankPipeline => p !== null);
  if (reported.length === 0) return null;
  const shapeOf = (p: RankPipeline) => `${p.stages}x${p.replicas}`;
  const votes = new Map<string, number>();
  for (const p of reported) votes.set(shapeOf(p), (votes.get(shapeOf(p)) ?? 0) + 1);
  const shape = [...votes.entries()].reduce((a, b) => (b[1] > a[1] ? b : a))[0];
  const ref = reported.find((p) => shapeOf(p) === shape)!;
  const S = ref.stages;
  const D = ref.replicas;
  // [stage][replica]: the one rank that holds it (a place claimed twice counts for neither).
  const at: Array<Array<RankPipeline | null | undefined>> = Array.from({ length: S }, () => new Array<RankPipeline | null | undefined>(D).fill(undefined));
  for (const p of reported) {
    if (shapeOf(p) !== shape) continue;
    at[p.stage]![p.replica] = at[p.stage]![p.replica] === undefined ? p : null;
  }
  const stages: PipelineStageSummary[] = at.map((replicas, stage) => {
    const holders = replicas.map((p) => p ?? null);
    const first = holders.find((p) => p !== null) ?? null;
    const weightHashes = holders.map((p) => p?.weightHash ?? null);
    return {
      stage,
      ranks: holders.filter((p): p is RankPipeline => p !== null).map((p) => p.rank),
      layers: first?.layers ?? [],
      layerClasses: first?.layerClasses ?? [],
      parameters: first?.parameters ?? null,
      peakLiveTensors: first?.peakLiveTensors ?? null,
      peakStashedMicroBatches: first?.peakStashedMicroBatches ?? null,
      bubble: first?.bubble.measured ?? null,
      breakdownMs: first?.breakdownMs ?? (Object.fromEntries(PIPELINE_BREAKDOWN.map((k) => [k, null])) as RankPipeline['breakdownMs']),
      weightHashes,
      replicasIdentical: weightHashes.every((h) => h !== null && h === weightHashes[0]),
    };
  });
  const measured = stages.map((s) => s.bubble).filter((b): b is number => b !== null);
  const microBatches = ref.microBatches;
  const formula = ref.bubble.formula ?? (microBatches === null ? null : (S - 1) / (microBatches + S - 1));
  return {
    summary: {
      replicas: D,
      microBatches,
      schedule: ref.schedule,
      activationDtype: ref.activationDtype,
      bubble: { measured: measured.length === S ? round4(measured.reduce((a, b) => a + b, 0) / S) : null, formula: formula === null ? null : round4(formula) },
      stages,
    },
    identical: stages.every((st) => st.replicasIdentical),
  };
}

/** Counters of a parameter-server run's samples (server 0 counts them). */
/** Server 0's counts, as the page reports them. */
export type PsSamplesSummary = PsSampleCounts;

/** Pushes at one server, by verdict. */
export interface PsPushesSummary {
  applied: number;
  stale: number;
  duplicate: number;
  refused: number;
}

/** The staleness of the pushes a server judged: its histogram (index: updates behind) and figures. */
export interface PsStalenessSummary {
  histogram: number[];
  mean: number | null;
  p50: number | null;
  p90: number | null;
  max: number | null;
}

/** One rank's `parameterServer` part of its result, checked field by field. */
interface RankParameterServer {
  rank: number;
  strategy: 'async' | 'central';
  role: 'server' | 'worker';
  index: number;
  servers: Array<{ index: number; rank: number; parameters: number[]; numel: number }>;
  workers: number | null;
  versions: Array<number | null>;
  updatesPerSec: number | null;
  samples: PsSamplesSummary | null;
  pushes: PsPushesSummary | null;
  staleness: PsStalenessSummary | null;
  maxStaleness: number | null;
  stalenessLr: boolean;
  checkpoints: number | null;
  restoredFrom: number | null;
  worker: { workerId: number; pulls: number | null; pushes: number | null; samples: number | null; samplesPerSec: number | null } | null;
}

/**
 * `parameterServer` in a parameter-server run's summary: the layout and final versions, server
 * 0's rate, sample counts and staleness, each server's own pushes and checkpoints, and each
 * worker's throughput (its own summary's).
 */
export interface ParameterServerSummary {
  strategy: 'async' | 'central';
  servers: Array<{
    index: number;
    /** The rank serving it at the end. */
    rank: number;
    numel: number;
    /** Indices of the model's trainable weights it holds. */
    parameters: number[];
    /** Updates applied (its final version). */
    version: number | null;
    /** Its own verdicts (null: its rank did not report). */
    pushes: PsPushesSummary | null;
    checkpoints: number | null;
    restoredFrom: number | null;
  }>;
  /** Workers in the last round. */
  workers: number | null;
  versions: Array<number | null>;
  /** Server 0's updates per second over the run. */
  updatesPerSec: number | null;
  /** Server 0's counts (null: server 0 did not report). */
  samples: PsSamplesSummary | null;
  /** Server 0's. */
  staleness: PsStalenessSummary | null;
  maxStaleness: number | null;
  stalenessLr: boolean;
  workerSamplesPerSec: Array<{ workerId: number; rank: number; samples: number | null; samplesPerSec: number | null }>;
}

/** More servers, parameters or histogram buckets than any page makes: a result claiming more is cut. */
const MAX_PS_ITEMS = 4096;

const record = (v: unknown): Record<string, unknown> | null => (typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null);
const rounded = (v: unknown): number | null => (finite(v) === null ? null : round(v as number));

function countsOf<K extends string>(v: unknown, keys: readonly K[]): Record<K, number> | null {
  const o = record(v);
  if (!o) return null;
  const out = {} as Record<K, number>;
  for (const k of keys) {
    const n = count(o[k]);
    if (n === null) return null;
    out[k] = n;
  }
  return out;
}

const SAMPLE_KEYS = ['target', 'leased', 'applied', 'stale', 'refused', 'lost', 'epoch'] as const;
const PUSH_KEYS = ['applied', 'stale', 'duplicate', 'refused'] as const;

function rankParameterServer(r: RankResult): RankParameterServer | null {
  const o = record(r.parameterServer);
  if (!o) return null;
  const strategy = o.strategy === 'async' || o.strategy === 'central' ? o.strategy : null;
  const role = o.role === 'server' || o.role === 'worker' ? o.role : null;
  const index = count(o.index);
  if (strategy === null || role === null || index === null) return null;
  const servers = (Array.isArray(o.servers) ? o.servers.slice(0, MAX_PS_ITEMS) : []).flatMap((s) => {
    const so = record(s);
    const i = count(so?.index);
    const rank = count(so?.rank);
    const numel = count(so?.numel);
    if (!so || i === null || rank === null || numel === null) return [];
    const parameters = Array.isArray(so.parameters) ? so.parameters.slice(0, MAX_PS_ITEMS) : [];
    return [{ index: i, rank, numel, parameters: parameters.every((p) => count(p) !== null) ? (parameters as number[]) : [] }];
  });
  const st = record(o.staleness);
  const histogram = Array.isArray(st?.histogram) ? st.histogram.slice(0, MAX_PS_ITEMS) : [];
  const w = record(o.worker);
  const workerId = count(w?.workerId);
  return {
    rank: r.rank,
    strategy,
    role,
    index,
    servers: servers.sort((a, b) => a.index - b.index),
    workers: count(o.workers),
    versions: Array.isArray(o.versions) ? o.versions.slice(0, MAX_PS_ITEMS).map(count) : [],
    updatesPerSec: rounded(o.updatesPerSec),
    samples: countsOf(o.samples, SAMPLE_KEYS),
    pushes: countsOf(o.pushes, PUSH_KEYS),
    staleness: st
      ? {
          histogram: histogram.every((h) => count(h) !== null) ? (histogram as number[]) : [],
          mean: rounded(st.mean),
          p50: finite(st.p50),
          p90: finite(st.p90),
          max: finite(st.max),
        }
      : null,
    maxStaleness: count(o.maxStaleness),
    stalenessLr: o.stalenessLr === true,
    checkpoints: count(o.checkpoints),
    restoredFrom: count(o.restoredFrom),
    worker:
      w && workerId !== null
        ? { workerId, pulls: count(w.pulls), pushes: count(w.pushes), samples: count(w.samples), samplesPerSec: rounded(w.samplesPerSec) }
        : null,
  };
}

/**
 * A parameter-server run's figures from its ranks' `parameterServer` parts; null when no rank
 * reported a well-formed one (a DDP or pipeline run). The layout, versions, rate, samples and
 * staleness are server 0's (the lowest rank's when server 0 did not report); each server's
 * pushes and checkpoints its own; each worker's throughput its own (sorted by worker id).
 */
export function parameterServerSummary(ranks: RankResult[]): ParameterServerSummary | null {
  const reported = ranks.map(rankParameterServer).filter((p): p is RankParameterServer => p !== null);
  if (reported.length === 0) return null;
  const byRank = [...reported].sort((a, b) => a.rank - b.rank);
  const serversOf = (index: number) => byRank.filter((p) => p.role === 'server' && p.index === index);
  const server0 = serversOf(0)[0] ?? null;
  const ref = server0 ?? byRank[0]!;
  const workers = new Map<number, RankParameterServer>();
  for (const p of byRank) if (p.role === 'worker' && p.worker && !workers.has(p.worker.workerId)) workers.set(p.worker.workerId, p);
  return {
    strategy: ref.strategy,
    servers: ref.servers.map((s) => {
      const own = serversOf(s.index)[0] ?? null;
      return {
        index: s.index,
        rank: s.rank,
        numel: s.numel,
        parameters: s.parameters,
        version: ref.versions[s.index] ?? null,
        pushes: own?.pushes ?? null,
        checkpoints: own?.checkpoints ?? null,
        restoredFrom: own?.restoredFrom ?? null,
      };
    }),
    workers: ref.workers,
    versions: ref.versions,
    updatesPerSec: ref.updatesPerSec,
    samples: server0?.samples ?? null,
    staleness: server0?.staleness ?? null,
    maxStaleness: ref.maxStaleness,
    stalenessLr: ref.stalenessLr,
    workerSamplesPerSec: [...workers.values()]
      .sort((a, b) => a.worker!.workerId - b.worker!.workerId)
      .map((p) => ({ workerId: p.worker!.workerId, rank: p.rank, samples: p.worker!.samples, samplesPerSec: p.worker!.samplesPerSec })),
  };
}

/**
 * The launcher's few lines about a parameter-server run, printed before the JSON summary:
 * strategy, servers (rank, elements, final version), updates/s, samples, staleness, and each
 * worker's samples/s. Figures a rank did not report read "n/a".
 */
export function parameterServerLines(ps: ParameterServerSummary): string[] {
  const n = (v: number | null | undefined) => (v === null || v === undefined ? 'n/a' : String(v));
  const plural = (k: number, word: string) => `${k} ${word}${k === 1 ? '' : 's'}`;
  const options = [ps.maxStaleness === null ? '' : `max staleness ${ps.maxStaleness}`, ps.stalenessLr ? 'gradients scaled by 1/(1 + staleness)' : ''].filter(Boolean);
  const s = ps.samples;
  const st = ps.staleness;
  const workers = ps.workerSamplesPerSec;
  return [
    `parameter servers: strategy ${ps.strategy}, ${plural(ps.servers.length, 'server')}, ${ps.workers === null ? 'n/a' : plural(ps.workers, 'worker')} in the last round${options.length ? `; ${options.join(', ')}` : ''}`,
    `  servers: ${ps.servers.length ? ps.servers.map((sv) => `${sv.index} on rank ${sv.rank} (${sv.numel} elements, version ${n(sv.version)})`).join('; ') : 'n/a'}`,
    `  updates/s (server 0): ${n(ps.updatesPerSec)}`,
    `  samples (server 0): ${s ? `${s.applied} applied, ${s.stale} stale, ${s.refused} refused, ${s.lost} lost of ${s.target}` : 'n/a'}`,
    `  staleness (server 0): ${st ? `mean ${n(st.mean)}, p50 ${n(st.p50)}, p90 ${n(st.p90)}, max ${n(st.max)}` : 'n/a'}`,
    `  samples/s per worker: ${workers.length ? workers.map((w) => `worker ${w.workerId} (rank ${w.rank}) ${n(w.samplesPerSec)}`).join(', ') : 'n/a'}`,
  ];
}

/** --comm-hook in a DDP run's summary (see commSummary). */
export interface CommSummary {
  /** Rank 0's `commHook` (the lowest rank's that reported one): `name` (none, fp16, bf16, powersgd, localsgd), `registered` and the hook's numbers. */
  commHook?: Record<string, string | number>;
  /** Bytes a rank sent per step to keep the replicas in step, the mean over the ranks that reported it. */
  bytesPerStep?: number | null;
  /** Those bytes over what the float32 ring all-reduce of the same gradients would have sent: summed over the ranks (each rank's mean per step). */
  compressionRatio?: number | null;
  /** Bytes per step after the hook's start (PowerSGD's plain warm-up left out), the mean over ranks. */
  bytesPerStepAfterStart?: number | null;
  /** Rank 0's overlap: the communication's span per step, what the step waited for of it, and the share hidden behind the backward. */
  overlap?: { commMs: number; exposedMs: number; hiddenShare: number };
}

const COMM_HOOK_NAMES = new Set(['none', 'fp16', 'bf16', 'powersgd', 'localsgd']);
const COMM_HOOK_NUMBERS = ['rank', 'startIter', 'statsStep', 'elementsSent', 'elementsDense', 'period', 'startStep', 'averagings', 'averageBytes'] as const;

/**
 * A DDP run's communication figures from its ranks' results (the pipeline and parameter-server
 * trainers report none, and get none): `commHook` as rank 0 reported it (fields checked: a page's
 * result is its own to fill), `bytesPerStep` the mean of the ranks' `bytesPerStep`, and
 * `compressionRatio` = the ranks' bytesPerStep summed / their `denseBytesPerStep` summed (the
 * mean bytes over the mean baseline), or the mean of their own ratios when a rank did not say its
 * baseline. Empty when no rank reported a `commHook` or `bytesPerStep`.
 */
export function commSummary(ranks: RankResult[]): CommSummary {
  const hook = ranks.map((r) => record(r.commHook)).find((h) => h !== null && typeof h.name === 'string' && COMM_HOOK_NAMES.has(h.name)) ?? null;
  const sent = ranks.map((r) => finite(r.bytesPerStep));
  if (hook === null && sent.every((b) => b === null)) return {};
  const commHook: Record<string, string | number> = {};
  if (hook) {
    commHook.name = hook.name as string;
    if (typeof hook.registered === 'string' && /^[\w.-]{1,64}$/.test(hook.registered)) commHook.registered = hook.registered;
    for (const k of COMM_HOOK_NUMBERS) if (count(hook[k]) !== null) commHook[k] = hook[k] as number;
    // PowerSGD's wire (float32, or 16-bit under the fp16/bf16 wrapper): one of three words, nothing else.
    if (typeof hook.wire === 'string' && ['float32', 'float16', 'bfloat16'].includes(hook.wire)) commHook.wire = hook.wire;
  }
  const known = sent.filter((b): b is number => b !== null && b >= 0);
  const bytesPerStep = known.length > 0 ? round(known.reduce((a, b) => a + b, 0) / known.length) : null;
  const pairs = ranks.map((r) => ({ sent: finite(r.bytesPerStep), dense: finite(r.denseBytesPerStep) }));
  let compressionRatio: number | null = null;
  if (pairs.length > 0 && pairs.every((p) => p.sent !== null && p.sent >= 0 && p.dense !== null && p.dense > 0)) {
    compressionRatio = round4(pairs.reduce((a, p) => a + p.sent!, 0) / pairs.reduce((a, p) => a + p.dense!, 0));
  } else {
    const ratios = ranks.map((r) => finite(r.compressionRatio)).filter((x): x is number => x !== null && x >= 0);
    if (ratios.length > 0) compressionRatio = round4(ratios.reduce((a, b) => a + b, 0) / ratios.length);
  }
  const after = ranks.map((r) => finite(r.bytesPerStepAfterStart)).filter((b): b is number => b !== null && b >= 0);
  const o = ranks.map((r) => record(r.overlap)).find((x) => x !== null && [x.commMs, x.exposedMs, x.hiddenShare].every((v) => finite(v) !== null)) ?? null;
  return {
    ...(hook ? { commHook } : {}),
    bytesPerStep,
    compressionRatio,
    ...(after.length > 0 ? { bytesPerStepAfterStart: round(after.reduce((a, b) => a + b, 0) / after.length) } : {}),
    ...(o ? { overlap: { commMs: round(o.commMs as number), exposedMs: round(o.exposedMs as number), hiddenShare: round4(o.hiddenShare as number) } } : {}),
  };
}

/**
 * The launcher's line about a DDP run's communication, printed before the JSON summary: the
 * hook and its settings, the bytes per step and the ratio to the float32 all-reduce. Null when
 * the summary has neither a `commHook` nor `bytesPerStep`.
 */
export function commLine(summary: Record<string, unknown>): string | null {
  const hook = record(summary.commHook);
  const bytes = finite(summary.bytesPerStep);
  const ratio = finite(summary.compressionRatio);
  if (hook === null && bytes === null) return null;
  const n = (k: string) => (typeof hook?.[k] === 'number' ? (hook[k] as number) : null);
  let what: string;
  switch (hook?.name) {
    case 'none':
      what = 'none (float32 ring all-reduce)';
      break;
    case 'fp16':
    case 'bf16':
      what = `${hook.name} (${hook.name === 'fp16' ? 'float16' : 'bfloat16'} values on the wire)`;
      break;
    case 'powersgd': {
      const stats = n('elementsSent') !== null && n('elementsDense') !== null ? `; step ${n('statsStep') ?? '?'} sent ${n('elementsSent')} of ${n('elementsDense')} elements` : '';
      const wire = typeof hook.wire === 'string' && hook.wire !== 'float32' ? `, ${hook.wire} on the wire` : '';
      what = `powersgd rank ${n('rank') ?? '?'}${wire}, plain all-reduce for the first ${n('startIter') ?? '?'} steps${stats}`;
      break;
    }
    case 'localsgd':
      what = `localsgd, models averaged every ${n('period') ?? '?'} steps after ${n('startStep') ?? '?'} averaged ones${n('averagings') === null ? '' : ` (${n('averagings')} averagings timed)`}`;
      break;
    default:
      what = 'n/a';
  }
  const registered = typeof hook?.registered === 'string' ? ` [hook ${hook.registered}]` : '';
  const sent = bytes === null ? 'n/a' : `${Math.round(bytes)} bytes`;
  return `communication: ${what}${registered}; ${sent} sent per step per rank (mean over ranks), ${ratio === null ? 'n/a' : ratio} of the float32 all-reduce's bytes`;
}

/** One device of a rank (--devices K > 1), as the launcher reports it. */
export interface DeviceReport {
  device: number;
  backend: string;
  fallbackReason?: string;
  steps: number;
  samples: number;
  /** Mean compute per step on the device, ms (null before any step). */
  meanComputeMs: number | null;
  /** Live tensors on the device after its steps: equal when nothing leaks (null before any step). */
  liveTensors: { min: number; max: number } | null;
}

/** --devices in a DDP run's summary (see devicesSummary). */
export interface DevicesSummary {
  /** Devices per rank (rank 0's; 1 unless --devices). */
  devices?: number;
  /** With more than one: each rank's devices, their backends and figures. */
  deviceReports?: Array<{ rank: number; devices: DeviceReport[] }>;
}

const DEVICE_BACKEND_NAMES = new Set(['webgpu', 'webgl', 'wasm', 'cpu']);

/** A page's `deviceReports` entry, checked field by field (a page's result is its own to fill); null when it is not one. */
function deviceReport(v: unknown): DeviceReport | null {
  const d = record(v);
  if (!d || count(d.device) === null || typeof d.backend !== 'string' || !DEVICE_BACKEND_NAMES.has(d.backend)) return null;
  const tensors = record(d.liveTensors);
  return {
    device: d.device as number,
    backend: d.backend,
    ...(typeof d.fallbackReason === 'string' ? { fallbackReason: d.fallbackReason.slice(0, 500) } : {}),
    steps: count(d.steps) ?? 0,
    samples: count(d.samples) ?? 0,
    meanComputeMs: rounded(d.meanComputeMs),
    liveTensors: tensors && count(tensors.min) !== null && count(tensors.max) !== null ? { min: tensors.min as number, max: tensors.max as number } : null,
  };
}

/**
 * A DDP run's devices per rank (`devices`, rank 0's) and, when a rank had more than one, each
 * rank's devices with their backends and figures (`deviceReports`). Empty for runs whose ranks
 * report no `devices` (pipelines, parameter servers).
 */
export function devicesSummary(ranks: RankResult[]): DevicesSummary {
  const devices = ranks.map((r) => count(r.devices)).find((d) => d !== null);
  if (devices === undefined) return {};
  const reports = ranks
    .filter((r) => Array.isArray(r.deviceReports))
    .map((r) => ({ rank: r.rank, devices: (r.deviceReports as unknown[]).map(deviceReport).filter((d): d is DeviceReport => d !== null) }));
  return { devices, ...(reports.length > 0 ? { deviceReports: reports } : {}) };
}

/** The launcher's line about the ranks' devices (--devices K > 1): each device's backend and compute per step. Null with one device per rank. */
export function devicesLine(summary: Record<string, unknown>): string | null {
  const reports = summary.deviceReports as DevicesSummary['deviceReports'];
  if (!reports || reports.length === 0) return null;
  const rank = (r: { rank: number; devices: DeviceReport[] }) =>
    `rank ${r.rank}: ${r.devices.map((d) => `device ${d.device} ${d.backend}${d.fallbackReason ? ' (fallback)' : ''} ${d.meanComputeMs ?? 'n/a'} ms/step, ${d.samples} samples`).join('; ')}`;
  return `devices: ${String(summary.devices)} per rank; ${reports.map(rank).join(' | ')}`;
}
