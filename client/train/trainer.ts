/**
 * The built-in training job: a user script of the library like any other. It loads the data,
 * builds the model and hands a plain training step to `runElastic`, which carries the rounds,
 * recovery, re-sharding, the votes and the checkpoints. This module picks the strategy's trainer
 * (ddp_trainer.ts, pipeline_trainer.ts, ps_trainer.ts); what they do alike (the job's
 * configuration, its data, its metrics, test-set evaluation and the events the dashboard and the
 * launcher show) is the job harness, harness.ts.
 */
import { trainDdp } from './ddp_trainer.ts';
import type { TrainerOptions, TrainResult } from './harness.ts';

export async function train(opts: TrainerOptions): Promise<TrainResult> {
  // Model parallel: the pipeline's own trainer (a module of its own, loaded when used).
  if (opts.config.pp > 1) return (await import('./pipeline_trainer.ts')).trainPipeline(opts);
  // Parameter servers (asynchronous, or CentralStorage): a trainer of their own too.
  if (opts.config.strategy !== 'ddp') return (await import('./ps_trainer.ts')).trainParameterServer(opts);
  // Data parallel (DDP): every rank holds the whole model (ddp_trainer.ts).
  return trainDdp(opts);
}
