/**
 * DDP communication hooks and the collectives' 16-bit wire, in Node (TF.js cpu backend,
 * in-memory links, real server for the store): float16/bfloat16 rounding, all-reduces with a
 * 16-bit wire (bit-identical on every rank, half the bytes), the bytes counter against the frames
 * that actually crossed the links, and DDP with fp16/bf16 compression hooks.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup, ReduceOpName, WireDtype } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { DistributedDataParallel } from '../src/parallel/ddp/ddp.ts';
import { CollectiveMismatchError } from '../src/wire/errors.ts';
import { FrameKind, readHeader } from '../src/wire/framing.ts';
import {
  decode16,
  encode16,
  fromBfloat16Bits,
  fromFloat16Bits,
  packHalf,
  roundToWire,
  toBfloat16Bits,
  toFloat16Bits,
  unpackHalf,
  type HalfDtype,
} from '../src/wire/half.ts';
import { packHalf as stagePackHalf } from '../src/parallel/pipeline/stage.ts';
import { allreduceHook, bf16CompressHook, fp16CompressHook } from '../src/parallel/comm_hooks/default_hooks.ts';
import type { CommHook, CommHookState, GradBucket } from '../src/parallel/comm_hooks/types.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { syntheticDataset } from '../src/datasets/synthetic.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { hex, rng } from './fixtures/tensors.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  await tf.setBackend('cpu');
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

async function groups(n: number, net = new MemoryNetwork(), extra: { maxFrameBytes?: number } = {}): Promise<ProcessGroup[]> {
  const session = uniqueSession('hooks');
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
        ...extra,
      }),
    ),
  );
}

const destroy = (pgs: ProcessGroup[]) =>
  pgs.forEach((pg) => {
    pg.destroy();
  });
const bitsOf = (v: number) => new Uint32Array(Float32Array.of(v).buffer)[0]!;

/** Rank `rank`'s input: values in [-4, 4) that are not exact in 16 bits. */
function input(rank: number, len: number): Float32Array {
  const r = rng(1000 + rank * 17 + len);
  return Float32Array.from({ length: len }, () => (r() - 0.5) * 8);
}

/**
 * Frames of collectives and point-to-point messages (headers included) that each rank's links
 * actually carried, from now on: liveness frames left out.
 */
function countFrames(net: MemoryNetwork, n: number): number[] {
  const sent = new Array<number>(n).fill(0);
  for (let from = 0; from < n; from++) {
    for (let to = 0; to < n; to++) {
      const link = from === to ? undefined : net.end(from, to);
      if (!link) continue;
      link.intercept = (f) => {
        const h = readHeader(f);
        if (h.kind === FrameKind.collective || h.kind === FrameKind.p2p) sent[from]! += f.length;
        return [f];
      };
    }
  }
  return sent;
}

