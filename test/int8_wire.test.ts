/**
 * The int8 wire (src/wire/int8_wire.ts): blocks of 32 values with a power-of-two scale. The codec's
 * bounds, exactness and idempotence; all-reduces on it (ring and recursive doubling, in-memory
 * links, the real server for the store) bit-identical on every rank and close to float32; the
 * bytes it sends, counted on the links and computed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup, ReduceOpName } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { allReduceBytes } from '../src/c10d/collective_bytes.ts';
import { FrameKind, readHeader } from '../src/wire/framing.ts';
import { checkWireDtype, roundToWire, wirePayloadBytes } from '../src/wire/half.ts';
import { decodeInt8, encodeInt8, int8Bytes, INT8_BLOCK, roundToInt8 } from '../src/wire/int8_wire.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { hex, rng } from './fixtures/tensors.ts';
import { segments } from '../src/c10d/ring.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

/** Rank `rank`'s input: values of very different sizes from block to block, as gradients are. */
function input(rank: number, len: number): Float32Array {
  const r = rng(3000 + rank * 31 + len);
  return Float32Array.from({ length: len }, (_, i) => (r() - 0.5) * 2 ** (((i >> 5) % 9) - 4));
}

/** The largest |value| within a block's length of element i: a bound for whichever block of 32 it travelled in (the ring's blocks start at its segments). */
function nearMax(values: Float32Array, i: number): number {
  let max = 0;
  for (let j = Math.max(0, i - INT8_BLOCK + 1); j < Math.min(values.length, i + INT8_BLOCK); j++) max = Math.max(max, Math.abs(values[j]!));
  return max;
}

/** The largest |value| of each element's block. */
function blockMax(values: Float32Array, i: number): number {
  const start = i - (i % INT8_BLOCK);
  let max = 0;
  for (let j = start; j < Math.min(values.length, start + INT8_BLOCK); j++) max = Math.max(max, Math.abs(values[j]!));
  return max;
}

describe('int8 codec', () => {
  it('takes one byte per value and one per block of 32', () => {
    expect([0, 1, 31, 32, 33, 1000].map(int8Bytes)).toEqual([0, 2, 32, 33, 35, 1032]);
    expect(wirePayloadBytes('int8', 1000)).toBe(1032);
    expect(wirePayloadBytes('float16', 1000)).toBe(2000);
    expect(checkWireDtype('int8')).toBe('int8');
    expect(() => checkWireDtype('int4')).toThrow(errorOf(RangeError, /unknown wire dtype "int4"; use float32, float16, bfloat16, int8/));
  });

  it("rounds each value to within 1/127 of its block's largest, exactly and idempotently", () => {
    const values = input(0, 4099);
    const bytes = encodeInt8(values);
    expect(bytes.length).toBe(int8Bytes(values.length));
    const back = new Float32Array(values.length);
    decodeInt8(bytes, back);
    for (let i = 0; i < values.length; i++) expect(Math.abs(back[i]! - values[i]!)).toBeLessThanOrEqual(blockMax(values, i) / 127);
    // The block's largest value keeps its sign and is nearly exact (at least 64 steps of the scale).
    expect(Math.sign(back[0]!)).toBe(Math.sign(values[0]!));
    // Decoded values encode to the same bytes: what the ring's forwarded blocks rely on.
    expect(Buffer.from(encodeInt8(back)).equals(Buffer.from(bytes))).toBe(true);
    expect(hex(roundToInt8(back.slice()))).toBe(hex(back));
    expect(hex(roundToWire('int8', values.slice()))).toBe(hex(back));
  });

  it('keeps a NaN or an infinity visible (its block becomes NaN), and leaves the other blocks alone', () => {
    const values = input(1, 100);
    values[40] = Infinity;
    values[90] = NaN;
    const back = new Float32Array(100);
    decodeInt8(encodeInt8(values), back);
    for (let i = 32; i < 64; i++) expect(back[i]).toBeNaN();
    for (let i = 96 - 32; i < 96; i++) expect(back[i]).toBeNaN();
    for (let i = 0; i < 32; i++) expect(Math.abs(back[i]! - values[i]!)).toBeLessThanOrEqual(blockMax(values, i) / 127);
    for (let i = 96; i < 100; i++) expect(Number.isFinite(back[i]!)).toBe(true);
  });

  it("zeros, float32's extremes and tiny blocks", () => {
    const back = (v: number[]) => {
      const out = new Float32Array(v.length);
      decodeInt8(encodeInt8(Float32Array.from(v)), out);
      return [...out];
    };
    expect(back([0, 0, 0])).toEqual([0, 0, 0]);
    // float32's largest stays finite (rounded down, not up to infinity), within 1/127 of itself.
    const [big, minusBig] = back([3.4028234663852886e38, -3.4028234663852886e38]);
    expect(Number.isFinite(big!) && Number.isFinite(minusBig!)).toBe(true);
    expect(big! / 3.4028234663852886e38).toBeGreaterThan(1 - 1 / 63);
    expect(minusBig).toBe(-big!);
    expect(back([2 ** -140, -(2 ** -141)])).toEqual([0, 0]);
    expect(back([127, 1, -127])).toEqual([127, 1, -127]);
    expect(back([0.5, 0.25, -0.125])).toEqual([0.5, 0.25, -0.125]);
  });
});

async function groups(n: number, net = new MemoryNetwork()): Promise<ProcessGroup[]> {
  const session = uniqueSession('int8');
  return Promise.all(
    Array.from({ length: n }, (_, rank) =>
      initProcessGroup({
        url: server.url,
        session,
        token: tokenFor(session),
        worldSize: n,
        rank,
        timeoutMs: 5_000,
        linkFactory: net.factoryFor(rank),
        maxFrameBytes: 1024,
      }),
    ),
  );
}

