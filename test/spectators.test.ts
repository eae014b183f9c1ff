/**
 * Spectators against the real server: a member asking to `spectate` a full group waits beyond
 * its maximum (rounds with rank -1) instead of being refused, takes a rank that comes free, is
 * capped by `maxSpectators`, and is not counted as waiting by the running ranks (no regroup churn).
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { RoundEvent, WaitingEvent } from '../src/wire/protocol.ts';
import { parseRequest, parseServerMessage } from '../src/wire/protocol_validation.ts';
import { RendezvousHandler, type RendezvousEvent, type RendezvousOptions } from '../src/c10d/rendezvous.ts';
import { RendezvousError, ServerMessageError } from '../src/wire/errors.ts';
import { connect, withServer } from './fixtures/server.ts';
import { uniqueSession, tokenFor } from './fixtures/session.ts';
import { errorOf } from './fixtures/errors.ts';
import { ProtocolViolation } from '../src/wire/protocol_validation.ts';

let server: RunningServer | undefined;
const agents: RendezvousHandler[] = [];
afterEach(async () => {
  for (const a of agents.splice(0)) a.shutdown();
  await server?.close();
  server = undefined;
});

async function agent(
  session: string,
  min: number,
  max: number,
  more: Partial<RendezvousOptions> = {},
  listener?: (e: RendezvousEvent) => void,
): Promise<RendezvousHandler> {
  const a = await RendezvousHandler.start(
    { url: server!.url, session, token: tokenFor(session), min, max, timeoutMs: 5_000, heartbeatIntervalMs: 100, reconnect: true, ...more },
    listener,
  );
  agents.push(a);
  return a;
}

/** Three members of a 1..3 group: at its maximum, so the round forms at once. */
async function fullGroup(session: string) {
  const members = [await agent(session, 1, 3), await agent(session, 1, 3), await agent(session, 1, 3)];
  const rounds = await Promise.all(members.map((m) => m.nextRendezvous(0)));
  expect(rounds.map((r) => [r.round, r.rank, r.worldSize])).toEqual([
    [1, 0, 3],
    [1, 1, 3],
    [1, 2, 3],
  ]);
  return { members, rounds };
}

