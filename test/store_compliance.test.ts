/**
 * The Store interface's compliance suite (as c10d's StoreTestBase): the same tests on every
 * implementation: the client of the real server over real WebSockets (TCPStore), a PrefixStore
 * over it, the in-memory HashStore and a PrefixStore over that; and the server on a real Redis
 * (`--store redis://`, started here on its own port): one server, and two servers on one Redis
 * with the pair's handles on different servers. What only the real server does
 * (many sockets, a server that goes away, waiters of a departed client) is in store.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { StoreError, StoreTimeoutError } from '../src/wire/errors.ts';
import { HashStore } from '../src/c10d/hash_store.ts';
import { PrefixStore, type Store } from '../src/c10d/store.ts';
import { connect, pendingWaiters, text, withServer } from './fixtures/server.ts';
import { uniqueSession } from './fixtures/session.ts';
import { waitFor } from './fixtures/wait.ts';
import { engineMissing, startEngine, type EngineProcess } from '../scripts/cluster_engines.ts';

let server: RunningServer;
/** Two servers on one Redis (engineServers[0] alone for the single-server rows). */
const engineServers: RunningServer[] = [];
let engine: EngineProcess | undefined;
// Skipped without redis-server on a developer's machine; CI (DDP_REQUIRE_ALL_TESTS) requires it.
const redisMissing = engineMissing('redis');
if (redisMissing && process.env.DDP_REQUIRE_ALL_TESTS)
  throw new Error(`the engine-backed store's rows ${redisMissing}, and DDP_REQUIRE_ALL_TESTS is set: CI must run them, not skip them`);
beforeAll(async () => {
  server = await withServer();
  if (redisMissing) return;
  engine = await startEngine('redis');
  for (let i = 0; i < 2; i++) engineServers.push(await withServer({ store: engine.url }));
});
afterAll(async () => {
  await server.close();
  await Promise.all(engineServers.map((s) => s.close()));
  await engine?.stop();
});

/** Two handles onto one fresh store (as two ranks hold it), and how to let go of them. */
interface Pair {
  a: Store;
  b: Store;
  close(): void;
  /** Resolves once `n` blocking calls wait in the store (a call on a remote store takes a while to get there). */
  waiting(n: number): Promise<void>;
}

/** A HashStore registers a blocking call's waiter in the call itself: nothing to wait for. */
const atOnce = async () => {};
/** Over the real server: its store's count of waiting calls. */
const onServer = (session: string) => (n: number) =>
  waitFor(`${n} blocking call(s) to wait on the server`, () => pendingWaiters(server, session) === n);

/** A pair on the engine: handle a on server `ia`, b on server `ib` (both on one Redis). */
const onEngine = (ia: number, ib: number) => async (): Promise<Pair> => {
  const session = uniqueSession('compliance-redis');
  const a = await connect(engineServers[ia]!, session);
  const b = await connect(engineServers[ib]!, session);
  return {
    a,
    b,
    close: () => {
      a.close();
      b.close();
    },
    waiting: (n: number) => waitFor(`${n} blocking call(s) to wait on the server`, () => pendingWaiters(engineServers[ia]!, session) === n),
  };
};

const implementations: Array<[string, () => Promise<Pair>]> = [
  [
    'StoreClient (the real server)',
    async () => {
      const session = uniqueSession('compliance');
      const [a, b] = await Promise.all([connect(server, session), connect(server, session)]);
      return {
        a,
        b,
        close: () => {
          a.close();
          b.close();
        },
        waiting: onServer(session),
      };
    },
  ],
  [
    'PrefixStore over StoreClient',
    async () => {
      const session = uniqueSession('compliance');
      const [a, b] = await Promise.all([connect(server, session), connect(server, session)]);
      return {
        a: new PrefixStore('pg/1', a),
        b: new PrefixStore('pg/1', b),
        close: () => {
          a.close();
          b.close();
        },
        waiting: onServer(session),
      };
    },
  ],
  [
    'HashStore (in memory)',
    async () => {
      const s = new HashStore();
      return { a: s, b: s, close: () => {}, waiting: atOnce };
    },
  ],
  [
    'PrefixStore over HashStore',
    async () => {
      const s = new HashStore();
      return { a: new PrefixStore('sub1', s), b: new PrefixStore('sub1', s), close: () => {}, waiting: atOnce };
    },
  ],
  ...(redisMissing
    ? []
    : ([
        ['StoreClient (the server on Redis)', onEngine(0, 0)],
        ['StoreClient, two servers on one Redis', onEngine(0, 1)],
      ] as Array<[string, () => Promise<Pair>]>)),
];