describe('allReduce on the int8 wire', () => {
  for (const n of [2, 3, 4, 5]) {
    it(`world ${n}: ring and recursive doubling, sum and avg: bit-identical on every rank, close to float32`, async () => {
      const pgs = await groups(n);
      for (const algorithm of n > 2 ? (['ring', 'doubling'] as const) : (['ring'] as const)) {
        for (const op of ['sum', 'avg'] as ReduceOpName[]) {
          for (const len of [0, 1, 31, 33, 1000, 4099]) {
            const outs = await Promise.all(pgs.map((pg) => pg.allReduce(input(pg.rank, len), op, { wire: 'int8', algorithm })));
            expect(new Set(outs.map(hex)).size, `${algorithm} ${op} ${len}`).toBe(1);
            const out = outs[0]!;
            // Every rank holds values the wire carries: blocks from each ring segment's start, or from 0 (doubling).
            const parts = algorithm === 'ring' ? segments(len, n) : [{ start: 0, end: len }];
            for (const { start, end } of parts) expect(hex(roundToInt8(out.slice(start, end)))).toBe(hex(out.subarray(start, end)));
            const inputs = pgs.map((pg) => input(pg.rank, len));
            const absSum = Float32Array.from({ length: len }, (_, i) => inputs.reduce((a, x) => a + Math.abs(x[i]!), 0));
            for (let i = 0; i < len; i++) {
              const sum = inputs.reduce((a, x) => a + x[i]!, 0);
              const want = op === 'avg' ? sum / n : sum;
              // Every rounding of a partial sum (n - 1 hops or log2 n exchanges, and the last) is
              // within 1/127 of its block's largest partial sum, itself at most the block's largest sum of |x|.
              const bound = ((n + 1) * nearMax(absSum, i)) / 127 / (op === 'avg' ? n : 1);
              expect(Math.abs(out[i]! - want), `${algorithm} ${op} ${len} [${i}]`).toBeLessThanOrEqual(bound);
            }
          }
        }
      }
      pgs.forEach((pg) => {
        pg.destroy();
      });
    });
  }

  it('max and min: the rounded extreme on every rank', async () => {
    const pgs = await groups(3);
    for (const op of ['max', 'min'] as const) {
      const outs = await Promise.all(pgs.map((pg) => pg.allReduce(input(pg.rank, 101), op, { wire: 'int8', algorithm: 'ring' })));
      expect(new Set(outs.map(hex)).size).toBe(1);
      const want = Float32Array.from({ length: 101 }, (_, i) => Math[op](...pgs.map((pg) => roundToInt8(input(pg.rank, 101))[i]!)));
      const rawMax = Float32Array.from({ length: 101 }, (_, i) => Math.max(...pgs.map((pg) => Math.abs(input(pg.rank, 101)[i]!))));
      // The inputs rounded once on the way, the extreme once more by its owner.
      for (let i = 0; i < 101; i++) expect(Math.abs(outs[0]![i]! - want[i]!)).toBeLessThanOrEqual((3 * nearMax(rawMax, i)) / 127);
    }
    pgs.forEach((pg) => {
      pg.destroy();
    });
  });

  it('a world of one rounds as the wire would', async () => {
    const [solo] = await groups(1);
    const x = input(0, 70);
    expect(hex(await solo!.allReduce(x.slice(), 'sum', { wire: 'int8' }))).toBe(hex(roundToInt8(x.slice())));
    solo!.destroy();
  });

  for (const n of [2, 4]) {
    it(`world ${n}: int8 sends about 0.26 of float32's bytes, and allReduceBytes computes exactly what the links carried`, async () => {
      const net = new MemoryNetwork();
      const pgs = await groups(n, net);
      await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(8), 'sum', { algorithm: 'ring' }))); // every link of the ring open
      const sent = new Array<number>(n).fill(0);
      for (let from = 0; from < n; from++) {
        for (let to = 0; to < n; to++) {
          const link = from === to ? undefined : net.end(from, to);
          if (!link) continue;
          link.intercept = (f) => {
            const h = readHeader(f);
            if (h.kind === FrameKind.collective) sent[from]! += f.length;
            return [f];
          };
        }
      }
      const len = 50_001;
      const measure = async (wire: 'float32' | 'int8') => {
        const before = [...sent];
        await Promise.all(pgs.map((pg) => pg.allReduce(input(pg.rank, len), 'sum', { wire })));
        return sent.map((s, r) => s - before[r]!);
      };
      const f32 = await measure('float32');
      const i8 = await measure('int8');
      for (let r = 0; r < n; r++) {
        expect(i8[r]! / f32[r]!).toBeLessThan(0.27);
        expect(i8[r]! / f32[r]!).toBeGreaterThan(0.25);
        expect(i8[r]).toBe(allReduceBytes(len, r, n, { wire: 'int8', frameBytes: 1024 }));
        expect(pgs[r]!.bytesSent()).toBeGreaterThan(0);
      }
      pgs.forEach((pg) => {
        pg.destroy();
      });
    });
  }

  it('ranks that pass different wires are told so (a mismatch, not wrong numbers)', async () => {
    const pgs = await groups(2);
    const results = await Promise.allSettled(
      pgs.map((pg) => pg.allReduce(input(pg.rank, 64), 'sum', { wire: pg.rank === 0 ? 'int8' : 'float16' })),
    );
    for (const r of results) {
      expect(r.status).toBe('rejected');
      expect(String((r as PromiseRejectedResult).reason)).toMatch(/int8/);
    }
    pgs.forEach((pg) => {
      pg.destroy();
    });
  });
});
