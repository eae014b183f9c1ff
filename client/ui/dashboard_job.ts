/**
 * The job's settings in words: the one-line description the log and the facts card show, and how
 * a --comm-hook reads.
 */
import type { TrainConfig } from '../train/events.ts';
import { formatAttack, type CommHookSpec } from '../../src/jobs/train_config.ts';
import { describeAggregation } from '../../src/parallel/robust/reducer.ts';
import { plural } from './dashboard_format.ts';
import { fmtInt } from './format.ts';

/** The job in one line: "mlp on mnist · adam lr 0.003 · batch 64/rank (192 global) · 2 epochs". */
export function describeJob(c: TrainConfig): string {
  const length = c.steps !== null ? `${fmtInt(c.steps)} steps` : `${c.epochs} epoch${c.epochs === 1 ? '' : 's'}`;
  // --slow: the stragglers go with the length, so both kinds of run show them.
  const slowed = c.slow ? Object.entries(c.slow).map(([rank, f]) => `rank ${rank} ${f}× slower`) : [];
  const subset = (c.trainSize > 0 ? ` · first ${fmtInt(c.trainSize)} samples` : '') + (slowed.length > 0 ? ` · ${slowed.join(', ')}` : '');
  // --hidden: said only when it is not the model's default (older configs have no such field).
  const model =
    c.hidden === null || c.hidden === undefined
      ? c.model
      : c.hidden === 0
        ? `${c.model} (no hidden layer)`
        : `${c.model} (${fmtInt(c.hidden)} hidden)`;
  if (c.pp > 1) {
    // A pipeline run is a fixed size, and its batch is per replica (every stage of a replica sees it).
    const wire = c.activationDtype === 'float32' ? '' : `, ${c.activationDtype} activations`;
    const pipeline = ` · pipeline of ${plural(c.pp, 'stage')} × ${plural(c.dp, 'replica')}, ${plural(c.microBatches, 'micro-batch', 'micro-batches')} (${c.schedule}${wire})`;
    return `${model} on ${c.dataset} · ${c.optimizer} lr ${c.lr} · batch ${c.batchSize}/replica (${c.batchSize * c.dp} global) · ${length}${subset}${pipeline}`;
  }
  const global = c.min === c.max ? `${c.batchSize * c.max} global` : `up to ${c.batchSize * c.max} global`;
  const tabs = c.min === c.max ? '' : ` · elastic, ${c.min} to ${c.max} tabs`;
  // --comm-hook: said only when the gradients travel otherwise than the plain all-reduce.
  const hook = c.commHook && c.commHook.kind !== 'none' ? ` · ${describeCommHook(c.commHook)}` : '';
  const devices = (c.devices ?? 1) > 1 ? ` · ${c.devices} devices per tab` : '';
  // --aggregation and --attack: said only when asked for (older configs have neither).
  const robust = c.aggregation && c.aggregation.kind !== 'mean' ? ` · ${describeAggregation(c.aggregation)} aggregation` : '';
  const attack = c.attack
    ? ` · attack ${formatAttack(c.attack)} by the last ${plural(c.attack.attackers, 'rank')} (measuring defences)`
    : '';
  return `${model} on ${c.dataset} · ${c.optimizer} lr ${c.lr} · batch ${c.batchSize}/rank (${global}) · ${length}${subset}${tabs}${hook}${devices}${robust}${attack}`;
}

/** How a --comm-hook reads on the page ("PowerSGD, rank 2, after 10 plain steps"). */
export function describeCommHook(h: CommHookSpec): string {
  switch (h.kind) {
    case 'none':
      return 'float32 all-reduce';
    case 'fp16':
      return 'fp16 compression (float16 on the wire)';
    case 'bf16':
      return 'bf16 compression (bfloat16 on the wire)';
    case 'powersgd':
      return `PowerSGD, rank ${h.rank}${h.wire === 'float32' ? '' : `, ${h.wire} on the wire`}, after ${plural(h.startIter, 'plain step')}`;
    case 'localsgd':
      return `local SGD, models averaged every ${plural(h.period, 'step')} after ${plural(h.startStep, 'averaged step')}`;
    case 'diloco':
      return `DiLoCo, an outer step every ${plural(h.syncEvery, 'inner step')} (outer lr ${h.outerLr}, ${h.outerMomentum > 0 ? `Nesterov momentum ${h.outerMomentum}` : 'no momentum'}${h.stream > 0 ? `, streaming in ${plural(h.stream, 'fragment')} overlapped with the next ${h.overlap > 1 ? plural(h.overlap, 'step') : 'step'}` : ''}${h.wire === 'float32' ? '' : `, ${h.wire} on the wire`})`;
  }
}
