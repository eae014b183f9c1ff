/**
 * The PowerSGD comm hook in Node (in-memory links, the real server): bit-identical outputs on
 * every rank, exact recovery of low-rank averages, convergence with error feedback close to
 * uncompressed SGD, vanilla all-reduce before startIter, its state round-tripping, and what it
 * sends.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { powerSGD, PowerSGDStateError, type PowerSGDHook, type PowerSGDOptions } from '../src/parallel/comm_hooks/powersgd.ts';
import type { GradBucket } from '../src/parallel/comm_hooks/types.ts';
import type { ProcessGroup, ReduceOpName } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

async function groups(n: number): Promise<ProcessGroup[]> {
  const session = uniqueSession('psgd');
  const net = new MemoryNetwork();
  return Promise.all(
    Array.from({ length: n }, (_, rank) =>
      initProcessGroup({
        url: server.url,
        session,
        token: tokenFor(session),
        worldSize: n,
        rank,
        timeoutMs: 10_000,
        linkFactory: net.factoryFor(rank),
      }),
    ),
  );
}

function destroy(pgs: ProcessGroup[]): void {
  for (const pg of pgs) pg.destroy();
}

/** A seeded generator of uniform values in [-1, 1) (mulberry32). */
function rng(seed: number): () => number {
  let s = seed | 0;
  return () => {
    s = (s + 0x6d2b79f5) | 0;
    let t = Math.imul(s ^ (s >>> 15), s | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (((t ^ (t >>> 14)) >>> 0) / 2 ** 32) * 2 - 1;
  };
}

function randomArray(length: number, seed: number): Float32Array {
  const next = rng(seed);
  return Float32Array.from({ length }, () => next());
}

type Layout = Array<{ index: number; shape: number[] }>;

function bucket(index: number, layout: Layout, buffer: Float32Array, step: number, isLast: boolean): GradBucket {
  let offset = 0;
  const parameters = layout.map(({ index: i, shape }) => {
    const size = shape.reduce((a, b) => a * b, 1);
    const p = { index: i, shape, offset, size };
    offset += size;
    return p;
  });
  if (offset !== buffer.length) throw new Error(`layout of ${offset} elements for a buffer of ${buffer.length}`);
  return { index, buffer, parameters, step, isLast };
}

const sizeOf = (layout: Layout) => layout.reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0);
const hex = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

function average(inputs: Float32Array[]): Float32Array {
  const out = new Float32Array(inputs[0]!.length);
  for (let i = 0; i < out.length; i++) out[i] = inputs.reduce((s, a) => s + a[i]!, 0) / inputs.length;
  return out;
}

function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!));
  return d;
}

/** A process group that records the all-reduces it is asked for. */
function spy(pg: ProcessGroup, calls: Array<{ length: number; op: ReduceOpName }>): ProcessGroup {
  return {
    allReduce: (buf: Float32Array, op: ReduceOpName = 'sum') => {
      calls.push({ length: buf.length, op });
      return pg.allReduce(buf, op);
    },
  } as unknown as ProcessGroup;
}

/** Two buckets: a matrix and a bias, then a 4-D kernel and a matrix. */
const layouts: Layout[] = [
  [
    { index: 3, shape: [16, 12] },
    { index: 2, shape: [12] },
  ],
  [
    // A TF.js convolution kernel [kh, kw, in, out], viewed as (kh kw in) x out = 72 x 16.
    { index: 1, shape: [3, 3, 8, 16] },
    { index: 0, shape: [20, 10] },
  ],
];

/** One step on every rank, both buckets reduced concurrently (as DDP starts them). */
async function step(pgs: ProcessGroup[], hooks: PowerSGDHook[], s: number, seed = 0): Promise<Float32Array[][]> {
  return Promise.all(
    pgs.map((pg, r) =>
      Promise.all(
        layouts.map((layout, b) =>
          hooks[r]!.reduce(pg, bucket(b, layout, randomArray(sizeOf(layout), seed + 1000 * s + 100 * r + b), s, b === layouts.length - 1)),
        ),
      ),
    ),
  );
}

