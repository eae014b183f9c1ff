/**
 * The session's host against the real server: only the hello that creates a session may fix its
 * host secret; only a host connection may `control` the session (NOT_HOST otherwise); every
 * control reaches every socket of the session; 'min' pauses and resumes the group; 'end' closes
 * every socket with 4008 and refuses the session from then on.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RunningServer } from '../signaling/server.ts';
import { HOST_FILE, SessionTokens, TOKEN_FILE } from '../signaling/session_tokens.ts';
import { CloseCode, type ControlEvent, type RoundEvent, type WaitingEvent } from '../src/wire/protocol.ts';
import { parseRequest, parseServerMessage } from '../src/wire/protocol_validation.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { RendezvousHandler, type RendezvousEvent, type RendezvousOptions } from '../src/c10d/rendezvous.ts';
import { SessionEndedError, StoreError, UnauthorizedError, ServerMessageError } from '../src/wire/errors.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { saveCheckpoint } from '../src/checkpoint/checkpoint.ts';
import { connect, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { errorOf } from './fixtures/errors.ts';
import { ProtocolViolation } from '../src/wire/protocol_validation.ts';

let server: RunningServer | undefined;
const agents: RendezvousHandler[] = [];
const clients: StoreClient[] = [];
const dirs: string[] = [];
afterEach(async () => {
  for (const a of agents.splice(0)) a.shutdown();
  for (const c of clients.splice(0)) c.close();
  await server?.close();
  server = undefined;
  for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
});

async function client(session: string, host?: string): Promise<StoreClient> {
  const c = await StoreClient.connect(server!.url, { session, token: tokenFor(session), host, timeoutMs: 5_000 });
  clients.push(c);
  return c;
}

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

async function refusal(p: Promise<unknown>): Promise<StoreError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(StoreError);
  return err as StoreError;
}

describe('host secret', () => {
  it('the hello that creates the session fixes it; later hellos must match it or are refused', async () => {
    server = await withServer();
    const session = uniqueSession('host');
    const host = newSessionToken();
    const h = await client(session, host);
    expect([h.isHost, h.hasHost]).toEqual([true, true]);

    const member = await client(session);
    expect([member.isHost, member.hasHost]).toEqual([false, true]);

    const wrong = await refusal(client(session, newSessionToken()));
    expect(wrong).toBeInstanceOf(UnauthorizedError);
    expect(wrong.message).toContain('the host link is wrong');

    const malformed = await refusal(client(session, 'short'));
    expect(malformed).toBeInstanceOf(UnauthorizedError);
    expect(malformed.message).toMatch(/host secret must be 22-128 characters/);

    const again = await client(session, host);
    expect([again.isHost, again.hasHost]).toEqual([true, true]);
  });

  it('a malformed host secret on the creating hello is refused before the token is fixed', async () => {
    server = await withServer();
    const session = uniqueSession('host');
    // A malformed host secret on the creating hello: refused before the token is fixed.
    expect(await refusal(client(session, 'x'))).toBeInstanceOf(UnauthorizedError);
    const first = await client(session);
    expect([first.isHost, first.hasHost]).toEqual([false, false]);
  });

  it('a later member cannot make itself host of a session created without one (its secret is ignored)', async () => {
    server = await withServer();
    const session = uniqueSession('nohost');
    const creator = await client(session);
    expect([creator.isHost, creator.hasHost]).toEqual([false, false]);
    const late = await client(session, newSessionToken());
    expect([late.isHost, late.hasHost]).toEqual([false, false]);
    expect((await refusal(late.control('stop'))).code).toBe('NOT_HOST');
  });

  it('a host secret given with a right token to a running session is not fixed afterwards', async () => {
    server = await withServer();
    const session = uniqueSession('host');
    const host = newSessionToken();
    await client(session, host);
    // Someone with the member link tries another host secret, then the real host comes back.
    await refusal(client(session, newSessionToken()));
    expect((await client(session, host)).isHost).toBe(true);
  });

  it('keeps the host secret beside the token in the checkpoint folder, so a restart keeps it', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'host-'));
    dirs.push(dir);
    server = await withServer({ checkpointDir: dir });
    const session = uniqueSession('persist');
    const host = newSessionToken();
    await client(session, host);
    const empty = new ArrayBuffer(0);
    await saveCheckpoint(
      server.url,
      session,
      {
        meta: { step: 1 },
        model: { modelTopology: {}, weightSpecs: [], weightData: empty },
        optimizer: { weightSpecs: [], weightData: empty },
      },
      { token: tokenFor(session) },
    );
    expect(await readFile(join(dir, session, HOST_FILE), 'utf8')).toMatch(/^[0-9a-f]{64}\n$/);
    const port = server.port;
    await server.close();
    server = await withServer({ checkpointDir: dir, port });
    // The first hello after the restart finds the token on disk, so it creates nothing: a host
    // secret it brings must match the persisted one.
    const member = await client(session, newSessionToken()).catch((e: unknown) => e);
    expect(member).toBeInstanceOf(UnauthorizedError);
    const plain = await client(session);
    expect([plain.isHost, plain.hasHost]).toEqual([false, true]);
    expect((await client(session, host)).isHost).toBe(true);
  });

  it('SessionTokens: only the creating claim fixes the host; persist writes it and removes a stray one', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'host-'));
    dirs.push(dir);
    const tokens = new SessionTokens(dir);
    const [token, host] = [newSessionToken(), newSessionToken()];
    expect(await tokens.claimSession('s', token, host, true)).toEqual({ ok: true, created: true });
    expect(await tokens.claimSession('s', token, newSessionToken(), false)).toEqual({ ok: true, created: false });
    expect(await tokens.checkHost('s', host)).toBe('host');
    expect(await tokens.checkHost('s', newSessionToken())).toBe('wrong');
    expect(await tokens.checkHost('s', undefined)).toBe('member');
    await tokens.persist('s');
    const restarted = new SessionTokens(dir);
    expect(await restarted.claimSession('s', token, newSessionToken(), false)).toEqual({ ok: true, created: false });
    expect(await restarted.checkHost('s', host)).toBe('host');
    expect(restarted.hasHost('s')).toBe(true);

    // A session without a host: a host file left from an older session of the name goes.
    const t = new SessionTokens(dir);
    expect(await t.claimSession('t', token, undefined, true)).toEqual({ ok: true, created: true });
    await t.persist('t');
    await writeFile(join(dir, 't', HOST_FILE), `${'a'.repeat(64)}\n`);
    await t.persist('t');
    await expect(readFile(join(dir, 't', HOST_FILE))).rejects.toThrow();
    expect(await readFile(join(dir, 't', TOKEN_FILE), 'utf8')).toMatch(/^[0-9a-f]{64}\n$/);
    expect(await new SessionTokens(dir).checkHost('t', host)).toBe('member');
  });
});

describe('control', () => {
  it('a non-host gets NOT_HOST, and it counts as a refusal toward maxErrorsPerSocket', async () => {
    server = await withServer({ limits: { maxErrorsPerSocket: 2 } });
    const session = uniqueSession('nothost');
    await client(session, newSessionToken());
    const member = await client(session);
    const err = await refusal(member.control('stop'));
    expect(err.code).toBe('NOT_HOST');
    expect(err.message).toContain(`only the host of session "${session}" may stop it`);
    expect((await refusal(member.control('min', 1))).message).toContain('change its minimum');
    const closed = new Promise<number>((r) => member.on('close', (e) => r(e.code)));
    await refusal(member.control('end'));
    expect(await closed).toBe(CloseCode.TOO_MANY_ERRORS);
    // Nothing was ended.
    expect(server.sessions.get(session)?.ended).toBe(false);
  });

  it("the host's stop reaches every socket: members, a spectator, a store-only client and the host", async () => {
    server = await withServer({ settleMs: 5_000 });
    const session = uniqueSession('stop');
    const h = await client(session, newSessionToken());
    const heard: RendezvousEvent[][] = [[], [], []];
    const members = [
      await agent(session, 1, 2, {}, (e) => heard[0]!.push(e)),
      await agent(session, 1, 2, {}, (e) => heard[1]!.push(e)),
      await agent(session, 1, 2, { spectate: true }, (e) => heard[2]!.push(e)),
    ];
    await Promise.all(members.slice(0, 2).map((m) => m.nextRendezvous(0)));
    await expect.poll(() => heard[2]!.some((e) => e.type === 'spectating')).toBe(true);
    const storeOnly = await client(session);
    const raw: ControlEvent[][] = [[], []];
    h.on('control', (e) => raw[0]!.push(e));
    storeOnly.on('control', (e) => raw[1]!.push(e));
    await h.control('stop');
    const stop: ControlEvent = { type: 'control', action: 'stop', by: 'host' };
    await expect.poll(() => raw).toEqual([[stop], [stop]]);
    await expect
      .poll(() => heard.map((h) => h.filter((e) => e.type === 'control')))
      .toEqual([[{ type: 'control', action: 'stop' }], [{ type: 'control', action: 'stop' }], [{ type: 'control', action: 'stop' }]]);
    // Stop only relays: the group goes on.
    expect(members[0]!.numNodesWaiting()).toBe(0);
    expect(server.sessions.get(session)?.ended).toBe(false);
  });

  it('min raised above the running group pauses it; an arrival (with the original range) resumes it; min is checked against max', async () => {
    server = await withServer({ settleMs: 500 });
    const session = uniqueSession('min');
    const h = await client(session, newSessionToken());
    const [a, b] = [await agent(session, 1, 3), await agent(session, 1, 3)];
    const g1 = await Promise.all([a.nextRendezvous(0), b.nextRendezvous(0)]);
    expect(g1.map((g) => g.worldSize)).toEqual([2, 2]);
    const events: RendezvousEvent[] = [];
    a.on((e) => events.push(e));
    const rounds: RoundEvent[] = [];
    a.store.on('round', (e) => rounds.push(e));

    await h.control('min', 3);
    await expect.poll(() => events.find((e) => e.type === 'paused')).toEqual({ type: 'paused', round: 2, min: 3 });
    // The control came first, then its effect.
    expect(events[0]).toEqual({ type: 'control', action: 'min', min: 3 });
    expect(rounds[0]).toMatchObject({ round: 2, rank: -1, paused: true, min: 3, max: 3 });

    const c = await agent(session, 1, 3);
    const g2 = await Promise.all([a.nextRendezvous(g1[0].id), b.nextRendezvous(g1[1].id), c.nextRendezvous(0)]);
    expect(g2.map((g) => [g.round, g.rank, g.worldSize])).toEqual([
      [3, 0, 3],
      [3, 1, 3],
      [3, 2, 3],
    ]);
    expect(rounds.at(-1)).toMatchObject({ round: 3, rank: 0, worldSize: 3, paused: false, min: 3 });

    // Lowering it while the group runs changes nothing but what everyone is told.
    const waiting: WaitingEvent[] = [];
    a.store.on('waiting', (e) => waiting.push(e));
    await h.control('min', 1);
    await expect.poll(() => waiting.at(-1)).toMatchObject({ min: 1, max: 3, members: 3, waiting: 0 });
    expect(rounds.at(-1)!.round).toBe(3);

    for (const [min, pattern] of [
      [4, /min 4 is outside 1\.\.3/],
      [0, /"min" is 0; allowed is 1\.\./],
    ] as const) {
      const err = await refusal(h.control('min', min));
      expect([err.code, err.message]).toEqual(['BAD_MESSAGE', expect.stringMatching(pattern)]);
    }
    expect((await refusal(h.control('min'))).message).toContain('field "min" must be an integer');
    expect((await refusal(h.control('stop', 2))).message).toContain('field "min" goes with action "min" only');
  });

  it('min lowered below the members of a group that waits for its maximum forms it', async () => {
    server = await withServer({ settleMs: 100 });
    const session = uniqueSession('minfix');
    const h = await client(session, newSessionToken());
    const [a, b] = [await agent(session, 3, 3), await agent(session, 3, 3)];
    await h.control('min', 2);
    const g = await Promise.all([a.nextRendezvous(0), b.nextRendezvous(0)]);
    expect(g.map((x) => [x.rank, x.worldSize])).toEqual([
      [0, 2],
      [1, 2],
    ]);
  });

  it('refuses min before the session has a group', async () => {
    server = await withServer();
    const session = uniqueSession('nogroup');
    const h = await client(session, newSessionToken());
    const err = await refusal(h.control('min', 2));
    expect([err.code, err.message]).toEqual([
      'BAD_MESSAGE',
      `session "${session}" has no group yet: its minimum can be changed once a member has joined`,
    ]);
  });

  it('end relays, closes every socket with 4008, drops the keys and refuses later hellos and requests', async () => {
    server = await withServer({ settleMs: 100 });
    const session = uniqueSession('end');
    const host = newSessionToken();
    const h = await client(session, host);
    const member = await client(session);
    await member.set('k', 'v');
    const events: RendezvousEvent[] = [];
    const a = await agent(session, 1, 2, {}, (e) => events.push(e));
    const g = await a.nextRendezvous(0);
    const closes = [h, member].map((c) => new Promise<[number, string]>((r) => c.on('close', (e) => r([e.code, e.reason]))));
    const heard = new Promise<ControlEvent>((r) => member.on('control', r));
    const next = a.nextRendezvous(g.id, 10_000).catch((e: unknown) => e);

    await h.control('end');
    expect(await heard).toEqual({ type: 'control', action: 'end', by: 'host' });
    // Between the event and the close, the session refuses everything.
    const late = await refusal(member.get('k', 100));
    expect([late.code, late.message]).toEqual(['SESSION_ENDED', `the host ended session "${session}": create a new one`]);
    expect(server.sessions.get(session)?.store.numKeys).toBe(0);
    for (const c of await Promise.all(closes)) expect(c).toEqual([CloseCode.SESSION_ENDED, `the host ended session "${session}"`]);
    expect(events.filter((e) => e.type === 'control')).toEqual([{ type: 'control', action: 'end' }]);
    // The handler does not rejoin: it fails for good.
    expect(await next).toBeInstanceOf(SessionEndedError);

    for (const secret of [undefined, host]) {
      const err = await refusal(client(session, secret));
      expect(err).toBeInstanceOf(SessionEndedError);
      expect(err.message).toBe(`the host ended session "${session}": create a new one`);
    }
    // A wrong token learns nothing more than before.
    const stranger = await refusal(StoreClient.connect(server.url, { session, token: newSessionToken(), timeoutMs: 2_000 }));
    expect(stranger).toBeInstanceOf(UnauthorizedError);
    // Other sessions are untouched.
    const other = await connect(server, uniqueSession('other'));
    await other.set('x', '1');
    other.close();
  });
});

describe('control messages', () => {
  it('parses control requests, host secrets and control events, and refuses malformed ones', () => {
    expect(parseRequest(JSON.stringify({ type: 'control', id: 1, action: 'min', min: 2 }))).toEqual({
      type: 'control',
      id: 1,
      action: 'min',
      min: 2,
    });
    expect(parseRequest(JSON.stringify({ type: 'control', id: 1, action: 'end' }))).toEqual({ type: 'control', id: 1, action: 'end' });
    expect(() => parseRequest(JSON.stringify({ type: 'control', id: 1, action: 'pause' }))).toThrow(
      errorOf(ProtocolViolation, /"action" must be one of "stop", "end", "min"/, { code: 'BAD_MESSAGE' }),
    );
    expect(parseRequest(JSON.stringify({ type: 'hello', id: 1, session: 's', version: 4, token: 't', host: 'h' }))).toMatchObject({
      host: 'h',
    });
    expect(() => parseRequest(JSON.stringify({ type: 'hello', id: 1, session: 's', version: 4, token: 't', host: 5 }))).toThrow(
      errorOf(ProtocolViolation, /"host" must be a string/, { code: 'BAD_MESSAGE' }),
    );
    const event = { type: 'control', action: 'min', min: 3, by: 'host' };
    expect(parseServerMessage(JSON.stringify(event))).toEqual(event);
    expect(() => parseServerMessage(JSON.stringify({ ...event, by: 'rank 0' }))).toThrow(
      errorOf(ServerMessageError, /bad action or sender/, { messageType: 'control' }),
    );
    expect(() => parseServerMessage(JSON.stringify({ type: 'control', action: 'stop', min: 3, by: 'host' }))).toThrow(
      errorOf(ServerMessageError, /bad min/, { messageType: 'control' }),
    );
  });
});
