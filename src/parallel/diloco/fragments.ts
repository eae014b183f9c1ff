/**
 * DiLoCo's fragments (diloco.ts): how the weights are cut and when each fragment syncs, each
 * fragment's outer state, its state dict both ways (checked, since it comes from a file or a
 * peer), and the round start's combination of the ranks' pseudo-gradients (mean or robust).
 */
import type { ProcessGroup } from '../../c10d/process_group.ts';
import type { CommHookState } from '../comm_hooks/types.ts';
import type { WeightSpec } from '../../checkpoint/checkpoint_format.ts';
import { allFinite } from '../../wire/finite.ts';
import type { SGD } from '../../nn/optim.ts';
import type { RobustReducer } from '../robust/reducer.ts';
import type { OuterAggregation } from '../robust/outer_aggregation.ts';

/** The contiguous ranges [start, end) of `fragments` nearly equal fragments of `numel` weights. */
export function fragmentRanges(numel: number, fragments: number): Array<{ start: number; end: number }> {
  return Array.from({ length: fragments }, (_, f) => ({
    start: Math.floor((f * numel) / fragments),
    end: Math.floor(((f + 1) * numel) / fragments),
  }));
}

/** The fragments whose outer step falls after `step`: fragment f's every `syncEvery` steps, staggered by f's share of them (one fragment: every syncEvery-th step). */
export function fragmentsSyncingAt(step: number, syncEvery: number, fragments: number): number[] {
  const out: number[] = [];
  for (let f = 0; f < fragments; f++) if (step % syncEvery === Math.round(((f + 1) * syncEvery) / fragments) % syncEvery) out.push(f);
  return out;
}

/** One fragment's outer state, and its all-reduce while on the wire. */
export interface Fragment {
  start: number;
  end: number;
  outer: SGD;
  steps: number;
  syncedAt: number;
  inFlight: { sum: Promise<Float32Array>; sent: Float32Array; due: number; mine: number } | null;
  /** Samples since the fragment's pseudo-gradient was last taken: this rank's, and the group's (see countStep). */
  mine: number;
  all: number;
  /** Robust aggregation's reducer for this fragment (null: the mean). */
  robust: RobustReducer | null;
}

/** What rejoin needs of a rank's held weights (DiLoCoHeld's). */
interface Held {
  weights: Float32Array;
  samples: number[] | null;
}

/** The outer state as a hook state's meta and tensors (without the name). */
export function outerStateDict(
  outerWeights: Float32Array | null,
  fragments: readonly Fragment[],
  meta: CommHookState['meta'],
): Omit<CommHookState, 'name'> {
  const tensors: Record<string, Float32Array> = {};
  const out: CommHookState['meta'] = { ...meta };
  if (outerWeights) {
    tensors.outer_weights = outerWeights.slice();
    const momentum = new Float32Array(outerWeights.length);
    let any = false;
    for (const f of fragments) {
      const values = new Float32Array(f.outer.stateBundle().weightData);
      if (values.length > 1) {
        momentum.set(values.subarray(1), f.start);
        any = true;
      }
    }
    if (any) tensors.momentum_buffer = momentum;
    out.fragmentSteps = fragments.map((f) => f.steps).join(',');
    out.fragmentSyncedAt = fragments.map((f) => f.syncedAt).join(',');
  }
  return { meta: out, tensors };
}