describe.each(implementations)('Store: %s', (_name, open) => {
  let pair: Pair;
  const store = async () => {
    pair = await open();
    return pair.a;
  };

  it('sets and gets strings and bytes; get returns bytes', async () => {
    const s = await store();
    await s.set('a', 'hello');
    await s.set('b', new Uint8Array([0, 1, 2, 255]));
    expect(text(await s.get('a'))).toBe('hello');
    expect([...(await s.get('b'))]).toEqual([0, 1, 2, 255]);
    await s.set('empty', '');
    expect((await s.get('empty')).length).toBe(0);
    pair.close();
  });

  it('a blocking get is woken by a later set from another handle', async () => {
    const { a, b, close, waiting } = await open();
    const pending = a.get('late', 5_000);
    await waiting(1);
    await b.set('late', 'now');
    expect(text(await pending)).toBe('now');
    close();
  });

  it('a get that times out names the key and the time waited', async () => {
    const s = await store();
    const err = await s.get('never', 150).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StoreTimeoutError);
    const t = err as StoreTimeoutError;
    expect(t.timeoutMs).toBe(150);
    expect(t.message).toMatch(/"(\S+\/)?never"/);
    expect(t.message).toContain('150 ms');
    pair.close();
  });

  it('wait resolves when every key exists and times out naming only the missing ones', async () => {
    const s = await store();
    await s.set('k1', '1');
    const w = s.wait(['k1', 'k2'], 5_000);
    await s.set('k2', '2');
    await expect(w).resolves.toBeUndefined();
    const err = (await s.wait(['k1', 'k3', 'k4'], 120).catch((e: unknown) => e)) as StoreTimeoutError;
    expect(err).toBeInstanceOf(StoreTimeoutError);
    expect(err.keys.map((k) => k.split('/').at(-1))).toEqual(['k3', 'k4']);
    expect(err.message).toMatch(/timed out after 120 ms waiting for keys "(\S+\/)?k3", "(\S+\/)?k4"/);
    pair.close();
  });

  it('add counts from zero, returns the new value, and refuses a non-integer value', async () => {
    const s = await store();
    expect(await s.add('c', 5)).toBe(5);
    expect(await s.add('c', -2)).toBe(3);
    expect(text(await s.get('c'))).toBe('3');
    await s.set('notint', 'abc');
    const err = (await s.add('notint', 1).catch((e: unknown) => e)) as StoreError;
    expect(err).toBeInstanceOf(StoreError);
    expect(err.code).toBe('NOT_AN_INTEGER');
    expect(err.message).toContain('notint');
    pair.close();
  });

  it('concurrent adds from two handles sum exactly', async () => {
    const { a, b, close } = await open();
    await Promise.all([a, b].flatMap((h) => Array.from({ length: 25 }, () => h.add('total', 1))));
    expect(text(await a.get('total'))).toBe('50');
    close();
  });

  describe('compareSet follows torch', () => {
    it('missing key, empty expected: sets desired and returns it', async () => {
      const s = await store();
      expect(text(await s.compareSet('k', '', 'new'))).toBe('new');
      expect(text(await s.get('k'))).toBe('new');
      pair.close();
    });
    it('missing key, non-empty expected: changes nothing and returns expected', async () => {
      const s = await store();
      expect(text(await s.compareSet('k', 'old', 'new'))).toBe('old');
      expect(await s.check(['k'])).toBe(false);
      pair.close();
    });
    it('present and equal: swaps and returns desired', async () => {
      const s = await store();
      await s.set('k', 'old');
      expect(text(await s.compareSet('k', 'old', 'new'))).toBe('new');
      expect(text(await s.get('k'))).toBe('new');
      pair.close();
    });
    it('present and different: changes nothing and returns the current value', async () => {
      const s = await store();
      await s.set('k', 'current');
      expect(text(await s.compareSet('k', 'old', 'new'))).toBe('current');
      expect(text(await s.get('k'))).toBe('current');
      pair.close();
    });
    it('wakes a get waiting on the key', async () => {
      const { a, b, close } = await open();
      const pending = a.get('k', 5_000);
      await b.compareSet('k', '', 'v');
      expect(text(await pending)).toBe('v');
      close();
    });
  });

  it('check, deleteKey and numKeys', async () => {
    const s = await store();
    expect(await s.numKeys()).toBe(0);
    await s.set('x', '1');
    await s.set('y', '2');
    expect(await s.check(['x', 'y'])).toBe(true);
    expect(await s.check(['x', 'z'])).toBe(false);
    expect(await s.numKeys()).toBe(2);
    expect(await s.deleteKey('x')).toBe(true);
    expect(await s.deleteKey('x')).toBe(false);
    expect(await s.numKeys()).toBe(1);
    pair.close();
  });

  it('append creates or extends', async () => {
    const s = await store();
    await s.append('log', 'a');
    await s.append('log', new Uint8Array([98]));
    await s.append('log', 'c');
    expect(text(await s.get('log'))).toBe('abc');
    pair.close();
  });

  it('multiSet and multiGet; multiGet blocks until all exist and times out naming the missing', async () => {
    const s = await store();
    await s.multiSet(['m1', 'm2'], ['one', new Uint8Array([2])]);
    const pending = s.multiGet(['m1', 'm2', 'm3'], 5_000);
    await s.set('m3', 'three');
    const values = await pending;
    expect(text(values[0]!)).toBe('one');
    expect([...values[1]!]).toEqual([2]);
    expect(text(values[2]!)).toBe('three');
    const err = await s.multiGet(['m1', 'nope'], 100).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StoreTimeoutError);
    expect((err as StoreTimeoutError).keys.map((k) => k.split('/').at(-1))).toEqual(['nope']);
    pair.close();
  });

  it('values are copies: changing what was set or got changes nothing stored', async () => {
    const s = await store();
    const bytes = new Uint8Array([1, 2, 3]);
    await s.set('v', bytes);
    bytes[0] = 9;
    const got = await s.get('v');
    got[1] = 9;
    expect([...(await s.get('v'))]).toEqual([1, 2, 3]);
    pair.close();
  });
});
