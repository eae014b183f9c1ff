/**
 * The parameter-server run's pure parts: server 0's lease book (every sample of every epoch
 * handed out once, whatever the workers' order, and accounted for: applied, stale, refused or
 * lost) and the roles of a round (places given to new tabs, a server back to its own place).
 */
import { describe, expect, it } from 'vitest';
import { LeaseBook, leaseIndices, type Lease, type PushOutcome } from '../src/parallel/parameter_server/leases.ts';
import { assignPlaces, decodeClaims, encodeClaim, rolesOf } from '../src/parallel/parameter_server/roles.ts';
import { errorOf } from './fixtures/errors.ts';

/** A small deterministic generator (mulberry32). */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe('LeaseBook (asynchronous)', () => {
  it('hands out every sample of every epoch exactly once and accounts for each, over random interleavings of pushes, lost replies and lost workers', () => {
    let cases = 0;
    for (const datasetLength of [1, 7, 64, 100]) {
      for (const batchSize of [1, 3, 16]) {
        for (const epochs of [1, 3]) {
          for (const seed of [1, 2, 3]) {
            cases++;
            const o = { datasetLength, batchSize, epochs, shuffle: true, seed: 11 };
            const book = new LeaseBook({ strategy: 'async', ...o });
            const random = rng(seed * 1000 + datasetLength * 7 + batchSize);
            const seen = new Map<string, number>();
            const held = new Map<number, Lease>();
            let nextWorker = 3;
            let workers = [0, 1, 2];
            for (let guard = 0; guard < 100_000; guard++) {
              const w = workers[Math.floor(random() * workers.length)]!;
              const r = random();
              if (held.has(w) && r < 0.6) {
                const outcome: PushOutcome = r < 0.45 ? 'applied' : r < 0.52 ? 'stale' : r < 0.56 ? 'refused' : 'duplicate';
                book.pushed(w, outcome, 0);
                if (outcome !== 'duplicate') held.delete(w);
                continue;
              }
              if (held.has(w) && r < 0.65) {
                // The worker left holding its lease; a new tab (a new member id) joins.
                workers = [...workers.filter((x) => x !== w), nextWorker++];
                held.delete(w);
                const lost = book.roundChanged(new Set(workers));
                expect(lost.map((l) => l.workerId)).toEqual([w]);
                continue;
              }
              const lease = book.lease(w, 0, workers.length, 0);
              if (lease === null) {
                if (held.size === 0 && workers.every((x) => book.lease(x, 0, workers.length, 0) === null)) break;
                continue;
              }
              if (held.has(w)) {
                // Asked again before pushing: the reply was lost, the same lease comes back.
                expect(lease).toEqual(held.get(w));
                continue;
              }
              held.set(w, lease);
              for (const i of leaseIndices(lease, o)) {
                const key = `${lease.epoch}:${i}`;
                seen.set(key, (seen.get(key) ?? 0) + 1);
              }
            }
            const s = book.samples;
            expect(s.leased).toBe(epochs * datasetLength);
            expect(s.applied + s.stale + s.refused + s.lost).toBe(s.leased);
            expect(book.exhausted(0)).toBe(true);
            expect(seen.size).toBe(epochs * datasetLength);
            expect([...seen.values()].every((n) => n === 1)).toBe(true);
          }
        }
      }
    }
    expect(cases).toBe(72);
  });

  it('a step limit is the target; a lease never passes the target or the epoch', () => {
    const book = new LeaseBook({ strategy: 'async', datasetLength: 10, batchSize: 4, steps: 2 });
    expect(book.samples.target).toBe(8);
    expect(book.lease(0, 0, 1, 0)).toEqual({ epoch: 0, position: 0, replicas: 1, rank: 0, count: 4 });
    book.pushed(0, 'applied', 0);
    expect(book.lease(0, 0, 1, 0)).toMatchObject({ position: 4, count: 4 });
    // Every sample is handed out, but worker 0 has not pushed its lease: it is still its to train
    // (its reply may have been lost with a round), not the run's end for it.
    expect(book.exhausted(0)).toBe(true);
    expect(book.exhausted(0, 0)).toBe(false);
    expect(book.exhausted(0, 1)).toBe(true);
    book.pushed(0, 'applied', 0);
    expect(book.exhausted(0, 0)).toBe(true);
    expect(book.lease(0, 0, 1, 0)).toBeNull();
    const epochEnd = new LeaseBook({ strategy: 'async', datasetLength: 10, batchSize: 4, epochs: 2 });
    const counts = Array.from({ length: 6 }, () => {
      const l = epochEnd.lease(0, 0, 1, 0)!;
      epochEnd.pushed(0, 'applied', 0);
      return [l.epoch, l.count];
    });
    expect(counts).toEqual([
      [0, 4],
      [0, 4],
      [0, 2],
      [1, 4],
      [1, 4],
      [1, 2],
    ]);
  });

  it('a snapshot taken back is checked: damaged fields read as 0, a position past the dataset as its end', () => {
    const book = new LeaseBook({ strategy: 'async', datasetLength: 10, batchSize: 4, epochs: 2 });
    book.load({ leased: -5, applied: 1.5, stale: Number.NaN, refused: 2 ** 60, lost: 3, epoch: 1, position: 1e9 } as never);
    expect(book.snapshot()).toEqual({ target: 20, leased: 0, applied: 0, stale: 0, refused: 0, lost: 3, epoch: 1, position: 10 });
  });

  it('a worker refuses a lease it cannot read, naming it', () => {
    const o = { datasetLength: 10, batchSize: 4 };
    for (const bad of [{ replicas: 0 }, { rank: 2, replicas: 2 }, { position: 11 }, { count: 0 }, { count: 5 }]) {
      expect(() => leaseIndices({ epoch: 0, position: 0, replicas: 1, rank: 0, count: 4, ...bad }, o)).toThrow(
        errorOf(RangeError, /cannot read/),
      );
    }
  });
});

