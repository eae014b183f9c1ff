/**
 * samplesSeen: which samples a run trained on, from the ranks' reported batches. The events are
 * made the way the elastic runner makes them (DistributedSampler from the round's position), so
 * a right re-shard passes and a wrong one (a position too early or too late) is caught.
 */
import { describe, expect, it } from 'vitest';
import { samplesSeen } from '../launcher/samples_seen.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import { DistributedSampler } from '../src/datasets/sampler.ts';

interface Simulated {
  worldSize: number;
  /** Steps this round commits (the last one may be cut by the next round). */
  steps: number;
  /** Steps committed when the round starts (default: where the previous round's lineage ends). */
  resumeAt?: number;
  /** Start the round from this position instead of the right one: a wrong re-shard. */
  wrongPosition?: number;
  /** A step the round started but nobody committed (its batches are reported, then it fails). */
  failsDuringNextStep?: boolean;
  /** A rank whose batches never reach the launcher. */
  silentRank?: number;
}

const LENGTH = 100;
const BATCH = 4;
const SEED = 3;

/** Events of a run through `rounds`, each rank sharding the epoch from the round's position. */
function simulate(rounds: Simulated[]): ElasticEvent[] {
  const events: ElasticEvent[] = [];
  let step = 0;
  let epoch = 0;
  let position = 0;
  // position after each committed step, to resume from any earlier one
  const history: Array<{ epoch: number; position: number }> = [{ epoch: 0, position: 0 }];
  rounds.forEach((r, i) => {
    const key = `inst.${i + 1}`;
    if (r.resumeAt !== undefined) {
      step = r.resumeAt;
      ({ epoch, position } = history[step]!);
    }
    if (r.wrongPosition !== undefined) position = r.wrongPosition;
    events.push({
      type: 'round',
      round: key,
      rank: 0,
      worldSize: r.worldSize,
      step,
      epoch,
      position,
      datasetLength: LENGTH,
      shuffle: true,
      seed: SEED,
      dropLast: false,
      source: step === 0 ? 'fresh' : 'replica',
      from: 0,
      redone: false,
    });
    const shard = () =>
      Array.from({ length: r.worldSize }, (_, rank) => {
        const s = new DistributedSampler(LENGTH, { numReplicas: r.worldSize, rank, seed: SEED });
        s.loadStateDict({ epoch, position });
        return { indices: s.indices(), padFrom: s.numSamples - s.numPadding };
      });
    let shards = shard();
    let k = 0; // step within this round's part of the epoch
    const total = r.steps + (r.failsDuringNextStep ? 1 : 0);
    for (let n = 0; n < total; n++, k++) {
      for (let rank = 0; rank < r.worldSize; rank++) {
        if (rank === r.silentRank) continue;
        const { indices, padFrom } = shards[rank]!;
        const from = k * BATCH;
        const to = Math.min(from + BATCH, indices.length);
        events.push({
          type: 'batch',
          round: key,
          rank,
          step: step + 1,
          epoch,
          indices: indices.slice(from, to),
          padding: Math.max(0, to - Math.max(from, padFrom)),
        });
      }
      if (n === r.steps) break; // the failed step is not committed
      const stepsInEpoch = Math.ceil(shards[0]!.indices.length / BATCH);
      position = k === stepsInEpoch - 1 ? LENGTH : Math.min(LENGTH, position + BATCH * r.worldSize);
      step++;
      if (position >= LENGTH) {
        epoch++;
        position = 0;
        shards = shard();
        k = -1;
      }
      history[step] = { epoch, position };
    }
  });
  const last = rounds[rounds.length - 1]!;
  for (let rank = 0; rank < last.worldSize; rank++) {
    events.push({
      type: 'end',
      round: `inst.${rounds.length}`,
      rank,
      worldSize: last.worldSize,
      steps: step,
      epoch,
      generations: rounds.length,
      stepsRedone: 0,
      stoppedBy: null,
      weightHash: 'h',
    });
  }
  return events;
}

describe('samplesSeen', () => {
  it('one round over a whole epoch: every sample once (padding left out), complete', () => {
    // 100 samples over 3 ranks: 34 each, two padded repeats.
    const seen = samplesSeen(simulate([{ worldSize: 3, steps: 9 }]));
    expect(seen).toEqual([{ samples: 100, exactlyOnce: true, complete: true }]);
  });

  it('a rank lost mid-step: the failed step is trained again in the next round, still exactly once', () => {
    const events = simulate([
      { worldSize: 4, steps: 3, failsDuringNextStep: true },
      { worldSize: 3, steps: 5 }, // 52 left: 18 each (2 of them padding), in 5 steps
    ]);
    expect(samplesSeen(events)).toEqual([{ samples: 100, exactlyOnce: true, complete: true }]);
  });

  it('a round that resumes from an earlier step discards the later steps of earlier rounds', () => {
    // Round 1 commits 5 steps, but round 2 resumes from step 2 (an older checkpoint): steps 3-5 of round 1 do not count.
    const events = simulate([
      { worldSize: 2, steps: 5 },
      { worldSize: 2, steps: 11, resumeAt: 2 },
    ]);
    expect(samplesSeen(events)).toEqual([{ samples: 100, exactlyOnce: true, complete: true }]);
  });

  it('a wrong re-shard that starts too early trains samples twice: not exactly once', () => {
    const events = simulate([
      { worldSize: 4, steps: 3 },
      { worldSize: 3, steps: 7, wrongPosition: 40 }, // 48 were trained
    ]);
    const [epoch] = samplesSeen(events);
    expect(epoch!.exactlyOnce).toBe(false);
  });

  it('a wrong re-shard that starts too late skips samples: not exactly once, not complete', () => {
    const events = simulate([
      { worldSize: 4, steps: 3 },
      { worldSize: 3, steps: 4, wrongPosition: 56 }, // 48 were trained
    ]);
    expect(samplesSeen(events)).toEqual([{ samples: 92, exactlyOnce: false, complete: false }]);
  });

  it('a rank whose batches never arrived makes the epoch not exactly once', () => {
    const events = simulate([{ worldSize: 3, steps: 9, silentRank: 1 }]);
    const [epoch] = samplesSeen(events);
    expect(epoch!.exactlyOnce).toBe(false);
    expect(epoch!.complete).toBe(false);
  });

  it('a run cut short mid-epoch: the first samples of the order, each once, not complete', () => {
    expect(samplesSeen(simulate([{ worldSize: 2, steps: 5 }]))).toEqual([{ samples: 40, exactlyOnce: true, complete: false }]);
  });

  it('two epochs are counted apart', () => {
    // 50 samples per rank: 13 steps an epoch, so 7 steps of 2 x 4 into the second.
    const seen = samplesSeen(simulate([{ worldSize: 2, steps: 20 }]));
    expect(seen).toEqual([
      { samples: 100, exactlyOnce: true, complete: true },
      { samples: 56, exactlyOnce: true, complete: false },
    ]);
  });
});
