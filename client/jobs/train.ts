/** Job `train`: data-parallel training; progress as log lines and launcher reports. */
import { parseTrainConfig, train } from '../train/trainer.ts';
import type { TrainEvent } from '../train/events.ts';
import type { JobContext } from './job.ts';

export async function trainJob(ctx: JobContext): Promise<Record<string, unknown>> {
  const config = parseTrainConfig(ctx.params, ctx.worldSize);
  const logEvery = Math.max(1, Number(ctx.params.get('logEvery') ?? 20));
  const emit = (e: TrainEvent) => {
    switch (e.type) {
      case 'joined':
        ctx.joined(e.rank, e.worldSize);
        ctx.log(`rank ${e.rank}/${e.worldSize} on ${e.backend}${e.adapter ? ` (${e.adapter})` : ''}${e.fallbackReason ? `: ${e.fallbackReason}` : ''}`);
        break;
      case 'step':
        if (e.step === 1 || e.step % logEvery === 0 || e.step === e.totalSteps) {
          const loss = e.ranks.reduce((s, r) => s + r.loss, 0) / e.ranks.length;
          ctx.log(`epoch ${e.epoch} step ${e.step}/${e.totalSteps} loss ${loss.toFixed(4)}`);
        }
        break;
      case 'eval':
        ctx.log(`epoch ${e.epoch}: test accuracy ${(e.testAccuracy * 100).toFixed(2)}%, test loss ${e.testLoss.toFixed(4)}`);
        break;
      case 'log':
        ctx.log(`${e.level}: ${e.message}`);
        break;
      case 'shard':
        ctx.log(`epoch ${e.epoch}: ${e.samples} of ${e.datasetSize} samples on this rank, ${e.stepsPerEpoch} steps`);
        break;
      case 'stopped':
        ctx.log(`stopped by rank ${e.by} at step ${e.atStep}`);
        break;
      case 'config':
      case 'waiting':
      case 'link':
      case 'done':
        break;
      default: {
        const unknown: never = e;
        void unknown;
      }
    }
    ctx.progress(e as unknown as Record<string, unknown>);
  };
  const result = await train({
    serverUrl: ctx.serverUrl,
    session: ctx.session,
    rank: ctx.rank,
    timeoutMs: ctx.timeoutMs,
    params: ctx.params,
    config,
    emit,
    stopRequested: () => false,
  });
  return result.summary;
}
