import { describe, it, expect } from 'vitest';
import {
  DistributedSampler,
  Mt19937,
  RANDPERM_SMALL_N_LIMIT,
  epochOrder,
  randperm,
  randpermWithGenerator,
  shuffleInsideOut,
  uint64Mod,
  type DistributedSamplerOptions,
} from '../src/datasets/sampler.ts';
import { errorOf } from './fixtures/errors.ts';

function take(gen: Mt19937, count: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < count; i++) out.push(gen.nextUint32());
  return out;
}

function isPermutation(values: ArrayLike<number>, n: number): boolean {
  if (values.length !== n) return false;
  const seen = new Uint8Array(n);
  for (let i = 0; i < n; i++) {
    const v = values[i]!;
    if (!Number.isInteger(v) || v < 0 || v >= n || seen[v]) return false;
    seen[v] = 1;
  }
  return true;
}

/**
 * A literal transcription of torch/utils/data/distributed.py (__init__ + __iter__), list
 * operations and all, used as an oracle for the index arithmetic in src/datasets/sampler.ts.
 */
function torchReference(order: number[], numReplicas: number, rank: number, dropLast: boolean): number[] {
  const len = order.length;
  const numSamples =
    dropLast && len % numReplicas !== 0 ? Math.max(0, Math.ceil((len - numReplicas) / numReplicas)) : Math.ceil(len / numReplicas);
  const totalSize = numSamples * numReplicas;
  let indices = [...order];
  if (!dropLast) {
    const paddingSize = totalSize - indices.length;
    if (paddingSize <= indices.length) {
      indices = indices.concat(indices.slice(0, paddingSize));
    } else {
      const repeated: number[] = [];
      for (let r = 0; r < Math.ceil(paddingSize / indices.length); r++) repeated.push(...indices);
      indices = indices.concat(repeated.slice(0, paddingSize));
    }
  } else {
    indices = indices.slice(0, totalSize);
  }
  expect(indices.length).toBe(totalSize);
  const out: number[] = [];
  for (let i = rank; i < totalSize; i += numReplicas) out.push(indices[i]!);
  expect(out.length).toBe(numSamples);
  return out;
}

function allRanks(datasetLength: number, options: Omit<DistributedSamplerOptions, 'rank'>, epoch = 0): number[][] {
  const out: number[][] = [];
  for (let rank = 0; rank < options.numReplicas; rank++) {
    const s = new DistributedSampler(datasetLength, { ...options, rank });
    s.setEpoch(epoch);
    out.push(s.indices());
  }
  return out;
}

