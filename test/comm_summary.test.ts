/**
 * The launcher's summary of a DDP run's communication (--comm-hook): the ranks' `commHook`,
 * `bytesPerStep` and `compressionRatio` gathered into the summary (launcher/summary_comm.ts, through summarize), and
 * the one line printed before it. Fake ranks' results, as the pages report them.
 */
import { describe, expect, it } from 'vitest';
import { summarize } from '../launcher/summaries.ts';
import { commLine, commSummary } from '../launcher/summary_comm.ts';
import type { RankResult } from '../launcher/summary_fields.ts';

function rank(r: number, over: Record<string, unknown> = {}): RankResult {
  return {
    rank: r,
    worldSize: 2,
    backend: 'webgpu',
    model: 'mlp',
    dataset: 'mnist',
    steps: 40,
    epochs: 1,
    samplesPerSec: 500,
    finalLoss: 0.4,
    testAccuracy: 0.9,
    weightHash: 'same',
    breakdownMs: { compute: 10, readback: 2, allreduce: 5, apply: 1 },
    seconds: 20,
    commHook: {
      name: 'powersgd',
      registered: 'powerSGD',
      rank: 2,
      startIter: 10,
      statsStep: 40,
      elementsSent: 3_050,
      elementsDense: 101_770,
    },
    bytesPerStep: 100_000 + r * 1_000,
    denseBytesPerStep: 400_000 + r * 4_000,
    compressionRatio: 0.25,
    ...over,
  };
}

