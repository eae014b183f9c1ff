/**
 * Session secrets against the real server: the first connection fixes a session's token, and a
 * connection with a missing, malformed or other token can read, write, join, signal or regroup
 * nothing of the session.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { RunningServer } from '../signaling/server.ts';
import { SessionTokens } from '../signaling/session_tokens.ts';
import { CloseCode, PROTOCOL_VERSION } from '../src/wire/protocol.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { UnauthorizedError } from '../src/wire/errors.ts';
import { initProcessGroup } from '../src/c10d/init_process_group.ts';
import { newSessionToken, tokenFromFragment, withToken } from '../src/wire/session_token.ts';
import { connect, text, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';
import { errorOf } from './fixtures/errors.ts';

let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

/** A raw socket that sends frames and collects every server message, and how it closed. */
async function rawClient(url: string) {
  const ws = new WebSocket(`${url.replace('http', 'ws')}ws`);
  await new Promise((r) => ws.once('open', r));
  const messages: Array<Record<string, unknown>> = [];
  ws.on('message', (d) => messages.push(JSON.parse(d.toString()) as Record<string, unknown>));
  const closed = new Promise<number>((r) => ws.once('close', (code) => r(code)));
  return {
    send: (m: object) => ws.send(JSON.stringify(m)),
    messages,
    closed,
    close: () => ws.close(),
  };
}

describe('session tokens', () => {
  it('makes 256-bit base64url tokens and carries them in a link fragment', () => {
    const a = newSessionToken();
    expect(a).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(newSessionToken()).not.toBe(a);
    const link = withToken('http://127.0.0.1:8080/?session=s&world=2', a);
    expect(link).toBe(`http://127.0.0.1:8080/?session=s&world=2#token=${a}`);
    expect(new URL(link).search).not.toContain(a);
    expect(tokenFromFragment(link)).toBe(a);
    expect(tokenFromFragment('#other=1')).toBeUndefined();
  });

  it('refuses a wrong, malformed or missing token with UNAUTHORIZED and closes the socket', async () => {
    server = await withServer();
    const session = uniqueSession('tok');
    const owner = await connect(server, session);
    await owner.set('secret', 'weights of rank 0');

    const wrong = (await StoreClient.connect(server.url, { session, token: newSessionToken(), timeoutMs: 2_000 }).catch(
      (e: unknown) => e,
    )) as UnauthorizedError;
    expect(wrong).toBeInstanceOf(UnauthorizedError);
    expect(wrong.code).toBe('UNAUTHORIZED');
    expect(wrong.message).toContain(`wrong token for session "${session}"`);

    const short = (await StoreClient.connect(server.url, { session, token: 'abc', timeoutMs: 2_000 }).catch(
      (e: unknown) => e,
    )) as UnauthorizedError;
    expect(short).toBeInstanceOf(UnauthorizedError);
    expect(short.message).toMatch(/22-128 characters/);

    const raw = await rawClient(server.url);
    raw.send({ type: 'hello', id: 1, session, version: PROTOCOL_VERSION });
    await expect.poll(() => raw.messages.length).toBe(1);
    expect(raw.messages[0]).toMatchObject({ id: 1, code: 'BAD_MESSAGE' });
    expect(String(raw.messages[0]!.message)).toContain('"token"');
    raw.close();

    // The session is untouched, and its owner keeps working.
    expect(text(await owner.get('secret'))).toBe('weights of rank 0');
    expect(await owner.numKeys()).toBe(1);
    owner.close();
  });

  it('a socket refused at hello reads, writes, joins, signals and regroups nothing', async () => {
    server = await withServer({ settleMs: 50 });
    const session = uniqueSession('tok');
    const owner = await connect(server, session);
    await owner.set('k', 'v1');
    const raw = await rawClient(server.url);
    // Everything an attacker would try, sent at once behind the refused hello.
    raw.send({ type: 'hello', id: 1, session, version: PROTOCOL_VERSION, token: newSessionToken() });
    raw.send({ type: 'get', id: 2, key: 'k', timeoutMs: 100 });
    raw.send({ type: 'set', id: 3, key: 'k', value: btoa('overwritten') });
    raw.send({ type: 'rendezvous', id: 4, min: 1, max: 1, rank: 0 });
    raw.send({ type: 'signal', id: 5, to: 0, data: { channel: 'x', body: 'offer' } });
    raw.send({ type: 'regroup', id: 6, fromRound: 0 });
    expect(await raw.closed).toBe(CloseCode.UNAUTHORIZED);
    expect(raw.messages[0]).toMatchObject({ type: 'error', id: 1, code: 'UNAUTHORIZED' });
    // No reply carried a value, and nothing else reached the session.
    expect(raw.messages.filter((m) => m.type === 'reply')).toEqual([]);
    expect(text(await owner.get('k'))).toBe('v1');
    expect(server.sessions.get(session)?.rendezvous).toBeUndefined();
    owner.close();
  });

  it('the first of two racing connections fixes the token', async () => {
    server = await withServer();
    const session = uniqueSession('race');
    const [a, b] = [newSessionToken(), newSessionToken()];
    const results = await Promise.allSettled([a, b].map((token) => StoreClient.connect(server!.url, { session, token, timeoutMs: 2_000 })));
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    expect((results.find((r) => r.status === 'rejected') as PromiseRejectedResult).reason).toBeInstanceOf(UnauthorizedError);
    for (const r of results) if (r.status === 'fulfilled') r.value.close();
  });

  it('initProcessGroup with another token is refused, and the session goes on without it', async () => {
    server = await withServer();
    const session = uniqueSession('pg');
    const member = initProcessGroup({ url: server.url, session, token: tokenFor(session), worldSize: 1, timeoutMs: 5_000 });
    const pg = await member;
    const err = await initProcessGroup({ url: server.url, session, token: newSessionToken(), worldSize: 1, timeoutMs: 5_000 }).catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(UnauthorizedError);
    expect(Array.from(await pg.allReduce(Float32Array.of(3)))).toEqual([3]);
    pg.destroy();
  });

  it('keeps the token of a session dropped for idleness: its links still work, and nobody else takes its name', async () => {
    server = await withServer({ sessionIdleMs: 100 });
    const session = uniqueSession('idle');
    (await connect(server, session)).close();
    await expect.poll(() => server!.sessions.has(session), { timeout: 5_000, interval: 100 }).toBe(false);
    await expect(StoreClient.connect(server.url, { session, token: newSessionToken(), timeoutMs: 2_000 })).rejects.toThrow(
      errorOf(UnauthorizedError, /wrong token/, { code: 'UNAUTHORIZED' }),
    );
    (await connect(server, session)).close();
  });

  it('forgets a token a day after its session was last used (SessionTokens.expire), then the name is free again', async () => {
    const tokens = new SessionTokens(await mkdtemp(join(tmpdir(), 'tokens-')), 10, 1_000);
    await tokens.create('s', tokenFor('s'));
    tokens.expire(Date.now() + 500);
    expect(await tokens.verify('s', tokenFor('s'))).toBe('ok');
    tokens.expire(Date.now() + 2_000);
    expect(await tokens.verify('s', tokenFor('s'))).toBe('unknown');
    // Bounded: a creation past maxSessions kept tokens is refused.
    for (let i = 0; i < 10; i++) await tokens.create(`t${i}`, tokenFor(`t${i}`));
    await expect(tokens.create('one-more', tokenFor('one-more'))).rejects.toThrow(/keeps 10 sessions already/);
  });
});
