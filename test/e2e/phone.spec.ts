/**
 * A class's mixed fleet on real pages: a phone (Chromium's mobile emulation: 390x844, touch, 3x
 * pixels, an Android user agent, and a WebGL that does not start, so it falls back to the cpu
 * backend) creates a session on WebGL with the form, shares its link and trains with a laptop's
 * tab. Every view fits the phone's width (no horizontal scrolling), the charts fit their cards,
 * the link's QR code shows, and both tabs' fleet tables list both ranks with their browser,
 * backend, device and the phone's fallback. And a tab that cannot take part is told why and
 * joins nothing, while the others train on.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Browser, BrowserContextOptions, Page } from '@playwright/test';
import { PROJECT_ROOT } from '../../signaling/server.ts';
import { withToken } from '../../src/wire/session_token.ts';
import { tokenFor } from '../fixtures/session.ts';
import { expect, sessionName, test } from './fixtures.ts';

/** An Android phone of iPhone 13's size, as Playwright's `devices` describe one. */
function phone(browser: Browser): BrowserContextOptions {
  const major = browser.version().split('.')[0];
  return {
    viewport: { width: 390, height: 844 },
    screen: { width: 390, height: 844 },
    isMobile: true,
    hasTouch: true,
    deviceScaleFactor: 3,
    userAgent: `Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/${major}.0.0.0 Mobile Safari/537.36`,
  };
}

/** The page is no wider than its viewport: nothing scrolls sideways. Names what sticks out if not. */
async function expectFits(page: Page, view: string): Promise<void> {
  const m = await page.evaluate(() => ({
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth,
    past: [...document.querySelectorAll('body *')]
      .filter((e) => {
        const r = e.getBoundingClientRect();
        return r.width > 1 && r.right > innerWidth + 0.5;
      })
      .slice(0, 6)
      .map(
        (e) =>
          `${e.tagName.toLowerCase()}.${String((e as HTMLElement).className)} (right edge ${Math.round(e.getBoundingClientRect().right)})`,
      ),
  }));
  expect(
    m.scrollWidth,
    `${view}: the page scrolls sideways (${m.scrollWidth} > ${m.innerWidth}); past the edge: ${m.past.join(', ')}`,
  ).toBeLessThanOrEqual(m.innerWidth);
}

/** Each uPlot chart is as wide as its card's content and no wider, and wide enough to read. */
async function expectChartsFit(page: Page): Promise<void> {
  for (const id of ['loss-chart', 'accuracy-chart']) {
    const sizes = await page.getByTestId(id).evaluate((card) => {
      const host = card.querySelector<HTMLElement>('.chart-host')!;
      const plot = host.querySelector<HTMLElement>('.uplot');
      const canvas = host.querySelector('canvas');
      return {
        host: host.clientWidth,
        card: card.getBoundingClientRect().right,
        plot: plot?.getBoundingClientRect().width ?? 0,
        canvas: canvas?.getBoundingClientRect().right ?? Infinity,
      };
    });
    expect(sizes.plot, `${id}: drawn`).toBeGreaterThan(250);
    expect(sizes.plot, `${id}: no wider than its card`).toBeLessThanOrEqual(sizes.host + 1);
    expect(sizes.canvas, `${id}: its canvas inside the card`).toBeLessThanOrEqual(sizes.card);
  }
}

/** The QR code is on screen, inside the viewport's width and large enough for a camera. */
async function expectQrVisible(page: Page, where: string): Promise<void> {
  const qr = page.getByTestId('qr-code').last();
  await expect(qr, `${where}: the QR code`).toBeVisible();
  const box = (await qr.boundingBox())!;
  expect(box.x, `${where}: the QR code's left edge`).toBeGreaterThanOrEqual(0);
  expect(box.x + box.width, `${where}: the QR code's right edge`).toBeLessThanOrEqual(390);
  expect(box.width, `${where}: the QR code's size`).toBeGreaterThanOrEqual(150);
}

const stepOf = async (page: Page) => Number((await page.getByTestId('progress').getAttribute('data-step')) ?? 0);