describe('Mt19937', () => {
  it('matches std::mt19937 seeded with 5489', () => {
    // LLVM libc++ test libcxx/test/std/numerics/rand/rand.eng/rand.eng.mers/eval.pass.cpp
    // asserts these first three outputs of a default-constructed std::mt19937 (seed 5489).
    expect(take(new Mt19937(5489), 3)).toEqual([3499211612, 581869302, 3890346734]);
  });

  it('gives 4123659995 as the 10000th output of the default-seeded engine', () => {
    // C++ standard [rand.predef] / cppreference (mersenne_twister_engine constructor page):
    // "the 10000th consecutive invocation of a default-constructed std::mt19937 produces
    // the value 4123659995".
    const gen = new Mt19937();
    let last = 0;
    for (let i = 0; i < 10000; i++) last = gen.nextUint32();
    expect(last).toBe(4123659995);
  });

  it("matches torch's CPU generator after torch.manual_seed(137)", () => {
    // karpathy/llm.c llmc/rand.h ("Mersenne Twisters implementation, numerically identical
    // to torch") prints, under torch.manual_seed(137), torch.randint(0, 0xFFFFFFFF, [1])
    // five times: 4053805790 2173880614 380293709 1237255315 2986595568. randint with a
    // range below 2^32 is one random() % range, so these are the raw 32-bit outputs 0..4.
    // The same reference then draws torch.zeros(8).normal_() (8 values < 16 use 4 pairs of
    // random64 = 16 words) and prints randint again: 2186503452, i.e. output #21; then
    // torch.zeros(16).normal_() (16 words) and randint: 2756748748, output #38.
    const out = take(new Mt19937(137), 39);
    expect(out.slice(0, 5)).toEqual([4053805790, 2173880614, 380293709, 1237255315, 2986595568]);
    expect(out[21]).toBe(2186503452);
    expect(out[38]).toBe(2756748748);
  });

  it("only uses the low 32 bits of the seed, negative seeds as two's complement", () => {
    // at::mt19937_engine::init_with_uint32 stores `seed & 0xffffffff`; torch's Python
    // manual_seed maps negative ints to uint64 by two's complement (unpack_uint64).
    expect(take(new Mt19937(2 ** 32 + 137), 5)).toEqual(take(new Mt19937(137), 5));
    expect(take(new Mt19937(-1), 5)).toEqual(take(new Mt19937(2 ** 32 - 1), 5));
    expect(take(new Mt19937(-(2 ** 40)), 5)).toEqual(take(new Mt19937(0), 5));
  });

  it('re-seeding restarts the stream', () => {
    const gen = new Mt19937(7);
    const first = take(gen, 700); // crosses one twist
    gen.seed(7);
    expect(take(gen, 700)).toEqual(first);
  });

  it('random64 puts the first 32-bit output in the high word', () => {
    const a = new Mt19937(3);
    const b = new Mt19937(3);
    const [w0, w1] = take(b, 2);
    expect(a.nextUint64()).toEqual({ hi: w0, lo: w1 });
  });

  it('rejects non-integer seeds', () => {
    expect(() => new Mt19937(1.5)).toThrow(RangeError);
    expect(() => new Mt19937(Number.NaN)).toThrow(errorOf(RangeError, /Invalid seed NaN/));
  });
});

