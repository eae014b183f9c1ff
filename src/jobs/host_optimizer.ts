/**
 * The job's optimizer, in a module of its own: it loads TF.js (src/nn/optim.ts), and the job's
 * options (train_config.ts), which the launcher reads, do not need it (over a second of its start).
 */
import { Adam, SGD, type HostOptimizer } from '../nn/optim.ts';
import type { TrainConfig } from './train_config_types.ts';

/**
 * The job's optimizer for replicated weights (DDP, pipeline stages): torch's formulas on the host
 * (src/nn/optim.ts), so that tabs on different backends and browsers keep bit-identical replicas.
 */
export function hostOptimizer(config: Pick<TrainConfig, 'optimizer' | 'lr'>): HostOptimizer {
  return config.optimizer === 'adam' ? new Adam({ lr: config.lr }) : new SGD({ lr: config.lr });
}
