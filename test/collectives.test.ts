/**
 * The collectives' logic in Node: real server for rendezvous, in-memory peer links (the same
 * PeerLink interface as WebRTC) so every size and world size runs fast. The WebRTC path is
 * proven by the Playwright tests in test/e2e/collectives.spec.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup, ReduceOpName } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { CollectiveAbortedError, CollectiveMismatchError, PeerLostError, RankStalledError, isRecoverable } from '../src/wire/errors.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { sleep, waitFor } from './fixtures/wait.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
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
  extra: { peerTimeoutMs?: number; stallTimeoutMs?: number; maxFrameBytes?: number; highWaterMark?: number } = {},
): Promise<{ pgs: ProcessGroup[]; net: MemoryNetwork }> {
  const session = uniqueSession('coll');
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

/** Small integers: sums are exact in float32, so expected values are exact. */
const value = (rank: number, i: number) => ((i * 7 + rank * 13) % 17) - 8;
const input = (rank: number, len: number) => Float32Array.from({ length: len }, (_, i) => value(rank, i));

function expected(n: number, len: number, op: ReduceOpName): Float32Array {
  return Float32Array.from({ length: len }, (_, i) => {
    const vs = Array.from({ length: n }, (_, r) => value(r, i));
    if (op === 'max') return Math.max(...vs);
    if (op === 'min') return Math.min(...vs);
    const sum = vs.reduce((a, b) => a + b, 0);
    return op === 'avg' ? sum / n : sum;
  });
}

function destroy(pgs: ProcessGroup[]): void {
  for (const p of pgs) p.destroy();
}

describe('collectives over in-memory links', () => {
  for (const n of [2, 3, 4]) {
    it(`allReduce, every op and odd lengths, world ${n}: exact and bit-identical`, async () => {
      const { pgs } = await groups(n, { maxFrameBytes: 1024 });
      for (const op of ['sum', 'avg', 'max', 'min'] as const) {
        for (const len of [0, 1, 2, 7, 1000, 4099]) {
          const outs = await Promise.all(pgs.map((pg) => pg.allReduce(input(pg.rank, len), op)));
          const want = expected(n, len, op);
          for (const out of outs) expect(out).toEqual(want);
          const bytes = outs.map((o) => Buffer.from(o.buffer, o.byteOffset, o.byteLength).toString('hex'));
          expect(new Set(bytes).size).toBe(1);
        }
      }
      destroy(pgs);
    });
  }

  it('meshAllReduce gives the same results as the ring', async () => {
    const { pgs } = await groups(3, { maxFrameBytes: 1024 });
    const outs = await Promise.all(pgs.map((pg) => pg.meshAllReduce(input(pg.rank, 777), 'avg')));
    for (const out of outs) expect(out).toEqual(expected(3, 777, 'avg'));
    destroy(pgs);
  });

  it('broadcast from every source, pipelined through the ring', async () => {
    const { pgs } = await groups(4, { maxFrameBytes: 256 });
    for (const src of [0, 1, 3]) {
      const outs = await Promise.all(pgs.map((pg) => pg.broadcast(pg.rank === src ? input(src, 1001) : new Float32Array(1001), src)));
      for (const out of outs) expect(out).toEqual(input(src, 1001));
    }
    destroy(pgs);
  });

  it('allGather concatenates in rank order; reduceScatter gives rank r block r', async () => {
    const { pgs } = await groups(3);
    const gathered = await Promise.all(pgs.map((pg) => pg.allGather(input(pg.rank, 5))));
    const want = Float32Array.from([...input(0, 5), ...input(1, 5), ...input(2, 5)]);
    for (const g of gathered) expect(g).toEqual(want);
    const scattered = await Promise.all(pgs.map((pg) => pg.reduceScatter(input(pg.rank, 12), 'sum')));
    const full = expected(3, 12, 'sum');
    scattered.forEach((s, r) => {
      expect(s).toEqual(full.slice(r * 4, r * 4 + 4));
    });
    await expect(pgs[0].reduceScatter(new Float32Array(7))).rejects.toThrow(errorOf(RangeError, /divisible by the world size 3, got 7/));
    destroy(pgs);
  });

  it('send and recv match in order between a pair; lengths must agree', async () => {
    const { pgs } = await groups(3);
    const a = new Float32Array([1, 2, 3]);
    const b = new Float32Array([4, 5]);
    const got1 = new Float32Array(3);
    const got2 = new Float32Array(2);
    await Promise.all([pgs[0].send(a, 2), pgs[0].send(b, 2), pgs[2].recv(got1, 0), pgs[2].recv(got2, 0)]);
    expect([...got1]).toEqual([1, 2, 3]);
    expect([...got2]).toEqual([4, 5]);
    const err = await Promise.all([pgs[1].send(new Float32Array(4), 0), pgs[0].recv(new Float32Array(3), 1)]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CollectiveMismatchError);
    destroy(pgs);
  });

  it('a world of one returns its input for every collective', async () => {
    const { pgs } = await groups(1);
    const pg = pgs[0];
    expect([...(await pg.allReduce(new Float32Array([3]), 'avg'))]).toEqual([3]);
    expect([...(await pg.broadcast(new Float32Array([4]), 0))]).toEqual([4]);
    expect([...(await pg.allGather(new Float32Array([5])))]).toEqual([5]);
    expect([...(await pg.reduceScatter(new Float32Array([6]), 'max'))]).toEqual([6]);
    destroy(pgs);
  });
});