describe('16-bit floats', () => {
  const r = rng(7);
  // Normal values over float16's whole normal range, both signs.
  const normals = Float32Array.from({ length: 20_000 }, () => (r() < 0.5 ? -1 : 1) * 2 ** (-14 + r() * 29.9));

  it('float16 round trips within 2^-11 for normal values, exactly for halves, ties to even', () => {
    let worst = 0;
    for (const v of normals) {
      const back = fromFloat16Bits(toFloat16Bits(v));
      worst = Math.max(worst, Math.abs(back - v) / Math.abs(v));
      // A value decoded from 16 bits encodes to the same bits: what the ring relies on.
      expect(toFloat16Bits(back)).toBe(toFloat16Bits(v));
    }
    expect(worst).toBeLessThanOrEqual(2 ** -11);
    expect(worst).toBeGreaterThan(2 ** -12);
    for (const v of [1, -2.5, 0.099975586, 65504, 2 ** -14, 2 ** -24, 3 * 2 ** -24])
      expect(fromFloat16Bits(toFloat16Bits(v))).toBe(Math.fround(v));
    expect(fromFloat16Bits(toFloat16Bits(1 + 2 ** -11))).toBe(1); // halfway: to the even neighbour
    expect(fromFloat16Bits(toFloat16Bits(1 + 3 * 2 ** -11))).toBe(1 + 2 ** -9);
    expect(fromFloat16Bits(toFloat16Bits(1 + 2 ** -11 + 2 ** -20))).toBe(1 + 2 ** -10);
  });

  it('float16 special values: signed zeros and infinities, NaN, overflow, subnormals and underflow', () => {
    const rt = (v: number) => fromFloat16Bits(toFloat16Bits(v));
    expect(Object.is(rt(0), 0)).toBe(true);
    expect(Object.is(rt(-0), -0)).toBe(true);
    expect(rt(Infinity)).toBe(Infinity);
    expect(rt(-Infinity)).toBe(-Infinity);
    expect(rt(NaN)).toBeNaN();
    expect(toFloat16Bits(NaN) & 0x7c00).toBe(0x7c00);
    expect(rt(65519)).toBe(65504);
    expect(rt(65520)).toBe(Infinity); // halfway to 2^16: rounds to even, which overflows
    expect(rt(-1e6)).toBe(-Infinity);
    expect(rt(2 ** -20)).toBe(2 ** -20); // subnormal, exact
    expect(rt(1e-8)).toBe(0);
    expect(Object.is(rt(-1e-8), -0)).toBe(true);
    expect(rt(2 ** -25 + 2 ** -40)).toBe(2 ** -24); // just over half the smallest subnormal rounds up
  });

  it("bfloat16 round trips within 2^-8 over float32's range, ties to even", () => {
    const wide = Float32Array.from({ length: 20_000 }, () => (r() < 0.5 ? -1 : 1) * 2 ** (-126 + r() * 253));
    let worst = 0;
    for (const v of wide) {
      const back = fromBfloat16Bits(toBfloat16Bits(v));
      worst = Math.max(worst, Math.abs(back - v) / Math.abs(v));
      expect(toBfloat16Bits(back)).toBe(toBfloat16Bits(v));
    }
    expect(worst).toBeLessThanOrEqual(2 ** -8);
    expect(worst).toBeGreaterThan(2 ** -9);
    expect(fromBfloat16Bits(toBfloat16Bits(1 + 2 ** -8))).toBe(1);
    expect(fromBfloat16Bits(toBfloat16Bits(1 + 3 * 2 ** -8))).toBe(1 + 2 ** -6);
    expect(fromBfloat16Bits(toBfloat16Bits(1 + 2 ** -8 + 2 ** -20))).toBe(1 + 2 ** -7);
  });

  it('bfloat16 special values: NaN stays NaN (a low-bits payload too), infinities, zeros, overflow', () => {
    const rt = (v: number) => fromBfloat16Bits(toBfloat16Bits(v));
    const nanWithLowPayload = new Float32Array(new Uint32Array([0x7f800001]).buffer)[0]!;
    expect(rt(nanWithLowPayload)).toBeNaN();
    expect(rt(-nanWithLowPayload)).toBeNaN();
    expect(rt(NaN)).toBeNaN();
    expect(rt(Infinity)).toBe(Infinity);
    expect(rt(-Infinity)).toBe(-Infinity);
    expect(Object.is(rt(-0), -0)).toBe(true);
    expect(rt(3.4028234663852886e38)).toBe(Infinity); // float32's largest rounds up past bfloat16's
    expect(rt(3.3895313892515355e38)).toBe(3.3895313892515355e38); // bfloat16's largest
    expect(rt(2 ** -130)).toBe(2 ** -130); // subnormal, exact (bfloat16 has float32's subnormals down to 2^-133)
    expect(rt(2 ** -130 + 2 ** -149)).toBe(2 ** -130);
    expect(rt(2 ** -140)).toBe(0); // below half the smallest: zero
  });

  it('arrays: encode16/decode16 match the scalar codecs; roundToWire; packHalf moved but the same', () => {
    const values = Float32Array.from([...normals.subarray(0, 999), NaN, -0, Infinity, 1e-9, 1e30]);
    for (const dtype of ['float16', 'bfloat16'] as HalfDtype[]) {
      const bits = new Uint16Array(values.length);
      encode16(dtype, values, bits);
      const to = dtype === 'float16' ? toFloat16Bits : toBfloat16Bits;
      const from = dtype === 'float16' ? fromFloat16Bits : fromBfloat16Bits;
      values.forEach((v, i) => {
        expect(bits[i]).toBe(to(v));
      });
      const back = new Float32Array(values.length);
      decode16(dtype, bits, back);
      back.forEach((v, i) => {
        expect(Object.is(v, Math.fround(from(bits[i]!)))).toBe(true);
      });
      expect(hex(roundToWire(dtype, values.slice()))).toBe(hex(back));
      // Already rounded: rounding again changes no bit (NaNs compared as NaN).
      const again = roundToWire(dtype, back.slice());
      again.forEach((v, i) => {
        Number.isNaN(v) ? expect(back[i]).toBeNaN() : expect(bitsOf(v)).toBe(bitsOf(back[i]!));
      });
    }
    expect(stagePackHalf).toBe(packHalf);
    const odd = values.subarray(0, 7);
    expect(hex(unpackHalf(packHalf(odd), 7))).toBe(hex(roundToWire('float16', odd.slice())));
  });
});

