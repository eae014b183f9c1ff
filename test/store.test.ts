/** The store against the real server over real WebSockets: every operation, TCPStore's rules. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../signaling/server.ts';
import { StoreClient } from '../src/store.ts';
import { ConnectionClosedError, StoreError, StoreTimeoutError } from '../src/errors.ts';
import { connect, text, uniqueSession, withServer } from './helpers.ts';

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
  it('sets and gets strings and bytes; get returns bytes', async () => {
    const s = await fresh();
    await s.set('a', 'hello');
    await s.set('b', new Uint8Array([0, 1, 2, 255]));
    expect(text(await s.get('a'))).toBe('hello');
    expect([...(await s.get('b'))]).toEqual([0, 1, 2, 255]);
    await s.set('empty', '');
    expect((await s.get('empty')).length).toBe(0);
    s.close();
  });

  it('a blocking get is woken by a later set from another client', async () => {
    const session = uniqueSession('wake');
    const a = await connect(server, session);
    const b = await connect(server, session);
    const pending = a.get('late', 5_000);
    await new Promise((r) => setTimeout(r, 100));
    await b.set('late', 'now');
    expect(text(await pending)).toBe('now');
    a.close();
    b.close();
  });

  it('a get that times out names the key and the time waited', async () => {
    const s = await fresh();
    const err = await s.get('never', 150).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StoreTimeoutError);
    const t = err as StoreTimeoutError;
    expect(t.keys).toEqual(['never']);
    expect(t.timeoutMs).toBe(150);
    expect(t.message).toContain('"never"');
    expect(t.message).toContain('150 ms');
    s.close();
  });

  it('wait resolves when every key exists and times out naming only the missing ones', async () => {
    const s = await fresh();
    await s.set('k1', '1');
    const w = s.wait(['k1', 'k2'], 5_000);
    await s.set('k2', '2');
    await expect(w).resolves.toBeUndefined();
    const err = (await s.wait(['k1', 'k3', 'k4'], 120).catch((e: unknown) => e)) as StoreTimeoutError;
    expect(err).toBeInstanceOf(StoreTimeoutError);
    expect(err.keys).toEqual(['k3', 'k4']);
    expect(err.message).toMatch(/timed out after 120 ms waiting for keys "k3", "k4"/);
    s.close();
  });

  it('add counts from zero, returns the new value, and refuses a non-integer value', async () => {
    const s = await fresh();
    expect(await s.add('c', 5)).toBe(5);
    expect(await s.add('c', -2)).toBe(3);
    expect(text(await s.get('c'))).toBe('3');
    await s.set('notint', 'abc');
    const err = (await s.add('notint', 1).catch((e: unknown) => e)) as StoreError;
    expect(err).toBeInstanceOf(StoreError);
    expect(err.code).toBe('NOT_AN_INTEGER');
    expect(err.message).toContain('notint');
    s.close();
  });

  it('50 clients doing concurrent adds sum exactly', async () => {
    const session = uniqueSession('adds');
    const clients = await Promise.all(Array.from({ length: 50 }, () => connect(server, session)));
    await Promise.all(clients.flatMap((c) => Array.from({ length: 20 }, () => c.add('total', 1))));
    expect(text(await clients[0].get('total'))).toBe('1000');
    for (const c of clients) c.close();
  });

  describe('compareSet follows torch', () => {
    it('missing key, empty expected: sets desired and returns it', async () => {
      const s = await fresh();
      expect(text(await s.compareSet('k', '', 'new'))).toBe('new');
      expect(text(await s.get('k'))).toBe('new');
      s.close();
    });
    it('missing key, non-empty expected: changes nothing and returns expected', async () => {
      const s = await fresh();
      expect(text(await s.compareSet('k', 'old', 'new'))).toBe('old');
      expect(await s.check(['k'])).toBe(false);
      s.close();
    });
    it('present and equal: swaps and returns desired', async () => {
      const s = await fresh();
      await s.set('k', 'old');
      expect(text(await s.compareSet('k', 'old', 'new'))).toBe('new');
      expect(text(await s.get('k'))).toBe('new');
      s.close();
    });
    it('present and different: changes nothing and returns the current value', async () => {
      const s = await fresh();
      await s.set('k', 'current');
      expect(text(await s.compareSet('k', 'old', 'new'))).toBe('current');
      expect(text(await s.get('k'))).toBe('current');
      s.close();
    });
    it('wakes a get waiting on the key', async () => {
      const s = await fresh();
      const pending = s.get('k', 5_000);
      await s.compareSet('k', '', 'v');
      expect(text(await pending)).toBe('v');
      s.close();
    });
  });

  it('check, deleteKey and numKeys', async () => {
    const s = await fresh();
    expect(await s.numKeys()).toBe(0);
    await s.set('x', '1');
    await s.set('y', '2');
    expect(await s.check(['x', 'y'])).toBe(true);
    expect(await s.check(['x', 'z'])).toBe(false);
    expect(await s.numKeys()).toBe(2);
    expect(await s.deleteKey('x')).toBe(true);
    expect(await s.deleteKey('x')).toBe(false);
    expect(await s.numKeys()).toBe(1);
    s.close();
  });

  it('append creates or extends', async () => {
    const s = await fresh();
    await s.append('log', 'a');
    await s.append('log', new Uint8Array([98]));
    await s.append('log', 'c');
    expect(text(await s.get('log'))).toBe('abc');
    s.close();
  });

  it('multiSet and multiGet; multiGet blocks until all exist', async () => {
    const s = await fresh();
    await s.multiSet(['m1', 'm2'], ['one', new Uint8Array([2])]);
    const pending = s.multiGet(['m1', 'm2', 'm3'], 5_000);
    await s.set('m3', 'three');
    const values = await pending;
    expect(text(values[0])).toBe('one');
    expect([...values[1]]).toEqual([2]);
    expect(text(values[2])).toBe('three');
    const err = await s.multiGet(['m1', 'nope'], 100).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StoreTimeoutError);
    expect((err as StoreTimeoutError).keys).toEqual(['nope']);
    s.close();
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
    await new Promise((r) => setTimeout(r, 50));
    expect(server.sessions.get(session)!.store.pendingWaiters).toBe(2);
    s.close();
    await new Promise((r) => setTimeout(r, 100));
    expect(server.sessions.get(session)!.store.pendingWaiters).toBe(0);
  });
});
