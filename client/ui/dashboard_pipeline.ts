/**
 * The Pipeline panel's model: the stages and their layers, ranks and bubbles, the schedule drawing
 * of one step (the timeline), and the log's line for a round's layout.
 */
import type { StageLayer, TimelineEntry } from '../train/events.ts';
import type { DashboardState, PipelineLayout } from './dashboard_types.ts';
import { mean, plural } from './dashboard_format.ts';
import { fmtInt, fmtPercent } from './format.ts';

/** The log's line for a round's 'pipeline' event (also the page's console line, in other words). */
export function pipelineLine(p: PipelineLayout): string {
  const mine = p.layers.filter((l) => l.stage === p.stage);
  const params = mine.reduce((n, l) => n + l.parameters, 0);
  const replica = p.replicas > 1 ? ` (replica ${p.replica} of ${p.replicas})` : '';
  const layers = mine.length
    ? `layers ${mine.map((l) => `${l.index} ${l.className}`).join(', ')} (${fmtInt(params)} parameters)`
    : 'no layers reported';
  return `Pipeline: this tab is stage ${p.stage} of ${p.stages}${replica}, ${layers}; ${p.schedule} schedule, ${plural(p.microBatches, 'micro-batch', 'micro-batches')}, bubble ${fmtPercent(p.bubbleFormula)} by the formula.`;
}

export interface PipelineStageRow {
  stage: number;
  /** The stage's layers in model order. */
  layers: readonly StageLayer[];
  /** "2 Dense, 3 Dense" (index and class), or "–" when the layout names none. */
  layersText: string;
  parameters: number;
  /** The global ranks holding this stage, one per replica (rank = replica × stages + stage). */
  ranks: number[];
  /** This tab holds it. */
  self: boolean;
  /** Those of its ranks that are gone. */
  lost: number[];
  /** Mean idle share of its ranks in their latest step; null before one reported it. */
  bubble: number | null;
}

/** What the Pipeline panel shows (null for plain data-parallel runs). */
export interface PipelinePanel {
  stages: PipelineStageRow[];
  selfStage: number;
  selfReplica: number;
  /** "2 stages × 2 replicas · gpipe schedule · 4 micro-batches" (and the activations' dtype when not float32). */
  shape: string;
  formulaBubble: number;
  /** Mean of the stages' measured bubbles in their latest steps; null before a step reported one. */
  measuredBubble: number | null;
  /** "Bubble: 27.3% measured (latest step, mean of the stages) · 20.0% by the formula (S−1)/(M+S−1) = 1/5." */
  bubbleText: string;
}

export function pipelinePanel(s: DashboardState): PipelinePanel | null {
  const p = s.pipeline;
  if (!p) return null;
  const S = p.stages;
  // Bubbles by stage, from the ranks' own word on where they are.
  const bubbles = new Map<number, number[]>();
  for (const m of s.pipelineRanks.values()) {
    if (!Number.isFinite(m.bubble)) continue;
    bubbles.set(m.stage, [...(bubbles.get(m.stage) ?? []), m.bubble]);
  }
  const stages: PipelineStageRow[] = Array.from({ length: S }, (_, stage) => {
    const layers = p.layers.filter((l) => l.stage === stage).sort((a, b) => a.index - b.index);
    const ranks = Array.from({ length: p.replicas }, (_, replica) => replica * S + stage);
    const measured = bubbles.get(stage);
    return {
      stage,
      layers,
      layersText: layers.length ? layers.map((l) => `${l.index} ${l.className}`).join(', ') : '–',
      parameters: layers.reduce((n, l) => n + l.parameters, 0),
      ranks,
      self: stage === p.stage,
      lost: ranks.filter((r) => s.lost.includes(r)),
      bubble: measured ? mean(measured) : null,
    };
  });
  const measuredStages = stages.map((r) => r.bubble).filter((b): b is number => b !== null);
  const measuredBubble = measuredStages.length ? mean(measuredStages) : null;
  const M = p.microBatches;
  const wire = s.config && s.config.activationDtype !== 'float32' ? ` · ${s.config.activationDtype} activations` : '';
  const formula = `${fmtPercent(p.bubbleFormula)} by the formula (S−1)/(M+S−1) = ${S - 1}/${M + S - 1}`;
  return {
    stages,
    selfStage: p.stage,
    selfReplica: p.replica,
    shape: `${plural(S, 'stage')} × ${plural(p.replicas, 'replica')} · ${p.schedule} schedule · ${plural(M, 'micro-batch', 'micro-batches')}${wire}`,
    formulaBubble: p.bubbleFormula,
    measuredBubble,
    bubbleText: `Bubble: ${measuredBubble === null ? 'not measured yet' : `${fmtPercent(measuredBubble)} measured (latest step, mean of the stages)`} · ${formula}.`,
  };
}

