/**
 * The launcher's summary of a pipeline run (launcher/summary_pipeline.ts): 2 stages x 2 replicas, rank =
 * replica * 2 + stage. Each stage is described by its replica 0; `identical` means every stage's
 * replicas agree (the two stages naturally differ); a page's result is checked, not trusted.
 */
import { describe, expect, it } from 'vitest';
import { summarize } from '../launcher/summaries.ts';
import type { RankResult } from '../launcher/summary_fields.ts';
import { pipelineSummary } from '../launcher/summary_pipeline.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';

const STAGE_HASH = ['aaaa0000', 'bbbb1111'];

function pipelinePart(rank: number, over: Record<string, unknown> = {}): Record<string, unknown> {
  const stage = rank % 2;
  const replica = Math.floor(rank / 2);
  return {
    stage,
    stages: 2,
    replica,
    replicas: 2,
    schedule: '1f1b',
    microBatches: 4,
    activationDtype: 'float16',
    layers: stage === 0 ? [0, 1] : [2],
    layerClasses: stage === 0 ? ['Flatten', 'Dense'] : ['Dense'],
    parameters: stage === 0 ? 100_480 : 1_290,
    peakLiveTensors: 40 + rank,
    peakStashedMicroBatches: stage === 0 ? 2 : 1,
    bubble: { measured: stage === 0 ? 0.3 + replica / 10 : 0.2, formula: 0.2 },
    breakdownMs: { compute: 10.123, waitActivations: stage === 1 ? 4 : 0, waitGradients: stage === 0 ? 5 : 0, allreduce: 1.5, apply: 0.25 },
    weightHash: STAGE_HASH[stage],
    ...over,
  };
}

function result(rank: number, over: Record<string, unknown> = {}, pipelineOver: Record<string, unknown> = {}): RankResult {
  const stage = rank % 2;
  return {
    rank,
    worldSize: 4,
    backend: 'webgpu',
    model: 'mlp',
    dataset: 'mnist',
    steps: 20,
    epochs: 1,
    samplesPerSec: 812.345,
    // Only the last stage computes the loss.
    finalLoss: stage === 1 ? 0.42 : null,
    testAccuracy: stage === 1 ? 0.91 : null,
    weightHash: STAGE_HASH[stage],
    breakdownMs: { compute: 10, readback: 0, allreduce: 1.5, apply: 0.25 },
    seconds: 12 + rank,
    pipeline: pipelinePart(rank, pipelineOver),
    ...over,
  };
}

const run = (results: RankResult[], events: ElasticEvent[] = []) => summarize('train', 4, results, events);

