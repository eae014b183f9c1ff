/**
 * The latency-optimal collectives (src/c10d/latency_collectives.ts): recursive doubling for
 * all-reduce (with the fold of a world that is not a power of two), Bruck's all-gather and the
 * binomial-tree broadcast, over in-memory links and the real server's rendezvous; and the
 * tuner that picks them by size, the same way on every rank.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { Collective, readHeader } from '../src/wire/framing.ts';
import { chooseAlgorithm, DEFAULT_LATENCY_THRESHOLD_BYTES } from '../src/c10d/latency_collectives.ts';
import { allReduceBytes } from '../src/c10d/collective_bytes.ts';
import { roundToWire, type WireDtype } from '../src/wire/half.ts';
import { CollectiveMismatchError } from '../src/wire/errors.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { waitFor } from './fixtures/wait.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

async function groups(
  n: number,
  extra: { latencyThresholdBytes?: number; maxFrameBytes?: number } = {},
): Promise<{ pgs: ProcessGroup[]; net: MemoryNetwork }> {
  const session = uniqueSession('latency');
  const net = new MemoryNetwork();
  const pgs = await Promise.all(
    Array.from({ length: n }, (_, rank) =>
      initProcessGroup({
        url: server.url,
        session,
        token: tokenFor(session),
        worldSize: n,
        rank,
        timeoutMs: 5_000,
        linkFactory: net.factoryFor(rank),
        ...extra,
      }),
    ),
  );
  return { pgs, net };
}

/** Deterministic floats with many significant bits: sums depend on their order. */
function noisy(rank: number, len: number): Float32Array {
  let x = (rank + 1) * 2654435761;
  return Float32Array.from({ length: len }, () => {
    x = (x * 1103515245 + 12345) % 2147483648;
    return (x / 2147483648 - 0.5) * 10 ** ((x % 7) - 3);
  });
}

const small = (rank: number, len: number) => Float32Array.from({ length: len }, (_, i) => ((i * 7 + rank * 13) % 17) - 8);

function bits(a: Float32Array): number[] {
  return Array.from(new Uint32Array(a.buffer, a.byteOffset, a.length));
}

/** Every rank's all-reduce of `small` values by `algorithm` equals the exact reduction, for each length. */
async function expectExact(
  pgs: ProcessGroup[],
  op: 'sum' | 'avg' | 'max' | 'min',
  algorithm: 'doubling' | 'tree',
  lengths: number[],
): Promise<void> {
  const n = pgs.length;
  for (const len of lengths) {
    const outs = await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, len), op, { algorithm })));
    const want = Float32Array.from({ length: len }, (_, i) => {
      const vs = pgs.map((pg) => small(pg.rank, len)[i]!);
      if (op === 'max') return Math.max(...vs);
      if (op === 'min') return Math.min(...vs);
      const sum = vs.reduce((a, b) => a + b, 0);
      return op === 'avg' ? Math.fround(sum / n) : sum;
    });
    for (const out of outs) expect(Array.from(out)).toEqual(Array.from(want));
  }
}

/** Every collective frame's (sender's link, step) and code, from now on. */
function watch(net: MemoryNetwork): { messages: Set<string>; codes: Set<number> } {
  const seen = { messages: new Set<string>(), codes: new Set<number>() };
  net.links.forEach((link, i) => {
    link.intercept = (frame) => {
      const h = readHeader(frame);
      if (h.kind === 1) {
        seen.messages.add(`${i}:${h.seq}:${h.step}`);
        seen.codes.add(h.collective);
      }
      return [frame];
    };
  });
  return seen;
}

