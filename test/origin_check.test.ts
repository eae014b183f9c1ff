/**
 * Origin and Host checks against the real server: a foreign page's socket and a rebinding host
 * name are refused with 403 at the upgrade, and pages and API with a foreign Host get 403 too.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { RunningServer } from '../signaling/server.ts';
import { PROTOCOL_VERSION } from '../src/wire/protocol.ts';
import { rawRequest, withServer } from './fixtures/server.ts';
import { tokenFor, uniqueSession } from './fixtures/session.ts';

let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

/** Opens a socket with these headers; resolves with the HTTP status of a refused upgrade, or 101. */
function upgrade(url: string, headers: Record<string, string>): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${url.replace('http', 'ws')}ws`, { headers });
    const timer = setTimeout(() => reject(new Error('upgrade neither opened nor was refused in 5 s')), 5_000);
    ws.on('open', () => {
      clearTimeout(timer);
      ws.close();
      resolve({ status: 101, body: '' });
    });
    ws.on('unexpected-response', (_req, res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => {
        clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, body });
      });
    });
    ws.on('error', () => {});
  });
}

const get = (url: string, headers: Record<string, string>, method = 'GET') => rawRequest(url, { headers, method });

describe('origin and host checks', () => {
  it('refuses a WebSocket from a foreign page with 403 at the upgrade, before any session is touched', async () => {
    server = await withServer();
    const refused = await upgrade(server.url, { origin: 'http://evil.example' });
    expect(refused.status).toBe(403);
    expect(refused.body).toContain('"http://evil.example" are not allowed');
    expect(server.sessions.size).toBe(0);
    // Also a page at another port of the same machine: another origin.
    const otherPort = new URL(server.url);
    otherPort.port = String(Number(otherPort.port) + 1);
    expect((await upgrade(server.url, { origin: otherPort.origin })).status).toBe(403);
    expect((await upgrade(server.url, { origin: 'null' })).status).toBe(403);
  });

  it('accepts sockets without an Origin (Node clients) and from its own pages', async () => {
    server = await withServer();
    expect((await upgrade(server.url, {})).status).toBe(101);
    expect((await upgrade(server.url, { origin: new URL(server.url).origin })).status).toBe(101);
    const byName = new URL(server.url);
    byName.hostname = 'localhost';
    expect((await upgrade(server.url, { origin: byName.origin, host: byName.host })).status).toBe(101);
  });

  it('refuses a rebinding host name for sockets, pages and the API', async () => {
    server = await withServer();
    const port = new URL(server.url).port;
    const foreign = { host: `rebind.example:${port}` };
    const ws = await upgrade(server.url, foreign);
    expect(ws.status).toBe(403);
    expect(ws.body).toContain('does not answer to the host name "rebind.example:');
    expect((await get(server.url, foreign)).status).toBe(403);
    expect((await get(`${server.url}api/checkpoints/${uniqueSession()}`, foreign)).status).toBe(403);
    expect((await get(`${server.url}datasets/mnist/t10k-labels-idx1-ubyte`, foreign)).status).toBe(403);
    // The same requests by the server's own name are answered.
    expect((await get(`${server.url}datasets/mnist/t10k-labels-idx1-ubyte`, { host: `localhost:${port}` })).status).toBe(200);
    expect((await get(`${server.url}datasets/mnist/t10k-labels-idx1-ubyte`, { host: `[::1]:${port}` })).status).toBe(200);
  });

  it('refuses API requests from a foreign page (a cross-site POST needs no preflight)', async () => {
    server = await withServer();
    const res = await get(
      `${server.url}api/checkpoints/${uniqueSession()}`,
      { origin: 'http://evil.example', 'content-type': 'text/plain' },
      'POST',
    );
    expect(res.status).toBe(403);
  });

  it('answers configured extra host names and origins', async () => {
    server = await withServer({ allowedHosts: ['ddp.lan'], allowedOrigins: ['https://ddp.example.org'] });
    const port = new URL(server.url).port;
    expect((await upgrade(server.url, { host: `ddp.lan:${port}` })).status).toBe(101);
    expect((await upgrade(server.url, { origin: 'https://ddp.example.org' })).status).toBe(101);
    expect((await upgrade(server.url, { origin: 'https://other.example.org' })).status).toBe(403);
    // A session still works over a socket from the allowed origin.
    const session = uniqueSession();
    const ws = new WebSocket(`${server.url.replace('http', 'ws')}ws`, { headers: { origin: 'https://ddp.example.org' } });
    await new Promise((r) => ws.once('open', r));
    const reply = new Promise<string>((r) => ws.once('message', (d) => r(d.toString())));
    ws.send(JSON.stringify({ type: 'hello', id: 1, session, version: PROTOCOL_VERSION, token: tokenFor(session) }));
    expect(JSON.parse(await reply)).toMatchObject({ type: 'reply', id: 1 });
    ws.close();
  });
});
