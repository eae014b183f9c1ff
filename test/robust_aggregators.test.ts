/**
 * Robust aggregation's math (src/parallel/robust/aggregators.ts) against PyTorch (Debian's
 * python3-torch, test/fixtures/robust_reference.py computes the same cases): the coordinate-wise
 * trimmed mean (torch.sort along dim 0, the middle's mean), the median (torch.median's lower
 * middle value for an even count) and centered clipping; then what makes them fit for replicas:
 * the same bits whatever order the ranks' blocks come in, a non-finite block refused and named,
 * and each rank's judgment. The attacks (robust/attacks.ts) are checked here too.
 */
import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { aggregate, checkAggregationSpec, NoContributionError, type AggregationSpec } from '../src/parallel/robust/aggregators.ts';
import { applyAttack, isAttacker } from '../src/parallel/robust/attacks.ts';
import { Mulberry32 } from '../src/datasets/synthetic.ts';
import { torchTestsBlocked } from './fixtures/torch.ts';
import { errorOf } from './fixtures/errors.ts';

/** k blocks of n values, with some exact ties (equal values in several blocks) and a few -0/+0. */
function blocksOf(k: number, n: number, seed: number): Float32Array[] {
  const rng = new Mulberry32(seed);
  const blocks = Array.from({ length: k }, () => Float32Array.from({ length: n }, () => Math.fround((rng.nextFloat() - 0.5) * 4)));
  for (let i = 0; i < n; i += 7) blocks[k - 1]![i] = blocks[0]![i]!;
  if (k >= 3) {
    for (let i = 3; i < n; i += 11) {
      blocks[1]![i] = -0;
      blocks[2]![i] = 0;
    }
  }
  return blocks;
}

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

interface TorchCase {
  spec: AggregationSpec;
  blocks: Float32Array[];
  center: Float32Array | null;
}

const CASES: TorchCase[] = [
  { spec: { kind: 'trimmed-mean', trim: 1 }, blocks: blocksOf(5, 300, 1), center: null },
  { spec: { kind: 'trimmed-mean', trim: 2 }, blocks: blocksOf(7, 300, 2), center: null },
  { spec: { kind: 'trimmed-mean', trim: 1 }, blocks: blocksOf(4, 300, 3), center: null },
  { spec: { kind: 'median' }, blocks: blocksOf(4, 300, 4), center: null },
  { spec: { kind: 'median' }, blocks: blocksOf(5, 300, 5), center: null },
  { spec: { kind: 'centered-clip', tau: 0.5, iterations: 3 }, blocks: blocksOf(5, 300, 6), center: null },
  { spec: { kind: 'centered-clip', tau: 2, iterations: 1 }, blocks: blocksOf(4, 300, 7), center: blocksOf(1, 300, 8)[0]! },
  { spec: { kind: 'centered-clip', tau: 'auto', iterations: 5 }, blocks: blocksOf(6, 300, 9), center: null },
];

const blocked = torchTestsBlocked();