describe('randperm', () => {
  // Published outputs of torch.randperm(10) on CPU with a fixed seed. Each was found with
  // the search tool in public code; repositories are named where the tool showed them.
  it('seed 0 -> [4, 1, 7, 5, 3, 9, 0, 8, 6, 2]', () => {
    // Independent sources: a script that runs `generator.manual_seed(0)` / torch.manual_seed(0)
    // and prints torch.randperm(10).tolist() with the output in a comment; a MappedMNISTCEL
    // module commenting "seed 0 should give [4, 1, 7, 5, 3, 9, 0, 8, 6, 2]" after
    // torch.manual_seed(0); torch.randperm(10); and a PPJAX test whose
    // TORCH_RANDPERM10_SEED0 is "measured with torch ... on CPU".
    expect(randperm(10, 0)).toEqual([4, 1, 7, 5, 3, 9, 0, 8, 6, 2]);
  });

  it('seed 1, 42, 2^32 + 1 and 2^53 - 1 match published torch outputs', () => {
    // A public pytest, test_shuffle_matches_pytorch_cpu_randperm (for the ImageBatchEdit
    // "shuffle" node of a dinkster_nodes_image package; repository not confirmed), is
    // parametrised with exactly these (seed, torch CPU randperm(10)) pairs. Seed 0 there
    // agrees with the sources above.
    expect(randperm(10, 1)).toEqual([5, 6, 1, 2, 0, 8, 9, 3, 7, 4]);
    expect(randperm(10, 42)).toEqual([2, 6, 1, 8, 4, 5, 0, 9, 3, 7]);
    expect(randperm(10, 2 ** 32 + 1)).toEqual([5, 6, 1, 2, 0, 8, 9, 3, 7, 4]);
    expect(randperm(10, 2 ** 53 - 1)).toEqual([1, 4, 6, 2, 0, 5, 8, 7, 9, 3]);
    // Seed 42 is also the expected list in a ResumableRandomSampler unittest
    // (test_indices_with_seed_42), a torch.Generator-seeded randperm sampler.
  });

  it('advances a shared generator by n - 1 draws, like torch', () => {
    // A stored Jupyter notebook (repository not identified) prints, in its torch.Generator
    // section, tensor([2, 6, 1, 8, 4, 5, 0, 9, 3, 7]) then tensor([3, 5, 8, 9, 4, 6, 1, 0, 7, 2]).
    // Its source cell was not visible; the first matches seed 42 above, and the second is what
    // a second randperm(10) on the same generator gives here. Treat this as corroboration.
    const gen = new Mt19937(42);
    expect(Array.from(randpermWithGenerator(10, gen))).toEqual([2, 6, 1, 8, 4, 5, 0, 9, 3, 7]);
    expect(Array.from(randpermWithGenerator(10, gen))).toEqual([3, 5, 8, 9, 4, 6, 1, 0, 7, 2]);
    // Draw count itself: after randperm(10) the stream is 9 words further on.
    const a = new Mt19937(5);
    randpermWithGenerator(10, a);
    const b = new Mt19937(5);
    take(b, 9);
    expect(a.nextUint32()).toBe(b.nextUint32());
  });

  it('handles n = 0, 1, 2', () => {
    expect(randperm(0, 0)).toEqual([]);
    expect(randperm(1, 0)).toEqual([0]);
    expect(randperm(2, 0).sort()).toEqual([0, 1]);
  });

  it('returns a permutation for many n and seeds', () => {
    for (const n of [3, 5, 16, 17, 100, 623, 624, 625, 1000, 4096]) {
      for (const seed of [0, 1, 2, 12345, -7]) {
        expect(isPermutation(randperm(n, seed), n)).toBe(true);
      }
    }
  });

  it('is deterministic per seed and differs between seeds', () => {
    expect(randperm(1000, 9)).toEqual(randperm(1000, 9));
    expect(randperm(1000, 9)).not.toEqual(randperm(1000, 10));
  });

  it('handles n = 10 million', { timeout: 60_000 }, () => {
    const n = 10_000_000;
    const perm = randpermWithGenerator(n, new Mt19937(0));
    expect(isPermutation(perm, n)).toBe(true);
  });

  it('rejects invalid n', () => {
    expect(() => randperm(-1, 0)).toThrow(RangeError);
    expect(() => randperm(2.5, 0)).toThrow(errorOf(RangeError, /Invalid n 2.5/));
  });

  it("uses torch's small-n/large-n threshold of 4294967295 / 20", () => {
    expect(RANDPERM_SMALL_N_LIMIT).toBe(214748364);
  });

  it('large-n branch (inside-out shuffle with random64) yields a permutation', () => {
    // Not checked against torch output: no published randperm for n >= 214748364 was found,
    // and materialising one here would need ~1 GB. This only checks the algorithm's shape.
    for (const n of [0, 1, 2, 10, 1000]) {
      const r = new Uint32Array(n);
      shuffleInsideOut(r, new Mt19937(1));
      expect(isPermutation(r, n)).toBe(true);
    }
  });

  it('uint64Mod equals BigInt arithmetic', () => {
    const gen = new Mt19937(99);
    const moduli = [1, 2, 3, 10, 65535, 65536, 65537, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32];
    for (let t = 0; t < 2000; t++) {
      const hi = gen.nextUint32();
      const lo = gen.nextUint32();
      const m = t < moduli.length ? moduli[t]! : 1 + (gen.nextUint32() % 2 ** 32);
      const expected = Number(((BigInt(hi) << 32n) | BigInt(lo)) % BigInt(m));
      expect(uint64Mod(hi, lo, m)).toBe(expected);
    }
    expect(uint64Mod(0xffffffff, 0xffffffff, 2 ** 32)).toBe(0xffffffff);
  });
});

describe('epochOrder', () => {
  it('is randperm(len, seed + epoch) when shuffling, identity otherwise', () => {
    expect(epochOrder(10)).toEqual([4, 1, 7, 5, 3, 9, 0, 8, 6, 2]);
    expect(epochOrder(10, { seed: 0, epoch: 1 })).toEqual(randperm(10, 1));
    expect(epochOrder(10, { seed: 40, epoch: 2 })).toEqual([2, 6, 1, 8, 4, 5, 0, 9, 3, 7]);
    expect(epochOrder(5, { shuffle: false, epoch: 3 })).toEqual([0, 1, 2, 3, 4]);
  });
});

