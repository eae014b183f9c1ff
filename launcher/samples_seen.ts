/**
 * Which samples a run really trained on, from what its ranks reported (elastic 'round' and
 * 'batch' events), not from any rank's own position counter: a wrong re-shard shows up here.
 *
 * The steps that count are the run's lineage: a round resumes from some committed step R, so
 * steps above R that earlier rounds had started are discarded (they are trained again). For
 * every step of the lineage, the samples of every rank of the round that trained it count,
 * except the sampler's padding (repeats torch adds so that ranks get equal shares).
 */
import { epochOrder } from '../src/datasets/sampler.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';

export interface EpochSeen {
  /** Distinct samples trained on in the epoch. */
  samples: number;
  /** No sample twice, and the samples trained are exactly the first ones of the epoch's order. */
  exactlyOnce: boolean;
  /** Every sample of the dataset was trained on. */
  complete: boolean;
}

type RoundEvent = Extract<ElasticEvent, { type: 'round' }>;
type BatchEvent = Extract<ElasticEvent, { type: 'batch' }>;

/** Per epoch, from the events of every rank (any order of ranks; each rank's in its own order). */
export function samplesSeen(events: ElasticEvent[]): EpochSeen[] {
  const rounds: RoundEvent[] = [];
  const batches = new Map<string, BatchEvent[]>();
  let finalStep = 0;
  for (const e of events) {
    if (e.type === 'round' && !rounds.some((r) => r.round === e.round)) rounds.push(e);
    if (e.type === 'batch') {
      const key = `${e.round}#${e.step}`;
      const list = batches.get(key);
      if (list) list.push(e);
      else batches.set(key, [e]);
    }
    if (e.type === 'end') finalStep = Math.max(finalStep, e.steps);
  }
  // Each rank's own samples (localData): no global order to check them against.
  if (rounds.length === 0 || rounds.some((r) => r.localData)) return [];
  const { datasetLength, shuffle, seed } = rounds[0]!;

  // A round's steps count up to the lowest step any later round resumed from.
  const caps: number[] = new Array(rounds.length);
  let cap = finalStep;
  for (let i = rounds.length - 1; i >= 0; i--) {
    caps[i] = cap;
    cap = Math.min(cap, rounds[i]!.step);
  }
  const trained = new Map<number, number[]>(); // epoch -> sample indices, padding left out
  const missing = new Set<number>(); // epochs with a step some rank did not report
  // A run that resumed from another run's checkpoint trained the start of that epoch there.
  const first = rounds[0]!;
  if (first.step > 0 && first.position > 0) {
    trained.set(first.epoch, epochOrder(datasetLength, { shuffle, seed, epoch: first.epoch }).slice(0, first.position));
  }
  for (let i = 0; i < rounds.length; i++) {
    const r = rounds[i]!;
    for (let step = r.step + 1; step <= caps[i]!; step++) {
      const list = batches.get(`${r.round}#${step}`) ?? [];
      const ranks = new Set(list.map((b) => b.rank));
      for (const b of list) {
        const into = trained.get(b.epoch) ?? [];
        trained.set(b.epoch, into);
        into.push(...b.indices.slice(0, b.indices.length - b.padding));
      }
      if (ranks.size < (r.samplers ?? r.worldSize)) missing.add(list[0]?.epoch ?? -1);
    }
  }
  const epochs = [...trained.keys()].sort((a, b) => a - b);
  return epochs.map((epoch) => {
    const indices = trained.get(epoch)!;
    const distinct = new Set(indices);
    const order = epochOrder(datasetLength, { shuffle, seed, epoch });
    const prefix = new Set(order.slice(0, distinct.size));
    const isPrefix = [...distinct].every((i) => prefix.has(i));
    return {
      samples: distinct.size,
      exactlyOnce: distinct.size === indices.length && isPrefix && !missing.has(epoch) && !missing.has(-1),
      complete: distinct.size === datasetLength,
    };
  });
}