describe('LeaseBook (CentralStorage)', () => {
  it('hands worker i of W the DistributedSampler shard i of each step; every sample of the epoch once; an abandoned step is handed out again', () => {
    const o = { datasetLength: 40, batchSize: 4, epochs: 1, shuffle: true, seed: 5 };
    const book = new LeaseBook({ strategy: 'central', ...o });
    const seen: number[] = [];
    for (let step = 0; !book.exhausted(step); step++) {
      const leases = [0, 1].map((i) => book.lease(10 + i, i, 2, step)!);
      if (step === 2) {
        // The round changed before the step was applied: handed out again, the same samples.
        book.roundChanged(new Set([10, 11]));
        expect([0, 1].map((i) => book.lease(10 + i, i, 2, step))).toEqual(leases);
      }
      for (const l of leases) seen.push(...leaseIndices(l, o));
      book.stepApplied(2);
    }
    expect(seen.sort((a, b) => a - b)).toEqual(Array.from({ length: 40 }, (_, i) => i));
    expect(book.samples).toMatchObject({ leased: 40, applied: 40, epoch: 1 });
  });
});

describe('roles of a round', () => {
  const members = [11, 12, 13, 14];
  it('the first round: every rank is new, places go to ranks 0..K-1 in order', () => {
    const claims = members.map(() => ({ isNew: true, wasServer: -1 }));
    expect(assignPlaces([-1, -1], claims, members)).toEqual([11, 12]);
  });

  it('a held place stays with its holder; a vacant one goes to the server back with a new member id first, then to new ranks in order', () => {
    const claims = [
      { isNew: false, wasServer: -1 }, // an old worker: never takes a place
      { isNew: true, wasServer: -1 },
      { isNew: true, wasServer: 1 }, // served place 1 before its connection was lost
      { isNew: false, wasServer: 0 },
    ];
    expect(assignPlaces([14, -1], claims, members)).toEqual([14, 13]);
    expect(assignPlaces([14, -1, -1], claims, members)).toEqual([14, 13, 12]);
    // No new rank: the place stays vacant (the run waits for a tab to take it).
    expect(
      assignPlaces([14, -1], [claims[0]!, { isNew: false, wasServer: -1 }, { isNew: false, wasServer: -1 }, claims[3]!], members),
    ).toEqual([14, -1]);
  });

  it('roles from the holders: a holder outside the round leaves its place empty; everyone else works, by worker id', () => {
    expect(rolesOf([13, 99], members)).toEqual({
      serverRank: [2, -1],
      workers: [
        { workerId: 11, rank: 0 },
        { workerId: 12, rank: 1 },
        { workerId: 14, rank: 3 },
      ],
    });
  });

  it('claims travel as float32 rows; malformed ones read as "not new"', () => {
    const all = new Float32Array([...encodeClaim({ isNew: true, wasServer: 2 }), 7, Number.NaN, 1, 1.5]);
    expect(decodeClaims(all, 3)).toEqual([
      { isNew: true, wasServer: 2 },
      { isNew: false, wasServer: -1 },
      { isNew: true, wasServer: -1 },
    ]);
  });
});