describe('mismatch detection', () => {
  it('different lengths: every rank rejects naming both collectives, no hang', async () => {
    const { pgs } = await groups(3);
    const results = await Promise.allSettled(pgs.map((pg) => pg.allReduce(new Float32Array(pg.rank === 1 ? 20 : 10))));
    for (const r of results) {
      expect(r.status).toBe('rejected');
      const err = (r as PromiseRejectedResult).reason as Error;
      expect(err).toBeInstanceOf(CollectiveMismatchError);
      expect(err.message).toMatch(/allReduce\(sum\) of (10|20) elements/);
    }
    destroy(pgs);
  });

  it('different ops: rejects naming the ops', async () => {
    const { pgs } = await groups(2);
    const results = await Promise.allSettled([pgs[0].allReduce(new Float32Array(4), 'sum'), pgs[1].allReduce(new Float32Array(4), 'max')]);
    const messages = results.map((r) => ((r as PromiseRejectedResult).reason as Error).message);
    for (const m of messages) expect(m).toMatch(/allReduce\(max\).*allReduce\(sum\)|allReduce\(sum\).*allReduce\(max\)/);
    destroy(pgs);
  });

  it('different collectives at the same sequence number: rejects, even for zero-length buffers', async () => {
    const { pgs } = await groups(2);
    const results = await Promise.allSettled([pgs[0].allReduce(new Float32Array(0)), pgs[1].broadcast(new Float32Array(0), 0)]);
    for (const r of results) expect((r as PromiseRejectedResult).reason).toBeInstanceOf(CollectiveMismatchError);
    destroy(pgs);
  });

  it('a corrupted chunk breaks the collective with a FramingError instead of wrong numbers', async () => {
    const { pgs, net } = await groups(2, { maxFrameBytes: 256 });
    await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(4))));
    const link = net.end(0, 1)!;
    let sent = 0;
    link.intercept = (f) => (++sent === 2 ? [f, f] : [f]); // a duplicated chunk
    const results = await Promise.allSettled(pgs.map((pg) => pg.allReduce(new Float32Array(1000))));
    const reasons = results.map((r) => (r.status === 'rejected' ? (r.reason as Error).message : 'ok'));
    expect(reasons.some((m) => /duplicate chunk/.test(m))).toBe(true);
    expect(results.every((r) => r.status === 'rejected')).toBe(true);
    destroy(pgs);
  });
});