describe('spectators', () => {
  it('a 4th member with spectate waits with rank -1 and takes the rank a member leaves', async () => {
    server = await withServer({ settleMs: 5_000 });
    const session = uniqueSession('spec');
    const { members, rounds } = await fullGroup(session);
    const seen: RendezvousEvent[] = [];
    const spectator = await agent(session, 1, 3, { spectate: true }, (e) => seen.push(e));
    expect(seen.find((e) => e.type === 'spectating')).toEqual({ type: 'spectating', round: 1, worldSize: 3, max: 3 });
    const first = spectator.nextRendezvous(0);

    // Member 1 (rank 1) leaves: survivors keep their order, the spectator takes the last rank.
    members[1]!.shutdown();
    const next = await Promise.all([members[0]!.nextRendezvous(rounds[0]!.id), members[2]!.nextRendezvous(rounds[2]!.id), first]);
    expect(next.map((r) => [r.round, r.rank, r.worldSize])).toEqual([
      [2, 0, 3],
      [2, 1, 3],
      [2, 2, 3],
    ]);
    await Promise.all(next.map((r) => r.pg.barrier(3_000)));
  });

  it('on the wire: the spectator gets the running round with rank -1 and its world size', async () => {
    server = await withServer({ settleMs: 5_000 });
    const session = uniqueSession('wire');
    await fullGroup(session);
    const raw = await connect(server, session);
    const rounds: RoundEvent[] = [];
    const waiting: WaitingEvent[] = [];
    raw.on('round', (e) => rounds.push(e));
    raw.on('waiting', (e) => waiting.push(e));
    await raw.rendezvous({ min: 1, max: 3, spectate: true });
    expect(rounds).toEqual([{ type: 'round', round: 1, rank: -1, worldSize: 3, members: [1, 2, 3], paused: false, min: 1, max: 3 }]);
    await expect.poll(() => waiting.at(-1)).toEqual({ type: 'waiting', round: 1, waiting: 0, spectators: 1, members: 4, min: 1, max: 3 });
    raw.close();
  });

  it('without spectate a full group still refuses SESSION_FULL, and says spectate would wait', async () => {
    server = await withServer({ settleMs: 5_000 });
    const session = uniqueSession('full');
    await fullGroup(session);
    const err = await agent(session, 1, 3).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RendezvousError);
    expect((err as RendezvousError).code).toBe('SESSION_FULL');
    expect((err as RendezvousError).message).toContain('join with spectate to wait for a free rank');
  });

  it('takes at most maxSpectators beyond the maximum; a place that comes free admits the next', async () => {
    server = await withServer({ settleMs: 5_000, limits: { maxSpectators: 1 } });
    const session = uniqueSession('cap');
    const a = await agent(session, 1, 1);
    await a.nextRendezvous(0);
    const s1 = await agent(session, 1, 1, { spectate: true });
    const err = (await agent(session, 1, 1, { spectate: true }).catch((e: unknown) => e)) as RendezvousError;
    expect(err).toBeInstanceOf(RendezvousError);
    expect([err.code, err.message]).toEqual([
      'SESSION_FULL',
      `session "${session}" is full: all 1 ranks have joined, and 1 spectators wait, the most it takes`,
    ]);
    expect(err.details).toMatchObject({ max: 1, spectators: 1, maxSpectators: 1 });
    s1.shutdown();
    await expect
      .poll(
        () =>
          agent(session, 1, 1, { spectate: true }).then(
            () => true,
            () => false,
          ),
        { timeout: 3_000 },
      )
      .toBe(true);
  });

  it('numNodesWaiting counts only members a regroup could admit: spectators cause no regroup churn', async () => {
    server = await withServer({ settleMs: 200, limits: { regroupIntervalMs: 0 } });
    const session = uniqueSession('churn');
    const waits: Extract<RendezvousEvent, { type: 'waiting' }>[] = [];
    const a = await agent(session, 2, 3, {}, (e) => e.type === 'waiting' && waits.push(e));
    const b = await agent(session, 2, 3);
    const g1 = await Promise.all([a.nextRendezvous(0), b.nextRendezvous(0)]);
    expect(g1[0]!.worldSize).toBe(2);
    // One more fits (waits for a regroup); the one after it is beyond the maximum.
    const c = await agent(session, 2, 3);
    const spectating: RendezvousEvent[] = [];
    const d = await agent(session, 2, 3, { spectate: true }, (e) => e.type === 'spectating' && spectating.push(e));
    await expect
      .poll(() => waits.at(-1))
      .toEqual({ type: 'waiting', waiting: 1, spectators: 1, members: 4, min: 2, max: 3, running: true });
    expect(a.numNodesWaiting()).toBe(1);
    expect(spectating).toEqual([{ type: 'spectating', round: 1, worldSize: 2, max: 3 }]);

    expect(await Promise.all([a.regroup(g1[0]!), b.regroup(g1[1]!)])).toEqual([2, 2]);
    const g2 = await Promise.all([a.nextRendezvous(g1[0]!.id), b.nextRendezvous(g1[1]!.id), c.nextRendezvous(0)]);
    expect(g2.map((g) => [g.round, g.rank, g.worldSize])).toEqual([
      [2, 0, 3],
      [2, 1, 3],
      [2, 2, 3],
    ]);
    // The spectator is told the new round runs without it.
    await expect.poll(() => spectating.at(-1)).toEqual({ type: 'spectating', round: 2, worldSize: 3, max: 3 });
    await expect.poll(() => waits.at(-1)).toMatchObject({ waiting: 0, spectators: 1, members: 4, running: true });
    expect(a.numNodesWaiting()).toBe(0);
    // A regroup asked for anyway forms nothing: the group is full and only a spectator waits.
    expect(await Promise.all(g2.map((g, i) => [a, b, c][i]!.regroup(g)))).toEqual([2, 2, 2]);
    expect(server.sessions.get(session)?.rendezvous?.round).toBe(2);
    d.shutdown();
    await expect.poll(() => waits.at(-1)).toMatchObject({ waiting: 0, spectators: 0, members: 3 });
  });
});

describe('spectator messages', () => {
  it('parses spectate and the waiting event with spectators, and refuses bad ones', () => {
    expect(parseRequest(JSON.stringify({ type: 'rendezvous', id: 1, min: 1, max: 3, spectate: true }))).toEqual({
      type: 'rendezvous',
      id: 1,
      min: 1,
      max: 3,
      spectate: true,
    });
    expect(() => parseRequest(JSON.stringify({ type: 'rendezvous', id: 1, min: 1, max: 3, spectate: 'yes' }))).toThrow(
      errorOf(ProtocolViolation, /"spectate" must be true or false/, { code: 'BAD_MESSAGE' }),
    );
    const waiting = { type: 'waiting', round: 1, waiting: 0, spectators: 70, members: 73, min: 1, max: 3 };
    expect(parseServerMessage(JSON.stringify(waiting))).toEqual(waiting);
    expect(() => parseServerMessage(JSON.stringify({ ...waiting, spectators: undefined }))).toThrow(
      errorOf(ServerMessageError, /bad members or spectators/, { messageType: 'waiting' }),
    );
    const round = { type: 'round', round: 1, rank: -1, worldSize: 3, members: [4, 1, 9], paused: false, min: 1, max: 3 };
    expect(parseServerMessage(JSON.stringify(round))).toEqual(round);
    // Who is who comes from the server: one distinct member id per rank, or the round is refused.
    for (const members of [[4, 1], [4, 4, 9], [4, 0, 9], [4, 1.5, 9], undefined]) {
      expect(() => parseServerMessage(JSON.stringify({ ...round, members }))).toThrow(
        errorOf(ServerMessageError, /bad members/, { messageType: 'round' }),
      );
    }
    expect(parseServerMessage(JSON.stringify({ ...round, worldSize: 0, paused: true, members: [] }))).toMatchObject({
      paused: true,
      members: [],
    });
  });
});
