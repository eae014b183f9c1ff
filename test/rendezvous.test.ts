/** Rendezvous (initProcessGroup), barrier and the signaling relay against the real server. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { ProcessGroup } from '../src/c10d/process_group.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { DistTimeoutError, RendezvousClosedError, RendezvousError, isRecoverable, StoreError } from '../src/wire/errors.ts';
import { connect, groupSize, pendingWaiters, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { waitFor } from './fixtures/wait.ts';
import { CloseCode, ErrorCode, MAX_CLAIMS_PER_MEMBER, MAX_CLAIMS_PER_SESSION } from '../src/wire/protocol.ts';
import { Session } from '../signaling/session.ts';
import { StoreRefusal } from '../signaling/store.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer;
beforeAll(async () => {
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

function group(session: string, worldSize: number, rank?: number, timeoutMs = 5_000): Promise<ProcessGroup> {
  return initProcessGroup({ url: server.url, session, token: tokenFor(session), worldSize, rank, timeoutMs });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('rendezvous', () => {
  it('resolves once N ranks joined, assigning 0..N-1 in join order', async () => {
    const session = uniqueSession('rdzv');
    const groups: Array<Promise<ProcessGroup>> = [];
    for (let i = 0; i < 4; i++) {
      groups.push(group(session, 4));
      // A definite join order: the next joins once the server has admitted this one.
      await waitFor(`join ${i + 1} to be admitted`, () => groupSize(server, session) === i + 1);
    }
    const pgs = await Promise.all(groups);
    expect(pgs.map((p) => p.rank)).toEqual([0, 1, 2, 3]);
    expect(pgs.every((p) => p.worldSize === 4)).toBe(true);
    for (const p of pgs) p.destroy();
  });

  it('accepts explicit ranks and fills the rest with the lowest free ones', async () => {
    const session = uniqueSession('explicit');
    const a = group(session, 3, 2);
    await waitFor('the rank-2 join to be admitted', () => groupSize(server, session) === 1);
    const b = group(session, 3);
    await waitFor('the second join to be admitted', () => groupSize(server, session) === 2);
    const c = group(session, 3);
    const pgs = await Promise.all([a, b, c]);
    expect(pgs.map((p) => p.rank)).toEqual([2, 0, 1]);
    for (const p of pgs) p.destroy();
  });

  it('a world of one needs no peers', async () => {
    const pg = await group(uniqueSession('one'), 1);
    expect(pg.rank).toBe(0);
    const buf = new Float32Array([1, 2, 3]);
    expect([...(await pg.allReduce(buf, 'avg'))]).toEqual([1, 2, 3]);
    await pg.barrier();
    pg.destroy();
  });

  it('refuses a duplicate rank', async () => {
    const session = uniqueSession('dup');
    const first = group(session, 2, 1);
    await waitFor('the first rank 1 to be admitted', () => groupSize(server, session) === 1);
    const err = (await group(session, 2, 1).catch((e: unknown) => e)) as RendezvousError;
    expect(err).toBeInstanceOf(RendezvousError);
    expect(err.code).toBe('DUPLICATE_RANK');
    expect(err.message).toContain('rank 1');
    const other = await group(session, 2, 0);
    (await first).destroy();
    other.destroy();
  });

  it('refuses a rank outside 0..N-1', async () => {
    const session = uniqueSession('range');
    for (const rank of [3, -1]) {
      const err = (await group(session, 3, rank).catch((e: unknown) => e)) as RendezvousError;
      expect(err).toBeInstanceOf(RendezvousError);
      expect(err.code).toBe('RANK_OUT_OF_RANGE');
      expect(err.message).toContain(`rank ${rank} is outside 0..2`);
    }
  });

  it('refuses a world size that disagrees with the session', async () => {
    const session = uniqueSession('ws');
    const first = group(session, 2);
    await waitFor('the first join (world size 2) to be admitted', () => groupSize(server, session) === 1);
    const err = (await group(session, 3).catch((e: unknown) => e)) as RendezvousError;
    expect(err).toBeInstanceOf(RendezvousError);
    expect(err.code).toBe('WORLD_SIZE_MISMATCH');
    expect(err.message).toMatch(/world size 2, but this rank asked for 3/);
    const second = await group(session, 2);
    (await first).destroy();
    second.destroy();
  });

  it('refuses a join to a full session', async () => {
    const session = uniqueSession('full');
    const pgs = await Promise.all([group(session, 2), group(session, 2)]);
    const err = (await group(session, 2).catch((e: unknown) => e)) as RendezvousError;
    expect(err).toBeInstanceOf(RendezvousError);
    expect(err.code).toBe('SESSION_FULL');
    for (const p of pgs) p.destroy();
  });

  it('times out saying how many ranks never came', async () => {
    const session = uniqueSession('late');
    const err = (await group(session, 3, 0, 300).catch((e: unknown) => e)) as DistTimeoutError;
    expect(err).toBeInstanceOf(DistTimeoutError);
    expect(err.message).toContain('2 more ranks to join session');
    expect(err.message).toContain('1 of 3 joined');
  });

  it('barrier releases only when every rank arrived, and times out naming the count', async () => {
    const session = uniqueSession('barrier');
    const [a, b, c] = await Promise.all([group(session, 3), group(session, 3), group(session, 3)]);
    let released = 0;
    const pa = a.barrier().then(() => released++);
    const pb = b.barrier().then(() => released++);
    // Both have arrived and wait on the store for the last one: nothing can release them yet.
    await waitFor('a and b to wait at the barrier', () => pendingWaiters(server, session) === 2);
    expect(released).toBe(0);
    await c.barrier();
    await Promise.all([pa, pb]);
    expect(released).toBe(2);
    const err = (await a.barrier(200).catch((e: unknown) => e)) as DistTimeoutError;
    expect(err).toBeInstanceOf(DistTimeoutError);
    expect(err.message).toContain('barrier #2 (1 arrived)');
    for (const p of [a, b, c]) p.destroy();
  });

  it('a barrier fails at once, naming the rank, when a member leaves while others wait', async () => {
    const session = uniqueSession('barrier-lost');
    // Explicit ranks: joins sent together reach the server in any order (CI once made c rank 1).
    const [a, b, c] = await Promise.all([group(session, 3, 0), group(session, 3, 1), group(session, 3, 2)]);
    const waiting = a.barrier(10_000).catch((e: unknown) => e);
    await waitFor('a to wait at the barrier', () => pendingWaiters(server, session) === 1);
    const t0 = Date.now();
    c.destroy();
    const err = (await waiting) as Error;
    expect(err.name).toBe('PeerLostError');
    expect(err.message).toContain('lost rank 2');
    expect(Date.now() - t0).toBeLessThan(2_000);
    a.destroy();
    b.destroy();
  });

  it('relays signals by rank inside the session and tells members when one leaves', async () => {
    const session = uniqueSession('relay');
    const [s0, s1] = await Promise.all([connect(server, session), connect(server, session)]);
    const formed = new Promise((resolve) => s1.on('round', resolve));
    await s0.rendezvous({ min: 2, max: 2, rank: 0 });
    await s1.rendezvous({ min: 2, max: 2, rank: 1 });
    expect(await formed).toEqual({ type: 'round', round: 1, rank: 1, worldSize: 2, members: [1, 2], paused: false, min: 2, max: 2 });
    const got = new Promise((resolve) => s1.on('signal', resolve));
    await s0.signal(1, { channel: 'x', body: { sdp: 'offer' } });
    expect(await got).toEqual({ type: 'signal', from: 0, member: 1, data: { channel: 'x', body: { sdp: 'offer' } } });
    const left = new Promise((resolve) => s0.on('peer-left', resolve));
    s1.close();
    expect(await left).toEqual({ type: 'peer-left', round: 1, rank: 1, reason: 'closed its connection to the server' });
    const err = await s0.signal(1, { channel: 'x', body: null }).catch((e: unknown) => e);
    expect((err as RendezvousError).code).toBe('UNKNOWN_PEER');
    s0.close();
  });

  for (const [code, reason] of [
    [CloseCode.LEFT, 'its tab closed'], // what a page's StoreClient does on pagehide
    [CloseCode.STALLED, 'was paused (its tab froze or its computer slept) and joins again'], // a member that found it was paused
  ] as const) {
    it(`a member that closes with ${code} says why: the others are told "${reason}"`, async () => {
      const session = uniqueSession('left');
      const [s0, s1] = await Promise.all([connect(server, session), connect(server, session)]);
      await Promise.all([s0.rendezvous({ min: 2, max: 2, rank: 0 }), s1.rendezvous({ min: 2, max: 2, rank: 1 })]);
      const left = new Promise((resolve) => s0.on('peer-left', resolve));
      s1.close(code, 'test');
      expect(await left).toEqual({ type: 'peer-left', round: 1, rank: 1, reason });
      s0.close();
    });
  }

  it('a closed rendezvous forms no round: members without a rank are told, arrivals are refused, a rank that leaves is still reported', async () => {
    const session = uniqueSession('closed');
    const [s0, s1, spectator, waiter] = await Promise.all([0, 1, 2, 3].map(() => connect(server, session)));
    await Promise.all([s0.rendezvous({ min: 2, max: 2, rank: 0 }), s1.rendezvous({ min: 2, max: 2, rank: 1 })]);
    await spectator.rendezvous({ min: 2, max: 2, spectate: true });
    // Only a rank of the running round may end the run.
    const refused = (await spectator.closeRendezvous().catch((e: unknown) => e)) as StoreError;
    expect(refused.code).toBe('NOT_JOINED');
    expect(refused.message).toContain('only a member with a rank in the running round 1');
    const told = new Promise((resolve) => spectator.on('rendezvous-closed', resolve));
    let toldEarly = false;
    spectator.on('rendezvous-closed', () => (toldEarly = true));
    await s1.closeRendezvous();
    await s1.closeRendezvous(); // asking again changes nothing
    // One rank's close speaks for that rank only: the run ends when every rank is done.
    await spectator.check(['nothing']);
    expect(toldEarly).toBe(false);
    await s0.closeRendezvous();
    expect(await told).toEqual({ type: 'rendezvous-closed', round: 1, by: 1 });
    const late = (await waiter.rendezvous({ min: 2, max: 2 }).catch((e: unknown) => e)) as RendezvousClosedError;
    expect(late).toBeInstanceOf(RendezvousClosedError);
    expect(late.message).toBe(
      `the run of session "${session}" has ended (rank 1 closed its rendezvous after round 1): a tab that arrives after the end has nothing to join; to train again, start a new session`,
    );
    expect([late.round, late.closedBy]).toEqual([1, 1]);
    // A rank leaving after the end: the other hears it at once (its exit barrier fails), and no round forms.
    let rounds = 0;
    s0.on('round', () => rounds++);
    const left = new Promise((resolve) => s0.on('peer-left', resolve));
    s1.close(CloseCode.LEFT, 'done');
    expect(await left).toEqual({ type: 'peer-left', round: 1, rank: 1, reason: 'its tab closed' });
    // A round made by s1's leaving would reach s0 with peer-left, so before the reply to anything s0 asks after it.
    await s0.check(['nothing']);
    expect(rounds).toBe(0);
    // The group empties, and still the run is over: a new arrival is refused, not made a new group.
    s0.close();
    spectator.close();
    await waitFor('the group to empty', () => groupSize(server, session) === 0);
    const again = await connect(server, session);
    expect(await again.rendezvous({ min: 1, max: 4 }).catch((e: unknown) => (e as Error).name)).toBe('RendezvousClosedError');
    for (const c of [waiter, again]) c.close();
  });

  it("one member's close does not end the run for the others: they are not told, arrivals are not refused, and the next round goes on without it", async () => {
    const session = uniqueSession('close-alone');
    const [s0, s1, s2] = await Promise.all([0, 1, 2].map(() => connect(server, session)));
    const rounds: number[] = [];
    s0.on('round', (e) => rounds.push(e.worldSize));
    await Promise.all([s0, s1, s2].map((s) => s.rendezvous({ min: 1, max: 4 })));
    await waitFor('the first round', () => rounds.length === 1);
    const closed: unknown[] = [];
    for (const s of [s0, s1]) s.on('rendezvous-closed', (e) => closed.push(e));
    await s2.closeRendezvous();
    // A tab arriving now is not refused: it waits for the next round.
    const late = await connect(server, session);
    await late.rendezvous({ min: 1, max: 4 });
    // The honest ranks' next round (their collectives with the closer failed) goes on without it.
    await s0.regroup(1, true);
    await waitFor('round 2', () => rounds.length === 2);
    expect(rounds).toEqual([3, 3]);
    expect(closed).toEqual([]);
    // The ranks still training end the run together: then, and only then, arrivals are refused.
    await s0.closeRendezvous();
    await s1.closeRendezvous();
    const early = await connect(server, session);
    await early.rendezvous({ min: 1, max: 4 });
    early.close();
    await late.closeRendezvous();
    const after = await connect(server, session);
    expect(await after.rendezvous({ min: 1, max: 4 }).catch((e: unknown) => (e as Error).name)).toBe('RendezvousClosedError');
    for (const c of [s0, s1, s2, late, after]) c.close();
  });

  it('a round that must form while most ranks are done ends the run instead (a rank whose last step failed as the others finished)', async () => {
    const session = uniqueSession('close-most');
    const [s0, s1, s2] = await Promise.all([0, 1, 2].map(() => connect(server, session)));
    await Promise.all([s0, s1, s2].map((s, rank) => s.rendezvous({ min: 3, max: 3, rank })));
    const told: unknown[] = [];
    s2.on('rendezvous-closed', (e) => told.push(e));
    await s0.closeRendezvous();
    await s1.closeRendezvous();
    await s2.regroup(1, true);
    // The server sends the news before it answers anything s2 asks after its regroup.
    await s2.check(['nothing']);
    expect(told).toEqual([{ type: 'rendezvous-closed', round: 1, by: 0 }]);
    for (const c of [s0, s1, s2]) c.close();
  });

  it("a gather's rows are placed by the server at each sender's rank: a member gives its own row once, names no other rank's, and a round that ends fails the gather at once", async () => {
    const session = uniqueSession('gather');
    const [s0, s1, s2] = await Promise.all([0, 1, 2].map(() => connect(server, session)));
    const formed = Promise.all([s0, s1, s2].map((s) => new Promise((resolve) => s.on('round', resolve))));
    await Promise.all([s0, s1, s2].map((s, rank) => s.rendezvous({ min: 3, max: 3, rank })));
    await formed;
    // The hostile rank 2 gives its row, then tries to give another (as if for rank 0).
    const hostile = s2.gather(1, 'vote:1', [1, 12], 5_000);
    const again = (await s2.gather(1, 'vote:1', [1, 0], 5_000).catch((e: unknown) => e)) as StoreError;
    expect(again.message).toContain('rank 2 gave its row of gather "vote:1" in round 1 already');
    const rows = Promise.all([s0.gather(1, 'vote:1', [0, 10], 5_000), s1.gather(1, 'vote:1', [0, 11], 5_000)]);
    const expected = [
      [0, 10],
      [0, 11],
      [1, 12],
    ];
    expect(await rows).toEqual([expected, expected]);
    expect(await hostile).toEqual(expected);
    const late = (await s2.gather(1, 'vote:1', [1, 0], 5_000).catch((e: unknown) => e)) as StoreError;
    expect(late.message).toContain('which every rank completed already');
    // Bad rows are refused on the wire: non-finite values, an unknown round.
    const nan = (await s0.request('gather', { round: 1, tag: 'v', values: [NaN], timeoutMs: 100 }).catch((e: unknown) => e)) as StoreError;
    expect(nan.message).toMatch(/field "values" must be an array of at most \d+ finite numbers/);
    const stale = (await s0.gather(7, 'v', [1], 100).catch((e: unknown) => e)) as StoreError;
    expect(stale.code).toBe('GATHER_ABORTED');
    // A gather whose round loses a rank fails at once, naming why.
    const waiting = s0.gather(1, 'vote:2', [0], 10_000).catch((e: unknown) => e);
    s2.close();
    const lost = (await waiting) as StoreError;
    expect(lost.code).toBe('GATHER_ABORTED');
    expect(lost.message).toMatch(/cannot complete: rank 2/);
    // And one that waits too long names the ranks missing.
    for (const c of [s0, s1]) c.close();
  });

  it('gatherRows: a gather whose round loses a rank fails with an error a new round recovers from', async () => {
    const session = uniqueSession('gather-pg');
    const pgs = await Promise.all([0, 1, 2].map((rank) => group(session, 3, rank)));
    const waiting = Promise.all([pgs[0]!.gatherRows([1]), pgs[1]!.gatherRows([2])]).catch((e: unknown) => e);
    await sleep(50);
    pgs[2]!.destroy();
    const err = (await waiting) as Error;
    expect(isRecoverable(err)).toBe(true);
    for (const pg of pgs.slice(0, 2)) pg.destroy();
  });

  it('signals cannot reach another session', async () => {
    const [a0, b1] = await Promise.all([connect(server, uniqueSession('A')), connect(server, uniqueSession('B'))]);
    await a0.rendezvous({ min: 2, max: 2, rank: 0 });
    await b1.rendezvous({ min: 2, max: 2, rank: 1 });
    let leaked = false;
    b1.on('signal', () => (leaked = true));
    const err = await a0.signal(1, { channel: 'x', body: 'hi' }).catch((e: unknown) => e);
    expect((err as RendezvousError).code).toBe('UNKNOWN_PEER');
    // A leaked signal would go to b1 while a0's is handled, so before the reply to anything b1 asks now.
    await b1.check(['nothing']);
    expect(leaked).toBe(false);
    a0.close();
    b1.close();
  });
});

describe('places held by members (claim)', () => {
  it('a place is held by the member that took it until it leaves; nobody else takes or writes it', async () => {
    const session = uniqueSession('claim');
    const [a, b, c, storeOnly] = await Promise.all([0, 1, 2, 3].map(() => connect(server, session)));
    const ids: number[] = [];
    for (const m of [a, b, c]) ids.push((await m.rendezvous({ min: 1, max: 3 }, 200)).memberId);
    const [idA, idB, idC] = ids as [number, number, number];
    const keys = ['ps/place-0', 'ps/place-1'];
    expect(await a.claim(keys)).toEqual([-1, -1]);
    expect(await a.claim(keys, true)).toEqual([idA, -1]);
    expect(await b.claim(keys, true)).toEqual([idA, idB]);
    // A member that holds one of the keys takes no other; with no vacant key nobody takes any.
    expect(await b.claim(keys, true)).toEqual([idA, idB]);
    expect(await c.claim(keys, true)).toEqual([idA, idB]);
    // The store's operations never touch places.
    await c.set('ps/place-0', String(idC));
    await c.deleteKey('ps/place-0');
    expect(await c.claim(keys)).toEqual([idA, idB]);
    // Only members may look places up or take them.
    await expect(storeOnly.claim(keys, true)).rejects.toMatchObject({ code: 'NOT_JOINED' });
    await expect(storeOnly.request('claim', { keys: [], take: true })).rejects.toThrow(
      errorOf(StoreError, /1 to 64 places/, { code: 'BAD_MESSAGE' }),
    );
    await expect(a.request('claim', { keys, take: 'yes' as unknown as boolean })).rejects.toThrow(
      errorOf(StoreError, /"take" must be true or false/, { code: 'BAD_MESSAGE' }),
    );
    // One member holds at most 16 places: it cannot take a session's places for itself.
    for (let i = 0; i < 15; i++) expect(await b.claim([`spam/${i}`], true)).toEqual([idB]);
    await expect(b.claim(['spam/15'], true)).rejects.toMatchObject({
      code: 'QUOTA_KEYS',
      message: expect.stringMatching(/holds 16 places.*\(16\)/),
    });
    // A member that leaves frees its place: the next taker gets it.
    a.close();
    await waitFor("a's place to come free", async () => (await c.claim(keys))[0] === -1);
    expect(await c.claim(keys, true)).toEqual([idC, idB]);
    for (const m of [b, c, storeOnly]) m.close();
  });

  it("at the session's cap, the places of departed members are taken back; while every holder lives, the next place is refused", () => {
    // The server's Session with its real Rendezvous; participants are stand-ins (4,096 places
    // need 256 members: sockets would test the sockets, not the cap).
    const s = new Session('claim-cap', { maxKeys: 100, maxBytes: 100_000 });
    const timing = { maxSpectators: 0, settleMs: 3_600_000, regroupIntervalMs: 0 };
    const join = () => s.join({ send: () => {} }, { min: 1, max: 1_000 }, timing, () => {});
    try {
      const holders = Array.from({ length: MAX_CLAIMS_PER_SESSION / MAX_CLAIMS_PER_MEMBER }, join);
      holders.forEach((id, i) => {
        for (let j = 0; j < MAX_CLAIMS_PER_MEMBER; j++) expect(s.claim(id, [`p/${i}/${j}`], true)).toEqual([id]);
      });
      const late = join();
      let refused: unknown;
      try {
        s.claim(late, ['p/late'], true);
      } catch (e) {
        refused = e;
      }
      expect(refused).toBeInstanceOf(StoreRefusal);
      expect(refused).toMatchObject({ code: ErrorCode.QUOTA_KEYS, details: { max: MAX_CLAIMS_PER_SESSION } });
      expect(s.claim(late, ['p/late'], false)).toEqual([-1]);
      // Holder 0 leaves: its 16 places are free, the late member takes one, and the live holders keep theirs.
      s.rendezvous!.remove(holders[0]!, 'its tab closed');
      expect(s.claim(late, ['p/late'], true)).toEqual([late]);
      expect(s.claim(late, ['p/0/0'], false)).toEqual([-1]);
      expect(
        s.claim(
          late,
          holders.slice(1).map((_, i) => `p/${i + 1}/15`),
          false,
        ),
      ).toEqual(holders.slice(1));
    } finally {
      s.rendezvous?.close();
    }
  });

  it('member ids go on across the groups a session has: an id names one member while the server runs', async () => {
    const session = uniqueSession('memberids');
    const first = await connect(server, session);
    const { memberId: one } = await first.rendezvous({ min: 1, max: 1 }, 200);
    first.close();
    const next = await connect(server, session);
    let id = 0;
    await waitFor("the first member's leaving, so the next one can join", async () => {
      try {
        id = (await next.rendezvous({ min: 1, max: 1 }, 200)).memberId;
        return true;
      } catch {
        return false; // the first member's leaving not yet seen: the group is still full
      }
    });
    expect(id).toBeGreaterThan(one);
    next.close();
  });
});