describe('allReduce with a 16-bit wire', () => {
  for (const n of [2, 3, 4]) {
    it(`world ${n}: float16 and bfloat16, sum and avg, odd lengths: bit-identical on every rank, close to float32`, async () => {
      const pgs = await groups(n, new MemoryNetwork(), { maxFrameBytes: 1024 });
      for (const wire of ['float16', 'bfloat16'] as const) {
        const eps = wire === 'float16' ? 2 ** -11 : 2 ** -8;
        for (const op of ['sum', 'avg'] as ReduceOpName[]) {
          for (const len of [0, 1, 2, 3, 7, 1000, 4099]) {
            const outs = await Promise.all(pgs.map((pg) => pg.allReduce(input(pg.rank, len), op, { wire })));
            expect(new Set(outs.map(hex)).size).toBe(1);
            const out = outs[0]!;
            expect(out.length).toBe(len);
            // The result is a 16-bit value, rounded once by its owner.
            expect(hex(roundToWire(wire, out.slice()))).toBe(hex(out));
            const inputs = pgs.map((pg) => input(pg.rank, len));
            for (let i = 0; i < len; i++) {
              const sum = inputs.reduce((a, x) => a + x[i]!, 0);
              const abs = inputs.reduce((a, x) => a + Math.abs(x[i]!), 0);
              const want = op === 'avg' ? sum / n : sum;
              // n - 1 hops rounding a partial sum, and the final rounding.
              const bound = (eps * (n * abs)) / (op === 'avg' ? n : 1) + 1e-6;
              expect(Math.abs(out[i]! - want)).toBeLessThanOrEqual(bound);
            }
          }
        }
      }
      destroy(pgs);
    });
  }

  it('max and min with a 16-bit wire: the rounded extreme, on every rank', async () => {
    const pgs = await groups(3);
    for (const op of ['max', 'min'] as const) {
      const outs = await Promise.all(pgs.map((pg) => pg.allReduce(input(pg.rank, 101), op, { wire: 'bfloat16' })));
      expect(new Set(outs.map(hex)).size).toBe(1);
      const want = Float32Array.from({ length: 101 }, (_, i) => Math[op](...pgs.map((pg) => input(pg.rank, 101)[i]!)));
      // The extreme survives rounding as an extreme: rounding is monotonic.
      expect(hex(outs[0]!)).toBe(hex(roundToWire('bfloat16', want)));
    }
    destroy(pgs);
  });

  it('a world of one rounds as the wire would; float32 leaves the values alone', async () => {
    const [solo] = await groups(1);
    const x = input(0, 33);
    expect(hex(await solo!.allReduce(x.slice(), 'sum', { wire: 'float16' }))).toBe(hex(roundToWire('float16', x.slice())));
    expect(hex(await solo!.allReduce(x.slice(), 'sum'))).toBe(hex(x));
    solo!.destroy();
  });

  for (const n of [2, 3, 4]) {
    it(`world ${n}: a 16-bit wire sends at most 0.55 of float32's bytes; bytesSent counts exactly the frames sent`, async () => {
      const net = new MemoryNetwork();
      const pgs = await groups(n, net);
      await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(8), 'sum', { algorithm: 'ring' }))); // every link of the ring open
      const sent = countFrames(net, n);
      const len = 50_001;
      const measure = async (wire: WireDtype) => {
        const before = pgs.map((pg) => pg.bytesSent());
        const framesBefore = [...sent];
        await Promise.all(pgs.map((pg) => pg.allReduce(input(pg.rank, len), 'sum', { wire })));
        const counted = pgs.map((pg, r) => pg.bytesSent() - before[r]!);
        expect(counted).toEqual(sent.map((s, r) => s - framesBefore[r]!));
        return counted;
      };
      const f32 = await measure('float32');
      const f16 = await measure('float16');
      const bf16 = await measure('bfloat16');
      for (let r = 0; r < n; r++) {
        // 2(n-1) segments of at least len/n values each, plus a 36-byte header per 32 KiB frame.
        expect(f32[r]).toBeGreaterThanOrEqual(2 * (n - 1) * Math.floor(len / n) * 4);
        expect(f16[r]! / f32[r]!).toBeLessThanOrEqual(0.55);
        expect(f16[r]! / f32[r]!).toBeGreaterThan(0.49);
        expect(bf16[r]).toBe(f16[r]);
      }
      destroy(pgs);
    });
  }

  it('ranks that pass different wires get a CollectiveMismatchError naming both', async () => {
    const pgs = await groups(2);
    const results = await Promise.allSettled(
      pgs.map((pg) => pg.allReduce(input(pg.rank, 64), 'sum', pg.rank === 0 ? { wire: 'float16' } : {})),
    );
    for (const res of results) {
      expect(res.status).toBe('rejected');
      const err = (res as PromiseRejectedResult).reason as Error;
      expect(err).toBeInstanceOf(CollectiveMismatchError);
      expect(err.message).toMatch(/allReduce\(sum\) of 64 elements with a float16 wire/);
      expect(err.message).toMatch(/allReduce\(sum\) of 64 elements(?! with)/);
    }
    destroy(pgs);
  });

  it('an unknown wire is a RangeError before anything is sent', async () => {
    const [solo] = await groups(1);
    await expect(solo!.allReduce(new Float32Array(2), 'sum', { wire: 'int4' as WireDtype })).rejects.toThrow(
      /unknown wire dtype "int4"; use float32, float16, bfloat16, int8/,
    );
    solo!.destroy();
  });
});

