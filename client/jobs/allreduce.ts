/**
 * Job `allreduce`: times the all-reduce (the algorithm the tuner picks, or `--algorithm`; with
 * `--compare-algorithms` the ring and recursive doubling both; and, for comparison, a full-mesh
 * exchange) over the sizes given, as nccl-tests do (iterations back to back after a sync, their
 * mean; also one alone after a barrier), checks every result exactly, and measures one link's
 * throughput, the bound the ring's bus bandwidth is held against (nccl-tests' definitions, see
 * DESIGN.md).
 */
import type { ProcessGroup, ReduceOpName } from '../../src/index.ts';
import { hashFloat32 } from '../../src/wire/hash.ts';
import { joinGroup, type JobContext } from './job.ts';
import { linkReport } from '../report.ts';

/** Small integers, so that sums are exact in float32 and every rank knows the exact answer. */
export function fillValue(rank: number, size: number, i: number): number {
  return ((i * 7 + rank * 13 + size) % 17) - 8;
}

function expectedValue(worldSize: number, size: number, i: number, op: ReduceOpName): number {
  let acc = fillValue(0, size, i);
  for (let r = 1; r < worldSize; r++) {
    const v = fillValue(r, size, i);
    acc = op === 'max' ? Math.max(acc, v) : op === 'min' ? Math.min(acc, v) : acc + v;
  }
  return op === 'avg' ? Math.fround(acc / worldSize) : acc;
}

/** Above this many ranks the mesh comparison runs only when asked for (--mesh true). */
const MESH_DEFAULT_MAX = 16;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/**
 * Rank 0 streams `bytes` to rank 1 `rounds` times; rank 1 acknowledges each. Returns MB/s
 * (median) on rank 0. With `duplex`, rank 1 streams to rank 0 at the same time, as every link
 * of a ring does, and the figure is per direction.
 */
export async function measureLink(pg: ProcessGroup, duplex = false, bytes = 8 << 20, rounds = 3): Promise<number | null> {
  if (pg.worldSize < 2) return null;
  const out = new Float32Array(bytes / 4);
  const inbox = new Float32Array(bytes / 4);
  const ack = new Float32Array(1);
  const rates: number[] = [];
  for (let i = 0; i < rounds; i++) {
    if (pg.rank === 0) {
      const t0 = performance.now();
      await Promise.all([pg.send(out, 1), duplex ? pg.recv(inbox, 1) : undefined]);
      await pg.recv(ack, 1);
      rates.push(bytes / 1e6 / ((performance.now() - t0) / 1000));
    } else if (pg.rank === 1) {
      await Promise.all([pg.recv(inbox, 0), duplex ? pg.send(out, 0) : undefined]);
      await pg.send(ack, 0);
    }
  }
  return pg.rank === 0 ? median(rates) : null;
}

/** The job's options (--sizes, --iters, --op, --mesh, --measure-link, --algorithm, --compare-algorithms), checked. */
function allreduceOptions(params: URLSearchParams): {
  sizes: number[];
  iters: number;
  op: ReduceOpName;
  meshParam: string | null;
  measureParam: string | null;
  forced: 'auto' | 'ring' | 'doubling' | 'tree';
  compare: boolean;
} {
  const sizes = (params.get('sizes') ?? '1024,262144,1048576').split(',').map((s) => {
    const n = Number(s.trim());
    if (!Number.isInteger(n) || n < 0) throw new Error(`--sizes takes element counts, got "${s}"`);
    return n;
  });
  const iters = Number(params.get('iters') ?? 5);
  if (!Number.isInteger(iters) || iters < 1) throw new Error(`--iters must be a positive integer, got ${params.get('iters')}`);
  const op = (params.get('op') ?? 'sum') as ReduceOpName;
  if (!['sum', 'avg', 'max', 'min'].includes(op)) throw new Error(`--op must be sum, avg, max or min, got "${op}"`);
  const meshParam = params.get('mesh');
  if (meshParam !== null && meshParam !== 'true' && meshParam !== 'false')
    throw new Error(`--mesh must be true or false, got "${meshParam}"`);
  // 2 x 24 MiB over one link: a minute where a round trip holds the link to one credit window a trip.
  const measureParam = params.get('measure-link');
  if (measureParam !== null && measureParam !== 'true' && measureParam !== 'false')
    throw new Error(`--measure-link must be true or false, got "${measureParam}"`);
  const forced = params.get('algorithm') ?? 'auto';
  if (forced !== 'auto' && forced !== 'ring' && forced !== 'doubling' && forced !== 'tree')
    throw new Error(`--algorithm must be auto, ring, doubling or tree, got "${forced}"`);
  // Also time both algorithms, whichever the tuner picks: where the threshold should be.
  const compare = params.has('compare-algorithms') && params.get('compare-algorithms') !== 'false';
  return { sizes, iters, op, meshParam, measureParam, forced, compare };
}

/**
 * Timers of one size's all-reduce over `template`: nccl-tests' figure (`iters` back to back after a
 * warm-up and a sync over the wire, their mean) and the median of each alone after the store's barrier.
 */