describe('a DDP run’s communication in the summary', () => {
  it('carries rank 0’s hook, the mean bytes per step over the ranks, and their ratio to the float32 all-reduce’s', () => {
    const s = summarize('train', 2, [rank(1), rank(0)]);
    expect(s).toMatchObject({
      commHook: {
        name: 'powersgd',
        registered: 'powerSGD',
        rank: 2,
        startIter: 10,
        statsStep: 40,
        elementsSent: 3_050,
        elementsDense: 101_770,
      },
      bytesPerStep: 100_500,
      compressionRatio: 0.25,
    });
    // The ratio is the ranks' bytes summed over their baselines summed (not the mean of their ratios).
    expect(
      commSummary([rank(0, { bytesPerStep: 100, denseBytesPerStep: 400 }), rank(1, { bytesPerStep: 300, denseBytesPerStep: 400 })])
        .compressionRatio,
    ).toBe(0.5);
    // Without the baselines, the ranks' own ratios are averaged.
    expect(
      commSummary([
        rank(0, { denseBytesPerStep: undefined, compressionRatio: 0.2 }),
        rank(1, { denseBytesPerStep: undefined, compressionRatio: 0.3 }),
      ]).compressionRatio,
    ).toBe(0.25);
    expect(
      commSummary([
        rank(0, {
          commHook: { name: 'localsgd', registered: 'postLocalSGD', period: 4, startStep: 10, averagings: 7, averageBytes: 407_152 },
        }),
      ]).commHook,
    ).toEqual({
      name: 'localsgd',
      registered: 'postLocalSGD',
      period: 4,
      startStep: 10,
      averagings: 7,
      averageBytes: 407_152,
    });
  });

  it('says the model: its hidden width when the job was given one, and its parameters', () => {
    expect(summarize('train', 2, [rank(0, { model: 'cnn', hiddenUnits: 2048, parameters: 842_986 }), rank(1)])).toMatchObject({
      model: 'cnn',
      hiddenUnits: 2048,
      parameters: 842_986,
    });
    const plain = summarize('train', 2, [rank(0), rank(1)]);
    expect(plain).not.toHaveProperty('hiddenUnits');
    expect(plain).not.toHaveProperty('parameters');
  });

  it('prints one line: the hook and its settings, bytes per step, the ratio', () => {
    expect(commLine(summarize('train', 2, [rank(0), rank(1)]))).toBe(
      "communication: powersgd rank 2, plain all-reduce for the first 10 steps; step 40 sent 3050 of 101770 elements [hook powerSGD]; 100500 bytes sent per step per rank (mean over ranks), 0.25 of the float32 all-reduce's bytes",
    );
    const none = (r: number) =>
      rank(r, {
        commHook: { name: 'none', registered: 'allreduce' },
        bytesPerStep: 407_152,
        denseBytesPerStep: 407_152,
        compressionRatio: 1,
      });
    expect(commLine(summarize('train', 2, [none(0), none(1)]))).toBe(
      "communication: none (float32 ring all-reduce) [hook allreduce]; 407152 bytes sent per step per rank (mean over ranks), 1 of the float32 all-reduce's bytes",
    );
    // Robust aggregation: the line says what replaced the ring.
    expect(commLine({ ...summarize('train', 2, [none(0), none(1)]), aggregation: { kind: 'trimmed-mean' } })).toMatch(
      /^communication: trimmed-mean \(robust aggregation over a direct all-gather of each rank's own gradient\) \[hook allreduce\]/,
    );
    const fp16 = summarize('train', 1, [
      rank(0, {
        commHook: { name: 'fp16', registered: 'fp16_compress' },
        bytesPerStep: null,
        denseBytesPerStep: null,
        compressionRatio: null,
      }),
    ]);
    expect(fp16).toMatchObject({ commHook: { name: 'fp16' }, bytesPerStep: null, compressionRatio: null });
    expect(commLine(fp16)).toBe(
      "communication: fp16 (float16 values on the wire) [hook fp16_compress]; n/a sent per step per rank (mean over ranks), n/a of the float32 all-reduce's bytes",
    );
    // PowerSGD under the 16-bit wrapper says its wire; a wire that is not one of the three words is not believed.
    const wired = (wire: unknown) =>
      summarize(
        'train',
        2,
        [0, 1].map((r) => rank(r, { commHook: { name: 'powersgd', registered: 'powerSGD', rank: 2, startIter: 0, wire } })),
      );
    expect(wired('float16').commHook).toMatchObject({ wire: 'float16' });
    expect(commLine(wired('float16'))).toMatch(
      /^communication: powersgd rank 2, float16 on the wire, plain all-reduce for the first 0 steps/,
    );
    expect(wired('<b>float8</b>').commHook).not.toHaveProperty('wire');
    expect(commLine(wired('float32'))).toMatch(/^communication: powersgd rank 2, plain all-reduce/);
    const local = summarize(
      'train',
      2,
      [0, 1].map((r) => rank(r, { commHook: { name: 'localsgd', period: 4, startStep: 10, averagings: 7 }, compressionRatio: 0.3 })),
    );
    expect(commLine(local)).toMatch(
      /^communication: localsgd, models averaged every 4 steps after 10 averaged ones \(7 averagings timed\); 100500 bytes/,
    );
  });

  it('is absent from runs whose ranks report none (pipelines, parameter servers), and a malformed part is not believed', () => {
    const plain = (r: number) => ({ rank: r, worldSize: 2, steps: 10, breakdownMs: { compute: 1 }, seconds: 3, weightHash: 'a' });
    const s = summarize('train', 2, [plain(0), plain(1)]);
    expect(s).not.toHaveProperty('commHook');
    expect(s).not.toHaveProperty('bytesPerStep');
    expect(commLine(s)).toBeNull();
    // An unknown hook name, fields that are not counts, a registered name that is not a name: left out.
    const odd = commSummary([
      rank(0, { commHook: { name: 'zip' } }),
      rank(1, { commHook: { name: 'powersgd', registered: '<script>', rank: -1, startIter: 'ten', elementsSent: 5 } }),
    ]);
    expect(odd.commHook).toEqual({ name: 'powersgd', elementsSent: 5 });
    expect(commSummary([rank(0, { commHook: 'fp16', bytesPerStep: 'many', denseBytesPerStep: 0, compressionRatio: NaN })])).toEqual({});
    // Bytes without a hook still say what was sent.
    expect(commSummary([rank(0, { commHook: undefined })])).toEqual({ bytesPerStep: 100_000, compressionRatio: 0.25 });
  });
});
