/**
 * `npx tsx bench/capture_screenshot.ts`: the pictures of the capture panel in docs/class.md. A
 * server, Chromium with a fake camera (red, green and blue in turn: test/fixtures/y4m.ts), and a
 * tab of a session on each tab's own pictures at desktop width (docs/capture-desktop.png) and at
 * a phone's (390 px, docs/capture-phone.png), each after recording a few pictures of every class.
 * A script, not a test: the pictures change only when it is run.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { chromium, type Page } from 'playwright';
import { CHROMIUM_ARGS, chromiumPath } from '../launcher/browser.ts';
import { ensureBuilt } from '../signaling/build.ts';
import { PROJECT_ROOT, startServer } from '../signaling/server.ts';
import { newSessionToken, withToken } from '../src/wire/session_token.ts';
import { writeY4m, type Rgb } from '../test/fixtures/y4m.ts';

const { values } = parseArgs({ options: { out: { type: 'string' } } });
const outDir = values.out ?? join(PROJECT_ROOT, 'docs');
const dir = mkdtempSync(join(tmpdir(), 'ddp-capture-'));
const COLORS: readonly Rgb[] = [
  [220, 60, 50],
  [60, 170, 80],
  [50, 90, 210],
];
const video = writeY4m(join(dir, 'classes.y4m'), { width: 320, height: 240, fps: 10, colors: COLORS, framesEach: 12 });

await ensureBuilt();
const server = await startServer({ port: 0, log: () => {} });
const browser = await chromium.launch({
  executablePath: chromiumPath(),
  headless: true,
  args: [...CHROMIUM_ARGS, '--use-fake-device-for-media-stream', `--use-file-for-fake-video-capture=${video}`],
});

/** Waits until the camera's preview shows colour k (its centre pixel). */
async function waitForColour(page: Page, k: number): Promise<void> {
  await page.waitForFunction(
    ({ rgb }) => {
      const v = document.querySelector<HTMLVideoElement>('[data-testid="camera-preview"]')!;
      const c = document.createElement('canvas');
      c.width = 1;
      c.height = 1;
      const ctx = c.getContext('2d')!;
      ctx.drawImage(v, v.videoWidth / 2, v.videoHeight / 2, 1, 1, 0, 0, 1, 1);
      const d = ctx.getImageData(0, 0, 1, 1).data;
      return Math.abs(d[0]! - rgb[0]) + Math.abs(d[1]! - rgb[1]) + Math.abs(d[2]! - rgb[2]) < 60;
    },
    { rgb: COLORS[k]! },
    { polling: 50, timeout: 20_000 },
  );
}

/** Records `n` pictures of each class with the fake camera, each while its colour shows, as a person holds each class's button. */
async function record(page: Page, n: number): Promise<void> {
  await page.getByTestId('camera-start').click();
  await page.getByText('Camera on').waitFor();
  for (let k = 0; k < 3; k++) {
    await waitForColour(page, (k + 2) % 3);
    await waitForColour(page, k);
    await page.getByTestId(`hold-${k}`).hover();
    await page.mouse.down();
    await page.waitForFunction((c) => Number(document.querySelector(`[data-testid="class-${c.k}"]`)?.getAttribute('data-count')) >= c.n, {
      k,
      n,
    });
    await page.mouse.up();
  }
  await page.mouse.move(0, 0);
}

try {
  const session = `pictures-${Date.now().toString(36)}`;
  const params = new URLSearchParams({
    session,
    job: 'train',
    world: '3',
    dataset: 'local',
    classes: 'rock,paper,scissors',
    imageSize: '32',
  });
  const url = withToken(new URL(`/?${params}`, server.url), newSessionToken());
  const shots = [
    { name: 'capture-desktop.png', viewport: { width: 1280, height: 900 }, mobile: false, pictures: 7 },
    { name: 'capture-phone.png', viewport: { width: 390, height: 844 }, mobile: true, pictures: 6 },
  ];
  for (const shot of shots) {
    const context = await browser.newContext({
      viewport: shot.viewport,
      isMobile: shot.mobile,
      hasTouch: shot.mobile,
      deviceScaleFactor: 2,
    });
    await context.grantPermissions(['camera'], { origin: new URL(server.url).origin });
    const page = await context.newPage();
    await page.goto(url);
    await record(page, shot.pictures);
    const path = join(outDir, shot.name);
    await page.screenshot({ path, fullPage: true });
    console.log(`saved ${path}`);
    await context.close();
  }
} finally {
  await browser.close();
  await server.close();
  rmSync(dir, { recursive: true, force: true });
}
