/**
 * Hostile pages in a real browser: a page of another site open in the same Chromium cannot use the
 * store or the checkpoint routes, a foreign host name resolved to this machine (DNS rebinding)
 * gets 403, and a session link without its token joins nothing.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { chromium } from '@playwright/test';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { CHROMIUM_ARGS, chromiumPath } from '../../launcher/browser.ts';
import { PROJECT_ROOT } from '../../signaling/server.ts';
import { StoreClient } from '../../src/c10d/store.ts';
import { newSessionToken, withToken } from '../../src/wire/session_token.ts';
import { tokenFor } from '../fixtures/session.ts';
import { expect, sessionName, test } from './fixtures.ts';

/** Another site: a plain page on another port of this machine (another origin). */
async function foreignSite(): Promise<{ origin: string; server: Server }> {
  const server = createServer((_req, res) =>
    res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>elsewhere</title>'),
  );
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

test('a page of another site cannot open the store socket or post a checkpoint', async ({ page, server }) => {
  const site = await foreignSite();
  try {
    await page.goto(site.origin);
    const session = sessionName('victim');
    const target = new URL(server.url);
    const outcome = await page.evaluate(
      async ({ ws, api }) => {
        const socket = await new Promise<string>((resolve) => {
          const s = new WebSocket(ws);
          s.onopen = () => resolve('open');
          s.onclose = (e) => resolve(`closed ${e.code}`);
        });
        // A "simple" cross-site request: no preflight, the browser sends it and hides the answer.
        await fetch(api, { method: 'POST', mode: 'no-cors', headers: { 'content-type': 'text/plain' }, body: 'not a checkpoint' }).catch(
          () => undefined,
        );
        const read = await fetch(api).then(
          (r) => `status ${r.status}`,
          (e: Error) => `blocked: ${e.name}`,
        );
        return { socket, read };
      },
      { ws: `ws://${target.host}/ws`, api: `${server.url}api/checkpoints/${session}` },
    );
    expect(outcome.socket).toBe('closed 1006'); // refused at the upgrade (403): no socket, no session
    expect(outcome.read).toMatch(/^blocked/);
    expect(server.sessions.size).toBe(0);
    expect(existsSync(join(PROJECT_ROOT, 'checkpoints', session))).toBe(false);
  } finally {
    site.server.close();
  }
});

test('a foreign host name resolved to this server (DNS rebinding) gets 403 for the page and the socket', async ({ server }) => {
  const port = new URL(server.url).port;
  const browser = await chromium.launch({
    executablePath: chromiumPath(),
    args: [...CHROMIUM_ARGS, '--host-resolver-rules=MAP rebind.test 127.0.0.1'],
  });
  try {
    const page = await browser.newPage();
    const response = await page.goto(`http://rebind.test:${port}/?session=x&world=1`);
    expect(response?.status()).toBe(403);
    await expect(page.locator('body')).toContainText('does not answer to the host name "rebind.test');
    const socket = await page.evaluate(
      (ws) =>
        new Promise<string>((resolve) => {
          const s = new WebSocket(ws);
          s.onopen = () => resolve('open');
          s.onclose = (e) => resolve(`closed ${e.code}`);
        }),
      `ws://rebind.test:${port}/ws`,
    );
    expect(socket).toBe('closed 1006');
    expect(server.sessions.size).toBe(0);
  } finally {
    await browser.close();
  }
});

test('a training link with another token is told it is the wrong link, and the session is untouched', async ({ page, server }) => {
  const session = sessionName('guarded');
  const owner = await StoreClient.connect(server.url, { session, token: tokenFor(session) });
  await owner.set('config', 'the owner’s');
  await page.goto(withToken(`${server.url}?session=${session}&world=2&job=train&model=mlp&dataset=synthetic`, newSessionToken()));
  await expect(page.getByTestId('bad-link')).toContainText('This link’s #token does not open this session');
  await expect(page.getByTestId('bad-link')).toContainText('Ask the host for the link again');
  expect(new TextDecoder().decode(await owner.get('config'))).toBe('the owner’s');
  expect(await owner.numKeys()).toBe(1);
  owner.close();
});
