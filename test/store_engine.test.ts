/**
 * The server on a shared Redis (`--store redis://`), beyond the store's rules (those are the
 * compliance suite's, store_compliance.test.ts): a bad --store and an engine that cannot be
 * reached stop the start naming it; a session created through one server opens through another
 * with its token, and nobody else's; the engine holds token hashes, never tokens; an engine that
 * is killed makes requests fail with STORE_UNAVAILABLE, and once it is restarted on its folder (an
 * append-only file) the servers serve again and the sessions are still there: tokens and keys.
 * One that stops answering (SIGSTOP) makes a client try its repeatable requests again, within a
 * bound, saying so (a 'store' event) as it goes and comes back (src/c10d/store_unavailable.ts).
 * A real redis-server, started here on its own port, data in a temporary folder.
 */
import { spawnSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { PROJECT_ROOT, ServerStartError, startServer, type RunningServer } from '../signaling/server.ts';
import { RendezvousHandler, type RendezvousEvent } from '../src/c10d/rendezvous.ts';
import { StoreClient } from '../src/c10d/store.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import type { StoreError } from '../src/wire/errors.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { engineMissing, freePort, startEngine, type EngineProcess } from '../scripts/cluster_engines.ts';
import { text, withServer } from './fixtures/server.ts';
import { uniqueSession } from './fixtures/session.ts';

const redisMissing = engineMissing('redis');
if (redisMissing && process.env.DDP_REQUIRE_ALL_TESTS)
  throw new Error(`these tests ${redisMissing}, and DDP_REQUIRE_ALL_TESTS is set: CI must run them, not skip them`);

const startError = (store: string) =>
  startServer({ port: 0, log: () => {}, store }).then(
    (s) => {
      void s.close();
      throw new Error('the server started');
    },
    (err: unknown) => err as ServerStartError,
  );

describe('--store: what it takes', () => {
  it('refuses a URL that is none, another scheme, or etcd, saying what to give', async () => {
    const notUrl = await startError('localhost:6379');
    expect(notUrl).toBeInstanceOf(ServerStartError);
    expect([notUrl.code, notUrl.message]).toEqual(['ESTORE', expect.stringContaining('redis://:PASSWORD@HOST:PORT')]);
    expect((await startError('http://127.0.0.1:6379')).message).toMatch(/--store takes redis:\/\/:PASSWORD@HOST:PORT, not "http:"/);
    expect((await startError('etcd://127.0.0.1:2379')).message).toMatch(/runs on Redis/);
  });

  it('npm start -- --store with a bad URL stops at once (before building the page), saying what to give', () => {
    const run = spawnSync(process.execPath, ['--import', 'tsx', 'signaling/main.ts', '--store', 'etcd://127.0.0.1:2379'], {
      cwd: PROJECT_ROOT,
      encoding: 'utf8',
      timeout: 30_000,
    });
    expect(run.status).toBe(1);
    expect(run.stderr.trim()).toBe(
      '--store etcd://127.0.0.1:2379: etcd was measured (bench/results/store_engine.md) but the shared store runs on Redis: give redis://:PASSWORD@HOST:PORT',
    );
  });

  it.skipIf(redisMissing !== undefined)('names an engine it cannot reach, without its password, and what to do', async () => {
    const port = await freePort();
    const err = await startError(`redis://:s3cret-pass@127.0.0.1:${port}`);
    expect(err.code).toBe('ESTORE');
    expect(err.message).toContain(`cannot reach the store redis://127.0.0.1:${port}`);
    expect(err.message).toContain('start redis-server');
    expect(err.message).not.toContain('s3cret-pass');
  });
});

describe.skipIf(redisMissing !== undefined)('servers on one Redis', () => {
  let engine: EngineProcess;
  const servers: RunningServer[] = [];
  beforeAll(async () => {
    engine = await startEngine('redis');
    servers.push(await withServer({ store: engine.url }));
    // The second cannot create sessions itself (as behind a proxy): what opens there was created elsewhere.
    servers.push(await withServer({ store: engine.url, loopbackCreates: false }));
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.close()));
    await engine?.stop();
    // A restarted engine was given its folder, which its stop() leaves.
    if (engine) rmSync(engine.dir, { recursive: true, force: true });
  });

  it('refuses a wrong password, naming the engine', async () => {
    const err = await startError(engine.url.replace(/:\/\/:[^@]+@/, '://:wrong-password@'));
    expect(err.message).toMatch(/the store redis:\/\/127\.0\.0\.1:\d+ refused the password/);
  });

  it('a session created through one server opens through another with its token, not with another; the engine keeps only hashes', async () => {
    const session = uniqueSession('engine-token');
    const token = newSessionToken();
    const a = await StoreClient.connect(servers[0]!.url, { session, token });
    await a.set('k', 'from server 1');
    const b = await StoreClient.connect(servers[1]!.url, { session, token });
    expect(new TextDecoder().decode(await b.get('k', 2_000))).toBe('from server 1');
    const wrong = await StoreClient.connect(servers[1]!.url, { session, token: newSessionToken() }).catch((e: unknown) => e);
    expect((wrong as StoreError).code).toBe('UNAUTHORIZED');
    const unknown = await StoreClient.connect(servers[1]!.url, { session: uniqueSession('nobody-made'), token }).catch((e: unknown) => e);
    expect((unknown as StoreError).code).toBe('UNAUTHORIZED');
    // What a reader of the engine finds: no token.
    const reader = new Redis(engine.url, { lazyConnect: true });
    await reader.connect();
    const keys = await reader.keys(`ddp:{${session}}:*`);
    expect(keys).toContain(`ddp:{${session}}:auth`);
    const everything = (await Promise.all(keys.map((k) => reader.dumpBuffer(k)))).map((d) => d?.toString('latin1') ?? '').join('');
    expect(everything).not.toContain(token);
    reader.disconnect();
    a.close();
    b.close();
  });

  it('a session its host ended through one server opens through no other', async () => {
    const session = uniqueSession('engine-ended');
    const token = newSessionToken();
    const host = await StoreClient.connect(servers[0]!.url, { session, token, host: newSessionToken() });
    const member = await StoreClient.connect(servers[1]!.url, { session, token });
    await host.control('end');
    await expect
      .poll(
        () =>
          StoreClient.connect(servers[1]!.url, { session, token }).then(
            (c) => {
              c.close();
              return 'opened';
            },
            (e: StoreError) => e.code,
          ),
        { timeout: 5_000 },
      )
      .toBe('UNAUTHORIZED');
    host.close();
    member.close();
  });

  it('a Redis killed (SIGKILL) fails requests with STORE_UNAVAILABLE, not a hang; restarted on its folder it still has the session: its token opens it on a new server, its keys are there', async () => {
    const session = uniqueSession('engine-restart');
    const token = newSessionToken();
    // Not tried again (storeUnavailableRetryMs: 0): each refusal during the outage is seen as the server gives it.
    const client = await StoreClient.connect(servers[0]!.url, { session, token, storeUnavailableRetryMs: 0 });
    await client.set('checkpoints/latest', 'step 41');
    await client.add('epoch', 3);
    const { port, dir } = engine;
    const password = new URL(engine.url).password;
    // A crash, not a clean shutdown: what a clean one writes on its way out is no help then.
    process.kill(engine.pid, 'SIGKILL');
    await engine.exited;
    // Settles (refused) while Redis is away: a hang here would time the test out, Redis never back.
    const err = (await client.set('during', '2').catch((e: unknown) => e)) as StoreError;
    expect(err.code).toBe('STORE_UNAVAILABLE');
    expect(err.message).toMatch(/^store unavailable: .*try again in a few seconds/);
    engine = await startEngine('redis', { port, password, dir });
    await expect
      .poll(
        () =>
          client.set('after', '3').then(
            () => true,
            () => false,
          ),
        { timeout: 15_000, message: 'a set once Redis is back' },
      )
      .toBe(true);
    // A server that never saw the session (nor creates one): all it knows is what Redis kept.
    const fresh = await withServer({ store: engine.url, loopbackCreates: false });
    servers.push(fresh);
    const again = await StoreClient.connect(fresh.url, { session, token });
    expect(text(await again.get('checkpoints/latest', 1_000))).toBe('step 41');
    expect(await again.add('epoch', 0)).toBe(3);
    expect(text(await again.get('after', 1_000))).toBe('3');
    const wrong = await StoreClient.connect(fresh.url, { session, token: newSessionToken() }).catch((e: unknown) => e);
    expect((wrong as StoreError).code).toBe('UNAUTHORIZED');
    again.close();
    client.close();
  }, 30_000);

  it('a Redis that stops answering (SIGSTOP): a set is tried again until it answers (SIGCONT), the rendezvous handler saying so each way; an add is refused at once; past the bound a set is refused, and the store heard back without another request', async () => {
    const session = uniqueSession('engine-paused');
    const token = newSessionToken();
    const events: RendezvousEvent[] = [];
    const handler = await RendezvousHandler.start(
      { url: servers[0]!.url, session, token, min: 1, max: 1, timeoutMs: 20_000, linkFactory: new MemoryNetwork().factoryFor(0) },
      (e) => events.push(e),
    );
    const bounded = await StoreClient.connect(servers[0]!.url, { session, token, storeUnavailableRetryMs: 1_000 });
    const boundedHeard: boolean[] = [];
    bounded.on('store', (e) => boundedHeard.push(e.available));
    const stored = () => events.filter((e) => e.type === 'store');
    try {
      await handler.nextRendezvous(0, 20_000);
      process.kill(engine.pid, 'SIGSTOP');
      const setting = handler.store.set('k', 'v');
      await expect.poll(() => stored().length, { timeout: 10_000, message: "the handler's 'store' event" }).toBe(1);
      expect(stored()[0]).toMatchObject({ available: false, message: expect.stringMatching(/^store unavailable: /) });
      // Not repeatable (it may have counted already): the caller's at once.
      expect(((await handler.store.add('n', 1).catch((e: unknown) => e)) as StoreError).code).toBe('STORE_UNAVAILABLE');
      const refused = (await bounded.set('b', '1').catch((e: unknown) => e)) as StoreError;
      expect(refused.code).toBe('STORE_UNAVAILABLE');
      expect(refused.message).toMatch(/\(tried again for \d+\.\d s\)$/);
      process.kill(engine.pid, 'SIGCONT');
      await setting;
      expect(stored().map((e) => e.type === 'store' && e.available)).toEqual([false, true]);
      expect(text(await handler.store.get('k', 2_000))).toBe('v');
      // A client with no request of its own left hears that the store answers again too (it probes).
      await expect.poll(() => boundedHeard, { timeout: 10_000, message: "the bounded client's 'store' events" }).toEqual([false, true]);
    } finally {
      process.kill(engine.pid, 'SIGCONT');
      handler.shutdown();
      bounded.close();
    }
  }, 30_000);
});
