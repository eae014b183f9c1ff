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
    case 'train':
      return { ...summarizeTrain(job, worldSize, ranks), ...elasticFigures(events), ...linksOf(ranks) };
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

/** Training: the figures every rank agrees on from rank 0, and every rank's weight hash. */
function summarizeTrain(job: string, worldSize: number, ranks: RankResult[]): Record<string, unknown> {
  const r0 = ranks[0];
  const breakdown = r0.breakdownMs as Record<string, number | null>;
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
    finalLoss: r0.finalLoss,
    testAccuracy: r0.testAccuracy,
    weightHashes: ranks.map((r) => r.weightHash),
    identical: ranks.every((r) => r.weightHash === r0.weightHash),
    breakdownMs: Object.fromEntries(Object.entries(breakdown).map(([k, v]) => [k, v === null ? null : round(v)])),
    seconds: round(Math.max(...ranks.map((r) => r.seconds as number))),
    pausedGenerations: Math.max(0, ...ranks.map((r) => (typeof r.pausedGenerations === 'number' ? r.pausedGenerations : 0))),
    ...(Array.isArray(r0.resumes) && r0.resumes.length > 0 ? { resumes: r0.resumes } : {}),
    ...(r0.identicalEveryStep !== undefined ? { identicalEveryStep: ranks.every((r) => r.identicalEveryStep === true) } : {}),
    ...(r0.stoppedBy !== undefined ? { stoppedBy: r0.stoppedBy } : {}),
    backends: [...new Set(ranks.map((r) => r.backend))],
  };
}