describe('DistributedSampler (hand-computed, no shuffle)', () => {
  it('len 10, 3 replicas: pads with the head of the list', () => {
    // num_samples = ceil(10/3) = 4, total_size = 12, indices = [0..9, 0, 1].
    const ranks = allRanks(10, { numReplicas: 3, shuffle: false });
    expect(ranks).toEqual([
      [0, 3, 6, 9],
      [1, 4, 7, 0],
      [2, 5, 8, 1],
    ]);
    const s = new DistributedSampler(10, { numReplicas: 3, rank: 1, shuffle: false });
    expect(s.length).toBe(4);
    expect(s.numSamples).toBe(4);
    expect(s.totalSize).toBe(12);
    expect([...s]).toEqual([1, 4, 7, 0]);
  });

  it('len 10, 3 replicas, dropLast: truncates to 9', () => {
    // 10 % 3 != 0 -> num_samples = ceil((10 - 3) / 3) = 3, total_size = 9.
    expect(allRanks(10, { numReplicas: 3, shuffle: false, dropLast: true })).toEqual([
      [0, 3, 6],
      [1, 4, 7],
      [2, 5, 8],
    ]);
  });

  it('len 9, 3 replicas, dropLast: nothing to drop', () => {
    expect(allRanks(9, { numReplicas: 3, shuffle: false, dropLast: true })).toEqual([
      [0, 3, 6],
      [1, 4, 7],
      [2, 5, 8],
    ]);
  });

  it('len 2, 5 replicas: padding (3) larger than the dataset (2)', () => {
    // num_samples = 1, total_size = 5, padding_size = 3 > 2:
    // indices += ([0, 1] * ceil(3 / 2))[:3] -> [0, 1, 0, 1, 0].
    expect(allRanks(2, { numReplicas: 5, shuffle: false })).toEqual([[0], [1], [0], [1], [0]]);
  });

  it('len 2, 5 replicas, dropLast: every rank gets nothing', () => {
    // ceil((2 - 5) / 5) = ceil(-0.6) = 0 in Python; must be +0 here, not -0.
    const s = new DistributedSampler(2, { numReplicas: 5, rank: 4, shuffle: false, dropLast: true });
    expect(s.length).toBe(0);
    expect(s.totalSize).toBe(0);
    expect(s.indices()).toEqual([]);
  });

  it('empty dataset', () => {
    const s = new DistributedSampler(0, { numReplicas: 3, rank: 2 });
    expect(s.length).toBe(0);
    expect([...s]).toEqual([]);
  });

  it('one replica with shuffle is exactly randperm', () => {
    const s = new DistributedSampler(10, { numReplicas: 1, rank: 0, seed: 42 });
    expect(s.indices()).toEqual([2, 6, 1, 8, 4, 5, 0, 9, 3, 7]);
  });
});

describe('DistributedSampler (shuffled)', () => {
  it('len 10, 3 replicas, seed 0, epoch 0', () => {
    // Global order = published randperm(10, seed 0) = [4, 1, 7, 5, 3, 9, 0, 8, 6, 2],
    // padded with its first two entries [4, 1], then strided by 3.
    expect(allRanks(10, { numReplicas: 3 })).toEqual([
      [4, 5, 0, 2],
      [1, 3, 8, 4],
      [7, 9, 6, 1],
    ]);
  });

  it('setEpoch(1) with seed 0 shards randperm(10, 1)', () => {
    // Published randperm(10, seed 1) = [5, 6, 1, 2, 0, 8, 9, 3, 7, 4], padded with [5, 6].
    expect(allRanks(10, { numReplicas: 3 }, 1)).toEqual([
      [5, 2, 9, 4],
      [6, 0, 3, 5],
      [1, 8, 7, 6],
    ]);
  });

  it('setEpoch changes the order deterministically', () => {
    const s = new DistributedSampler(1000, { numReplicas: 4, rank: 2, seed: 5 });
    const e0 = s.indices();
    s.setEpoch(1);
    const e1 = s.indices();
    expect(e1).not.toEqual(e0);
    s.setEpoch(0);
    expect(s.indices()).toEqual(e0);
    const t = new DistributedSampler(1000, { numReplicas: 4, rank: 2, seed: 5 });
    t.setEpoch(1);
    expect(t.indices()).toEqual(e1);
    // Only seed + epoch matters, as in torch.
    const u = new DistributedSampler(1000, { numReplicas: 4, rank: 2, seed: 6 });
    expect(u.indices()).toEqual(e1);
    expect(s.epoch).toBe(0);
  });

  it('matches a literal transcription of torch __iter__ on many configurations', () => {
    for (const len of [0, 1, 2, 3, 7, 10, 11, 64, 101]) {
      for (const numReplicas of [1, 2, 3, 4, 5, 8, 13, 200]) {
        for (const dropLast of [false, true]) {
          for (const shuffle of [false, true]) {
            for (const epoch of [0, 3]) {
              const order = epochOrder(len, { shuffle, seed: 17, epoch });
              for (let rank = 0; rank < numReplicas; rank++) {
                const s = new DistributedSampler(len, { numReplicas, rank, shuffle, seed: 17, dropLast });
                s.setEpoch(epoch);
                expect(s.indices()).toEqual(torchReference(order, numReplicas, rank, dropLast));
              }
            }
          }
        }
      }
    }
  });
});

