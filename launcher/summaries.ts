/** Turns the ranks' results into the launcher's one-line JSON summary, per job or script. */
import type { ElasticEvent } from '../src/elastic/events.ts';
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
    samplesSeen: samplesSeen(events),
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
  const breakdown = r0.breakdownMs as Record<string, number | null>;
  const pipeline = pipelineSummary(ranks);
  // The loss is the last stage's to compute: rank 0 of a pipeline may not know it.
  const lastStage = pipeline ? ranks.find((r) => r.rank === pipeline.summary.stages.at(-1)?.ranks[0]) : undefined;
  const fromLastStage = (key: string) => (typeof r0[key] !== 'number' && lastStage && typeof lastStage[key] === 'number' ? lastStage[key] : r0[key]);
  return {
    job,
    // The final generation's size (it differs from --nproc after an elastic run lost or gained ranks).
    worldSize: typeof r0.worldSize === 'number' ? r0.worldSize : worldSize,
    backend: r0.backend,
    model: r0.model,
    dataset: r0.dataset,
    steps: r0.steps,
    epochs: r0.epochs,
    samplesPerSec: typeof r0.samplesPerSec === 'number' ? round(r0.samplesPerSec) : null,
    finalLoss: pipeline ? fromLastStage('finalLoss') : r0.finalLoss,
    testAccuracy: pipeline ? fromLastStage('testAccuracy') : r0.testAccuracy,
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
    ...(pipeline ? { pipeline: pipeline.summary } : {}),
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