/** A hook state's outer weights and fragments, checked (RangeError naming what is wrong); null for a state without outer weights. */
export function parseOuterState(
  state: CommHookState,
  fragmentCount: number,
  outerMomentum: number,
  newOptimizer: () => SGD,
  newReducer: () => RobustReducer | null,
): { weights: Float32Array; fragments: Fragment[] } | null {
  const bad = (what: string) => new RangeError(`DiLoCo state: ${what}`);
  if (state.meta.fragments !== fragmentCount)
    throw bad(`it is for ${String(state.meta.fragments)} fragments, this DiLoCo has ${fragmentCount}: every rank must cut the model alike`);
  const weights = state.tensors.outer_weights ?? null;
  const momentum = state.tensors.momentum_buffer ?? null;
  if (!weights) {
    if (momentum) throw bad('a momentum buffer without outer weights');
    return null;
  }
  if (momentum && momentum.length !== weights.length)
    throw bad(`a momentum buffer of ${momentum.length} values for ${weights.length} weights`);
  for (const t of [weights, momentum]) if (t && !allFinite(t)) throw bad('a non-finite value; non-finite state is never loaded');
  if (momentum && outerMomentum === 0) throw bad('it has an outer momentum buffer, and this DiLoCo no outer momentum (outerMomentum)');
  const counts = (key: string): number[] => {
    const v = state.meta[key];
    const items = typeof v === 'string' && v.length <= 16 * fragmentCount ? v.split(',').map(Number) : [];
    if (items.length !== fragmentCount || !items.every((n) => Number.isSafeInteger(n) && n >= 0))
      throw bad(`${key} "${String(v).slice(0, 40)}" is not ${fragmentCount} counts`);
    return items;
  };
  const steps = counts('fragmentSteps');
  const syncedAt = counts('fragmentSyncedAt');
  const fragments = fragmentRanges(weights.length, fragmentCount).map(({ start, end }, f): Fragment => {
    const outer = newOptimizer();
    const taken = steps[f]!;
    if (taken > 0 && outerMomentum > 0) {
      if (!momentum) throw bad(`no outer momentum buffer after ${taken} outer steps with momentum`);
      const specs: WeightSpec[] = [
        { name: 'step', shape: [], dtype: 'float32' },
        { name: '0/momentum_buffer', shape: [end - start], dtype: 'float32' },
      ];
      const data = new Float32Array(1 + end - start);
      data[0] = taken;
      data.set(momentum.subarray(start, end), 1);
      outer.loadStateBundle({ weightSpecs: specs, weightData: data.buffer });
    } else if (taken > 0) {
      outer.loadStateBundle({ weightSpecs: [{ name: 'step', shape: [], dtype: 'float32' }], weightData: Float32Array.of(taken).buffer });
    }
    return { start, end, outer, steps: taken, syncedAt: syncedAt[f]!, inFlight: null, mine: 0, all: 0, robust: newReducer() };
  });
  return { weights: weights.slice(), fragments };
}

/**
 * Collective, at a round start: the ranks' pseudo-gradients since the last outer step (`prev`
 * less `held`'s weights; `held` null: this rank's do not count) averaged, each weighed by its
 * samples per fragment; null when no rank's count.
 */
export async function rejoinMean(
  pg: ProcessGroup,
  prev: Float32Array,
  fragments: readonly Fragment[],
  held: Held | null,
): Promise<{ delta: Float32Array; contributors: number } | null> {
  // The pseudo-gradient weighed by samples, then a slot per fragment for the samples and one
  // counting the ranks it comes from: one all-reduce.
  const n = prev.length;
  const P = fragments.length;
  const sum = new Float32Array(n + P + 1);
  if (held) {
    fragments.forEach((f, k) => {
      const samples = held.samples?.[k] ?? 1;
      for (let i = f.start; i < f.end; i++) sum[i] = (prev[i]! - held.weights[i]!) * samples;
      sum[n + k] = samples;
    });
    sum[n + P] = 1;
  }
  await pg.allReduce(sum, 'sum');
  const contributors = sum[n + P]!;
  if (!(contributors >= 1)) return null;
  const delta = sum.subarray(0, n);
  // The same division on every rank of the same sums: the same bits.
  fragments.forEach((f, k) => {
    const samples = sum[n + k]!;
    for (let i = f.start; i < f.end; i++) delta[i] = samples > 0 ? delta[i]! / samples : 0;
  });
  return { delta, contributors };
}

/**
 * rejoinMean's robust counterpart: fragment by fragment, the pseudo-gradients of the ranks that
 * trained samples on it aggregated (unweighted); `contributors` is the most ranks any fragment took in.
 */
export async function rejoinRobust(
  pg: ProcessGroup,
  prev: Float32Array,
  fragments: readonly Fragment[],
  held: Held | null,
  combine: OuterAggregation,
  step: number,
): Promise<{ delta: Float32Array; contributors: number } | null> {
  const parts = fragments.map((f, k) => {
    const present = held !== null && (held.samples?.[k] ?? 1) > 0;
    const mine = new Float32Array(f.end - f.start);
    if (present) for (let i = f.start; i < f.end; i++) mine[i - f.start] = prev[i]! - held.weights[i]!;
    return combine.reduce(pg, f.robust!, mine, present, step, k);
  });
  const results = await Promise.all(parts);
  const contributors = Math.max(0, ...results.map((r) => r.used));
  if (contributors < 1) return null;
  const delta = new Float32Array(prev.length);
  results.forEach((r, k) => {
    delta.set(r.values, fragments[k]!.start);
  });
  return { delta, contributors };
}
