/** The rendezvous handler against the real server: rounds on loss, join, pause and eviction. */
import { afterEach, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { RunningServer } from '../signaling/server.ts';
import { RendezvousHandler, type RendezvousEvent, type Round } from '../src/c10d/rendezvous.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { PROTOCOL_VERSION } from '../src/wire/protocol.ts';
import { parseRequest } from '../src/wire/protocol_validation.ts';
import { RankStalledError, type RendezvousError } from '../src/wire/errors.ts';
import { withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { errorOf } from './fixtures/errors.ts';
import { ProtocolViolation } from '../src/wire/protocol_validation.ts';

let server: RunningServer | undefined;
const agents: RendezvousHandler[] = [];
afterEach(async () => {
  for (const a of agents.splice(0)) a.shutdown();
  await server?.close();
  server = undefined;
});

async function agent(session: string, min: number, max: number, rank?: number): Promise<RendezvousHandler> {
  const a = await RendezvousHandler.start({
    url: server!.url,
    session,
    token: tokenFor(session),
    min,
    max,
    rank,
    timeoutMs: 5_000,
    heartbeatIntervalMs: 100,
    reconnect: true,
  });
  agents.push(a);
  return a;
}

describe('rendezvous rounds', () => {
  it('forms a first round once min ranks settle, then a new one with contiguous ranks when a rank leaves', async () => {
    server = await withServer({ settleMs: 200 });
    const session = uniqueSession('el');
    const [a, b, c] = [await agent(session, 2, 4), await agent(session, 2, 4), await agent(session, 2, 4)];
    const g1 = await Promise.all([a, b, c].map((x) => x.nextRendezvous(0)));
    expect(g1.map((g) => g.rank)).toEqual([0, 1, 2]);
    expect(g1.every((g) => g.worldSize === 3 && g.round === 1)).toBe(true);
    // Rank 1 goes away: the others get generation 2 with ranks 0 and 1, in their old order.
    const lost = g1[0].pg.barrier(5_000).catch((e: Error) => e);
    b.shutdown();
    const g2 = await Promise.all([a.nextRendezvous(g1[0].id), c.nextRendezvous(g1[2].id)]);
    expect(g2.map((g) => [g.round, g.rank, g.worldSize])).toEqual([
      [2, 0, 2],
      [2, 1, 2],
    ]);
    expect(((await lost) as Error).message).toMatch(/lost rank 1|round 1 ended/);
    await Promise.all(g2.map((g) => g.pg.barrier(2_000)));
  });

  it("a lost rank's place goes to the last rank; every other survivor keeps its rank (and its links' peers)", async () => {
    server = await withServer({ settleMs: 200 });
    const session = uniqueSession('stable');
    const members = [await agent(session, 2, 4), await agent(session, 2, 4), await agent(session, 2, 4), await agent(session, 2, 4)];
    const g1 = await Promise.all(members.map((x) => x.nextRendezvous(0)));
    expect(g1.map((g) => g.rank)).toEqual([0, 1, 2, 3]);
    const lost = g1[0].pg.barrier(5_000).catch((e: Error) => e);
    members[1]!.shutdown();
    const g2 = await Promise.all([0, 2, 3].map((i) => members[i]!.nextRendezvous(g1[i]!.id)));
    // Ranks 0 and 2 keep theirs; rank 3 takes rank 1's place (renumbering in order would give 0, 1, 2).
    expect(g2.map((g) => [g.round, g.rank, g.worldSize])).toEqual([
      [2, 0, 3],
      [2, 2, 3],
      [2, 1, 3],
    ]);
    await lost;
    await Promise.all(g2.map((g) => g.pg.barrier(2_000)));
  });

  it('admits a late member at a regroup the running ranks ask for', async () => {
    server = await withServer({ settleMs: 100 });
    const session = uniqueSession('join');
    const [a, b] = [await agent(session, 2, 3), await agent(session, 2, 3)];
    const g1 = await Promise.all([a.nextRendezvous(0), b.nextRendezvous(0)]);
    const pending = new Promise<RendezvousEvent>((resolve) => a.on((e) => e.type === 'waiting' && resolve(e)));
    const late = await agent(session, 2, 3);
    expect(await pending).toEqual({ type: 'waiting', waiting: 1, members: 3, min: 2, max: 3, running: true, spectators: 0 });
    expect(a.numNodesWaiting()).toBe(1);
    const rounds = await Promise.all(g1.map((g, i) => [a, b][i].regroup(g)));
    expect(rounds).toEqual([2, 2]);
    const g2 = await Promise.all([a.nextRendezvous(g1[0].id), b.nextRendezvous(g1[1].id), late.nextRendezvous(0)]);
    expect(g2.map((g) => g.rank)).toEqual([0, 1, 2]);
    expect(new Set(g2.map((g) => g.round))).toEqual(new Set([2]));
    // A fourth tab is told the session is full.
    const err = await agent(session, 2, 3).catch((e: unknown) => e);
    expect((err as RendezvousError).code).toBe('SESSION_FULL');
  });

  it('rejoin: the others get a round without the member at once, and a regroup admits it again as a new member', async () => {
    server = await withServer({ settleMs: 100 });
    const session = uniqueSession('rejoin');
    const [a, b, c] = [await agent(session, 2, 3), await agent(session, 2, 3), await agent(session, 2, 3)];
    const g1 = await Promise.all([a, b, c].map((x) => x.nextRendezvous(0)));
    expect(g1.map((g) => g.rank)).toEqual([0, 1, 2]);
    const interrupted = g1[0].pg.barrier(5_000).catch((e: Error) => e);
    let prepared = false;
    const waiting = new Promise<RendezvousEvent>((resolve) => a.on((e) => e.type === 'waiting' && e.waiting === 1 && resolve(e)));
    // While b prepares, the others already train in a round of two.
    const rejoined = b.rejoin(async () => {
      const g2 = await Promise.all([a.nextRendezvous(g1[0].id), c.nextRendezvous(g1[2].id)]);
      expect(g2.map((g) => [g.rank, g.worldSize])).toEqual([
        [0, 2],
        [1, 2],
      ]);
      prepared = true;
    });
    expect(await interrupted).toBeInstanceOf(Error);
    await rejoined;
    expect(prepared).toBe(true);
    await waiting;
    const g2 = [await a.nextRendezvous(g1[0].id), await c.nextRendezvous(g1[2].id)];
    expect(await Promise.all(g2.map((g, i) => [a, c][i]!.regroup(g)))).toEqual([3, 3]);
    const g3 = await Promise.all([a.nextRendezvous(g2[0]!.id), c.nextRendezvous(g2[1]!.id), b.nextRendezvous(g1[1].id)]);
    // Survivors first, the rejoined member last.
    expect(g3.map((g) => [g.round, g.rank, g.worldSize])).toEqual([
      [3, 0, 3],
      [3, 1, 3],
      [3, 2, 3],
    ]);
    await Promise.all(g3.map((g) => g.pg.barrier(2_000)));
  });

  it('pauses below the minimum and resumes when a tab joins', async () => {
    server = await withServer({ settleMs: 100 });
    const session = uniqueSession('pause');
    const [a, b] = [await agent(session, 2, 3), await agent(session, 2, 3)];
    const g1 = await a.nextRendezvous(0);
    await b.nextRendezvous(0);
    const paused = new Promise<RendezvousEvent>((resolve) => a.on((e) => e.type === 'paused' && resolve(e)));
    const count = new Promise<RendezvousEvent>((resolve) => a.on((e) => e.type === 'waiting' && resolve(e)));
    b.shutdown();
    expect(await paused).toEqual({ type: 'paused', round: 2, min: 2 });
    expect(await count).toMatchObject({ type: 'waiting', waiting: 1, members: 1, running: false });
    const resumed = a.nextRendezvous(g1.id);
    await agent(session, 2, 3);
    const g = await resumed;
    expect([g.rank, g.worldSize]).toEqual([0, 2]);
  });

  it('a fixed world size is the range N..N: a lost rank pauses the group until a tab takes its place', async () => {
    server = await withServer();
    const session = uniqueSession('fixed');
    const [a, b, c] = [await agent(session, 3, 3, 2), await agent(session, 3, 3), await agent(session, 3, 3)];
    const g1 = await Promise.all([a, b, c].map((x) => x.nextRendezvous(0)));
    expect(g1.map((g) => g.rank)).toEqual([2, 0, 1]);
    const paused = new Promise<RendezvousEvent>((resolve) => a.on((e) => e.type === 'paused' && resolve(e)));
    const lost = g1[0].pg.barrier(5_000).catch((e: unknown) => e);
    b.shutdown();
    expect(await paused).toEqual({ type: 'paused', round: 2, min: 3 });
    expect(((await lost) as Error).name).toBe('PeerLostError');
    // A replacement takes the free rank; the rank asked for is kept, the survivor keeps its order.
    const d = await agent(session, 3, 3);
    const g2 = await Promise.all([a.nextRendezvous(g1[0].id), c.nextRendezvous(g1[2].id), d.nextRendezvous(0)]);
    expect(g2.map((g) => [g.round, g.rank, g.worldSize])).toEqual([
      [3, 2, 3],
      [3, 0, 3],
      [3, 1, 3],
    ]);
    await Promise.all(g2.map((g) => g.pg.barrier(2_000)));
  });

  it('evicts a member that stops sending (a frozen tab) within the heartbeat timeout', async () => {
    server = await withServer({ settleMs: 100, heartbeatTimeoutMs: 600 });
    const session = uniqueSession('freeze');
    const a = await agent(session, 1, 3);
    // A member that joins and then goes silent, like a frozen page: raw socket, no heartbeats.
    const raw = new WebSocket(`${server.url.replace('http', 'ws')}ws`);
    await new Promise((r) => raw.once('open', r));
    raw.send(JSON.stringify({ type: 'hello', id: 1, session, version: PROTOCOL_VERSION, token: tokenFor(session) }));
    raw.send(JSON.stringify({ type: 'rendezvous', id: 2, min: 1, max: 3 }));
    const closed = new Promise<[number, string]>((r) => raw.once('close', (code, reason) => r([code, reason.toString()])));
    const g1 = await a.nextRendezvous(0);
    let g = g1;
    if (g.worldSize < 2) g = await a.nextRendezvous(g.id);
    expect(g.worldSize).toBe(2);
    const t0 = Date.now();
    const after = await a.nextRendezvous(g.id);
    expect(after.worldSize).toBe(1);
    expect(Date.now() - t0).toBeLessThan(2_500);
    const [code, reason] = await closed;
    expect(code).toBe(4003);
    expect(reason).toMatch(/evicted: no heartbeat for \d+ ms/);
  });

  it('keeps a member whose socket is held up while another member of its round hears it over their link, for at most VOUCH_LIMIT timeouts', async () => {
    server = await withServer({ settleMs: 100, heartbeatTimeoutMs: 400 });
    /** A member on a raw socket at a fixed rank of 2: it sends nothing after joining unless told to. */
    const member = async (session: string, rank: number) => {
      const ws = new WebSocket(`${server!.url.replace('http', 'ws')}ws`);
      await new Promise((r) => ws.once('open', r));
      const rounds: number[] = [];
      ws.on('message', (m: Buffer) => {
        const msg = JSON.parse(m.toString()) as { type: string; round?: number; worldSize?: number };
        if (msg.type === 'round' && typeof msg.round === 'number' && msg.worldSize === 2) rounds.push(msg.round);
      });
      const closed = new Promise<number>((r) => ws.once('close', () => r(Date.now())));
      ws.send(JSON.stringify({ type: 'hello', id: 1, session, version: PROTOCOL_VERSION, token: tokenFor(session) }));
      ws.send(JSON.stringify({ type: 'rendezvous', id: 2, min: 2, max: 2, rank }));
      return { ws, rounds, closed };
    };
    for (const honest of [false, true]) {
      const session = uniqueSession(honest ? 'vouch' : 'vouch-wrong');
      const silent = await member(session, 0);
      // The voucher: the store client as a process group drives it, heartbeats every 100 ms naming
      // rank 0 as heard (of another round when not honest).
      const voucher = await StoreClient.connect(server.url, { session, token: tokenFor(session) });
      const rounds: number[] = [];
      voucher.on('round', (e) => rounds.push(e.round));
      await voucher.rendezvous({ min: 2, max: 2, rank: 1 }, 100);
      await expect.poll(() => rounds.length, { timeout: 5_000 }).toBeGreaterThan(0);
      const start = Date.now();
      voucher.reportHeardPeers(() => ({ round: honest ? rounds[0]! : rounds[0]! + 5, ranks: [0] }));
      const evictedAfter = (await silent.closed) - start;
      voucher.close();
      if (honest) {
        // Kept past the 400 ms timeout while heard, evicted at 4 x 400 ms of its own silence all the same.
        expect(evictedAfter).toBeGreaterThanOrEqual(1_400);
        expect(evictedAfter).toBeLessThan(3_000);
      } else {
        expect(evictedAfter).toBeLessThan(1_200);
      }
    }
  });

  it("reads a heartbeat's heard peers, and refuses them malformed", () => {
    expect(parseRequest(JSON.stringify({ type: 'heartbeat', id: 4 }))).toEqual({ type: 'heartbeat', id: 4 });
    expect(parseRequest(JSON.stringify({ type: 'heartbeat', id: 4, heard: { round: 3, ranks: [0, 2] } }))).toEqual({
      type: 'heartbeat',
      id: 4,
      heard: { round: 3, ranks: [0, 2] },
    });
    expect(() => parseRequest(JSON.stringify({ type: 'heartbeat', id: 4, heard: [0, 2] }))).toThrow(
      errorOf(ProtocolViolation, /field "heard" must be an object \{round, ranks\}/, { code: 'BAD_MESSAGE' }),
    );
    expect(() => parseRequest(JSON.stringify({ type: 'heartbeat', id: 4, heard: { round: 3, ranks: 'all' } }))).toThrow(
      errorOf(ProtocolViolation, /"heard.ranks" must be an array of at most 4096 ranks/, { code: 'BAD_MESSAGE' }),
    );
    expect(() => parseRequest(JSON.stringify({ type: 'heartbeat', id: 4, heard: { round: 3, ranks: new Array(5000).fill(0) } }))).toThrow(
      errorOf(ProtocolViolation, /at most 4096 ranks/, { code: 'BAD_MESSAGE' }),
    );
    expect(() => parseRequest(JSON.stringify({ type: 'heartbeat', id: 4, heard: { round: 3, ranks: [-1] } }))).toThrow(
      errorOf(ProtocolViolation, /field "0"/, { code: 'BAD_MESSAGE' }),
    );
    expect(() => parseRequest(JSON.stringify({ type: 'heartbeat', id: 4, heard: { round: 'x', ranks: [] } }))).toThrow(
      errorOf(ProtocolViolation, /field "round"/, { code: 'BAD_MESSAGE' }),
    );
  });

  it('does not evict live members when the server itself was held up past the heartbeat timeout', async () => {
    server = await withServer({ settleMs: 100, heartbeatTimeoutMs: 400 });
    const session = uniqueSession('held');
    const [a, b] = [await agent(session, 2, 2), await agent(session, 2, 2)];
    const g = await Promise.all([a.nextRendezvous(0), b.nextRendezvous(0)]);
    const rounds: number[] = [];
    a.on((e) => e.type === 'round' && rounds.push(e.round));
    // This process (the server's and both members') does nothing else for 1 s: the heartbeats wait
    // in the sockets until the loop reads them, after its timers.
    const until = Date.now() + 1_000;
    while (Date.now() < until) {
      // busy
    }
    await new Promise((r) => setTimeout(r, 600));
    expect(rounds).toEqual([]);
    await Promise.all(g.map((x) => x.pg.barrier(2_000)));
  });

  it('refuses to mix fixed and elastic sizes, and elastic ranges that differ', async () => {
    server = await withServer();
    const session = uniqueSession('mix');
    await agent(session, 2, 4);
    const s = await StoreClient.connect(server.url, { session, token: tokenFor(session) });
    const e1 = (await s.rendezvous({ min: 2, max: 2 }).catch((e: unknown) => e)) as RendezvousError;
    expect(e1.code).toBe('ELASTIC_MISMATCH');
    const e2 = (await agent(session, 1, 4).catch((e: unknown) => e)) as RendezvousError;
    expect(e2.code).toBe('ELASTIC_MISMATCH');
    expect(e2.message).toContain('2..4');
    s.close();
  });

  it('joins again after a server restart and gets a round from the new server', async () => {
    server = await withServer({ settleMs: 100 });
    const port = server.port;
    const session = uniqueSession('restart');
    const a = await agent(session, 1, 2);
    const g1: Round = await a.nextRendezvous(0);
    await server.close();
    server = await withServer({ settleMs: 100, port });
    const g2 = await a.nextRendezvous(g1.id, 10_000);
    expect(g2.id).toBeGreaterThan(g1.id);
    expect(g2.rank).toBe(0);
  });
});

describe('a member paused past its stall bound', () => {
  it('fails its group with RankStalledError, leaves the round and joins again, so a new round forms without waiting for an eviction', async () => {
    server = await withServer({ settleMs: 100 });
    const session = uniqueSession('stalled');
    const reasons: string[] = [];
    const start = () =>
      RendezvousHandler.start(
        {
          url: server!.url,
          session,
          token: tokenFor(session),
          min: 2,
          max: 3,
          timeoutMs: 10_000,
          heartbeatIntervalMs: 100,
          reconnect: true,
          stallTimeoutMs: 1_000,
        },
        (e) => e.type === 'reconnecting' && reasons.push(e.reason),
      ).then((a) => {
        agents.push(a);
        return a;
      });
    const [a, b] = [await start(), await start()];
    const g1 = await Promise.all([a.nextRendezvous(0), b.nextRendezvous(0)]);
    // Both members live in this process: a long synchronous block pauses both, well under the
    // server's 5 s eviction bound, so only their own stall detection can move the group on.
    const until = Date.now() + 1_600;
    while (Date.now() < until) {
      /* blocked */
    }
    const g2 = await Promise.all([a.nextRendezvous(g1[0].id), b.nextRendezvous(g1[1].id)]);
    for (const g of g1) expect(g.pg.error).toBeInstanceOf(RankStalledError);
    expect(reasons.length).toBeGreaterThanOrEqual(2);
    for (const r of reasons) expect(r).toMatch(/paused past its stall bound/);
    expect(g2.map((g) => g.worldSize)).toEqual([2, 2]);
    expect(g2[0].round).toBeGreaterThan(g1[0].round);
  });
});