describe.skipIf(blocked !== undefined)(`robust aggregation against PyTorch${blocked ? ` (skipped: ${blocked})` : ''}`, () => {
  it('trimmed mean, median (lower middle for even counts) and centered clipping compute what torch computes', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'robust-ref-'));
    try {
      const cases = CASES.map(({ spec, blocks, center }) => ({
        kind: spec.kind,
        blocks: blocks.map((b) => Array.from(b)),
        trim: spec.kind === 'trimmed-mean' ? spec.trim : 0,
        tau: spec.kind === 'centered-clip' ? spec.tau : 0,
        iterations: spec.kind === 'centered-clip' ? spec.iterations : 0,
        center: center ? Array.from(center) : null,
      }));
      await writeFile(join(dir, 'in.json'), JSON.stringify({ cases }));
      execFileSync(
        '/usr/bin/python3',
        [join(import.meta.dirname, 'fixtures', 'robust_reference.py'), join(dir, 'in.json'), join(dir, 'out.json')],
        { stdio: 'pipe', timeout: 120_000 },
      );
      const { results } = JSON.parse(await readFile(join(dir, 'out.json'), 'utf8')) as { results: number[][] };
      CASES.forEach(({ spec, blocks, center }, c) => {
        const ours = aggregate(spec, blocks, center).values;
        const theirs = results[c]!;
        expect(ours.length).toBe(theirs.length);
        let worst = 0;
        for (let i = 0; i < ours.length; i++)
          worst = Math.max(worst, Math.abs(ours[i]! - theirs[i]!) / Math.max(1e-6, Math.abs(theirs[i]!)));
        // float64 sums rounded once to float32 on both sides: at most a last-bit difference.
        expect(worst, `case ${c} (${spec.kind})`).toBeLessThan(1e-6);
        // The median is a selection: torch's picks the very same float32 values (-0 or +0 where both are in the middle).
        if (spec.kind === 'median') expect(theirs.every((v, i) => v === ours[i])).toBe(true);
      });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('robust aggregation', () => {
  it('trimmed mean and median give the same bits whatever order the ranks come in (ties, -0 and +0 included)', () => {
    const blocks = blocksOf(6, 500, 11);
    const shuffled = [blocks[3]!, blocks[0]!, blocks[5]!, blocks[1]!, blocks[4]!, blocks[2]!];
    for (const spec of [{ kind: 'trimmed-mean', trim: 2 }, { kind: 'median' }] as const) {
      expect(bits(aggregate(spec, shuffled).values)).toBe(bits(aggregate(spec, blocks).values));
    }
    // -0 and +0 in the middle: the median picks -0 whichever rank sent it.
    const zeros = [Float32Array.of(0), Float32Array.of(-0), Float32Array.of(1), Float32Array.of(-1)];
    const picked = [zeros, [zeros[1]!, zeros[0]!, zeros[3]!, zeros[2]!]].map((z) => bits(aggregate({ kind: 'median' }, z).values));
    expect(picked).toEqual([bits(Float32Array.of(-0)), bits(Float32Array.of(-0))]);
    // Centered clipping sums in rank order: the same inputs in the same order, the same bits.
    const cc = { kind: 'centered-clip', tau: 0.3, iterations: 4 } as const;
    expect(bits(aggregate(cc, blocks).values)).toBe(
      bits(
        aggregate(
          cc,
          blocks.map((b) => b.slice()),
        ).values,
      ),
    );
  });

  it('refuses a block holding a NaN or an infinity, names it and the index, and aggregates the rest', () => {
    const blocks: Array<Float32Array | null> = blocksOf(4, 50, 12);
    const bad = blocks[2]!.slice();
    bad[17] = NaN;
    const inf = blocks[3]!.slice();
    inf[4] = -Infinity;
    const withBad = [blocks[0]!, blocks[1]!, bad, inf, null];
    for (const spec of [
      { kind: 'trimmed-mean', trim: 1 },
      { kind: 'median' },
      { kind: 'centered-clip', tau: 1 },
      { kind: 'mean' },
    ] as const) {
      const r = aggregate(spec, withBad);
      expect(r.used).toBe(2);
      expect(r.judgments.map((j) => j.status)).toEqual(['used', 'used', 'refused', 'refused', 'absent']);
      expect(r.judgments[2]).toMatchObject({ nonfiniteIndex: 17, norm: null, distance: null });
      expect(r.judgments[2]!.reason).toMatch(/non-finite value NaN at index 17/);
      expect(r.judgments[3]!.reason).toMatch(/-Infinity at index 4/);
      expect(r.values.every(Number.isFinite)).toBe(true);
      // Exactly what the two good blocks alone give.
      expect(bits(r.values)).toBe(bits(aggregate(spec, [blocks[0]!, blocks[1]!], null).values));
    }
    expect(() => aggregate({ kind: 'median' }, [bad, null])).toThrow(NoContributionError);
    expect(() => aggregate({ kind: 'median' }, [bad, null])).toThrow(
      errorOf(NoContributionError, /rank 0 refused \(non-finite value NaN at index 17\), rank 1 absent/),
    );
  });

  it('judges each rank: a scaled contribution is far, trimmed everywhere and clipped hard; honest ones are not', () => {
    const honest = blocksOf(4, 400, 13);
    const hostile = honest[3]!.map((v) => v * 1000);
    const blocks = [honest[0]!, honest[1]!, honest[2]!, hostile];
    const tm = aggregate({ kind: 'trimmed-mean', trim: 1 }, blocks);
    expect(tm.trim).toBe(1);
    // The hostile block is the largest or smallest almost everywhere.
    expect(tm.judgments[3]!.trimmed).toBeGreaterThan(0.95);
    for (const j of tm.judgments.slice(0, 3)) expect(j.trimmed).toBeLessThan(0.6);
    expect(tm.judgments[3]!.distance!).toBeGreaterThan(100 * tm.judgments[0]!.distance!);
    expect(tm.judgments[3]!.norm!).toBeCloseTo(1000 * Math.hypot(...honest[3]!), -1);
    const cc = aggregate({ kind: 'centered-clip', tau: 'auto', iterations: 3 }, blocks);
    expect(cc.judgments[3]!.clipScale).toBeLessThan(0.01);
    expect(cc.tau).toBeGreaterThan(0);
    const med = aggregate({ kind: 'median' }, blocks);
    expect(med.judgments[3]!.trimmed).toBeGreaterThan(0.95);
    // Each coordinate of the median is one of the honest values.
    for (let i = 0; i < 400; i++) expect([honest[0]![i], honest[1]![i], honest[2]![i]]).toContain(med.values[i]);
  });

  it('trims less when too few ranks are left (at least one value per coordinate), and one rank is its own aggregate', () => {
    const blocks = blocksOf(3, 20, 14);
    const r = aggregate({ kind: 'trimmed-mean', trim: 2 }, blocks);
    expect(r.trim).toBe(1);
    // The middle value: the median's (a trimmed sum of a lone -0 is +0, the only difference).
    const median = aggregate({ kind: 'median' }, blocks).values;
    expect(Array.from(r.values).every((v, i) => v === median[i])).toBe(true);
    const one = aggregate({ kind: 'trimmed-mean', trim: 1 }, [blocks[0]!]);
    expect(bits(one.values)).toBe(bits(blocks[0]!));
  });

  it('centered clipping starts from the center it is given: contributions within tau of it average plainly', () => {
    const blocks = blocksOf(3, 10, 15);
    const mean = aggregate({ kind: 'mean' }, blocks).values;
    const r = aggregate({ kind: 'centered-clip', tau: 1e6, iterations: 1 }, blocks, new Float32Array(10));
    for (let i = 0; i < 10; i++) expect(r.values[i]).toBeCloseTo(mean[i]!, 6);
    expect(r.judgments.every((j) => j.clipScale === 1)).toBe(true);
  });

  it('refuses specs no run can use', () => {
    expect(() => checkAggregationSpec({ kind: 'trimmed-mean', trim: -1 })).toThrow(errorOf(RangeError, /trim must be an integer >= 0/));
    expect(() => checkAggregationSpec({ kind: 'centered-clip', tau: 0 })).toThrow(
      errorOf(RangeError, /tau must be a positive finite number or 'auto'/),
    );
    expect(() => checkAggregationSpec({ kind: 'centered-clip', tau: 1, iterations: 0 })).toThrow(
      errorOf(RangeError, /iterations must be an integer from 1/),
    );
    expect(() => checkAggregationSpec({ kind: 'krum' } as unknown as AggregationSpec)).toThrow(
      errorOf(RangeError, /unknown aggregation "krum"/),
    );
  });
});

describe('attacks (for measuring defences)', () => {
  it('scale x1000, flip x-4, noise of the given std, alie a consistent shift of -z x RMS; the last K ranks play them', () => {
    const g = Float32Array.from([1, -2, 3, -4]);
    const play = (spec: Parameters<typeof applyAttack>[0]) => {
      const v = g.slice();
      applyAttack(spec, v, { rank: 3, step: 5 });
      return Array.from(v);
    };
    expect(play({ kind: 'scale' })).toEqual([1000, -2000, 3000, -4000]);
    expect(play({ kind: 'flip' })).toEqual([-4, 8, -12, 16]);
    expect(play({ kind: 'flip', factor: -1 })).toEqual([-1, 2, -3, 4]);
    const rms = Math.sqrt((1 + 4 + 9 + 16) / 4);
    play({ kind: 'alie' }).forEach((v, i) => {
      expect(v).toBeCloseTo(g[i]! - rms, 5);
    });
    // Noise: seeded (the same draw for the same rank and step), with about the std asked for.
    const big = new Float32Array(20_000);
    applyAttack({ kind: 'noise', std: 3 }, big, { rank: 1, step: 2 });
    const again = new Float32Array(20_000);
    applyAttack({ kind: 'noise', std: 3 }, again, { rank: 1, step: 2 });
    expect(bits(big)).toBe(bits(again));
    const std = Math.sqrt(big.reduce((s, v) => s + v * v, 0) / big.length);
    expect(std).toBeGreaterThan(2.9);
    expect(std).toBeLessThan(3.1);
    expect([0, 1, 2, 3].map((r) => isAttacker({ kind: 'scale', attackers: 1 }, r, 4))).toEqual([false, false, false, true]);
    // Never every rank: at least one stays honest.
    expect([0, 1].map((r) => isAttacker({ kind: 'scale', attackers: 5 }, r, 2))).toEqual([false, true]);
  });
});
