/**
 * The page side of `npm run bench:rpc` (bench/rpc.ts): on 2 ranks, rank 0 times round trips to
 * rank 1 of the same bytes three ways: an RPC whose function returns its argument, and send/recv
 * there and back (rank 1 receives and sends back). Small (4 bytes) and large (1 MiB); the median
 * of each, after a warm-up.
 */
import { initProcessGroup, initRpc, intArg, rpc, type LaunchContext } from '../src/index.ts';

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

export default async function main(ctx: LaunchContext) {
  const pg = await initProcessGroup({ url: ctx.url, session: ctx.session, token: ctx.token, worldSize: 2, timeoutMs: ctx.timeoutMs });
  const agent = await initRpc({ group: pg, name: (r) => `w${r}`, functions: { echo: (x: unknown) => x } });
  const iters = intArg(ctx.args, 'iters', 50);
  const sizes = [1, 262_144]; // float32 elements: 4 B and 1 MiB
  const result: Record<string, unknown> = {};
  for (const n of sizes) {
    const buf = new Float32Array(n).fill(1);
    const times = { rpc: [] as number[], sendRecv: [] as number[] };
    for (let i = 0; i < iters + 5; i++) {
      if (agent.rank === 0) {
        let t = performance.now();
        await rpc.rpcSync(1, 'echo', [buf]);
        if (i >= 5) times.rpc.push(performance.now() - t);
        t = performance.now();
        await pg.send(buf, 1);
        await pg.recv(buf, 1);
        if (i >= 5) times.sendRecv.push(performance.now() - t);
      } else {
        await pg.recv(buf, 0);
        await pg.send(buf, 0);
      }
    }
    if (agent.rank === 0) result[`${n * 4}`] = { rpcMs: median(times.rpc), sendRecvMs: median(times.sendRecv) };
  }
  await rpc.shutdown();
  await pg.destroy();
  return { roundTrips: result, iters };
}
