/** `pipeline` in a pipeline run's summary: its shape and, per stage, what the stage's replicas reported. */
import { count, finite, round, round4, type RankResult } from './summary_fields.ts';

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

function rankPipeline(r: RankResult): RankPipeline | null {
  const p = r.pipeline;
  if (typeof p !== 'object' || p === null || Array.isArray(p)) return null;
  const o = p as Record<string, unknown>;
  const stages = count(o.stages);
  const replicas = count(o.replicas);
  const stage = count(o.stage);
  const replica = count(o.replica);
  if (stages === null || replicas === null || stage === null || replica === null) return null;
  if (stages < 1 || replicas < 1 || stages > MAX_PIPELINE_ITEMS || replicas > MAX_PIPELINE_ITEMS || stage >= stages || replica >= replicas)
    return null;
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
    bubble: {
      measured: measured !== null && measured >= 0 && measured <= 1 ? measured : null,
      formula: formula !== null && formula >= 0 && formula <= 1 ? formula : null,
    },
    breakdownMs: Object.fromEntries(
      PIPELINE_BREAKDOWN.map((k) => [k, finite(breakdown[k]) === null ? null : round(breakdown[k] as number)]),
    ) as RankPipeline['breakdownMs'],
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
  const at: Array<Array<RankPipeline | null | undefined>> = Array.from({ length: S }, () =>
    new Array<RankPipeline | null | undefined>(D).fill(undefined),
  );
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
      bubble: {
        measured: measured.length === S ? round4(measured.reduce((a, b) => a + b, 0) / S) : null,
        formula: formula === null ? null : round4(formula),
      },
      stages,
    },
    identical: stages.every((st) => st.replicasIdentical),
  };
}