describe('failure', () => {
  it('a peer that vanishes mid-collective makes every survivor reject naming it, within the bound', async () => {
    const { pgs } = await groups(4, { peerTimeoutMs: 1_000 });
    // The ring's links open first (the collective below runs on the ring): the peer vanishes mid-collective, not mid-handshake.
    await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(10), 'sum', { algorithm: 'ring' })));
    const t0 = Date.now();
    // Rank 2 never joins the next collective and goes away.
    const survivors = [0, 1, 3].map((r) => pgs[r].allReduce(new Float32Array(100000)));
    // A scenario, not an order: the survivors' calls are all made, and rank 2 going at any time after them ends the same way.
    void sleep(100).then(() => pgs[2].destroy());
    const results = await Promise.allSettled(survivors);
    for (const r of results) {
      expect(r.status).toBe('rejected');
      const err = (r as PromiseRejectedResult).reason as PeerLostError;
      expect(err).toBeInstanceOf(PeerLostError);
      expect(err.rank).toBe(2);
    }
    expect(Date.now() - t0).toBeLessThan(3_000);
    // The group is broken for good: later calls fail at once, naming the lost rank.
    await expect(pgs[0].allReduce(new Float32Array(1))).rejects.toThrow(errorOf(PeerLostError, /lost rank 2/));
    destroy(pgs);
  });

  it('a link whose send queue stops draining fails the sender after peerTimeoutMs, naming the peer', async () => {
    const session = uniqueSession('stall');
    const net = new MemoryNetwork();
    // Rank 1 waits longer, so the failure seen first is rank 0's full send queue, not rank 1's silence.
    const pgs = await Promise.all(
      [500, 10_000].map((peerTimeoutMs, rank) =>
        initProcessGroup({
          url: server.url,
          session,
          token: tokenFor(session),
          worldSize: 2,
          rank,
          timeoutMs: 5_000,
          linkFactory: net.factoryFor(rank),
          peerTimeoutMs,
          highWaterMark: 4096,
          maxFrameBytes: 1024,
        }),
      ),
    );
    await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(4))));
    net.end(0, 1)!.stall();
    const t0 = Date.now();
    const other = pgs[1].allReduce(new Float32Array(100_000)).catch(() => {});
    const err = (await pgs[0].allReduce(new Float32Array(100_000)).then(
      () => new Error('the all-reduce finished over a link that took nothing'),
      (e: unknown) => e,
    )) as PeerLostError;
    const waited = Date.now() - t0;
    expect(err).toBeInstanceOf(PeerLostError);
    expect(err.rank).toBe(1);
    expect(err.message).toMatch(/its link did not take data for 500 ms \(\d+ bytes queued\)/);
    expect(waited).toBeGreaterThanOrEqual(450);
    expect(waited).toBeLessThan(3_000);
    destroy(pgs);
    await other;
  });

  it('a send waiting on a full queue fails with the lost rank, not with what closing the group did to its links', async () => {
    const { pgs, net } = await groups(3, { peerTimeoutMs: 10_000, highWaterMark: 4096, maxFrameBytes: 1024 });
    await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(4))));
    net.end(0, 1)!.stall(); // rank 0's send to rank 1 waits for a drain that never comes
    const results = pgs.map((pg) =>
      pg.allReduce(new Float32Array(30_000)).then(
        () => new Error('finished'),
        (e: unknown) => e as Error,
      ),
    );
    await waitFor("rank 0's send to rank 1 to wait on its full queue", () => net.end(0, 1)!.buffered > 4096);
    // Rank 2's destroy aborts its collective and tells its peers so (its links stay open for its bye), then the server tells them it left and forms a new round, which closes their groups.
    void pgs[2].destroy();
    const err = await results[0];
    expect(err).toBeInstanceOf(CollectiveAbortedError);
    expect((err as CollectiveAbortedError).origin).toBe(2);
    expect(err!.message).toMatch(/rank 2 aborted collective #\d+: .*the process group was destroyed/);
    destroy(pgs);
    await Promise.all(results);
  });

  it('a silent peer (no close) is declared lost after peerTimeoutMs', async () => {
    const { pgs } = await groups(2, { peerTimeoutMs: 300 });
    const t0 = Date.now();
    const err = (await pgs[0].allReduce(new Float32Array(8)).catch((e: unknown) => e)) as PeerLostError;
    expect(err).toBeInstanceOf(PeerLostError);
    expect(err.rank).toBe(1);
    expect(err.message).toMatch(/sent nothing for 300 ms/);
    expect(Date.now() - t0).toBeLessThan(2_000);
    destroy(pgs);
  });
});

