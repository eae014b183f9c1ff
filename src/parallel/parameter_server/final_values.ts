/**
 * The end of a parameter-server run: once everyone has stopped, every rank gets every shard's
 * final values, server 0's sample counts and each server's version. Apart from the runner
 * (runner.ts): these are the run's last collectives, the same on every rank whatever its role.
 */
import type * as tf from '@tensorflow/tfjs';
import type { ProcessGroup } from '../../c10d/process_group.ts';
import { assignFlatWeights } from '../replicas.ts';
import type { LeaseBook, PsSampleCounts } from './leases.ts';
import type { ParameterServerShard } from './shard.ts';
import { joinShards, type ShardLayout } from './sharding.ts';
import type { PsServerSlot } from './types.ts';

/**
 * Sets `model` to the servers' final values and returns server 0's sample counts and each
 * server's version. `serving`: the place this tab serves with `shard` (-1: a worker).
 */
export async function gatherFinal(
  pg: ProcessGroup,
  servers: readonly PsServerSlot[],
  layout: ShardLayout,
  model: tf.LayersModel,
  serving: number,
  shard: ParameterServerShard | null,
  book: LeaseBook,
): Promise<{ samples: PsSampleCounts; versions: number[] }> {
  await pg.barrier();
  const parts: Float32Array[] = [];
  for (const s of servers) {
    const buf = serving === s.index ? (await shard!.pull()).values : new Float32Array(s.numel);
    parts.push(await pg.broadcast(buf, s.rank));
  }
  assignFlatWeights(model, joinShards(layout, parts), "the parameter servers' final values");
  const c = book.samples;
  const counts = await pg.broadcast(
    serving === 0 ? Float32Array.of(c.target, c.leased, c.applied, c.stale, c.refused, c.lost, c.epoch) : new Float32Array(7),
    servers[0]!.rank,
  );
  const samples: PsSampleCounts = {
    target: counts[0]!,
    leased: counts[1]!,
    applied: counts[2]!,
    stale: counts[3]!,
    refused: counts[4]!,
    lost: counts[5]!,
    epoch: counts[6]!,
  };
  const versionRow = new Float32Array(layout.numServers);
  if (serving >= 0) versionRow[serving] = shard!.version;
  const versions = Array.from(await pg.allReduce(versionRow, 'sum'));
  return { samples, versions };
}
