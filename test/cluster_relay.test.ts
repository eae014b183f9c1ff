/**
 * One session held by two servers at once (signaling/relay.ts): a real Redis and two real servers
 * on it, clients of the real protocol connected straight to each (no proxy routing them to one).
 * The session's owner runs it; the other server relays its sockets there. So members on either
 * server meet in one group, keys set through one are read and waited on through the other, signals
 * cross, and the host's controls reach members on the other server.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { WebSocket } from 'ws';
import { CloseCode, PROTOCOL_VERSION, type ControlEvent, type RoundEvent, type SignalEvent } from '../src/wire/protocol.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { engineMissing, startEngine, type EngineProcess } from '../scripts/cluster_engines.ts';
import { text, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';

const redisMissing = engineMissing('redis');
if (redisMissing && process.env.DDP_REQUIRE_ALL_TESTS)
  throw new Error(`these tests ${redisMissing}, and DDP_REQUIRE_ALL_TESTS is set: CI must run them, not skip them`);

describe.skipIf(redisMissing !== undefined)('one session on two servers', () => {
  let engine: EngineProcess;
  const servers: RunningServer[] = [];
  const clients: StoreClient[] = [];
  beforeAll(async () => {
    engine = await startEngine('redis');
    for (let i = 0; i < 2; i++) servers.push(await withServer({ store: engine.url, settleMs: 100 }));
  });
  afterAll(async () => {
    for (const c of clients) c.close();
    await Promise.all(servers.map((s) => s.close()));
    await engine?.stop();
  });

  const connect = async (server: RunningServer, session: string, host?: string) => {
    const c = await StoreClient.connect(server.url, { session, token: tokenFor(session), timeoutMs: 5_000, ...(host ? { host } : {}) });
    clients.push(c);
    return c;
  };

  it('members on either server form one group; keys, waits, signals and the host control cross servers', async () => {
    const session = uniqueSession('span');
    const host = newSessionToken();
    await servers[0]!.createSession(session, tokenFor(session), host);
    // The first socket makes server 1 the session's owner; the others come to server 2.
    const a = await connect(servers[0]!, session);
    const b = await connect(servers[1]!, session);
    const h = await connect(servers[1]!, session, host);
    const rounds: RoundEvent[][] = [[], []];
    a.on('round', (e) => rounds[0]!.push(e));
    b.on('round', (e) => rounds[1]!.push(e));
    await Promise.all([a.rendezvous({ min: 2, max: 2, rank: 0 }, 200), b.rendezvous({ min: 2, max: 2, rank: 1 }, 200)]);
    await expect.poll(() => rounds.map((r) => r.at(-1)?.worldSize), { timeout: 5_000 }).toEqual([2, 2]);
    expect(rounds.map((r) => r.at(-1)?.rank)).toEqual([0, 1]);
    // One group, on the owner: server 2 holds no session of its own.
    expect(servers[0]!.sessions.get(session)?.rendezvous?.size).toBe(2);
    expect(servers[1]!.sessions.has(session)).toBe(false);

    // A key set through server 1 is read through server 2; a wait through server 2 wakes on a set through server 1.
    await a.set('k', 'from server 1');
    expect(text(await b.get('k', 2_000))).toBe('from server 1');
    const waited = b.wait(['late'], 5_000);
    await a.set('late', 'x');
    await waited;
    expect(await b.add('n', 2)).toBe(2);
    expect(await a.add('n', 3)).toBe(5);

    // A signal from the member on server 2 reaches the member on server 1.
    const signal = new Promise<SignalEvent>((resolve) => a.on('signal', resolve));
    await b.signal(0, { channel: 'x', body: { sdp: 'offer' } });
    expect(await signal).toMatchObject({ type: 'signal', from: 1, data: { channel: 'x', body: { sdp: 'offer' } } });

    // The host, on server 2, stops the session: the member on server 1 hears it.
    const heard: ControlEvent[] = [];
    a.on('control', (e) => heard.push(e));
    await h.control('stop');
    await expect.poll(() => heard, { timeout: 5_000 }).toEqual([{ type: 'control', action: 'stop', by: 'host' }]);
  }, 30_000);

  it("a socket's hello must be for the session its URL names (the URL routed it to that session's owner)", async () => {
    const session = uniqueSession('route');
    await servers[0]!.createSession(session, tokenFor(session));
    const ws = new WebSocket(`${servers[1]!.url.replace('http', 'ws')}ws?session=${uniqueSession('other')}`);
    await new Promise((resolve, reject) => {
      ws.once('open', resolve);
      ws.once('error', reject);
    });
    const reply = new Promise<{ code: string; message: string }>((resolve) => ws.once('message', (d) => resolve(JSON.parse(String(d)))));
    ws.send(JSON.stringify({ type: 'hello', id: 1, session, version: PROTOCOL_VERSION, token: tokenFor(session) }));
    expect(await reply).toMatchObject({
      code: 'BAD_MESSAGE',
      message: expect.stringContaining(`open the socket at /ws?session=${session}`),
    });
    ws.close();
  });

  it("when the owner goes, the other server's relayed sockets close with SERVER_CLOSING; the next socket makes that server the owner, with the session's keys", async () => {
    const session = uniqueSession('takeover');
    await servers[0]!.createSession(session, tokenFor(session));
    const a = await connect(servers[0]!, session);
    const b = await connect(servers[1]!, session);
    await a.set('k', 'kept');
    const closed = new Promise<number>((resolve) => b.on('close', (e) => resolve(e.code)));
    await servers[0]!.close();
    expect(await closed).toBe(CloseCode.SERVER_CLOSING);
    const again = await connect(servers[1]!, session);
    expect(text(await again.get('k', 2_000))).toBe('kept');
    expect(servers[1]!.sessions.has(session)).toBe(true);
  }, 20_000);
});