describe('DistributedSampler coverage', () => {
  it('without dropLast every index appears once, plus exactly the padding from the head', () => {
    for (const [len, numReplicas] of [
      [10, 3],
      [2, 5],
      [1, 7],
      [100, 8],
      [101, 8],
      [97, 10],
    ] as const) {
      const ranks = allRanks(len, { numReplicas, seed: 3 }, 2);
      const order = epochOrder(len, { seed: 3, epoch: 2 });
      const counts = new Map<number, number>();
      for (const r of ranks) for (const i of r) counts.set(i, (counts.get(i) ?? 0) + 1);
      const total = ranks.reduce((acc, r) => acc + r.length, 0);
      const padding = total - len;
      // Expected count: 1 for every index, plus one per time it is reused as padding.
      const expected = new Map<number, number>();
      for (const i of order) expected.set(i, 1);
      for (let p = 0; p < padding; p++) {
        const i = order[p % len]!;
        expected.set(i, expected.get(i)! + 1);
      }
      expect(counts).toEqual(expected);
      expect(ranks.every((r) => r.length === ranks[0]!.length)).toBe(true);
    }
  });

  it('with dropLast the ranks are disjoint and cover the first totalSize of the order', () => {
    const len = 103;
    const numReplicas = 5;
    const ranks = allRanks(len, { numReplicas, dropLast: true, seed: 11 });
    const flat = ranks.flat();
    expect(new Set(flat).size).toBe(flat.length);
    const order = epochOrder(len, { seed: 11 });
    expect(new Set(flat)).toEqual(new Set(order.slice(0, 100)));
  });
});

