/**
 * Several servers behind one address (scripts/cluster.ts): a real Redis, two real server processes
 * on it and a real HAProxy in front. A session's members, connecting through the proxy, meet on one
 * server; when that server dies (SIGKILL) they reconnect through the proxy to the other, rejoin
 * (the rendezvous handler's reconnect path) and find the session's keys there, with their token.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RendezvousHandler } from '../src/c10d/rendezvous.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { newSessionToken } from '../src/wire/session_token.ts';
import { engineMissing } from '../scripts/cluster_engines.ts';
import { haproxyMissing, startCluster, type Cluster } from '../scripts/cluster.ts';
import { text } from './fixtures/server.ts';
import { uniqueSession } from './fixtures/session.ts';

const missing = [engineMissing('redis'), haproxyMissing()].filter(Boolean).join(' and ');
if (missing && process.env.DDP_REQUIRE_ALL_TESTS)
  throw new Error(`the cluster tests ${missing}, and DDP_REQUIRE_ALL_TESTS is set: CI must run them, not skip them`);

describe.skipIf(missing !== '')('a cluster: Redis, two servers, HAProxy in front', () => {
  let cluster: Cluster;
  beforeAll(async () => {
    cluster = await startCluster({ servers: 2, settleMs: 100 });
  }, 60_000);
  afterAll(async () => {
    await cluster?.stop();
  });

  it("a session's members meet on one server through the proxy; when it dies they rejoin on the other, with the session's keys", async () => {
    const session = uniqueSession('cluster');
    const token = newSessionToken();
    const net = new MemoryNetwork();
    const handlers = await Promise.all(
      [0, 1].map((i) =>
        RendezvousHandler.start({
          url: cluster.url,
          session,
          token,
          min: 2,
          max: 2,
          timeoutMs: 20_000,
          heartbeatIntervalMs: 200,
          reconnect: true,
          linkFactory: net.factoryFor(i),
        }),
      ),
    );
    try {
      const first = await Promise.all(handlers.map((h) => h.nextRendezvous(0, 20_000)));
      expect(first.map((r) => r.worldSize)).toEqual([2, 2]);
      await handlers[0]!.store.set('checkpoints/index', 'step 7');
      const holds = (s: Cluster['servers'][number]) => s.log.some((l) => l.includes(`session "${session}"`));
      const holder = cluster.servers.findIndex(holds);
      expect(holder).toBeGreaterThanOrEqual(0);
      const other = cluster.servers[1 - holder]!;
      expect(holds(other)).toBe(false);

      cluster.servers[holder]!.process.kill('SIGKILL');
      const second = await Promise.all(handlers.map((h, i) => h.nextRendezvous(first[i]!.id, 30_000)));
      expect(second.map((r) => r.worldSize)).toEqual([2, 2]);
      expect(holds(other)).toBe(true);
      expect(text(await handlers[1]!.store.get('checkpoints/index', 2_000))).toBe('step 7');
    } finally {
      for (const h of handlers) h.shutdown();
    }
  }, 60_000);
});
