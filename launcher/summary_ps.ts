/** `parameterServer` in a parameter-server run's summary, and the launcher's lines about the run. */
import type { PsSampleCounts } from '../src/parallel/parameter_server/leases.ts';
import { count, finite, record, rounded, type RankResult } from './summary_fields.ts';

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
  const options = [
    ps.maxStaleness === null ? '' : `max staleness ${ps.maxStaleness}`,
    ps.stalenessLr ? 'gradients scaled by 1/(1 + staleness)' : '',
  ].filter(Boolean);
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
