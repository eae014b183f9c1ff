/**
 * The host removes a tab, against the real server: the removed member's socket closes with
 * REMOVED and its handler stops for good; the session's token changes and every other socket gets
 * the new one (never the removed one); a hello with the old token is refused saying the link
 * changed, one with the new token enters; the others train on and rejoin with the new token; only
 * the host may remove; a stale rank or an unknown member is refused; other sessions are untouched.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RunningServer } from '../signaling/server.ts';
import { TOKEN_FILE } from '../signaling/session_tokens.ts';
import { CloseCode, ROTATED_TOKEN_MESSAGE, type TokenEvent } from '../src/wire/protocol.ts';
import { parseRequest, parseServerMessage } from '../src/wire/protocol_validation.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { RendezvousHandler, type RendezvousOptions } from '../src/c10d/rendezvous.ts';
import {
  NotHostError,
  RemovedByHostError,
  type StoreError,
  TokenRotatedError,
  UnauthorizedError,
  ServerMessageError,
} from '../src/wire/errors.ts';
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

async function client(session: string, options: { host?: string; token?: string } = {}): Promise<StoreClient> {
  const c = await StoreClient.connect(server!.url, {
    session,
    token: options.token ?? tokenFor(session),
    host: options.host,
    timeoutMs: 5_000,
  });
  clients.push(c);
  return c;
}

async function agent(session: string, more: Partial<RendezvousOptions> = {}): Promise<RendezvousHandler> {
  const a = await RendezvousHandler.start({
    url: server!.url,
    session,
    token: tokenFor(session),
    min: 1,
    max: 3,
    timeoutMs: 10_000,
    heartbeatIntervalMs: 100,
    reconnect: true,
    ...more,
  });
  agents.push(a);
  return a;
}

async function rejection(p: Promise<unknown>): Promise<Error> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(Error);
  return err as Error;
}

const sha256 = (token: string) => createHash('sha256').update(token, 'utf8').digest('hex');

describe('the host removes a tab', () => {
  it("closes the removed member's socket with REMOVED, gives the others the new token, and refuses the old one", async () => {
    server = await withServer({ settleMs: 200 });
    const session = uniqueSession('remove');
    const old = tokenFor(session);
    const host = await client(session, { host: newSessionToken() });
    const heardByA: string[] = [];
    const a = await agent(session, { onToken: (t) => heardByA.push(t) });
    const b = await agent(session);
    const storeOnly = await client(session);
    const [ga, gb] = await Promise.all([a.nextRendezvous(0), b.nextRendezvous(0)]);
    expect([ga.worldSize, gb.worldSize]).toEqual([2, 2]);

    const events: TokenEvent[][] = [[], [], []];
    for (const [i, c] of [host, a.store, b.store].entries()) c.on('token', (e) => events[i]!.push(e));
    const heardByStoreOnly = new Promise<TokenEvent>((r) => storeOnly.on('token', r));
    const closed = new Promise<[number, string]>((r) => b.store.on('close', (e) => r([e.code, e.reason])));
    const bNext = b.nextRendezvous(gb.id).catch((e: unknown) => e);
    const aNext = a.nextRendezvous(ga.id);

    const { token } = await host.removeMember({ rank: gb.rank, round: gb.round });
    expect(token).not.toBe(old);
    expect(token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(await closed).toEqual([CloseCode.REMOVED, `removed by the host of session "${session}"`]);
    const removed = await bNext;
    expect(removed).toBeInstanceOf(RemovedByHostError);
    expect((removed as Error).message).toContain(`the host removed this tab from session "${session}"`);
    // Everyone else has the new token (the host too, before its reply); the removed tab never saw it.
    const reason = `the host removed rank ${gb.rank} of round ${gb.round} from the session`;
    expect(events[0]).toEqual([{ type: 'token', token, reason }]);
    expect(events[1]).toEqual([{ type: 'token', token, reason }]);
    expect(events[2]).toEqual([]);
    expect((await heardByStoreOnly).token).toBe(token);
    expect(heardByA).toEqual([token]);
    expect([host.token, a.store.token, storeOnly.token, b.store.token]).toEqual([token, token, token, old]);

    // The group goes on without it at once.
    const next = await aNext;
    expect([next.rank, next.worldSize]).toEqual([0, 1]);

    // The old link is refused, saying why; the new one enters.
    const stale = await rejection(client(session));
    expect(stale).toBeInstanceOf(TokenRotatedError);
    expect(stale).toBeInstanceOf(UnauthorizedError);
    expect(stale.message).toBe(ROTATED_TOKEN_MESSAGE);
    const fresh = await client(session, { token });
    await fresh.set('k', 'v');
    expect([fresh.isHost, fresh.hasHost]).toEqual([false, true]);
    // A wrong token is still just wrong.
    expect((await rejection(client(session, { token: newSessionToken() }))).message).toContain('wrong token');
    // So are the checkpoint routes: the old token gets the same words.
    const list = await fetch(new URL(`/api/checkpoints/${session}`, server.url), { headers: { authorization: `Bearer ${old}` } });
    expect(list.status).toBe(403);
    expect(await list.text()).toContain(ROTATED_TOKEN_MESSAGE);
    expect(
      (await fetch(new URL(`/api/checkpoints/${session}`, server.url), { headers: { authorization: `Bearer ${token}` } })).status,
    ).toBe(200);

    // A member that reconnects later (its socket dropped) comes back with the new token.
    await a.rejoin();
    expect(a.store.token).toBe(token);
    expect((await a.nextRendezvous(next.id)).worldSize).toBe(1);
    // The host steers on as before.
    await host.control('min', 1);
  });

  it('is refused to anyone but the host, names what it cannot find, and leaves other sessions alone', async () => {
    server = await withServer({ settleMs: 100 });
    const session = uniqueSession('remove-refused');
    const host = await client(session, { host: newSessionToken() });
    const a = await agent(session);
    const b = await agent(session);
    const [ga] = await Promise.all([a.nextRendezvous(0), b.nextRendezvous(0)]);
    const other = await connect(server, uniqueSession('bystander'));
    await other.set('x', '1');

    const notHost = await rejection(a.store.removeMember({ rank: 1 }));
    expect(notHost).toBeInstanceOf(NotHostError);
    expect([(notHost as StoreError).code, notHost.message]).toEqual([
      'NOT_HOST',
      `only the host of session "${session}" may remove a tab from it: this connection did not present the session's host secret (open the host link)`,
    ]);
    const stale = (await rejection(host.removeMember({ rank: 1, round: ga.round + 5 }))) as StoreError;
    expect([stale.code, stale.message]).toEqual([
      'UNKNOWN_PEER',
      expect.stringContaining(`round ${ga.round + 5} of session "${session}" is over (round ${ga.round} runs now`),
    ]);
    expect(((await rejection(host.removeMember({ rank: 2 }))) as StoreError).message).toBe(
      `round ${ga.round} of session "${session}" has no rank 2 (it left, or the round is smaller): nothing to remove`,
    );
    expect(((await rejection(host.removeMember({ member: 999 }))) as StoreError).message).toContain('member 999 is not in the group');
    // Malformed: both or neither target, a target with another action.
    expect((await rejection(host.request('control', { action: 'remove' }))).message).toContain('one of the two');
    expect((await rejection(host.request('control', { action: 'remove', rank: 0, member: 1 }))).message).toContain('one of the two');
    expect((await rejection(host.request('control', { action: 'stop', rank: 0 }))).message).toBe(
      'field "rank" goes with action "remove" only, not "stop"',
    );

    // Nothing changed: the old token still opens the session, everyone is still in the group.
    await client(session);
    expect(server.sessions.get(session)?.rendezvous?.size).toBe(2);
    expect(a.store.token).toBe(tokenFor(session));

    // By member id: the host removes a member; the bystander session never notices.
    const target = ga.members[1]!;
    const { token } = await host.removeMember({ member: target });
    expect(server.sessions.get(session)?.rendezvous?.isMember(target)).toBe(false);
    expect(token).not.toBe(tokenFor(session));
    expect(new TextDecoder().decode(await other.get('x'))).toBe('1');
    expect(other.token).toBe(tokenFor(other.session));
    other.close();
  });

  it("refuses to remove the host's own tab", async () => {
    server = await withServer({ settleMs: 100 });
    const session = uniqueSession('remove-self');
    const hostSecret = newSessionToken();
    await client(session, { host: hostSecret });
    const own = await agent(session, { host: hostSecret });
    const g = await own.nextRendezvous(0);
    const err = (await rejection(own.store.removeMember({ rank: g.rank }))) as StoreError;
    expect([err.code, err.message]).toEqual([
      'BAD_MESSAGE',
      expect.stringContaining("is this tab, the host's own: to leave, close the tab"),
    ]);
    expect(own.store.token).toBe(tokenFor(session));
  });

  it("writes the new token's hash where the old one was persisted, so a restarted server keeps the new link only", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'remove-'));
    dirs.push(dir);
    server = await withServer({ checkpointDir: dir, settleMs: 100 });
    const session = uniqueSession('remove-persist');
    const host = await client(session, { host: newSessionToken() });
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
    expect((await readFile(join(dir, session, TOKEN_FILE), 'utf8')).trim()).toBe(sha256(tokenFor(session)));
    const [a, b] = [await agent(session), await agent(session)];
    const [, gb] = await Promise.all([a.nextRendezvous(0), b.nextRendezvous(0)]);
    const { token } = await host.removeMember({ rank: gb.rank });
    expect((await readFile(join(dir, session, TOKEN_FILE), 'utf8')).trim()).toBe(sha256(token));
    const port = server.port;
    for (const x of agents.splice(0)) x.shutdown();
    for (const c of clients.splice(0)) c.close();
    await server.close();
    server = await withServer({ checkpointDir: dir, port });
    expect(await rejection(client(session))).toBeInstanceOf(UnauthorizedError);
    await client(session, { token });
  });
});

describe('remove and token messages', () => {
  it('parses remove requests and token events, and refuses malformed ones', () => {
    expect(parseRequest(JSON.stringify({ type: 'control', id: 1, action: 'remove', rank: 2, round: 7 }))).toEqual({
      type: 'control',
      id: 1,
      action: 'remove',
      rank: 2,
      round: 7,
    });
    expect(parseRequest(JSON.stringify({ type: 'control', id: 1, action: 'remove', member: 9 }))).toEqual({
      type: 'control',
      id: 1,
      action: 'remove',
      member: 9,
    });
    expect(() => parseRequest(JSON.stringify({ type: 'control', id: 1, action: 'remove', member: 9, round: 2 }))).toThrow(
      errorOf(ProtocolViolation, 'field "round" goes with field "rank" only', { code: 'BAD_MESSAGE' }),
    );
    expect(() => parseRequest(JSON.stringify({ type: 'control', id: 1, action: 'remove', rank: -1 }))).toThrow(
      errorOf(ProtocolViolation, 'field "rank" is -1', { code: 'BAD_MESSAGE' }),
    );
    expect(() => parseRequest(JSON.stringify({ type: 'control', id: 1, action: 'remove', rank: 0, min: 1 }))).toThrow(
      errorOf(ProtocolViolation, 'field "min" goes with action "min" only', { code: 'BAD_MESSAGE' }),
    );
    expect(() => parseRequest(JSON.stringify({ type: 'control', id: 1, action: 'kick' }))).toThrow(
      errorOf(ProtocolViolation, 'field "action" must be one of "stop", "end", "min", "remove"', { code: 'BAD_MESSAGE' }),
    );
    const event = { type: 'token', token: newSessionToken(), reason: 'the host removed rank 1 of round 3 from the session' };
    expect(parseServerMessage(JSON.stringify(event))).toEqual(event);
    expect(() => parseServerMessage(JSON.stringify({ ...event, token: 'short' }))).toThrow(
      errorOf(ServerMessageError, 'bad token or reason', { messageType: 'token' }),
    );
    expect(() => parseServerMessage(JSON.stringify({ type: 'token', token: event.token }))).toThrow(
      errorOf(ServerMessageError, 'bad token or reason', { messageType: 'token' }),
    );
  });
});