describe('liveness', () => {
  it('a peer that sends nothing at all (a paused page) is lost as stalled within stallTimeoutMs, naming it and the collective', async () => {
    const { pgs, net } = await groups(2, { peerTimeoutMs: 20_000, stallTimeoutMs: 1_500 });
    await Promise.all(pgs.map((pg) => pg.allReduce(Float32Array.of(1)))); // links open, both alive
    net.end(1, 0)!.stall(); // from now on nothing of rank 1 reaches rank 0, liveness frames included
    const t0 = Date.now();
    const err = (await pgs[0]!.allReduce(Float32Array.of(1)).catch((e: unknown) => e)) as PeerLostError;
    expect(err).toBeInstanceOf(PeerLostError);
    expect(err.rank).toBe(1);
    expect(err.message).toMatch(/stalled: no sign of life for \d+ ms .* while this rank waited for allReduce\(sum\) of 1 elements #2/);
    expect(Date.now() - t0).toBeLessThan(5_000);
    for (const pg of pgs) pg.destroy();
  });

  it('a rank whose own page stops running past stallTimeoutMs fails with RankStalledError, naming itself and what it waited for', async () => {
    const { pgs } = await groups(2, { peerTimeoutMs: 20_000, stallTimeoutMs: 1_000 });
    await Promise.all(pgs.map((pg) => pg.allReduce(Float32Array.of(1))));
    const waiting = pgs[0]!.allReduce(Float32Array.of(1)).then(
      () => new Error('finished'),
      (e: unknown) => e as Error,
    );
    // A long synchronous block: this process's ticks stop, as a frozen tab's do (both ranks live
    // here, so both were paused).
    const until = Date.now() + 1_600;
    while (Date.now() < until) {
      /* blocked */
    }
    const err = (await waiting) as RankStalledError;
    expect(err).toBeInstanceOf(RankStalledError);
    expect(err.rank).toBe(0);
    expect(err.stalledMs).toBeGreaterThan(1_000);
    expect(err.during).toBe('waiting for allReduce(sum) of 1 elements #2');
    expect(err.message).toMatch(
      /^this tab \(rank 0\) was paused for 1\.\d s \(the browser froze it, the computer slept, or a script blocked the page\) while it was waiting for allReduce\(sum\) of 1 elements #2: the other ranks have gone on without it$/,
    );
    expect(isRecoverable(err)).toBe(true);
    // Rank 1 was between collectives; its group failed the same way, and later calls say so.
    await expect(pgs[1]!.allReduce(Float32Array.of(1))).rejects.toThrow(
      errorOf(RankStalledError, /this tab \(rank 1\) was paused .* while it was between collectives/),
    );
    for (const pg of pgs) pg.destroy();
  });

  it('a peer that is alive but late (busy elsewhere) is waited for past stallTimeoutMs', async () => {
    const { pgs } = await groups(2, { peerTimeoutMs: 20_000, stallTimeoutMs: 1_000 });
    await Promise.all(pgs.map((pg) => pg.allReduce(Float32Array.of(1))));
    const early = pgs[0]!.allReduce(Float32Array.of(2));
    await sleep(3_000); // the behaviour under test: rank 1 is busy for three stall bounds, but its liveness frames arrive
    const late = pgs[1]!.allReduce(Float32Array.of(3));
    expect(Array.from(await early)).toEqual([5]);
    expect(Array.from(await late)).toEqual([5]);
    for (const pg of pgs) pg.destroy();
  });
});