describe('a 2 x 2 pipeline run in the summary', () => {
  it('describes each stage from its replica 0, lists its ranks and every replica’s hash, and the bubble as the mean of the stages', () => {
    // Results arrive in any order.
    const s = run([result(3), result(0), result(2), result(1)]);
    expect(s.pipeline).toEqual({
      replicas: 2,
      microBatches: 4,
      schedule: '1f1b',
      activationDtype: 'float16',
      bubble: { measured: 0.25, formula: 0.2 },
      stages: [
        {
          stage: 0,
          ranks: [0, 2],
          layers: [0, 1],
          layerClasses: ['Flatten', 'Dense'],
          parameters: 100_480,
          peakLiveTensors: 40,
          peakStashedMicroBatches: 2,
          bubble: 0.3,
          breakdownMs: { compute: 10.12, waitActivations: 0, waitGradients: 5, allreduce: 1.5, apply: 0.25 },
          weightHashes: ['aaaa0000', 'aaaa0000'],
          replicasIdentical: true,
        },
        {
          stage: 1,
          ranks: [1, 3],
          layers: [2],
          layerClasses: ['Dense'],
          parameters: 1_290,
          peakLiveTensors: 41,
          peakStashedMicroBatches: 1,
          bubble: 0.2,
          breakdownMs: { compute: 10.12, waitActivations: 4, waitGradients: 0, allreduce: 1.5, apply: 0.25 },
          weightHashes: ['bbbb1111', 'bbbb1111'],
          replicasIdentical: true,
        },
      ],
    });
    // The stages differ from each other, as they should: identical still holds.
    expect(s.identical).toBe(true);
    expect(s.weightHashes).toEqual(['aaaa0000', 'bbbb1111', 'aaaa0000', 'bbbb1111']);
    // The loss and accuracy come from the last stage when rank 0 has none.
    expect(s.finalLoss).toBe(0.42);
    expect(s.testAccuracy).toBe(0.91);
    expect(s.worldSize).toBe(4);
  });

  it('a replica of one stage that differs makes the run not identical, and says which stage', () => {
    const s = run([result(0), result(1), result(2), result(3, {}, { weightHash: 'cccc2222' })]);
    const stages = (s.pipeline as { stages: Array<{ replicasIdentical: boolean; weightHashes: unknown[] }> }).stages;
    expect(stages.map((x) => x.replicasIdentical)).toEqual([true, false]);
    expect(stages[1]!.weightHashes).toEqual(['bbbb1111', 'cccc2222']);
    expect(s.identical).toBe(false);
  });

  it("keeps its own verdict over the elastic events' all-hashes-equal one", () => {
    const end = (rank: number): ElasticEvent => ({
      type: 'end',
      round: 'r1',
      rank,
      worldSize: 4,
      steps: 20,
      epoch: 1,
      generations: 1,
      stepsRedone: 0,
      stoppedBy: null,
      weightHash: STAGE_HASH[rank % 2]!,
    });
    const s = run(
      [0, 1, 2, 3].map((r) => result(r)),
      [0, 1, 2, 3].map(end),
    );
    expect(s.generations).toBe(1);
    expect(s.identical).toBe(true);
  });

  it('a missing replica leaves its hash null and its stage not identical', () => {
    const s = run([result(0), result(1), result(3)]);
    const stages = (s.pipeline as { stages: Array<{ ranks: number[]; weightHashes: unknown[]; replicasIdentical: boolean }> }).stages;
    expect(stages[0]).toMatchObject({ ranks: [0], weightHashes: ['aaaa0000', null], replicasIdentical: false });
    expect(stages[1]).toMatchObject({ ranks: [1, 3], replicasIdentical: true });
    expect(s.identical).toBe(false);
  });

  it('checks every field: wrong types become null, a bad place or shape leaves the rank out, and nothing throws', () => {
    const bad = [
      result(
        0,
        {},
        {
          parameters: '100',
          peakLiveTensors: -1,
          bubble: { measured: 'x', formula: 7 },
          breakdownMs: { compute: Number.NaN, apply: '1', allreduce: Infinity },
          layers: [0, 'one'],
          layerClasses: [{}],
          schedule: 'zigzag',
          activationDtype: 'int8',
          weightHash: 42,
        },
      ),
      result(1, {}, { stage: 5 }),
      result(2, {}, { stages: 3, replicas: 1, stage: 0, replica: 0 }),
      result(3, { pipeline: 'no' }),
    ];
    const p = pipelineSummary(bad)!;
    // Rank 0's shape (2 x 2) is the one kept; ranks 1, 2 and 3 say nothing usable.
    expect(p.summary.replicas).toBe(2);
    expect(p.summary.schedule).toBeNull();
    expect(p.summary.activationDtype).toBeNull();
    // No formula reported: computed from S and M, (2-1)/(4+2-1).
    expect(p.summary.bubble).toEqual({ measured: null, formula: 0.2 });
    expect(p.summary.stages[0]).toEqual({
      stage: 0,
      ranks: [0],
      layers: [],
      layerClasses: [],
      parameters: null,
      peakLiveTensors: null,
      peakStashedMicroBatches: 2,
      bubble: null,
      breakdownMs: { compute: null, waitActivations: null, waitGradients: null, allreduce: null, apply: null },
      weightHashes: [null, null],
      replicasIdentical: false,
    });
    expect(p.summary.stages[1]!.ranks).toEqual([]);
    expect(p.identical).toBe(false);
  });

  it('two ranks claiming the same place count for neither', () => {
    const s = run([result(0), result(1), result(2, {}, { stage: 1, replica: 0 }), result(3)]);
    const stages = (s.pipeline as { stages: Array<{ ranks: number[] }> }).stages;
    expect(stages.map((x) => x.ranks)).toEqual([[0], [3]]);
    expect(s.identical).toBe(false);
  });

  it('a plain data-parallel run has no pipeline part and compares every rank’s hash as before', () => {
    const plain = [0, 1].map((rank) => ({
      rank,
      worldSize: 2,
      backend: 'webgpu',
      steps: 5,
      weightHash: 'dddd',
      breakdownMs: { compute: 1 },
      seconds: 3,
      finalLoss: 0.5,
    }));
    const s = summarize('train', 2, plain);
    expect(s.pipeline).toBeUndefined();
    expect(s.identical).toBe(true);
    expect(s.finalLoss).toBe(0.5);
    expect(summarize('train', 2, [plain[0]!, { ...plain[1]!, weightHash: 'eeee' }]).identical).toBe(false);
  });
});