// --- DDP -------------------------------------------------------------------------------------------

const data = syntheticDataset({ length: 512, inputSize: 16, numClasses: 4, seed: 3 });
const mlp = () => buildModel({ kind: 'mlp', inputShape: [16], numClasses: 4, seed: 11 });
const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);

interface Run {
  ddps: DistributedDataParallel[];
  net: MemoryNetwork;
  /** Per rank and step: `commBytes`, the counter's difference over the backward, and the frames the links carried. */
  commBytes: number[][];
  /** Per rank and step: the communication's span and the wait at the end (BackwardTimings.comm, .allreduce). */
  spans: Array<Array<{ comm: number; allreduce: number }>>;
  counterDiffs: number[][];
  frameBytes: number[][];
}

/** `steps` SGD steps of DDP on `n` ranks (rank r on its 16 samples of each 16n batch), with `hook` registered unless undefined. */
async function train(
  n: number,
  steps: number,
  hook?: () => CommHook,
  options: { bucketCapMB?: number; firstBucketCapMB?: number } = {},
): Promise<Run> {
  const net = new MemoryNetwork();
  const ddps = await Promise.all((await groups(n, net)).map((pg) => DistributedDataParallel.create(mlp(), pg, options)));
  if (hook) for (const d of ddps) d.registerCommHook(hook());
  await Promise.all(ddps.map((d) => d.pg.allReduce(new Float32Array(4)))); // every link of the ring open
  const sent = countFrames(net, n);
  const run: Run = {
    ddps,
    net,
    commBytes: ddps.map(() => []),
    spans: ddps.map(() => []),
    counterDiffs: ddps.map(() => []),
    frameBytes: ddps.map(() => []),
  };
  for (let s = 0; s < steps; s++) {
    await Promise.all(
      ddps.map(async (d, r) => {
        const { x, y } = data.batch(range(s * 16 * n + r * 16, s * 16 * n + r * 16 + 16));
        const xs = tf.tensor(x, [16, 16]);
        const ys = tf.tensor1d(y, 'int32');
        const before = d.pg.bytesSent();
        const framesBefore = sent[r]!;
        const res = await d.backward(() => classificationLoss(d.model.apply(xs) as tf.Tensor, ys, 4));
        run.commBytes[r]!.push(res.commBytes);
        run.spans[r]!.push({ comm: res.timings.comm, allreduce: res.timings.allreduce });
        run.counterDiffs[r]!.push(d.pg.bytesSent() - before);
        run.frameBytes[r]!.push(sent[r]! - framesBefore);
        tf.dispose([xs, ys]);
        d.step(tf.train.sgd(0.2));
      }),
    );
  }
  return run;
}