describe('PowerSGD hook', () => {
  for (const n of [2, 3]) {
    it(`returns bit-identical gradients on ${n} ranks, and sends less after startIter`, async () => {
      const pgs = await groups(n);
      try {
        const hooks = pgs.map(() => powerSGD({ matrixApproximationRank: 2, startIter: 2 }));
        for (let s = 1; s <= 6; s++) {
          const outs = await step(pgs, hooks, s);
          for (let b = 0; b < layouts.length; b++) {
            const reference = hex(outs[0]![b]!);
            for (let r = 1; r < n; r++) expect(hex(outs[r]![b]!)).toBe(reference);
            for (const v of outs[0]![b]!) expect(Number.isFinite(v)).toBe(true);
          }
          const stats = hooks[0]!.lastStats;
          expect(stats.step).toBe(s);
          expect(stats.elementsDense).toBe(sizeOf(layouts[0]!) + sizeOf(layouts[1]!));
          if (s <= 2) expect(stats.elementsSent).toBe(stats.elementsDense);
          // (16 + 12) 2 + 12 and (72 + 16) 2 + (20 + 10) 2.
          else expect(stats.elementsSent).toBe(68 + 236);
          expect(hooks[0]!.iteration).toBe(s);
        }
        // The warm-start Q's are the same everywhere; the errors are each rank's own.
        const states = hooks.map((h) => h.stateDict());
        for (const key of Object.keys(states[0]!.tensors).filter((k) => k.startsWith('q:'))) {
          for (let r = 1; r < n; r++) expect(hex(states[r]!.tensors[key]!)).toBe(hex(states[0]!.tensors[key]!));
        }
        expect(hex(states[1]!.tensors['error:0/3']!)).not.toBe(hex(states[0]!.tensors['error:0/3']!));
      } finally {
        destroy(pgs);
      }
    });
  }

  it('recovers a rank-r average exactly (up to rounding), and averages 1-D parameters uncompressed', async () => {
    const n = 3;
    const pgs = await groups(n);
    try {
      const [rows, cols, rank] = [12, 9, 2];
      const layout: Layout = [
        { index: 1, shape: [rows, cols] },
        { index: 0, shape: [cols] },
      ];
      // M_r = U V_r^T: every rank's matrix, and so their average, lies in U's column space.
      const U = randomArray(rows * rank, 1);
      const inputs = pgs.map((_, r) => {
        const V = randomArray(cols * rank, 10 + r);
        const buf = new Float32Array(rows * cols + cols);
        for (let i = 0; i < rows; i++)
          for (let j = 0; j < cols; j++) for (let k = 0; k < rank; k++) buf[i * cols + j] += U[i * rank + k]! * V[j * rank + k]!;
        buf.set(randomArray(cols, 20 + r), rows * cols);
        return buf;
      });
      const want = average(inputs);
      for (const warmStart of [false, true]) {
        const hooks = pgs.map(() => powerSGD({ matrixApproximationRank: rank, startIter: 0, useErrorFeedback: false, warmStart }));
        const calls: Array<{ length: number; op: ReduceOpName }> = [];
        const outs = await Promise.all(
          pgs.map((pg, r) => hooks[r]!.reduce(r === 0 ? spy(pg, calls) : pg, bucket(0, layout, inputs[r]!.slice(), 1, true))),
        );
        const scale = Math.max(...want.map(Math.abs));
        expect(maxAbsDiff(outs[0]!, want) / scale).toBeLessThan(1e-5);
        // The bias: the plain average.
        expect(maxAbsDiff(outs[0]!.subarray(rows * cols), want.subarray(rows * cols))).toBeLessThan(1e-6);
        // The bias alone, uncompressed; then P (12 x 2) and Q (9 x 2).
        expect(calls).toEqual([
          { length: cols, op: 'avg' },
          { length: rows * rank, op: 'sum' },
          { length: cols * rank, op: 'avg' },
        ]);
        expect(hooks[0]!.lastStats).toEqual({ step: 1, elementsSent: cols + (rows + cols) * rank, elementsDense: rows * cols + cols });
      }
    } finally {
      destroy(pgs);
    }
  });

  it('equals plain all-reduce exactly up to startIter', async () => {
    const pgs = await groups(3);
    try {
      const hooks = pgs.map(() => powerSGD({ startIter: 3 }));
      for (let s = 1; s <= 3; s++) {
        for (let b = 0; b < layouts.length; b++) {
          const inputs = pgs.map((_, r) => randomArray(sizeOf(layouts[b]!), 7 * s + r + 50 * b));
          const calls: Array<{ length: number; op: ReduceOpName }> = [];
          const outs = await Promise.all(
            pgs.map((pg, r) => hooks[r]!.reduce(spy(pg, calls), bucket(b, layouts[b]!, inputs[r]!.slice(), s, b === 1))),
          );
          const plain = await Promise.all(pgs.map((pg, r) => pg.allReduce(inputs[r]!.slice(), 'avg')));
          for (let r = 0; r < 3; r++) expect(hex(outs[r]!)).toBe(hex(plain[r]!));
          expect(calls.map((c) => c.op)).toEqual(['avg', 'avg', 'avg']);
        }
      }
      // No error feedback before startIter: nothing kept but the step.
      expect(hooks[0]!.stateDict().tensors).toEqual({});
      expect(hooks[0]!.stateDict().meta.iter).toBe(3);
    } finally {
      destroy(pgs);
    }
  });

  it('trains a least-squares problem with error feedback to within 10% of the uncompressed loss', async () => {
    const n = 2;
    const pgs = await groups(n);
    try {
      // y = W* x + noise, W* 10 x 12 of full rank, x uniform in [-1, 1)^12; each rank its own batches.
      const [out, inp, batch, steps, lr] = [10, 12, 16, 150, 0.5];
      const target = randomArray(out * inp, 99);
      const layout: Layout = [{ index: 0, shape: [out, inp] }];
      /** The expected loss 0.5 |W x - y|^2: E[x x^T] = I / 3, the noise's variance noise^2 / 3 per output. */
      const lossOf = (W: Float32Array, noise: number): number => {
        let d = 0;
        for (let i = 0; i < W.length; i++) d += (W[i]! - target[i]!) ** 2;
        return d / 6 + (out * noise ** 2) / 6;
      };
      const train = async (options: PowerSGDOptions, noise: number): Promise<number> => {
        const hooks = pgs.map(() => powerSGD(options));
        const weights = pgs.map(() => new Float32Array(out * inp));
        for (let s = 1; s <= steps; s++) {
          const grads = pgs.map((_, r) => {
            const x = randomArray(batch * inp, 7919 * s + r);
            const e = randomArray(batch * out, 104729 * s + r);
            const W = weights[r]!;
            const g = new Float32Array(out * inp);
            for (let b = 0; b < batch; b++) {
              for (let o = 0; o < out; o++) {
                let residual = -noise * e[b * out + o]!;
                for (let i = 0; i < inp; i++) residual += (W[o * inp + i]! - target[o * inp + i]!) * x[b * inp + i]!;
                for (let i = 0; i < inp; i++) g[o * inp + i] += (residual * x[b * inp + i]!) / batch;
              }
            }
            return g;
          });
          const avg = await Promise.all(pgs.map((pg, r) => hooks[r]!.reduce(pg, bucket(0, layout, grads[r]!, s, true))));
          pgs.forEach((_, r) => {
            for (let i = 0; i < out * inp; i++) weights[r]![i] -= lr * avg[r]![i]!;
          });
        }
        expect(hex(weights[1]!)).toBe(hex(weights[0]!));
        return lossOf(weights[0]!, noise);
      };
      const floor = lossOf(target, 0.1);
      const initial = lossOf(new Float32Array(out * inp), 0.1);
      const dense = await train({ startIter: steps }, 0.1);
      const compressed = await train({ matrixApproximationRank: 1, startIter: 10 }, 0.1);
      expect(initial).toBeGreaterThan(floor * 100);
      expect(dense).toBeLessThan(floor * 1.05);
      expect(compressed).toBeLessThan(dense * 1.1);
      // Without noise, error feedback is what lets rank 1 get all the way: without it the
      // directions it did not send are lost every step.
      const clean = await train({ matrixApproximationRank: 1, startIter: 10 }, 0);
      const noFeedback = await train({ matrixApproximationRank: 1, startIter: 10, useErrorFeedback: false, warmStart: false }, 0);
      expect(clean).toBeLessThan(initial * 1e-6);
      expect(clean).toBeLessThan(noFeedback / 100);
    } finally {
      destroy(pgs);
    }
  });

  it('round-trips its state: a hook loaded from stateDict gives the same next outputs', async () => {
    const pgs = await groups(2);
    try {
      const options: PowerSGDOptions = { matrixApproximationRank: 2, startIter: 2 };
      const hooks = pgs.map(() => powerSGD(options));
      for (let s = 1; s <= 5; s++) await step(pgs, hooks, s);
      const states = hooks.map((h) => h.stateDict());
      expect(Object.keys(states[0]!.tensors).sort()).toEqual(['error:0/3', 'error:1/0', 'error:1/1', 'q:0/3', 'q:1/0', 'q:1/1']);
      expect(states[0]!.meta).toMatchObject({ iter: 5, 'shape:0/3': '[16,12]', 'shape:1/1': '[3,3,8,16]' });
      const loaded = pgs.map(() => powerSGD(options));
      loaded.forEach((h, r) => {
        h.loadStateDict(structuredClone(states[r]!));
      });
      expect(loaded[0]!.iteration).toBe(5);
      const fresh = pgs.map(() => powerSGD(options));
      const a = await step(pgs, hooks, 6);
      const b = await step(pgs, loaded, 6);
      const c = await step(pgs, fresh, 6);
      for (let r = 0; r < 2; r++) {
        for (let k = 0; k < layouts.length; k++) expect(hex(b[r]![k]!)).toBe(hex(a[r]![k]!));
        const after = [hooks[r]!.stateDict(), loaded[r]!.stateDict()];
        for (const key of Object.keys(after[0]!.tensors)) expect(hex(after[1]!.tensors[key]!)).toBe(hex(after[0]!.tensors[key]!));
      }
      // Without the state (no error, a fresh Q) the step differs.
      expect(hex(c[0]![0]!)).not.toBe(hex(a[0]![0]!));
      // Another rank's state (a joiner's warm start): its Q's and iteration, not its errors.
      const joiner = powerSGD(options);
      joiner.loadStateDict(structuredClone(states[0]!), { otherRank: true });
      const warm = joiner.stateDict();
      expect(warm.meta).toEqual(states[0]!.meta);
      expect(Object.keys(warm.tensors).sort()).toEqual(['q:0/3', 'q:1/0', 'q:1/1']);
      for (const key of Object.keys(warm.tensors)) expect(hex(warm.tensors[key]!)).toBe(hex(states[0]!.tensors[key]!));
      // stateDict hands out copies.
      states[0]!.tensors['q:0/3']!.fill(0);
      expect(hooks[0]!.stateDict().tensors['q:0/3']!.some((v) => v !== 0)).toBe(true);
    } finally {
      destroy(pgs);
    }
  });

  it('one non-finite contribution leaves no trace in its state: the next steps are finite, and a poisoned state is refused', async () => {
    const pgs = await groups(2);
    try {
      const options: PowerSGDOptions = { matrixApproximationRank: 2, startIter: 2 };
      const hooks = pgs.map(() => powerSGD(options));
      for (let s = 1; s <= 3; s++) await step(pgs, hooks, s);
      const before = hooks.map((h) => h.stateDict());
      // Step 4: rank 1's gradient holds a NaN (a hostile member, or a spike past the fp16 wire).
      const poisoned = await Promise.all(
        pgs.map((pg, r) =>
          Promise.all(
            layouts.map((layout, b) => {
              const g = randomArray(sizeOf(layout), 4000 + 100 * r + b);
              if (r === 1) g[0] = NaN;
              return hooks[r]!.reduce(pg, bucket(b, layout, g, 4, b === layouts.length - 1));
            }),
          ),
        ),
      );
      expect(poisoned[0]![0]!.some((v) => Number.isNaN(v))).toBe(true);
      // Every rank kept its error feedback and warm start as they were after step 3.
      hooks.forEach((h, r) => {
        const after = h.stateDict();
        for (const key of Object.keys(before[r]!.tensors)) expect(hex(after.tensors[key]!)).toBe(hex(before[r]!.tensors[key]!));
      });
      const next = await step(pgs, hooks, 5);
      for (const rank of next) for (const out of rank) expect(out.every((v) => Number.isFinite(v))).toBe(true);
      const bad = structuredClone(before[0]!);
      bad.tensors['q:0/3']![0] = Infinity;
      expect(() => powerSGD(options).loadStateDict(bad)).toThrow(
        errorOf(PowerSGDStateError, /q:0\/3 for parameter 3 in bucket 0 holds a NaN or an infinity/),
      );
    } finally {
      destroy(pgs);
    }
  });

  it('refuses a state that does not fit', async () => {
    const pgs = await groups(2);
    try {
      const hooks = pgs.map(() => powerSGD({ startIter: 0 }));
      await step(pgs, hooks, 1);
      const state = hooks[0]!.stateDict();
      // A shape the hook has seen differently: refused at once, the hook unchanged.
      const transposed = structuredClone(state);
      transposed.meta['shape:0/3'] = '[12,16]';
      expect(() => hooks[0]!.loadStateDict(transposed)).toThrow(
        errorOf(PowerSGDStateError, /parameter 3 in bucket 0 of shape \[12, 16\], but this model's has shape \[16, 12\]/),
      );
      expect(hex(hooks[0]!.stateDict().tensors['q:0/3']!)).toBe(hex(state.tensors['q:0/3']!));
      // A hook that has not seen the bucket takes it, and its reduce refuses the model's shape.
      // (Its error has the same size in either shape; its Q would not fit, so it goes.)
      delete transposed.tensors['q:0/3'];
      const other = powerSGD({ startIter: 0 });
      other.loadStateDict(transposed);
      await expect(other.reduce(pgs[0]!, bucket(0, layouts[0]!, randomArray(sizeOf(layouts[0]!), 1), 2, false))).rejects.toThrow(
        PowerSGDStateError,
      );
      await expect(other.reduce(pgs[0]!, bucket(0, layouts[0]!, randomArray(sizeOf(layouts[0]!), 1), 2, false))).rejects.toThrow(
        /parameter 3 in bucket 0 has shape \[16, 12\], but the hook's state is for shape \[12, 16\]/,
      );
      // Arrays that do not fit their shapes, another rank, another hook.
      const short = structuredClone(state);
      short.tensors['error:0/3'] = new Float32Array(5);
      expect(() => powerSGD().loadStateDict(short)).toThrow(
        errorOf(PowerSGDStateError, /error for parameter 3 in bucket 0 has 5 elements, its shape \[16, 12\] 192/),
      );
      expect(() => powerSGD({ matrixApproximationRank: 2 }).loadStateDict(state)).toThrow(
        errorOf(PowerSGDStateError, /Q matrices are of rank 1, but this hook's matrixApproximationRank is 2/),
      );
      expect(() => powerSGD().loadStateDict({ ...state, name: 'postLocalSGD' })).toThrow(PowerSGDStateError);
      const noShape = structuredClone(state);
      delete noShape.meta['shape:1/0'];
      expect(() => powerSGD().loadStateDict(noShape)).toThrow(errorOf(PowerSGDStateError, /no valid shape:1\/0/));
    } finally {
      destroy(pgs);
    }
  });

  it('sends a large matrix as a few hundred elements', async () => {
    const pgs = await groups(2);
    try {
      const layout: Layout = [
        { index: 1, shape: [256, 512] },
        { index: 0, shape: [256] },
      ];
      const hooks = pgs.map(() => powerSGD({ startIter: 0 }));
      const outs = await Promise.all(
        pgs.map((pg, r) => hooks[r]!.reduce(pg, bucket(0, layout, randomArray(sizeOf(layout), r + 3), 1, true))),
      );
      expect(hex(outs[1]!)).toBe(hex(outs[0]!));
      const { elementsSent, elementsDense } = hooks[0]!.lastStats;
      expect(elementsDense).toBe(256 * 512 + 256);
      expect(elementsSent).toBe(256 + 512 + 256);
      expect(elementsDense / elementsSent).toBeGreaterThan(100);
    } finally {
      destroy(pgs);
    }
  });

  it('with a 16-bit wire (torch’s fp16_compress_wrapper) sends about half the bytes, bit-identical on every rank and close to float32', async () => {
    const pgs = await groups(3);
    try {
      const run = async (wire: PowerSGDOptions['wire']) => {
        const hooks = pgs.map(() => powerSGD({ matrixApproximationRank: 2, startIter: 1, wire }));
        const before = pgs.map((pg) => pg.bytesSent());
        let outs: Float32Array[][] = [];
        for (let s = 1; s <= 4; s++) outs = await step(pgs, hooks, s, 77);
        return { outs, bytes: pgs.map((pg, r) => pg.bytesSent() - before[r]!), stats: hooks[0]!.lastStats };
      };
      const f32 = await run('float32');
      for (const wire of ['float16', 'bfloat16'] as const) {
        const half = await run(wire);
        for (let b = 0; b < layouts.length; b++) {
          for (let r = 1; r < 3; r++) expect(hex(half.outs[r]![b]!)).toBe(hex(half.outs[0]![b]!));
          // Same elements; each one 16-bit, so the approximation differs from float32's by the
          // wire's rounding (relative 2^-11 for float16, 2^-8 for bfloat16, grown a little by the products).
          let scale = 0;
          for (const v of f32.outs[0]![b]!) scale = Math.max(scale, Math.abs(v));
          expect(maxAbsDiff(half.outs[0]![b]!, f32.outs[0]![b]!)).toBeLessThan(scale * (wire === 'float16' ? 0.01 : 0.05));
        }
        expect(half.stats.elementsSent).toBe(f32.stats.elementsSent);
        for (let r = 0; r < 3; r++) {
          // Half the payload; the frame headers stay as they were.
          expect(half.bytes[r]! / f32.bytes[r]!).toBeGreaterThan(0.5);
          expect(half.bytes[r]! / f32.bytes[r]!).toBeLessThan(0.6);
        }
      }
    } finally {
      destroy(pgs);
    }
  });

  it('checks its options', () => {
    expect(() => powerSGD({ wire: 'float8' as unknown as PowerSGDOptions['wire'] })).toThrow(
      errorOf(RangeError, /unknown wire dtype "float8"/),
    );
    expect(() => powerSGD({ matrixApproximationRank: 0 })).toThrow(RangeError);
    expect(() => powerSGD({ startIter: -1 })).toThrow(RangeError);
    expect(() => powerSGD({ orthogonalizationEpsilon: -1 })).toThrow(RangeError);
    expect(() => powerSGD({ seed: 1.5 })).toThrow(RangeError);
  });
});
