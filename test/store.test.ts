/** The store client against the real server over real WebSockets: what only a server does (many sockets, one going away, waiters of a departed client). Every Store's rules: store_compliance.test.ts. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import type { StoreClient } from '../src/c10d/store.ts';
import { ConnectionClosedError } from '../src/wire/errors.ts';
import { connect, pendingWaiters, text, withServer } from './fixtures/server.ts';
import { uniqueSession } from './fixtures/session.ts';
import { waitFor } from './fixtures/wait.ts';

let server: RunningServer;
beforeAll(async () => {
  server = await withServer();
});
afterAll(async () => {
  await server.close();
});

async function fresh(): Promise<StoreClient> {
  return connect(server, uniqueSession('store'));
}

describe('store', () => {
  // Every Store's rules (get, wait, add, compareSet, append, multiGet...) are in store_compliance.test.ts.
  it('50 clients doing concurrent adds sum exactly', async () => {
    const session = uniqueSession('adds');
    const clients = await Promise.all(Array.from({ length: 50 }, () => connect(server, session)));
    await Promise.all(clients.flatMap((c) => Array.from({ length: 20 }, () => c.add('total', 1))));
    expect(text(await clients[0].get('total'))).toBe('1000');
    for (const c of clients) c.close();
  });

  it('keeps many requests in flight on one socket', async () => {
    const s = await fresh();
    const waits = Array.from({ length: 20 }, (_, i) => s.get(`w${i}`, 5_000));
    await Promise.all(Array.from({ length: 20 }, (_, i) => s.set(`w${19 - i}`, String(19 - i))));
    expect((await Promise.all(waits)).map(text)).toEqual(Array.from({ length: 20 }, (_, i) => String(i)));
    s.close();
  });

  it('pending calls fail with ConnectionClosedError when the server goes away', async () => {
    const own = await withServer();
    const s = await connect(own, uniqueSession());
    const pending = s.get('never', 10_000);
    await own.close();
    const err = await pending.catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConnectionClosedError);
    expect((err as Error).message).toContain('get("never")');
  });

  it('a departed client leaves no waiters behind', async () => {
    const session = uniqueSession();
    const s = await connect(server, session);
    void s.get('gone', 10_000).catch(() => {});
    void s.wait(['gone2'], 10_000).catch(() => {});
    await waitFor('the get and the wait to wait on the server', () => pendingWaiters(server, session) === 2);
    s.close();
    // Well inside their 10 s timeouts: only the close can have taken them away.
    await waitFor("the departed client's waiters to go", () => pendingWaiters(server, session) === 0, { timeoutMs: 3_000 });
  });
});
