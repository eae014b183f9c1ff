/**
 * `pg.destroy()` (torch's destroy_process_group) right after a collective: a rank's collective is
 * done once it has received its part, while what it sent last may still be on its way. destroy
 * says bye on every link after those messages and leaves once each peer answered, so the server's
 * notice that it left never overtakes them (in-memory links, real server). The race itself, on
 * WebRTC in Chromium, is test/e2e/examples.spec.ts "a rank that destroys its group straight after…".
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { FrameKind, HEADER_BYTES, checkChunk, encodeBye, readHeader, writeHeader } from '../src/wire/framing.ts';
import { FramingError, PeerLostError } from '../src/wire/errors.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';

let server: RunningServer;
beforeAll(async () => {
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

async function pair(): Promise<{ pgs: ProcessGroup[]; net: MemoryNetwork }> {
  const session = uniqueSession('destroy');
  const net = new MemoryNetwork();
  const pgs = await Promise.all(
    [0, 1].map((rank) =>
      initProcessGroup({
        url: server.url,
        session,
        token: tokenFor(session),
        worldSize: 2,
        rank,
        timeoutMs: 5_000,
        linkFactory: net.factoryFor(rank),
      }),
    ),
  );
  return { pgs, net };
}

describe('destroy', () => {
  it("says bye after its last messages and leaves once the peer answered: the peer's last all-reduce completes", async () => {
    const { pgs } = await pair();
    const bufs = pgs.map((pg) => new Float32Array(1 << 18).fill(pg.rank + 1));
    // Rank 0 destroys the moment its own all-reduce is done, without a barrier.
    const early = pgs[0]!.allReduce(bufs[0]!, 'sum').then(async () => {
      const t0 = performance.now();
      await pgs[0]!.destroy();
      return performance.now() - t0;
    });
    const [took, late] = await Promise.all([early, pgs[1]!.allReduce(bufs[1]!, 'sum')]);
    expect(late[0]).toBe(3);
    expect(late[late.length - 1]).toBe(3);
    // Answered: no wait for the bound.
    expect(took).toBeLessThan(1_000);
    await pgs[1]!.destroy();
  });

  it('waits at most its bound for a peer that does not answer, then leaves; the peer hears it left', async () => {
    const { pgs, net } = await pair();
    await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(4), 'sum')));
    // Rank 1 takes rank 0's bye but its answer never arrives (its link to rank 0 delivers nothing).
    net.end(1, 0)!.stall();
    const lost = pgs[1]!.allReduce(new Float32Array(4), 'sum').catch((e: unknown) => e);
    const t0 = performance.now();
    await pgs[0]!.destroy();
    const took = performance.now() - t0;
    expect(took).toBeGreaterThanOrEqual(1_900);
    expect(took).toBeLessThan(4_000);
    expect(await lost).toBeInstanceOf(PeerLostError);
    await pgs[1]!.destroy();
  });

  it("closes at once without closeStore (a rendezvous round's group: the next round keeps the connection)", async () => {
    const { pgs, net } = await pair();
    await Promise.all(pgs.map((pg) => pg.allReduce(new Float32Array(4), 'sum')));
    net.end(1, 0)!.stall();
    const t0 = performance.now();
    await pgs[0]!.destroy(false);
    expect(performance.now() - t0).toBeLessThan(200);
    expect(net.end(0, 1)!.state).toBe('closed');
    await Promise.all(pgs.map((pg) => pg.destroy()));
  });

  it('a bye frame is header-only, group 0, step 0 or 1: anything else is refused', () => {
    expect(readHeader(encodeBye(false))).toMatchObject({ kind: FrameKind.bye, group: 0, step: 0, length: 0 });
    expect(readHeader(encodeBye(true))).toMatchObject({ kind: FrameKind.bye, step: 1 });
    const withPayload = new Uint8Array(HEADER_BYTES + 4);
    writeHeader(withPayload, { ...readHeader(encodeBye(false)), total: 4, length: 4 });
    expect(() => checkChunk(readHeader(withPayload))).toThrow(FramingError);
  });
});
