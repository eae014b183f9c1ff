/** A DDP run's communication in its summary (--comm-hook, bytes per step, overlap), and the launcher's line about it. */
import { count, finite, record, round, round4, type RankResult } from './summary_fields.ts';
import { COMM_HOOK_NAMES, COMM_HOOK_WIRE_TYPES } from '../src/jobs/comm_hook_spec.ts';

/** --comm-hook in a DDP run's summary (see commSummary). */
export interface CommSummary {
  /** Rank 0's `commHook` (the lowest rank's that reported one): `name` (one of COMM_HOOK_NAMES), `registered` and the hook's numbers. */
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

const HOOK_NAMES: ReadonlySet<string> = new Set(COMM_HOOK_NAMES);
const WIRE_TYPES: ReadonlySet<string> = new Set(COMM_HOOK_WIRE_TYPES);
const COMM_HOOK_NUMBERS = [
  'rank',
  'startIter',
  'statsStep',
  'elementsSent',
  'elementsDense',
  'period',
  'startStep',
  'averagings',
  'averageBytes',
  'syncEvery',
  'stream',
  'overlap',
  'outerSteps',
  'outerStepBytes',
] as const;
/** Numbers that need not be whole (DiLoCo's outer learning rate and momentum). */
const COMM_HOOK_DECIMALS = ['outerLr', 'outerMomentum'] as const;

/**
 * A DDP run's communication figures from its ranks' results (the pipeline and parameter-server
 * trainers report none, and get none): `commHook` as rank 0 reported it (fields checked: a page's
 * result is its own to fill), `bytesPerStep` the mean of the ranks' `bytesPerStep`, and
 * `compressionRatio` = the ranks' bytesPerStep summed / their `denseBytesPerStep` summed (the
 * mean bytes over the mean baseline), or the mean of their own ratios when a rank did not say its
 * baseline. Empty when no rank reported a `commHook` or `bytesPerStep`.
 */
export function commSummary(ranks: RankResult[]): CommSummary {
  const hook = ranks.map((r) => record(r.commHook)).find((h) => h !== null && typeof h.name === 'string' && HOOK_NAMES.has(h.name)) ?? null;
  const sent = ranks.map((r) => finite(r.bytesPerStep));
  if (hook === null && sent.every((b) => b === null)) return {};
  const commHook: Record<string, string | number> = {};
  if (hook) {
    commHook.name = hook.name as string;
    if (typeof hook.registered === 'string' && /^[\w.-]{1,64}$/.test(hook.registered)) commHook.registered = hook.registered;
    for (const k of COMM_HOOK_NUMBERS) if (count(hook[k]) !== null) commHook[k] = hook[k] as number;
    for (const k of COMM_HOOK_DECIMALS) if (finite(hook[k]) !== null && (hook[k] as number) >= 0) commHook[k] = hook[k] as number;
    // PowerSGD's or DiLoCo's wire (float32, 16-bit, or DiLoCo's int8): one of the spec's words, nothing else.
    if (typeof hook.wire === 'string' && WIRE_TYPES.has(hook.wire)) commHook.wire = hook.wire;
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
  const o =
    ranks
      .map((r) => record(r.overlap))
      .find((x) => x !== null && [x.commMs, x.exposedMs, x.hiddenShare].every((v) => finite(v) !== null)) ?? null;
  return {
    ...(hook ? { commHook } : {}),
    bytesPerStep,
    compressionRatio,
    ...(after.length > 0 ? { bytesPerStepAfterStart: round(after.reduce((a, b) => a + b, 0) / after.length) } : {}),
    ...(o
      ? {
          overlap: {
            commMs: round(o.commMs as number),
            exposedMs: round(o.exposedMs as number),
            hiddenShare: round4(o.hiddenShare as number),
          },
        }
      : {}),
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
    case 'none': {
      // Robust aggregation replaces the ring: each rank's whole gradient goes to every other.
      const robust = record(summary.aggregation);
      what =
        robust && typeof robust.kind === 'string' && robust.kind !== 'mean'
          ? `${robust.kind} (robust aggregation over a direct all-gather of each rank's own gradient)`
          : 'none (float32 ring all-reduce)';
      break;
    }
    case 'fp16':
    case 'bf16':
      what = `${hook.name} (${hook.name === 'fp16' ? 'float16' : 'bfloat16'} values on the wire)`;
      break;
    case 'powersgd': {
      const stats =
        n('elementsSent') !== null && n('elementsDense') !== null
          ? `; step ${n('statsStep') ?? '?'} sent ${n('elementsSent')} of ${n('elementsDense')} elements`
          : '';
      const wire = typeof hook.wire === 'string' && hook.wire !== 'float32' ? `, ${hook.wire} on the wire` : '';
      what = `powersgd rank ${n('rank') ?? '?'}${wire}, plain all-reduce for the first ${n('startIter') ?? '?'} steps${stats}`;
      break;
    }
    case 'localsgd':
      what = `localsgd, models averaged every ${n('period') ?? '?'} steps after ${n('startStep') ?? '?'} averaged ones${n('averagings') === null ? '' : ` (${n('averagings')} averagings timed)`}`;
      break;
    case 'diloco': {
      const stream =
        (n('stream') ?? 0) > 0
          ? `, streaming in ${n('stream')} fragments overlapped with the next ${(n('overlap') ?? 1) > 1 ? `${n('overlap')} inner steps` : 'inner step'}`
          : '';
      const wire = typeof hook.wire === 'string' && hook.wire !== 'float32' ? `, ${hook.wire} on the wire` : '';
      what = `diloco, an outer step every ${n('syncEvery') ?? '?'} inner steps (outer lr ${n('outerLr') ?? '?'}, momentum ${n('outerMomentum') ?? '?'})${stream}${wire}${n('outerSteps') === null ? '' : ` (${n('outerSteps')} outer all-reduces timed)`}`;
      break;
    }
    default:
      what = 'n/a';
  }
  const registered = typeof hook?.registered === 'string' ? ` [hook ${hook.registered}]` : '';
  const sent = bytes === null ? 'n/a' : `${Math.round(bytes)} bytes`;
  return `communication: ${what}${registered}; ${sent} sent per step per rank (mean over ranks), ${ratio === null ? 'n/a' : ratio} of the float32 all-reduce's bytes`;
}
