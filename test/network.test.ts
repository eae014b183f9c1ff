/**
 * Where other machines reach the server (`GET /api/info`, `RunningServer.urls`, what `npm start`
 * prints) and the error a taken port gives.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { networkInterfaces, type NetworkInterfaceInfo } from 'node:os';
import { request } from 'node:http';
import { createServer as createNetServer } from 'node:net';
import { ServerStartError, startServer, type RunningServer } from '../signaling/server.ts';
import { lanUrls, listenError, startupLines } from '../signaling/network.ts';
import { withServer } from './fixtures/server.ts';

const servers: RunningServer[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
});

async function started(options: Parameters<typeof withServer>[0]): Promise<RunningServer> {
  const s = await withServer(options);
  servers.push(s);
  return s;
}

/** A GET with chosen headers (fetch would not let a test set Host). */
function get(
  port: number,
  path: string,
  headers: Record<string, string> = {},
  method = 'GET',
  host = '127.0.0.1',
): Promise<{ status: number; headers: Record<string, unknown>; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host, port, path, method, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

const iface = (address: string, family: 'IPv4' | 'IPv6', internal = false): NetworkInterfaceInfo =>
  ({ address, family, internal, netmask: '', mac: '', cidr: null, ...(family === 'IPv6' ? { scopeid: 0 } : {}) }) as NetworkInterfaceInfo;

describe('LAN addresses', () => {
  const fake = {
    lo: [iface('127.0.0.1', 'IPv4', true), iface('::1', 'IPv6', true)],
    eth0: [iface('192.168.1.20', 'IPv4'), iface('fe80::1', 'IPv6'), iface('fd00::20', 'IPv6')],
    wlan0: [iface('10.0.0.7', 'IPv4'), iface('2001:db8::7', 'IPv6')],
  };

  it('lists every non-internal IPv4 address on 0.0.0.0, and the IPv6 ones after them on ::', () => {
    expect(lanUrls('0.0.0.0', 8080, fake)).toEqual(['http://192.168.1.20:8080/', 'http://10.0.0.7:8080/']);
    expect(lanUrls('::', 8080, fake)).toEqual([
      'http://192.168.1.20:8080/',
      'http://10.0.0.7:8080/',
      'http://[fd00::20]:8080/',
      'http://[2001:db8::7]:8080/',
    ]);
  });

  it('lists the one address of a server bound to it, and none on loopback', () => {
    expect(lanUrls('192.168.1.20', 9000, fake)).toEqual(['http://192.168.1.20:9000/']);
    expect(lanUrls('fd00::20', 9000, fake)).toEqual(['http://[fd00::20]:9000/']);
    for (const loopback of ['127.0.0.1', 'localhost', '::1', '127.0.1.1']) expect(lanUrls(loopback, 9000, fake)).toEqual([]);
  });

  it("GET /api/info on a server listening on 0.0.0.0 lists this machine's network addresses", async () => {
    const server = await started({ host: '0.0.0.0' });
    // Computed here from the interfaces, independently of the server's code.
    const expected = Object.values(networkInterfaces())
      .flatMap((l) => l ?? [])
      .filter((a) => a.family === 'IPv4' && !a.internal)
      .map((a) => `http://${a.address}:${server.port}/`);
    const res = await get(server.port, '/api/info', { host: `127.0.0.1:${server.port}` });
    expect(res.status).toBe(200);
    expect(res.headers['cache-control']).toBe('no-store');
    expect(res.headers['content-type']).toMatch(/^application\/json/);
    const info = JSON.parse(res.body) as { urls: string[]; secure: boolean; listening: string };
    expect(info).toEqual({
      urls: [...new Set(expected)],
      secure: false,
      listening: `0.0.0.0:${server.port}`,
      offers: { model: false, data: false },
    });
    expect(server.urls).toEqual(info.urls);
    // This machine has a network address: it must be listed, not loopback.
    if (expected.length > 0) expect(info.urls.some((u) => !u.includes('//127.'))).toBe(true);
    // Another machine (here: a connection from this machine's network address) is not told them.
    const lan = expected[0] ? new URL(expected[0]).host : undefined;
    if (lan) {
      const remote = await get(server.port, '/api/info', { host: lan }, 'GET', lan.replace(/:\d+$/, ''));
      expect(JSON.parse(remote.body)).toEqual({
        urls: [],
        secure: false,
        listening: `0.0.0.0:${server.port}`,
        offers: { model: false, data: false },
      });
    }
  });

  it('answers an empty list on loopback, and applies the Host and Origin checks', async () => {
    const server = await started({});
    const ok = await get(server.port, '/api/info', { host: `localhost:${server.port}` });
    expect(JSON.parse(ok.body)).toEqual({
      urls: [],
      secure: false,
      listening: `127.0.0.1:${server.port}`,
      offers: { model: false, data: false },
    });
    expect(server.urls).toEqual([]);
    expect((await get(server.port, '/api/info', { host: 'evil.example' })).status).toBe(403);
    expect((await get(server.port, '/api/info', { host: `127.0.0.1:${server.port}`, origin: 'https://evil.example' })).status).toBe(403);
    const post = await get(server.port, '/api/info', { host: `127.0.0.1:${server.port}` }, 'POST');
    expect([post.status, post.headers.allow]).toEqual([405, 'GET, HEAD']);
  });

  it('npm start prints the LAN URLs, or that other machines need HOST=0.0.0.0', () => {
    const lan = startupLines({ url: 'http://localhost:8080/', urls: ['http://192.168.1.20:8080/'], host: '0.0.0.0' }, 'DEMO');
    expect(lan).toEqual([
      'Serving on http://localhost:8080/',
      'Other machines on your network can open:',
      '  http://192.168.1.20:8080/',
      'Open http://localhost:8080/ to create a session, or open this link in two or three tabs to watch them train a short demo together: DEMO',
    ]);
    const local = startupLines({ url: 'http://127.0.0.1:8080/', urls: [], host: '127.0.0.1' }, 'DEMO');
    expect(local[1]).toBe(
      'Only this machine can open it (it listens on 127.0.0.1): for other machines on your network, start with HOST=0.0.0.0 npm start',
    );
    expect(local.at(-1)).toContain('DEMO');
  });
});

describe('start errors', () => {
  it('a port in use rejects with ServerStartError saying what to do', async () => {
    const first = await started({});
    const err = await startServer({ port: first.port, host: '127.0.0.1', log: () => {} }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ServerStartError);
    expect((err as ServerStartError).code).toBe('EADDRINUSE');
    expect((err as ServerStartError).message).toMatch(
      new RegExp(
        `^port ${first.port} is already in use \\(another npm start\\?\\): stop it or choose another with PORT=(\\d+) npm start \\(\\1 was free just now\\)$`,
      ),
    );
    // The first server is unharmed.
    expect((await get(first.port, '/api/info', { host: `127.0.0.1:${first.port}` })).status).toBe(200);
  });

  it('a port in use suggests a port it found free, not the next one when that is in use too', async () => {
    const first = await started({});
    // The next port taken as well (by anything: here a bare TCP listener), as a second npm start would.
    const next = createNetServer();
    const nextTaken = await new Promise<boolean>((done) => {
      next.once('error', () => done(false));
      next.listen(first.port + 1, '127.0.0.1', () => done(true));
    });
    try {
      const err = await startServer({ port: first.port, host: '127.0.0.1', log: () => {} }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ServerStartError);
      const suggested = Number(/PORT=(\d+) npm start/.exec((err as Error).message)?.[1]);
      expect(suggested).toBeGreaterThan(first.port + 1);
      // The suggestion works: a server starts on it.
      const second = await startServer({ port: suggested, host: '127.0.0.1', log: () => {} });
      servers.push(second);
      expect(second.port).toBe(suggested);
    } finally {
      if (nextTaken) await new Promise<void>((done) => next.close(() => done()));
    }
  });

  it("says what to do for a port it may not bind and an address that is not this machine's", () => {
    const denied = listenError(Object.assign(new Error('listen EACCES'), { code: 'EACCES' }), '0.0.0.0', 80);
    expect(denied).toBeInstanceOf(ServerStartError);
    expect(denied.message).toBe(
      'not allowed to listen on port 80 (ports below 1024 need administrator rights): choose another with PORT=8080 npm start',
    );
    const foreign = listenError(Object.assign(new Error('listen EADDRNOTAVAIL'), { code: 'EADDRNOTAVAIL' }), '203.0.113.9', 8080);
    expect(foreign.message).toContain('203.0.113.9 is not an address of this machine');
    const other = new Error('something else');
    expect(listenError(other, '127.0.0.1', 8080)).toBe(other);
  });
});
