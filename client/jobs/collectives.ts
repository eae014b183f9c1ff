/**
 * Job `collectives`: a self-check of every collective over real WebRTC. Each rank computes the
 * exact expected result of each case and reports whether it got it, with a hash of what it got
 * so that the caller can check every rank is bit-identical. With `loop=N` it runs N checked
 * all-reduces of `loopSize` elements instead: a group that is always mid-collective, for fault tests.
 */
import type { ProcessGroup, ReduceOpName } from '../../src/index.ts';
import { hashFloat32 } from '../../src/wire/hash.ts';
import { fillValue } from './allreduce.ts';
import { joinGroup, type JobContext } from './job.ts';

interface Case {
  name: string;
  ok: boolean;
  hash: string;
  detail?: string;
}

export async function collectivesJob(ctx: JobContext): Promise<Record<string, unknown>> {
  const sizes = (ctx.params.get('sizes') ?? '0,1,7,1000,65537').split(',').map(Number);
  // Small frames by default, so that even modest sizes cross many chunk boundaries.
  const pg = await joinGroup(ctx, { maxFrameBytes: 16_384 });
  const { rank, worldSize: n } = pg;
  const fill = (r: number, size: number) => Float32Array.from({ length: size }, (_, i) => fillValue(r, size, i));
  const loop = ctx.params.get('loop');
  if (loop !== null)
    return allReduceLoop(ctx, pg, positive(loop, 'loop'), positive(ctx.params.get('loopSize') ?? '65537', 'loopSize'), fill);
  const cases: Case[] = [];
  const check = (name: string, got: Float32Array, want: Float32Array) => {
    let bad = -1;
    if (got.length !== want.length) bad = 0;
    else for (let i = 0; i < want.length && bad < 0; i++) if (!Object.is(got[i], want[i])) bad = i;
    cases.push({
      name,
      ok: bad < 0,
      hash: hashFloat32(got),
      ...(bad >= 0 ? { detail: `first difference at ${bad}: got ${got[bad]}, want ${want[bad]}` } : {}),
    });
  };

  for (const op of ['sum', 'avg', 'max', 'min'] as ReduceOpName[]) {
    for (const size of sizes) {
      const want = fill(0, size);
      for (let r = 1; r < n; r++) {
        const v = fill(r, size);
        for (let i = 0; i < size; i++)
          want[i] = op === 'max' ? Math.max(want[i], v[i]) : op === 'min' ? Math.min(want[i], v[i]) : want[i] + v[i];
      }
      if (op === 'avg') for (let i = 0; i < size; i++) want[i] /= n;
      // The algorithm the tuner picks, then each one forced: the same exact values either way.
      check(`allReduce ${op} ${size}`, await pg.allReduce(fill(rank, size), op), want);
      for (const algorithm of ['ring', 'doubling'] as const) {
        if (size <= 1000) check(`allReduce ${op} ${size} ${algorithm}`, await pg.allReduce(fill(rank, size), op, { algorithm }), want);
      }
    }
  }
  for (const src of [0, n - 1]) {
    const size = 10_001;
    for (const algorithm of ['ring', 'doubling'] as const) {
      check(
        `broadcast src ${src} ${algorithm}`,
        await pg.broadcast(rank === src ? fill(src, size) : new Float32Array(size), src, { algorithm }),
        fill(src, size),
      );
    }
  }
  const wantGather = new Float32Array(333 * n);
  for (let r = 0; r < n; r++) wantGather.set(fill(r, 333), r * 333);
  for (const algorithm of ['ring', 'doubling'] as const)
    check(`allGather 333 ${algorithm}`, await pg.allGather(fill(rank, 333), { algorithm }), wantGather);
  const k = 257;
  const full = new Float32Array(k * n);
  for (let r = 0; r < n; r++) {
    const v = fill(r, k * n);
    for (let i = 0; i < full.length; i++) full[i] += v[i];
  }
  const scattered = await pg.reduceScatter(fill(rank, k * n), 'sum');
  cases.push({ ...caseOf(scattered, full.subarray(rank * k, (rank + 1) * k)), name: 'reduceScatter sum (own block)', hash: 'per-rank' });
  // Point to point around the ring: send to the right, receive from the left.
  const right = (rank + 1) % n;
  const left = (rank + n - 1) % n;
  const got = new Float32Array(4097);
  await Promise.all([pg.send(fill(rank, 4097), right), pg.recv(got, left)]);
  cases.push({ ...caseOf(got, fill(left, 4097)), name: 'send/recv ring', hash: 'per-rank' });
  await pg.barrier();
  pg.destroy();
  return { rank, worldSize: n, cases };
}

function positive(raw: string, name: string): number {
  const v = Number(raw);
  if (!Number.isSafeInteger(v) || v < 1) throw new Error(`--${name} must be a positive integer, got "${raw}"`);
  return v;
}

/** `iterations` all-reduces (sum) of `size` elements, each checked; a line of progress every 50. */
async function allReduceLoop(
  ctx: JobContext,
  pg: ProcessGroup,
  iterations: number,
  size: number,
  fill: (r: number, size: number) => Float32Array,
): Promise<Record<string, unknown>> {
  const want = fill(0, size);
  for (let r = 1; r < pg.worldSize; r++) {
    const v = fill(r, size);
    for (let i = 0; i < size; i++) want[i] += v[i];
  }
  const mine = fill(pg.rank, size);
  for (let it = 1; it <= iterations; it++) {
    const got = await pg.allReduce(mine.slice(), 'sum');
    const bad = caseOf(got, want);
    if (!bad.ok) throw new Error(`all-reduce ${it} of the loop is wrong: ${bad.detail ?? 'length differs'}`);
    if (it % 50 === 0) ctx.log(`loop: ${it} all-reduces of ${size} elements`);
  }
  await pg.barrier();
  pg.destroy();
  return { rank: pg.rank, worldSize: pg.worldSize, iterations, size };
}

function caseOf(got: Float32Array, want: Float32Array): { ok: boolean; detail?: string } {
  for (let i = 0; i < want.length; i++) if (!Object.is(got[i], want[i])) return { ok: false, detail: `first difference at ${i}` };
  return { ok: got.length === want.length };
}
