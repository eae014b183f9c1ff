/**
 * The training strategy's options against each other and the world (parameter servers, their
 * staleness rules, pipelines), for train_config.ts's schema.
 */
import { ConfigError } from './config_option.ts';
import type { StrategyName } from './train_config_types.ts';

/**
 * The parameter-server options against each other and the world: ps and the staleness options
 * only where the strategy uses them, no pipeline with a PS strategy, and at least one worker
 * besides the servers in the largest world and in the smallest (min). Throws ConfigError.
 */
export function checkStrategy(
  strategy: StrategyName,
  ps: number,
  maxStaleness: number | null,
  stalenessLr: boolean,
  world: { min: number; max: number; pp: number; dp: number },
): void {
  const { min, max, pp, dp } = world;
  if (strategy !== 'ddp' && (pp > 1 || dp > 1)) {
    const pipeline = [pp > 1 ? `pp ${pp}` : '', dp > 1 ? `dp ${dp}` : ''].filter(Boolean).join(', ');
    throw new ConfigError(
      'strategy',
      strategy,
      `ddp with pipeline stages or replicas (here ${pipeline}): a pipeline splits the model between tabs while parameter servers hold all of it, so leave out pp and dp, or strategy`,
    );
  }
  if (strategy === 'ddp' && ps !== 1)
    throw new ConfigError('ps', String(ps), '1 (or left out) unless strategy is ps: parameter servers need strategy=ps');
  if (strategy === 'central' && ps !== 1)
    throw new ConfigError(
      'ps',
      String(ps),
      '1 with strategy central, which keeps every variable on one server (for several, use strategy=ps)',
    );
  if (maxStaleness !== null && strategy !== 'ps') {
    throw new ConfigError(
      'maxStaleness',
      String(maxStaleness),
      `left out unless strategy is ps: ${strategy === 'central' ? 'strategy central is synchronous, its pushes are never stale' : 'only asynchronous parameter servers take stale pushes'}`,
    );
  }
  if (stalenessLr && strategy !== 'ps') {
    throw new ConfigError(
      'stalenessLr',
      'true',
      `false (or left out) unless strategy is ps: ${strategy === 'central' ? 'strategy central is synchronous, its pushes are never stale' : 'only asynchronous parameter servers take stale pushes'}`,
    );
  }
  if (strategy === 'ddp') return;
  const servers = `${ps} parameter server${ps === 1 ? '' : 's'}`;
  if (ps >= max) {
    // The default single server in a world of one tab: the world is what to change.
    if (ps === 1)
      throw new ConfigError('world', String(max), `at least 2 with strategy ${strategy}: a parameter server and at least one worker`);
    throw new ConfigError(
      'ps',
      String(ps),
      `at most ${max - 1}, the world size (${max}) less one: every tab that is not a server is a worker, and at least one is needed`,
    );
  }
  if (min < ps + 1)
    throw new ConfigError(
      'min',
      String(min),
      `at least ${ps + 1} with strategy ${strategy}: the ${servers} and one worker (with fewer tabs nothing trains)`,
    );
}