describe('DistributedSampler startIndex', () => {
  it('defaults to 0, which is plain torch behaviour', () => {
    const a = new DistributedSampler(10, { numReplicas: 3, rank: 0 });
    const b = new DistributedSampler(10, { numReplicas: 3, rank: 0, startIndex: 0 });
    expect(a.startIndex).toBe(0);
    expect(b.indices()).toEqual(a.indices());
  });

  it('shards only the remainder, padding it from its own head (hand-computed)', () => {
    // Remaining order [4..9] (6 items) over 4 replicas: num_samples 2, total 8,
    // padded with [4, 5].
    expect(allRanks(10, { numReplicas: 4, shuffle: false, startIndex: 4 })).toEqual([
      [4, 8],
      [5, 9],
      [6, 4],
      [7, 5],
    ]);
    // Same remainder with dropLast: 6 % 4 != 0 -> ceil((6 - 4) / 4) = 1, total 4.
    expect(allRanks(10, { numReplicas: 4, shuffle: false, startIndex: 4, dropLast: true })).toEqual([[4], [5], [6], [7]]);
  });

  it('covers exactly the remaining indices of the shuffled order', () => {
    for (const startIndex of [0, 1, 37, 99, 100]) {
      for (const numReplicas of [1, 3, 7]) {
        const len = 100;
        const order = epochOrder(len, { seed: 8, epoch: 4 });
        const remaining = order.slice(startIndex);
        const ranks = allRanks(len, { numReplicas, seed: 8, startIndex }, 4);
        const flat = ranks.flat();
        expect(new Set(flat)).toEqual(new Set(remaining));
        // Without padding the count is exact; padding adds at most numReplicas - 1 items.
        expect(flat.length - remaining.length).toBeGreaterThanOrEqual(0);
        expect(flat.length - remaining.length).toBeLessThan(numReplicas);
        for (let rank = 0; rank < numReplicas; rank++) {
          expect(ranks[rank]).toEqual(torchReference(remaining, numReplicas, rank, false));
        }
      }
    }
  });

  it('re-sharding after a membership change: 4 replicas, then 3 from where they stopped', () => {
    const len = 50;
    const seed = 2;
    const epoch = 1;
    const order = epochOrder(len, { seed, epoch });
    // 4 replicas each consumed 5 samples (a global position of 20 in the order).
    const before = allRanks(len, { numReplicas: 4, seed }, epoch).map((r) => r.slice(0, 5));
    expect(new Set(before.flat())).toEqual(new Set(order.slice(0, 20)));
    // 3 replicas carry on from position 20.
    const after = allRanks(len, { numReplicas: 3, seed, startIndex: 20 }, epoch);
    const seen = new Set([...before.flat(), ...after.flat()]);
    expect(seen.size).toBe(len);
    expect(new Set(after.flat())).toEqual(new Set(order.slice(20)));
  });

  it('persists across setEpoch until changed with setStartIndex', () => {
    const s = new DistributedSampler(10, { numReplicas: 2, rank: 0, shuffle: false, startIndex: 6 });
    expect(s.indices()).toEqual([6, 8]);
    expect(s.length).toBe(2);
    s.setEpoch(1);
    expect(s.indices()).toEqual([6, 8]);
    s.setStartIndex(0);
    expect(s.indices()).toEqual([0, 2, 4, 6, 8]);
    expect(s.length).toBe(5);
    s.setStartIndex(10);
    expect(s.indices()).toEqual([]);
    expect(s.length).toBe(0);
  });
});

describe('DistributedSampler state dict', () => {
  it('is the epoch and the global position, and a sampler of another world size continues from it', () => {
    const len = 103;
    const four = new DistributedSampler(len, { numReplicas: 4, rank: 2, seed: 9 });
    four.loadStateDict({ epoch: 3, position: 40 });
    expect(four.stateDict()).toEqual({ epoch: 3, position: 40 });
    expect(four.epoch).toBe(3);
    // 3 replicas take the rest of epoch 3 from position 40: together, each remaining sample once.
    const order = epochOrder(len, { seed: 9, epoch: 3 });
    const rest: number[] = [];
    for (let rank = 0; rank < 3; rank++) {
      const s = new DistributedSampler(len, { numReplicas: 3, rank, seed: 9 });
      s.loadStateDict(four.stateDict());
      rest.push(...s.indices().slice(0, s.numSamples - s.numPadding));
    }
    expect(rest.sort((a, b) => a - b)).toEqual(order.slice(40).sort((a, b) => a - b));
  });

  it("counts the padding at the end of each rank's list (torch repeats the head of the order)", () => {
    // 10 samples over 4 ranks: 3 each, 2 repeats, on ranks 2 and 3.
    const pads = [0, 1, 2, 3].map((rank) => new DistributedSampler(10, { numReplicas: 4, rank, shuffle: false }).numPadding);
    expect(pads).toEqual([0, 0, 1, 1]);
    expect(new DistributedSampler(10, { numReplicas: 4, rank: 3, shuffle: false }).indices()).toEqual([3, 7, 1]);
    // From position 7: 3 left over 2 ranks: rank 1 gets one repeat.
    const from7 = [0, 1].map((rank) => new DistributedSampler(10, { numReplicas: 2, rank, shuffle: false, startIndex: 7 }));
    expect(from7.map((s) => [s.indices(), s.numPadding])).toEqual([
      [[7, 9], 0],
      [[8, 7], 1],
    ]);
    // Nothing left, an even split, and dropLast: no padding.
    expect(new DistributedSampler(10, { numReplicas: 3, rank: 2, startIndex: 10 }).numPadding).toBe(0);
    expect(new DistributedSampler(12, { numReplicas: 4, rank: 3 }).numPadding).toBe(0);
    expect(new DistributedSampler(10, { numReplicas: 4, rank: 3, dropLast: true }).numPadding).toBe(0);
  });

  it('refuses a state outside the dataset', () => {
    const s = new DistributedSampler(10, { numReplicas: 2, rank: 0 });
    expect(() => s.loadStateDict({ epoch: 0, position: 11 })).toThrow(errorOf(RangeError, /Invalid startIndex 11/));
    expect(() => s.loadStateDict({ epoch: 1.5, position: 0 })).toThrow(errorOf(RangeError, /Invalid epoch 1.5/));
  });
});