const flat = (d: DistributedDataParallel) => d.flatWeights();
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

describe('DistributedDataParallel communication hooks', () => {
  it('times the communication: its span covers the wait at the end, so what is hidden is span - wait', async () => {
    const run = await train(2, 3, undefined, { bucketCapMB: 0.0005, firstBucketCapMB: 0.0005 });
    for (const perStep of run.spans) {
      for (const { comm, allreduce } of perStep) {
        expect(comm).toBeGreaterThan(0);
        expect(comm + 1e-6).toBeGreaterThanOrEqual(allreduce);
      }
    }
  });

  it('fp16CompressHook: replicas stay bit-identical, training stays close to float32, at most 0.55 of the bytes', async () => {
    const steps = 6;
    // Small buckets (the MLP's 4 parameters in 3): several reductions in flight per step, as on a bigger model.
    const caps = { firstBucketCapMB: 0.0004, bucketCapMB: 0.0001 };
    const plain = await train(2, steps, undefined, caps);
    const half = await train(2, steps, fp16CompressHook, caps);
    expect(plain.ddps[0]!.buckets.map((b) => b.params)).toEqual([[3, 2], [1], [0]]);
    const [h0, h1] = await Promise.all(half.ddps.map(flat));
    expect(hex(h0!)).toBe(hex(h1!));
    const [p0] = await Promise.all(plain.ddps.map(flat));
    let maxDiff = 0;
    let moved = 0;
    const [solo] = await groups(1);
    const start = await (await DistributedDataParallel.create(mlp(), solo!)).flatWeights();
    solo!.destroy();
    for (let i = 0; i < p0!.length; i++) {
      maxDiff = Math.max(maxDiff, Math.abs(h0![i]! - p0![i]!));
      moved = Math.max(moved, Math.abs(p0![i]! - start[i]!));
    }
    expect(moved).toBeGreaterThan(1e-2);
    expect(maxDiff).toBeLessThan(moved * 0.01);
    // Bytes: what the links carried, what the counter says, what DDP reports.
    for (const run of [plain, half]) {
      for (let r = 0; r < 2; r++) {
        expect(run.commBytes[r]).toEqual(run.counterDiffs[r]);
        expect(run.commBytes[r]).toEqual(run.frameBytes[r]);
        expect(run.ddps[r]!.bytesPerStep).toBe(mean(run.commBytes[r]!));
        expect(run.ddps[r]!.syncedSteps).toBe(steps);
      }
    }
    expect(half.ddps[0]!.bytesPerStep / plain.ddps[0]!.bytesPerStep).toBeLessThanOrEqual(0.55);
    expect(half.ddps[0]!.commHook.name).toBe('fp16_compress');
    expect(plain.ddps[0]!.commHook.name).toBe('allreduce');
    for (const d of [...plain.ddps, ...half.ddps]) d.pg.destroy();
  });

  it('bf16CompressHook on 3 ranks: replicas bit-identical, half the bytes', async () => {
    const plain = await train(3, 3);
    const half = await train(3, 3, bf16CompressHook);
    const ws = await Promise.all(half.ddps.map(flat));
    expect(new Set(ws.map(hex)).size).toBe(1);
    expect(half.ddps[1]!.bytesPerStep / plain.ddps[1]!.bytesPerStep).toBeLessThanOrEqual(0.55);
    expect(half.commBytes[2]).toEqual(half.frameBytes[2]);
    for (const d of [...plain.ddps, ...half.ddps]) d.pg.destroy();
  });

  it('allreduceHook registered explicitly gives the same bits as no hook', async () => {
    const caps = { firstBucketCapMB: 0.0004, bucketCapMB: 0.0001 };
    const none = await train(2, 3, undefined, caps);
    const explicit = await train(2, 3, allreduceHook, caps);
    const [a, b] = await Promise.all([flat(none.ddps[0]!), flat(explicit.ddps[1]!)]);
    expect(hex(a)).toBe(hex(b));
    expect(explicit.commBytes).toEqual(none.commBytes);
    for (const d of [...none.ddps, ...explicit.ddps]) d.pg.destroy();
  });

  it('a hook sees every bucket in order with its layout and step, may return a new array, and keeps state', async () => {
    const seen: Array<Omit<GradBucket, 'buffer'> & { length: number }> = [];
    /** Sums (not in place) and counts the calls; its state is the count and the last averages. */
    class Counting implements CommHook {
      readonly name = 'counting';
      calls = 0;
      last: Float32Array = new Float32Array(0);
      constructor(private readonly log: boolean) {}
      async reduce(pg: ProcessGroup, bucket: GradBucket): Promise<Float32Array> {
        if (this.log)
          seen.push({
            index: bucket.index,
            parameters: bucket.parameters,
            step: bucket.step,
            isLast: bucket.isLast,
            length: bucket.buffer.length,
          });
        this.calls++;
        const copy = await pg.allReduce(bucket.buffer.slice(), 'avg');
        if (bucket.isLast) this.last = copy;
        return copy;
      }
      stateDict(): CommHookState {
        return { name: this.name, meta: { calls: this.calls }, tensors: { last: this.last } };
      }
      loadStateDict(state: CommHookState): void {
        this.calls = state.meta.calls as number;
        this.last = state.tensors.last!;
      }
    }
    const caps = { firstBucketCapMB: 0.0004, bucketCapMB: 0.0001 };
    let rank = 0;
    const run = await train(2, 2, () => new Counting(rank++ === 0), caps);
    const reference = await train(2, 2, undefined, caps);
    const [a, b] = await Promise.all([flat(run.ddps[0]!), flat(reference.ddps[0]!)]);
    expect(hex(a)).toBe(hex(b));
    const ddp = run.ddps[0]!;
    const buckets = ddp.buckets;
    expect(seen.map((s) => [s.step, s.index, s.isLast])).toEqual(
      [1, 2].flatMap((step) => buckets.map((_, i) => [step, i, i === buckets.length - 1])),
    );
    const weights = ddp.model.trainableWeights;
    for (const s of seen) {
      const bucket = buckets[s.index]!;
      expect(s.length).toBe(bucket.end - bucket.start);
      expect(s.parameters.map((p) => p.index)).toEqual(bucket.params);
      for (const p of s.parameters) {
        expect(p.shape).toEqual(weights[p.index]!.shape);
        expect(p.size).toBe(p.shape.reduce((x, y) => x * y, 1));
        expect(p.offset).toBeGreaterThanOrEqual(0);
        expect(p.offset + p.size).toBeLessThanOrEqual(s.length);
      }
    }
    const state = ddp.commHookState()!;
    expect(state.meta.calls).toBe(2 * buckets.length);
    const fresh = new Counting(false);
    const other = await DistributedDataParallel.create(mlp(), (await groups(1))[0]!);
    other.registerCommHook(fresh);
    other.loadCommHookState(state);
    expect(fresh.calls).toBe(2 * buckets.length);
    expect(() => other.loadCommHookState({ ...state, name: 'powerSGD' })).toThrow(
      /state is powerSGD's, but the registered hook is counting/,
    );
    expect(reference.ddps[0]!.commHookState()).toBeNull();
    for (const d of [...run.ddps, ...reference.ddps, other]) d.pg.destroy();
  });

  it('registering twice, or after the first backward, throws; a hook returning the wrong length fails the backward', async () => {
    const [solo] = await groups(1);
    const ddp = await DistributedDataParallel.create(mlp(), solo!);
    ddp.registerCommHook(fp16CompressHook());
    expect(() => ddp.registerCommHook(bf16CompressHook())).toThrow(
      /already registered \(fp16_compress\); registerCommHook can only be called once/,
    );

    const late = await DistributedDataParallel.create(mlp(), solo!, { name: 'late' });
    const { x, y } = data.batch(range(0, 8));
    const xs = tf.tensor(x, [8, 16]);
    const ys = tf.tensor1d(y, 'int32');
    await late.backward(() => classificationLoss(late.model.apply(xs) as tf.Tensor, ys, 4));
    expect(() => late.registerCommHook(fp16CompressHook())).toThrow(/before the first backward/);

    const bad = await DistributedDataParallel.create(mlp(), solo!, { name: 'bad' });
    bad.registerCommHook({ name: 'short', reduce: async () => new Float32Array(1) });
    await expect(bad.backward(() => classificationLoss(bad.model.apply(xs) as tf.Tensor, ys, 4))).rejects.toThrow(
      errorOf(TypeError, /short returned 1 values for bucket 0/),
    );
    tf.dispose([xs, ys]);
    solo!.destroy();
  });

  it('startStep numbers the steps hooks see; noSync backwards call no hook', async () => {
    const [solo] = await groups(1);
    const steps: number[] = [];
    const ddp = await DistributedDataParallel.create(mlp(), solo!, { startStep: 41 });
    ddp.registerCommHook({
      name: 'steps',
      reduce: async (_pg, b) => {
        steps.push(b.step);
        return b.buffer;
      },
    });
    const { x, y } = data.batch(range(0, 8));
    const xs = tf.tensor(x, [8, 16]);
    const ys = tf.tensor1d(y, 'int32');
    const loss = () => classificationLoss(ddp.model.apply(xs) as tf.Tensor, ys, 4);
    await ddp.backward(loss);
    ddp.step(tf.train.sgd(0.1));
    const accumulated = await ddp.noSync(() => ddp.backward(loss));
    expect(accumulated.commBytes).toBe(0);
    await ddp.backward(loss);
    expect(steps).toEqual([41, 42]);
    expect(ddp.syncedSteps).toBe(2);
    tf.dispose([xs, ys]);
    solo!.destroy();
  });
});
