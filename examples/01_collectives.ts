/**
 * The collectives, as torch.distributed has them: all-reduce, broadcast, all-gather and
 * send/recv between ranks. Every rank checks that it got exactly the right numbers.
 *
 *   npm run launch -- --nproc 3 examples/01_collectives.ts
 */
import { initProcessGroup } from '../src/index.ts';
import type { LaunchContext } from '../src/index.ts';

export default async function main(ctx: LaunchContext) {
  const pg = await initProcessGroup({
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    worldSize: ctx.nproc,
    timeoutMs: ctx.timeoutMs,
  });
  const { rank, worldSize: n } = pg;
  const check = (what: string, got: Float32Array, want: number[]) => {
    if (got.length !== want.length || want.some((w, i) => got[i] !== w))
      throw new Error(`${what} on rank ${rank}: got [${[...got]}], want [${want}]`);
    ctx.log(`${what}: [${[...got]}]`);
  };
  const range = (length: number, f: (i: number) => number) => Array.from({ length }, (_, i) => f(i));

  // Every rank holds [rank, rank + 1, rank + 2]; the sum over ranks is known in advance.
  check(
    'allReduce sum',
    await pg.allReduce(Float32Array.from(range(3, (i) => rank + i)), 'sum'),
    range(3, (i) => n * i + (n * (n - 1)) / 2),
  );
  check('allReduce max', await pg.allReduce(Float32Array.of(rank), 'max'), [n - 1]);
  // The last rank's numbers, everywhere.
  check('broadcast', await pg.broadcast(rank === n - 1 ? Float32Array.of(7, 8, 9) : new Float32Array(3), n - 1), [7, 8, 9]);
  // Everyone's rank, in rank order.
  check(
    'allGather',
    await pg.allGather(Float32Array.of(rank * 10)),
    range(n, (r) => r * 10),
  );
  // Around the ring: send to the right, receive from the left.
  const fromLeft = new Float32Array(1);
  await Promise.all([pg.send(Float32Array.of(rank), (rank + 1) % n), pg.recv(fromLeft, (rank + n - 1) % n)]);
  check('send/recv', fromLeft, [(rank + n - 1) % n]);

  await pg.barrier();
  pg.destroy();
  return { worldSize: n, checks: 5 };
}
