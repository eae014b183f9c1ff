/**
 * HTTPS for remote tabs. A page opened by a name other than localhost is a secure context (and
 * gets WebGPU) only over https: Chromium maps the name ddp-host.test to 127.0.0.1 and trusts
 * exactly the server's self-signed certificate (its SPKI hash, `trustArgs`), as a lab machine
 * or the launcher's ranks would. Two ranks train over wss and WebRTC; the same name over plain
 * http is no secure context, which shows the test can fail.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type Browser, type Page } from '@playwright/test';
import { expect, openRanks, sessionName, test } from './fixtures.ts';
import { startServer, type RunningServer } from '../../signaling/server.ts';
import { machineNames, makeSelfSigned } from '../../signaling/tls.ts';
import { CHROMIUM_ARGS, chromiumPath, trustArgs } from '../../launcher/browser.ts';
import { launch } from '../../launcher/run.ts';

const NAME = 'ddp-host.test';

let cert: { cert: string; key: string };
let browser: Browser;
test.beforeAll(async () => {
  const names = machineNames();
  cert = await makeSelfSigned({ dns: [...names.dns, NAME], ips: names.ips });
  browser = await chromium.launch({
    executablePath: chromiumPath(),
    args: [...CHROMIUM_ARGS, ...trustArgs(cert.cert), `--host-resolver-rules=MAP ${NAME} 127.0.0.1`],
  });
});
test.afterAll(async () => {
  await browser?.close();
});

async function serve(tls: boolean): Promise<RunningServer> {
  return startServer({ port: 0, log: () => {}, allowedHosts: [NAME], ...(tls ? { tls: cert } : {}) });
}

function pageFacts(page: Page): Promise<{ secure: boolean; gpu: boolean; protocol: string }> {
  return page.evaluate(() => ({ secure: window.isSecureContext, gpu: 'gpu' in navigator, protocol: location.protocol }));
}

test('a page by a non-localhost name over https is a secure context with WebGPU, and two ranks train over wss and WebRTC', async () => {
  const server = await serve(true);
  try {
    const base = `https://${NAME}:${server.port}/`;
    const ranks = await openRanks(
      browser,
      server,
      2,
      {
        session: sessionName('https'),
        job: 'train',
        dataset: 'synthetic',
        model: 'mlp',
        trainSize: '512',
        batchSize: '16',
        steps: '6',
        evalEvery: '0',
        checkWeights: 'true',
      },
      base,
    );
    for (const r of ranks) {
      expect(r.page.url()).toMatch(new RegExp(`^https://${NAME.replace('.', '\\.')}:${server.port}/`));
      expect(await pageFacts(r.page)).toEqual({ secure: true, gpu: true, protocol: 'https:' });
    }
    const results = await Promise.all(ranks.map((r) => r.result));
    for (const result of results) {
      expect(result.backend).toBe('webgpu');
      expect(result.steps).toBe(6);
      expect(result.identicalEveryStep).toBe(true);
    }
    expect(results[1]!.weightHash).toBe(results[0]!.weightHash);
    await ranks[0]!.page.context().close();
  } finally {
    await server.close();
  }
});

test('the same name over plain http is no secure context: no WebGPU', async () => {
  const server = await serve(false);
  try {
    const context = await browser.newContext();
    const page = await context.newPage();
    await page.goto(`http://${NAME}:${server.port}/`);
    expect(await pageFacts(page)).toEqual({ secure: false, gpu: false, protocol: 'http:' });
    await context.close();
  } finally {
    await server.close();
  }
});

test('launch({ https: true }) serves its ranks over https and both have WebGPU', async () => {
  // The launcher keeps its certificate in CERT_DIR: a fresh folder, not the project's certs/.
  const saved = process.env.CERT_DIR;
  const dir = mkdtempSync(join(tmpdir(), 'ddp-launch-certs-'));
  process.env.CERT_DIR = dir;
  const lines: string[] = [];
  try {
    const { ok, summary } = await launch({
      nproc: 2,
      job: 'rendezvous',
      https: true,
      session: sessionName('launch-https'),
      timeoutSec: 120,
      jobParams: {},
      log: (l) => lines.push(l),
    });
    expect(ok, lines.join('\n')).toBe(true);
    expect(summary.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+\/$/);
    const ranks = summary.ranks as Array<{ rank: number; webgpu: boolean; adapter: string }>;
    expect(ranks.map((r) => [r.rank, r.webgpu])).toEqual([
      [0, true],
      [1, true],
    ]);
    expect(lines.join('\n')).toMatch(/made a self-signed certificate/);
  } finally {
    if (saved === undefined) delete process.env.CERT_DIR;
    else process.env.CERT_DIR = saved;
    rmSync(dir, { recursive: true, force: true });
  }
});