describe('the tuner', () => {
  it('picks recursive doubling below the threshold and the ring at or above it, for worlds of 3 and more', () => {
    expect(chooseAlgorithm(4096, 8, DEFAULT_LATENCY_THRESHOLD_BYTES)).toBe('doubling');
    expect(chooseAlgorithm(DEFAULT_LATENCY_THRESHOLD_BYTES, 8, DEFAULT_LATENCY_THRESHOLD_BYTES)).toBe('ring');
    expect(chooseAlgorithm(4096, 2, DEFAULT_LATENCY_THRESHOLD_BYTES)).toBe('ring');
    expect(chooseAlgorithm(4096, 8, 0)).toBe('ring');
    expect(chooseAlgorithm(1 << 30, 8, 0, 'doubling')).toBe('doubling');
    expect(chooseAlgorithm(4, 8, DEFAULT_LATENCY_THRESHOLD_BYTES, 'ring')).toBe('ring');
  });
});

describe('recursive doubling all-reduce', () => {
  for (const n of [3, 4, 5, 6, 7, 8]) {
    it(`world ${n}: every op exact on integers, and the same bits on every rank on noisy floats`, async () => {
      const { pgs } = await groups(n, { maxFrameBytes: 1024 });
      try {
        for (const op of ['sum', 'avg', 'max', 'min'] as const) {
          await expectExact(pgs, op, 'doubling', [0, 1, 7, 1000]);
          const outs = await Promise.all(pgs.map((pg) => pg.allReduce(noisy(pg.rank, 333), op, { algorithm: 'doubling' })));
          for (const out of outs) expect(bits(out)).toEqual(bits(outs[0]!));
        }
      } finally {
        for (const pg of pgs) pg.destroy();
      }
    });
  }

  it("a 16-bit wire: the same bits on every rank, within the wire's precision of the float32 sum", async () => {
    for (const n of [4, 5]) {
      const { pgs } = await groups(n);
      try {
        for (const wire of ['float16', 'bfloat16'] as const) {
          const exact = await Promise.all(pgs.map((pg) => pg.allReduce(noisy(pg.rank, 257), 'sum', { algorithm: 'doubling' })));
          const outs = await Promise.all(pgs.map((pg) => pg.allReduce(noisy(pg.rank, 257), 'sum', { algorithm: 'doubling', wire })));
          for (const out of outs) expect(bits(out)).toEqual(bits(outs[0]!));
          const tolerance = wire === 'float16' ? 2 ** -8 : 2 ** -5;
          outs[0]!.forEach((v, i) => {
            expect(Math.abs(v - exact[0]![i]!)).toBeLessThanOrEqual(tolerance * (Math.abs(exact[0]![i]!) + 1));
          });
        }
      } finally {
        for (const pg of pgs) pg.destroy();
      }
    }
  });

  it("worlds 3 and 5 on a 16-bit or int8 wire: a folded rank's values are rounded to the wire as its partner's are, so the sum is the wire-rounded sum, bit for bit", async () => {
    const round = (wire: WireDtype, a: Float32Array) => roundToWire(wire, Float32Array.from(a));
    const add = (a: Float32Array, b: Float32Array) => a.map((v, i) => v + b[i]!);
    /** Doubling's sum as the wire has it: every value rounded before it is added to another, and the result once more. */
    const wireSum = (inputs: Float32Array[], wire: WireDtype): Float32Array => {
      const p = 2 ** Math.floor(Math.log2(inputs.length));
      const extra = inputs.length - p;
      // The first 2 x extra ranks fold pairwise; the rest stand alone.
      let v = Array.from({ length: p }, (_, i) =>
        i < extra ? add(round(wire, inputs[2 * i + 1]!), round(wire, inputs[2 * i]!)) : inputs[i + extra]!,
      );
      for (let mask = 1; mask < p; mask <<= 1) v = v.map((x, i) => add(round(wire, x), round(wire, v[i ^ mask]!)));
      return round(wire, v[0]!);
    };
    for (const n of [3, 5]) {
      const { pgs } = await groups(n);
      try {
        for (const wire of ['float16', 'bfloat16', 'int8'] as const) {
          const outs = await Promise.all(pgs.map((pg) => pg.allReduce(noisy(pg.rank, 257), 'sum', { algorithm: 'doubling', wire })));
          const want = wireSum(
            pgs.map((pg) => noisy(pg.rank, 257)),
            wire,
          );
          for (const out of outs) expect(bits(out)).toEqual(bits(want));
        }
      } finally {
        for (const pg of pgs) pg.destroy();
      }
    }
  });

  it('takes log2 N messages per rank where the ring takes 2(N-1), and says which algorithm ran on the wire', async () => {
    const { pgs, net } = await groups(8);
    try {
      // Open the links each algorithm uses first: a link opens on first use.
      await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, 64), 'sum', { algorithm: 'doubling' })));
      await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, 64), 'sum', { algorithm: 'ring' })));
      let seen = watch(net);
      await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, 64))));
      expect(seen.messages.size).toBe(8 * 3);
      expect([...seen.codes]).toEqual([Collective.allReduceDoubling]);
      seen = watch(net);
      await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, 64), 'sum', { algorithm: 'ring' })));
      expect(seen.messages.size).toBe(8 * 2 * 7);
      expect([...seen.codes]).toEqual([Collective.allReduce]);
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it('latencyThresholdBytes 0 keeps every collective on the ring', async () => {
    const { pgs, net } = await groups(4, { latencyThresholdBytes: 0 });
    try {
      await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, 8))));
      const seen = watch(net);
      await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, 8))));
      await Promise.all(pgs.map((pg) => pg.allGather(small(pg.rank, 2))));
      await Promise.all(pgs.map((pg) => pg.broadcast(small(pg.rank, 8), 1)));
      expect([...seen.codes].sort()).toEqual([Collective.allReduce, Collective.broadcast, Collective.allGather].sort());
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it('a rank that forces another algorithm fails the collective on every rank with CollectiveMismatchError', async () => {
    const { pgs } = await groups(4);
    try {
      const results = await Promise.allSettled(
        pgs.map((pg) => pg.allReduce(small(pg.rank, 16), 'sum', { algorithm: pg.rank === 2 ? 'ring' : 'doubling' })),
      );
      expect(results.some((r) => r.status === 'rejected' && r.reason instanceof CollectiveMismatchError)).toBe(true);
      expect(results.every((r) => r.status === 'rejected')).toBe(true);
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it('a mismatching message that arrived before this rank joined the collective is caught when it does', async () => {
    const { pgs, net } = await groups(4);
    try {
      // Rank 2 runs the ring, whose first message goes to rank 3 at a step recursive doubling never uses.
      await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, 16), 'sum', { algorithm: 'ring' })));
      const toThree = net.end(2, 3)!;
      const sentBefore = toThree.bytesSent;
      const ring = pgs[2]!.allReduce(small(2, 16), 'sum', { algorithm: 'ring' });
      await waitFor("rank 2's ring message delivered to rank 3", () => toThree.bytesSent > sentBefore && toThree.buffered === 0);
      // Only now do the others start, by recursive doubling: rank 3 finds the message already waiting.
      const others = [0, 1, 3].map((r) => pgs[r]!.allReduce(small(r, 16), 'sum', { algorithm: 'doubling' }));
      const results = await Promise.allSettled([ring, ...others]);
      expect(results.every((r) => r.status === 'rejected')).toBe(true);
      const three = results[3] as PromiseRejectedResult;
      expect(three.reason).toBeInstanceOf(CollectiveMismatchError);
      expect((three.reason as Error).message).toMatch(
        /allReduce\(sum\) of 16 elements, rank 3 issued allReduce\(sum\) of 16 elements by recursive doubling/,
      );
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it('refuses an unknown algorithm, naming it; tree is for allReduce only', async () => {
    const { pgs } = await groups(1);
    await expect(pgs[0]!.allReduce(new Float32Array(4), 'sum', { algorithm: 'bush' as 'ring' })).rejects.toThrow(
      errorOf(RangeError, /algorithm must be 'auto', 'ring', 'doubling', 'tree', got bush/),
    );
    await expect(pgs[0]!.broadcast(new Float32Array(4), 0, { algorithm: 'tree' as 'ring' })).rejects.toThrow(
      errorOf(RangeError, /tree is for allReduce only/),
    );
    pgs[0]!.destroy();
  });
});

