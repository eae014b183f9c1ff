/** The ring schedule: which segment each rank sends and receives at each step. */
import { describe, expect, it } from 'vitest';
import { allGatherStep, leftOf, reduceScatterStep, rightOf, ringSchedule, segments } from '../src/c10d/ring.ts';

describe('segments', () => {
  it('cuts any length into parts differing by at most one, covering it exactly', () => {
    for (const parts of [1, 2, 3, 4, 7]) {
      for (const length of [0, 1, 2, 5, 7, 8, 1000003]) {
        const segs = segments(length, parts);
        expect(segs).toHaveLength(parts);
        expect(segs[0].start).toBe(0);
        expect(segs[parts - 1].end).toBe(length);
        for (let i = 1; i < parts; i++) expect(segs[i].start).toBe(segs[i - 1].end);
        const sizes = segs.map((s) => s.end - s.start);
        expect(Math.max(...sizes) - Math.min(...sizes)).toBeLessThanOrEqual(1);
      }
    }
  });
  it('gives the first length % parts segments the extra element', () => {
    expect(segments(7, 3)).toEqual([
      { start: 0, end: 3 },
      { start: 3, end: 5 },
      { start: 5, end: 7 },
    ]);
  });
});

describe('ring schedule', () => {
  it('for 4 ranks, rank 0 sends 3,2,1 and receives 2,1,0 in the reduce-scatter', () => {
    expect(ringSchedule(0, 4).reduceScatter).toEqual([
      { send: 3, recv: 2 },
      { send: 2, recv: 1 },
      { send: 1, recv: 0 },
    ]);
    expect(ringSchedule(0, 4).allGather).toEqual([
      { send: 0, recv: 3 },
      { send: 3, recv: 2 },
      { send: 2, recv: 1 },
    ]);
  });

  for (const n of [2, 3, 4, 5, 8]) {
    it(`n=${n}: what a rank receives at each step is what its left neighbour sends`, () => {
      for (let r = 0; r < n; r++) {
        for (let s = 0; s < n - 1; s++) {
          expect(reduceScatterStep(r, n, s).recv).toBe(reduceScatterStep(leftOf(r, n), n, s).send);
          expect(allGatherStep(r, n, s).recv).toBe(allGatherStep(leftOf(r, n), n, s).send);
        }
      }
    });

    it(`n=${n}: simulated on sets of contributions, rank r ends owning segment r with all n, then everyone has everything`, () => {
      // state[r][seg] = set of ranks whose contribution rank r holds for that segment
      const state = Array.from({ length: n }, (_, r) => Array.from({ length: n }, () => new Set([r])));
      for (let s = 0; s < n - 1; s++) {
        const sent = Array.from({ length: n }, (_, r) => new Set(state[r][reduceScatterStep(r, n, s).send]));
        for (let r = 0; r < n; r++) {
          const { recv } = reduceScatterStep(r, n, s);
          for (const c of sent[leftOf(r, n)]) state[r][recv].add(c);
        }
      }
      for (let r = 0; r < n; r++) expect(state[r][r].size).toBe(n);
      const full = Array.from({ length: n }, (_, r) => Array.from({ length: n }, (_, seg) => (seg === r ? n : 0)));
      for (let s = 0; s < n - 1; s++) {
        const sent = Array.from({ length: n }, (_, r) => full[r][allGatherStep(r, n, s).send]);
        for (let r = 0; r < n; r++) {
          const { recv } = allGatherStep(r, n, s);
          expect(full[r][recv]).toBe(0); // nothing is received twice
          full[r][recv] = sent[leftOf(r, n)];
        }
      }
      for (let r = 0; r < n; r++) expect(full[r]).toEqual(Array(n).fill(n));
    });
  }

  it('neighbours wrap around', () => {
    expect(rightOf(3, 4)).toBe(0);
    expect(leftOf(0, 4)).toBe(3);
    expect(ringSchedule(0, 1)).toEqual({ reduceScatter: [], allGather: [] });
  });
});