export interface TimelineBox {
  phase: TimelineEntry['phase'];
  microBatch: number;
  startMs: number;
  endMs: number;
  /** Left edge and width as fractions of the step's span (0..1). */
  left: number;
  width: number;
  /** "stage 1: backward of micro-batch 2, 3.1-5.4 ms" */
  label: string;
}

export interface TimelineRow {
  stage: number;
  /** This tab holds this stage (in its own replica). */
  self: boolean;
  totalMs: number;
  boxes: TimelineBox[];
  /** "stage 1: 8 passes, busy 9.5 of 12.3 ms" */
  label: string;
}

/** The schedule drawing: one row per stage, a box per pass, over the step's span. */
export interface TimelineModel {
  step: number;
  spanMs: number;
  rows: TimelineRow[];
  /** Axis ticks: position (fraction of the span) and label. */
  ticks: Array<{ at: number; label: string }>;
  /** What the drawing shows, in one sentence (its accessible description). */
  caption: string;
}

const PHASE_WORD: Readonly<Record<TimelineEntry['phase'], string>> = { F: 'forward', B: 'backward' };

/** A number of ms with one decimal ("3.1"), or none from 100 up. */
function msFigure(ms: number): string {
  return ms >= 100 ? ms.toFixed(0) : ms.toFixed(1);
}

export function timelineModel(s: DashboardState): TimelineModel | null {
  const t = s.timeline;
  if (!t) return null;
  const stages = [...t.stages].filter((st) => Number.isInteger(st.stage)).sort((a, b) => a.stage - b.stage);
  const ok = (e: TimelineEntry) => Number.isFinite(e.start) && Number.isFinite(e.end) && e.start >= 0;
  let spanMs = 0;
  for (const st of stages) {
    if (Number.isFinite(st.totalMs)) spanMs = Math.max(spanMs, st.totalMs);
    for (const e of st.entries) if (ok(e)) spanMs = Math.max(spanMs, e.end);
  }
  const span = spanMs > 0 ? spanMs : 1;
  const rows: TimelineRow[] = stages.map((st) => {
    const boxes = st.entries.filter(ok).map((e): TimelineBox => {
      const end = Math.max(e.start, e.end);
      return {
        phase: e.phase,
        microBatch: e.microBatch,
        startMs: e.start,
        endMs: end,
        left: e.start / span,
        width: (end - e.start) / span,
        label: `stage ${st.stage}: ${PHASE_WORD[e.phase]} of micro-batch ${e.microBatch}, ${msFigure(e.start)}-${msFigure(end)} ms`,
      };
    });
    const busy = boxes.reduce((sum, b) => sum + (b.endMs - b.startMs), 0);
    const total = Number.isFinite(st.totalMs) ? st.totalMs : spanMs;
    return {
      stage: st.stage,
      self: s.pipeline?.stage === st.stage,
      totalMs: total,
      boxes,
      label: `stage ${st.stage}: ${plural(boxes.length, 'pass', 'passes')}, busy ${msFigure(busy)} of ${msFigure(total)} ms`,
    };
  });
  const micro = s.pipeline ? `${plural(s.pipeline.microBatches, 'micro-batch', 'micro-batches')} on ` : '';
  return {
    step: t.step,
    spanMs,
    rows,
    ticks: axisTicks(spanMs),
    caption: `Step ${fmtInt(t.step)} of replica 0's pipeline: forward (F) and backward (B) passes of ${micro}${plural(rows.length, 'stage')} over ${msFigure(spanMs)} ms; the gaps are the bubble.`,
  };
}

/** Ticks at round numbers of ms (1, 2 or 5 × 10^k apart), at most about six, from 0. */
function axisTicks(spanMs: number): Array<{ at: number; label: string }> {
  if (!(spanMs > 0)) return [];
  const raw = spanMs / 5;
  const pow = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((k) => k * pow).find((x) => x >= raw)!;
  const ticks: Array<{ at: number; label: string }> = [];
  for (let v = 0; v <= spanMs + step * 1e-9; v += step) {
    const value = Number(v.toPrecision(12));
    ticks.push({ at: value / spanMs, label: `${value.toLocaleString('en-US', { maximumFractionDigits: 3 })} ms` });
  }
  return ticks;
}