test('a phone creates the session, shares its QR code and trains with a laptop; every view fits the phone', async ({
  browser,
  server,
}, testInfo) => {
  test.setTimeout(240_000);
  const phoneContext = await browser.newContext(phone(browser));
  // This phone's GPU gives no WebGL context: TF.js's webgl backend cannot start there.
  await phoneContext.addInitScript(() => {
    for (const proto of [HTMLCanvasElement.prototype, OffscreenCanvas.prototype] as Array<{
      getContext(kind: string, ...rest: unknown[]): unknown;
    }>) {
      const original = proto.getContext;
      proto.getContext = function (this: unknown, kind: string, ...rest: unknown[]) {
        return /^(experimental-)?webgl/.test(kind) ? null : original.call(this, kind, ...rest);
      };
    }
  });
  const p = await phoneContext.newPage();

  // The create form.
  await p.goto(server.url);
  await expectFits(p, 'the create form');
  const session = sessionName('phone');
  await p.getByLabel('Session name').fill(session);
  await p.getByTestId('demo-preset').tap();
  await p.getByLabel('World size (tabs)').fill('2');
  // Both tabs train every step together (a fixed size), on WebGL (faster than SwiftShader's WebGPU here).
  await p.getByLabel('Keep training with at least (tabs)').fill('2');
  await p.getByLabel('Steps (optional)').fill('80');
  await p.getByLabel('Backend').selectOption('webgl');
  await p.getByRole('button', { name: 'Create session' }).tap();

  // The session's link and its QR code.
  const shared = await p.getByTestId('share-link').inputValue();
  expect(shared).toMatch(/#token=/);
  await expectQrVisible(p, 'the created session');
  await expectFits(p, 'the created session with its link and QR code');
  await p.getByTestId('qr-code').scrollIntoViewIfNeeded();
  const createShot = await p.screenshot({ path: testInfo.outputPath('phone-create.png') });

  // The phone joins as the host; it waits for the laptop.
  await p.getByTestId('join-link').tap();
  await expect(p.getByTestId('phase-pill')).toHaveAttribute('data-phase', /waiting|starting/, { timeout: 30_000 });
  await expectFits(p, 'the training view, waiting for the other tab');

  const laptop = await (await browser.newContext()).newPage();
  await laptop.goto(shared);
  await expect.poll(() => stepOf(p), { timeout: 90_000, message: 'the phone past step 5' }).toBeGreaterThan(5);
  await expect.poll(() => stepOf(laptop), { timeout: 30_000, message: 'the laptop past step 5' }).toBeGreaterThan(5);

  // Mid-run: the training view and its charts fit; the dashboard's QR code opens.
  await expectFits(p, 'the training view mid-run');
  await expectChartsFit(p);
  await p.getByText('Show the link as a QR code').tap();
  await expectQrVisible(p, "the dashboard's link for more tabs");
  await expectFits(p, 'the training view with the QR code open');

  // Both tabs list both ranks with their browser, backend and device: the phone on the cpu
  // backend (a fallback, and why), the laptop on WebGL (SwiftShader's, as the renderer says).
  for (const [page, name] of [
    [p, 'phone'],
    [laptop, 'laptop'],
  ] as const) {
    const table = page.getByTestId('fleet-table');
    for (const rank of [0, 1]) {
      const row = table.locator(`tbody tr[data-rank="${rank}"]`);
      await expect(row.locator('[data-col=browser]'), `${name}'s table: rank ${rank}'s browser`).toContainText(/Chrom(e|ium) \d+/, {
        timeout: 30_000,
      });
      // The figure itself (a rank given no samples this step has a note beside it).
      await expect(
        row.locator('[data-col=share] [data-testid=fleet-share]'),
        `${name}'s table: rank ${rank}'s share of the batch`,
      ).toHaveText(/^\d+(\.\d)?%$/);
      await expect(row.locator('[data-col=step]'), `${name}'s table: rank ${rank}'s step time`).toContainText('ms');
    }
    // Each rank's samples over the sum (uneven when the ranks' speeds differ): the shares make the whole batch.
    const shares = await table.locator('[data-col=share] [data-testid=fleet-share]').allTextContents();
    const sum = shares.reduce((total, t) => total + Number.parseFloat(t), 0);
    expect(sum, `${name}'s table: the shares ${shares.join(' + ')}`).toBeGreaterThanOrEqual(98.5);
    expect(sum, `${name}'s table: the shares ${shares.join(' + ')}`).toBeLessThanOrEqual(101.5);
    const phoneRow = table.locator('tbody tr', { has: page.locator('[data-col=browser]', { hasText: 'Android phone' }) });
    const laptopRow = table.locator('tbody tr', { has: page.locator('[data-col=browser]', { hasText: 'Linux' }) });
    await expect(phoneRow, `${name}'s table: one phone`).toHaveCount(1);
    await expect(laptopRow, `${name}'s table: one laptop`).toHaveCount(1);
    await expect(phoneRow.locator('[data-col=backend] strong')).toHaveText('cpu');
    await expect(phoneRow.getByTestId('fleet-fallback')).toContainText('webgl');
    await expect(phoneRow.locator('[data-col=device]')).toContainText('CPU');
    await expect(laptopRow.locator('[data-col=backend]')).toHaveText('webgl');
    await expect(laptopRow.locator('[data-col=device]')).toContainText(/SwiftShader/i);
  }
  await expect(p.locator('[data-fact=browser]')).toContainText('Android phone');
  await laptop.locator('.fleet-card').screenshot({ path: testInfo.outputPath('laptop-fleet.png') });
  await expectFits(p, 'the training view with the fleet table');
  await p.getByTestId('fleet-table').scrollIntoViewIfNeeded();
  const fleetShot = await p.screenshot({ path: testInfo.outputPath('phone-fleet.png') });

  // The end.
  for (const page of [p, laptop]) await expect(page.getByTestId('progress')).toHaveAttribute('data-done', 'true', { timeout: 120_000 });
  await p.waitForTimeout(600); // the throttled parts draw the final figures
  await expectFits(p, 'the finished run');
  await expectChartsFit(p);
  await p.screenshot({ path: testInfo.outputPath('phone-done-full.png'), fullPage: true });
  await p.evaluate(() => window.scrollTo(0, 0));
  const topShot = await p.screenshot({ path: testInfo.outputPath('phone-done.png') });

  // The README's picture: the three phone screens side by side.
  const board = await (
    await browser.newContext({ viewport: { width: 3 * 390 + 4 * 24, height: 844 + 2 * 24 }, deviceScaleFactor: 1.5 })
  ).newPage();
  const img = (png: Buffer, alt: string) => `<img alt="${alt}" src="data:image/png;base64,${png.toString('base64')}">`;
  await board.setContent(
    `<style>body{margin:0;padding:24px;display:flex;gap:24px;background:#e5e7eb}img{width:390px;height:844px;border-radius:18px;box-shadow:0 2px 10px #0003}</style>` +
      img(createShot, 'create') +
      img(topShot, 'dashboard') +
      img(fleetShot, 'fleet'),
  );
  await board.waitForFunction(() => [...document.images].every((i) => i.complete && i.naturalWidth > 0), undefined, { timeout: 10_000 });
  const picture = await board.screenshot();
  await writeFile(testInfo.outputPath('phone.png'), picture);
  await mkdir(join(PROJECT_ROOT, 'docs'), { recursive: true });
  await writeFile(join(PROJECT_ROOT, 'docs', 'phone.png'), picture);
});

test('a tab that cannot take part is told why and joins nothing; the other tab trains on', async ({ browser, server }) => {
  test.setTimeout(120_000);
  const session = sessionName('cannot');
  const link = (params: Record<string, string>, name = session) => {
    const url = new URL(server.url);
    url.search = new URLSearchParams({
      session: name,
      world: '2',
      min: '1',
      job: 'train',
      dataset: 'synthetic',
      trainSize: '512',
      batchSize: '32',
      steps: '20',
      backend: 'cpu',
      ...params,
    }).toString();
    return withToken(url, tokenFor(name));
  };

  // A browser without WebRTC.
  const noRtc = await browser.newContext();
  await noRtc.addInitScript(() => {
    const w = window as unknown as Record<string, unknown>;
    delete w.RTCPeerConnection;
    delete w.webkitRTCPeerConnection;
  });
  const lonely = await noRtc.newPage();
  await lonely.goto(link({}));
  await expect(lonely.getByTestId('error-banner')).toHaveAttribute('data-title', 'This browser cannot join the training', {
    timeout: 30_000,
  });
  await expect(lonely.getByTestId('error-banner')).toContainText('no WebRTC');
  await expect(lonely.getByTestId('error-banner')).toContainText('the other tabs train on without it');
  await expect(lonely.getByTestId('phase-pill')).toHaveAttribute('data-phase', 'failed');
  await expect(lonely.getByTestId('continue-button')).toBeHidden();

  // The other tab of the session trains alone, never waiting for it.
  const fine = await (await browser.newContext()).newPage();
  await fine.goto(link({}));
  await expect(fine.getByTestId('progress')).toHaveAttribute('data-done', 'true', { timeout: 90_000 });
  await expect(fine.locator('[data-fact=rank]')).toContainText('world size 1');
  await expect(fine.getByTestId('error-banner')).toBeHidden();

  // A device with too little memory for MNIST held whole.
  const small = await browser.newContext();
  await small.addInitScript(() => Object.defineProperty(Navigator.prototype, 'deviceMemory', { get: () => 0.25, configurable: true }));
  const tiny = await small.newPage();
  await tiny.goto(link({ dataset: 'mnist' }, sessionName('small')));
  await expect(tiny.getByTestId('error-banner')).toHaveAttribute('data-title', 'Not enough memory on this device', { timeout: 30_000 });
  await expect(tiny.getByTestId('error-banner')).toContainText('reports 0.25 GB');
});
