/** Turns the ranks' results into the launcher's one-line JSON summary, per job or script. */
import type { ElasticEvent } from '../src/parallel/events.ts';
import { samplesSeen } from './samples_seen.ts';
import { aggregationSummary } from './summary_aggregation.ts';
import { commSummary } from './summary_comm.ts';
import { devicesSummary } from './summary_devices.ts';
import { round, type RankResult } from './summary_fields.ts';
import { linksOf } from './summary_links.ts';
import { pipelineSummary } from './summary_pipeline.ts';
import { parameterServerSummary } from './summary_ps.ts';
import { timelineSummary } from './summary_timeline.ts';

/** `events`: every elastic event the ranks reported (empty for jobs that do not train elastically). */
export function summarize(job: string, worldSize: number, results: RankResult[], events: ElasticEvent[] = []): Record<string, unknown> {
  const ranks = [...results].sort((a, b) => a.rank - b.rank);
  switch (job) {
    case 'rendezvous':
      return {
        job,
        worldSize,
        ranks: ranks.map((r) => ({ rank: r.rank, adapter: r.adapter, webgpu: r.webgpu, ...(r.reason ? { reason: r.reason } : {}) })),
      };
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
  algorithm: string;
  ms: number;
  afterBarrierMs: number | null;
  ringMs: number | null;
  doublingMs: number | null;
  meshMs: number | null;
  maxAbsErr: number;
  hash: string;
}

/**
 * nccl-tests' figures: algbw = bytes / time, busbw = algbw * 2(n-1)/n, the time an iteration's
 * mean over iterations back to back. A collective is done when its slowest rank is, so the time
 * is the largest of the ranks' (`afterBarrierMs`: of their medians of one alone after a barrier).
 */
function summarizeAllreduce(job: string, worldSize: number, ranks: RankResult[]): Record<string, unknown> {
  const rows = ranks.map((r) => r.results as AllreduceRow[]);
  const results = rows[0].map((first, i) => {
    const at = rows.map((rs) => rs[i]);
    const ms = Math.max(...at.map((r) => r.ms));
    const slowest = (pick: (r: AllreduceRow) => number | null | undefined) => {
      const times = at.map(pick).filter((m): m is number => typeof m === 'number');
      return times.length ? round(Math.max(...times)) : null;
    };
    const algbwMBps = ms > 0 ? first.bytes / 1e6 / (ms / 1000) : 0;
    return {
      elements: first.elements,
      bytes: first.bytes,
      algorithm: first.algorithm,
      ms: round(ms),
      algbwMBps: round(algbwMBps),
      busbwMBps: round((algbwMBps * 2 * (worldSize - 1)) / worldSize),
      maxAbsErr: Math.max(...at.map((r) => r.maxAbsErr)),
      identical: at.every((r) => r.hash === first.hash),
      afterBarrierMs: slowest((r) => r.afterBarrierMs),
      ringMs: slowest((r) => r.ringMs),
      doublingMs: slowest((r) => r.doublingMs),
      meshMs: slowest((r) => r.meshMs),
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
    ...(typeof r0.dataStreamed === 'boolean' ? { dataStreamed: r0.dataStreamed } : {}),
    steps: r0.steps,
    epochs: r0.epochs,
    samplesPerSec: typeof r0.samplesPerSec === 'number' ? round(r0.samplesPerSec) : null,
    // Parameter-server runs: samples processed over the whole training time (every rank says the same).
    ...(typeof r0.samplesPerSecWall === 'number' ? { samplesPerSecWall: round(r0.samplesPerSecWall) } : {}),
    finalLoss: pipeline || parameterServer ? fromLastStage('finalLoss') : r0.finalLoss,
    testAccuracy: pipeline || parameterServer ? fromLastStage('testAccuracy') : r0.testAccuracy,
    // The language model (model lm): per-character perplexity, the unigram baseline, characters per second and its last sample.
    ...languageModelSummary(r0, pipeline || parameterServer ? fromLastStage('perplexity') : r0.perplexity),
    weightHashes: ranks.map((r) => r.weightHash),
    identical: pipeline ? pipeline.identical : ranks.every((r) => r.weightHash === r0.weightHash),
    breakdownMs: Object.fromEntries(Object.entries(breakdown).map(([k, v]) => [k, v === null ? null : round(v)])),
    seconds: round(Math.max(...ranks.map((r) => r.seconds as number))),
    pausedGenerations: Math.max(0, ...ranks.map((r) => (typeof r.pausedGenerations === 'number' ? r.pausedGenerations : 0))),
    ...(Array.isArray(r0.resumes) && r0.resumes.length > 0 ? { resumes: r0.resumes } : {}),
    ...(r0.identicalEveryStep !== undefined ? { identicalEveryStep: ranks.every((r) => r.identicalEveryStep === true) } : {}),
    ...(r0.stoppedBy !== undefined ? { stoppedBy: r0.stoppedBy } : {}),
    backends: [...new Set(ranks.map((r) => r.backend))],
    // backend=auto: what each rank measured on each backend, and what it chose.
    ...(ranks.some((r) => Array.isArray(r.backendProbe))
      ? { backendProbe: ranks.map((r) => ({ rank: r.rank, backend: r.backend, figures: r.backendProbe ?? null })) }
      : {}),
    ...stragglers(ranks),
    ...commSummary(ranks),
    ...timelineSummary(ranks),
    ...devicesSummary(ranks),
    // Robust aggregation: the kind, and what the group judged of each rank's contributions.
    ...aggregationSummary(ranks),
    ...(pipeline ? { pipeline: pipeline.summary } : {}),
    ...(parameterServer ? { parameterServer } : {}),
  };
}

/** The language model's figures: perplexity (the last stage's in a pipeline), and a DDP run's unigram baseline, characters per second and last sample. */
function languageModelSummary(r0: RankResult, perplexity: unknown): Record<string, unknown> {
  if (typeof perplexity !== 'number') return {};
  return {
    perplexity: round(perplexity),
    ...(typeof r0.unigram === 'number'
      ? { unigram: r0.unigram, tokensPerSec: typeof r0.tokensPerSec === 'number' ? round(r0.tokensPerSec) : null, sample: r0.sample }
      : {}),
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
      .map((r) => ({
        rank: r.rank,
        slowFactor: r.slowFactor as number,
        slowedMs: typeof r.slowedMs === 'number' && Number.isFinite(r.slowedMs) ? round(r.slowedMs) : null,
      })),
  };
}
