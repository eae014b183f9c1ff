/**
 * Pipeline schedules (torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B): the order
 * in which one stage runs the forward (F) and backward (B) passes of a step's micro-batches.
 * Pure: no tensors, no I/O.
 *
 * Both schedules run the backwards in micro-batch order 0, 1, ..., M-1, so gradients accumulate
 * in the same order and both train to bit-identical weights; they differ in when: GPipe runs
 * every forward first (a stage keeps M inputs), 1F1B starts backwards as soon as it can (a stage
 * keeps at most S - s). Either way each stage idles for the pipeline's fill and drain, the
 * "bubble": (S-1)/(M+S-1) of the step when every pass takes the same time.
 */

export type ScheduleKind = 'gpipe' | '1f1b';
export const SCHEDULES: readonly ScheduleKind[] = ['gpipe', '1f1b'];

export interface Action {
  phase: 'F' | 'B';
  /** The micro-batch, 0 .. M-1. */
  microBatch: number;
}

/** The actions of `stage` (0 .. stages-1) for one step of `microBatches` micro-batches. */
export function scheduleActions(kind: ScheduleKind, stage: number, stages: number, microBatches: number): Action[] {
  if (!Number.isSafeInteger(stages) || stages < 1) throw new RangeError(`stages must be a positive integer, got ${stages}`);
  if (!Number.isSafeInteger(stage) || stage < 0 || stage >= stages) throw new RangeError(`stage must be in 0..${stages - 1}, got ${stage}`);
  if (!Number.isSafeInteger(microBatches) || microBatches < 1)
    throw new RangeError(`microBatches must be a positive integer, got ${microBatches}`);
  const F = (microBatch: number): Action => ({ phase: 'F', microBatch });
  const B = (microBatch: number): Action => ({ phase: 'B', microBatch });
  const all = Array.from({ length: microBatches }, (_, i) => i);
  switch (kind) {
    case 'gpipe':
      return [...all.map(F), ...all.map(B)];
    case '1f1b': {
      // Warm-up: enough forwards to fill the stages after this one; then one forward, one
      // backward; then the backwards left (cool-down).
      const warmup = Math.min(stages - 1 - stage, microBatches);
      const actions = all.slice(0, warmup).map(F);
      for (let i = 0; i < microBatches - warmup; i++) actions.push(F(warmup + i), B(i));
      for (let i = microBatches - warmup; i < microBatches; i++) actions.push(B(i));
      return actions;
    }
    default: {
      const unknown: never = kind;
      throw new RangeError(`unknown schedule "${String(unknown)}"; use ${SCHEDULES.join(' or ')}`);
    }
  }
}

/**
 * How a batch of `batchSize` samples is cut into micro-batches (torch.tensor_split): `count`
 * chunks in order whose sizes differ by at most one, the larger first. A batch smaller than
 * `count` (an epoch's short last batch) gets one micro-batch per sample.
 */
export function microBatchSizes(batchSize: number, count: number): number[] {
  if (!Number.isSafeInteger(batchSize) || batchSize < 1) throw new RangeError(`batch size must be a positive integer, got ${batchSize}`);
  if (!Number.isSafeInteger(count) || count < 1) throw new RangeError(`microBatches must be a positive integer, got ${count}`);
  const m = Math.min(count, batchSize);
  const base = Math.floor(batchSize / m);
  return Array.from({ length: m }, (_, i) => base + (i < batchSize % m ? 1 : 0));
}

/** The idle share of a step for S stages and M micro-batches when every pass takes the same time. */
export function bubbleFraction(stages: number, microBatches: number): number {
  return (stages - 1) / (microBatches + stages - 1);
}

/** Most micro-batch inputs a stage keeps at once under `actions` (its activation memory, in micro-batches). */
export function peakStashed(actions: Action[]): number {
  let held = 0;
  let peak = 0;
  for (const a of actions) {
    held += a.phase === 'F' ? 1 : -1;
    peak = Math.max(peak, held);
  }
  return peak;
}