function allreduceTimers(pg: ProcessGroup, template: Float32Array, iters: number) {
  // nccl-tests' figure: after a warm-up and a sync over the wire, `iters` back to back, their mean.
  const time = async (fn: (b: Float32Array) => Promise<Float32Array>): Promise<{ ms: number; out: Float32Array }> => {
    await fn(template.slice());
    const bufs = Array.from({ length: iters }, () => template.slice());
    await pg.allReduce(new Float32Array(1), 'sum', { algorithm: 'doubling' });
    const t0 = performance.now();
    let out: Float32Array = template;
    for (const buf of bufs) out = await fn(buf);
    return { ms: (performance.now() - t0) / iters, out };
  };
  // Each alone after the store's barrier, the median: adds the ranks' skew leaving the barrier
  // (its release reaches 16 pages sharing 2 cores over tens of ms).
  const timeAfterBarrier = async (fn: (b: Float32Array) => Promise<Float32Array>): Promise<number> => {
    const times: number[] = [];
    for (let it = 0; it < iters; it++) {
      const buf = template.slice();
      await pg.barrier();
      const t0 = performance.now();
      await fn(buf);
      times.push(performance.now() - t0);
    }
    return median(times);
  };
  return { time, timeAfterBarrier };
}

export async function allreduceJob(ctx: JobContext): Promise<Record<string, unknown>> {
  const { sizes, iters, op, meshParam, measureParam, forced, compare } = allreduceOptions(ctx.params);
  const pg = await joinGroup(ctx);
  const n = pg.worldSize;
  // The mesh opens n(n-1)/2 links at once: past MESH_DEFAULT_MAX ranks that is the ring's point, not a useful comparison.
  const mesh = meshParam === null ? n <= MESH_DEFAULT_MAX : meshParam === 'true';
  if (meshParam === null && !mesh)
    ctx.log(`no mesh comparison at ${n} ranks (it would open ${(n * (n - 1)) / 2} links): --mesh true asks for it`);
  // Open every link either algorithm uses before timing anything.
  await pg.allReduce(new Float32Array(n), op, { algorithm: 'ring' });
  await pg.allReduce(new Float32Array(n), op, { algorithm: 'doubling' });
  if (forced === 'tree') await pg.allReduce(new Float32Array(n), op, { algorithm: 'tree' });
  const measure = measureParam !== 'false';
  const linkMBps = measure ? await measureLink(pg) : null;
  const duplexMBps = measure ? await measureLink(pg, true) : null;
  if (linkMBps !== null)
    ctx.log(`link 0->1: ${linkMBps.toFixed(1)} MB/s alone, ${duplexMBps?.toFixed(1)} MB/s each way in both directions at once`);
  await pg.barrier();

  const results: Array<Record<string, unknown>> = [];
  for (const size of sizes) {
    const template = Float32Array.from({ length: size }, (_, i) => fillValue(pg.rank, size, i));
    const { time, timeAfterBarrier } = allreduceTimers(pg, template, iters);
    const algorithm = pg.algorithmFor(size * 4, forced, true);
    const run = await time((b) => pg.allReduce(b, op, { algorithm: forced }));
    const afterBarrierMs = await timeAfterBarrier((b) => pg.allReduce(b, op, { algorithm: forced }));
    let maxAbsErr = 0;
    for (let i = 0; i < size; i++) maxAbsErr = Math.max(maxAbsErr, Math.abs(run.out[i] - expectedValue(n, size, i, op)));
    const ringRun = compare && n > 1 ? await time((b) => pg.allReduce(b, op, { algorithm: 'ring' })) : undefined;
    const doublingRun = compare && n > 1 ? await time((b) => pg.allReduce(b, op, { algorithm: 'doubling' })) : undefined;
    const meshRun = mesh && n > 1 ? await time((b) => pg.meshAllReduce(b, op)) : undefined;
    const row = {
      elements: size,
      bytes: size * 4,
      algorithm,
      ms: run.ms,
      afterBarrierMs,
      ringMs: ringRun?.ms ?? null,
      doublingMs: doublingRun?.ms ?? null,
      meshMs: meshRun?.ms ?? null,
      maxAbsErr,
      hash: hashFloat32(run.out),
    };
    const also = [
      ringRun && `ring ${ringRun.ms.toFixed(2)} ms`,
      doublingRun && `doubling ${doublingRun.ms.toFixed(2)} ms`,
      meshRun && `mesh ${meshRun.ms.toFixed(2)} ms`,
    ].filter(Boolean);
    ctx.log(
      `${size} elements: ${algorithm} ${run.ms.toFixed(2)} ms (one alone after a barrier: ${afterBarrierMs.toFixed(2)} ms)${also.length ? `, ${also.join(', ')}` : ''}, max abs err ${maxAbsErr}`,
    );
    results.push(row);
  }
  // Before the barrier: every link is still open here.
  const links = await linkReport(pg);
  ctx.log(`links: ${links.map((l) => `to ${l.peer} ${l.local ?? '?'}/${l.remote ?? '?'} ${l.rttMs ?? '?'} ms`).join(', ') || 'none'}`);
  await pg.barrier();
  pg.destroy();
  return { rank: pg.rank, worldSize: n, op, iters, linkMBps, duplexMBps, results, links };
}