describe('argument validation', () => {
  const ok = { numReplicas: 3, rank: 0 };

  it('numReplicas must be a positive integer', () => {
    expect(() => new DistributedSampler(10, { numReplicas: 0, rank: 0 })).toThrow(RangeError);
    expect(() => new DistributedSampler(10, { numReplicas: 0, rank: 0 })).toThrow(
      'Invalid numReplicas 0, numReplicas should be a positive integer',
    );
    expect(() => new DistributedSampler(10, { numReplicas: 2.5, rank: 0 })).toThrow(errorOf(RangeError, /numReplicas 2.5/));
    expect(() => new DistributedSampler(10, { numReplicas: Number.NaN, rank: 0 })).toThrow(errorOf(RangeError, /numReplicas NaN/));
  });

  it('rank must be an integer in [0, numReplicas - 1] (torch wording)', () => {
    expect(() => new DistributedSampler(10, { numReplicas: 3, rank: 3 })).toThrow(RangeError);
    expect(() => new DistributedSampler(10, { numReplicas: 3, rank: 3 })).toThrow(
      'Invalid rank 3, rank should be an integer in the interval [0, 2]',
    );
    expect(() => new DistributedSampler(10, { numReplicas: 3, rank: -1 })).toThrow(errorOf(RangeError, /Invalid rank -1/));
    expect(() => new DistributedSampler(10, { numReplicas: 3, rank: 0.5 })).toThrow(errorOf(RangeError, /Invalid rank 0.5/));
  });

  it('datasetLength must be a non-negative integer', () => {
    expect(() => new DistributedSampler(-1, ok)).toThrow('Invalid datasetLength -1, datasetLength should be a non-negative integer');
    expect(() => new DistributedSampler(2.5, ok)).toThrow(RangeError);
    expect(() => epochOrder(-3)).toThrow(errorOf(RangeError, /Invalid datasetLength -3/));
  });

  it('seed and epoch must be integers', () => {
    expect(() => new DistributedSampler(10, { ...ok, seed: 0.5 })).toThrow(
      errorOf(RangeError, /Invalid seed 0.5, seed should be an integer/),
    );
    const s = new DistributedSampler(10, ok);
    expect(() => s.setEpoch(1.5)).toThrow(errorOf(RangeError, /Invalid epoch 1.5, epoch should be an integer/));
    expect(() => s.setEpoch(Number.POSITIVE_INFINITY)).toThrow(RangeError);
    const big = new DistributedSampler(10, { ...ok, seed: Number.MAX_SAFE_INTEGER });
    big.setEpoch(1);
    expect(() => big.indices()).toThrow(errorOf(RangeError, /seed \+ epoch/));
  });

  it('startIndex must be an integer in [0, datasetLength]', () => {
    expect(() => new DistributedSampler(10, { ...ok, startIndex: 11 })).toThrow(
      'Invalid startIndex 11, startIndex should be an integer in the interval [0, 10] (the dataset length)',
    );
    expect(() => new DistributedSampler(10, { ...ok, startIndex: -1 })).toThrow(RangeError);
    const s = new DistributedSampler(10, ok);
    expect(() => s.setStartIndex(1.5)).toThrow(errorOf(RangeError, /Invalid startIndex 1.5/));
  });
});