describe('tree all-reduce (up a binomial tree to rank 0 and back down)', () => {
  for (const n of [2, 3, 5, 6, 8]) {
    it(`world ${n}: every op exact on integers, rank 0's bits on every rank on noisy floats, and on every wire`, async () => {
      const { pgs } = await groups(n, { maxFrameBytes: 1024 });
      try {
        for (const op of ['sum', 'avg', 'max', 'min'] as const) {
          await expectExact(pgs, op, 'tree', [0, 1, 1000]);
        }
        for (const wire of ['float32', 'float16', 'bfloat16', 'int8'] as const) {
          const outs = await Promise.all(pgs.map((pg) => pg.allReduce(noisy(pg.rank, 333), 'sum', { algorithm: 'tree', wire })));
          for (const out of outs) expect(bits(out)).toEqual(bits(outs[0]!));
        }
      } finally {
        for (const pg of pgs) pg.destroy();
      }
    });
  }

  it('sends 2(N-1) messages in all where doubling sends N log2 N, as allReduceBytes counts them, and says so on the wire', async () => {
    const { pgs, net } = await groups(8);
    try {
      await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, 64), 'sum', { algorithm: 'tree' })));
      const before = pgs.map((pg) => pg.bytesSent());
      const seen = watch(net);
      await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, 64), 'sum', { algorithm: 'tree' })));
      expect(seen.messages.size).toBe(2 * 7);
      expect([...seen.codes]).toEqual([Collective.allReduceTree]);
      pgs.forEach((pg, r) => {
        expect(pg.bytesSent() - before[r]!).toBe(allReduceBytes(64, r, 8, { algorithm: 'tree' }));
      });
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });

  it('a rank that runs doubling where the others run the tree fails the collective on every rank with CollectiveMismatchError', async () => {
    const { pgs } = await groups(4);
    try {
      // With every link open (a link opens when both ends use it), the first wrong message tells.
      await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, 16), 'sum', { algorithm: 'doubling' })));
      await Promise.all(pgs.map((pg) => pg.allReduce(small(pg.rank, 16), 'sum', { algorithm: 'tree' })));
      const results = await Promise.allSettled(
        pgs.map((pg) => pg.allReduce(small(pg.rank, 16), 'sum', { algorithm: pg.rank === 1 ? 'doubling' : 'tree' })),
      );
      expect(results.some((r) => r.status === 'rejected' && r.reason instanceof CollectiveMismatchError)).toBe(true);
      expect(results.every((r) => r.status === 'rejected')).toBe(true);
    } finally {
      for (const pg of pgs) pg.destroy();
    }
  });
});

describe("Bruck's all-gather and the binomial-tree broadcast", () => {
  for (const n of [2, 3, 5, 6, 8]) {
    it(`world ${n}: every block in rank order; from every root, everyone gets the root's buffer`, async () => {
      const { pgs } = await groups(n, { maxFrameBytes: 512 });
      try {
        for (const k of [0, 1, 5, 300]) {
          const outs = await Promise.all(pgs.map((pg) => pg.allGather(noisy(pg.rank, k), { algorithm: 'doubling' })));
          const want = pgs.flatMap((pg) => bits(noisy(pg.rank, k)));
          for (const out of outs) expect(bits(out)).toEqual(want);
        }
        for (let root = 0; root < n; root++) {
          const outs = await Promise.all(
            pgs.map((pg) => pg.broadcast(pg.rank === root ? noisy(root, 301) : new Float32Array(301), root, { algorithm: 'doubling' })),
          );
          for (const out of outs) expect(bits(out)).toEqual(bits(noisy(root, 301)));
        }
      } finally {
        for (const pg of pgs) pg.destroy();
      }
    });
  }
});
