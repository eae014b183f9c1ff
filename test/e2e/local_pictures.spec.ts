/**
 * Each tab's own pictures (dataset local), on real pages with Chromium's fake camera: a video of
 * red, green and blue in turn (test/fixtures/y4m.ts), so the pictures each tab takes of class k
 * while colour k shows differ from the other classes'. Three tabs record their own bursts and a
 * fourth, whose camera is refused, adds files (a picture, then a text file it refuses), removes
 * its one picture and joins with none; the four train one model on the cpu backend with identical
 * replicas, and the dashboard shows every tab's held-out accuracy and the group's. No picture
 * leaves its tab: nothing at all goes out while the tabs take pictures (they are not connected
 * yet), and while they train no request carries a body and no WebSocket frame is as large as one
 * picture (the gradients go peer to peer; the library's own byte count is test/local_data*.test.ts).
 * The model exports as with any data: its TF.js files predict what the page did, and "For PyTorch".
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright';
import { CHROMIUM_ARGS, chromiumPath } from '../../launcher/browser.ts';
import { withToken } from '../../src/wire/session_token.ts';
import type { Report } from '../../src/jobs/job_report.ts';
import { tokenFor } from '../fixtures/session.ts';
import { writeY4m, type Rgb } from '../fixtures/y4m.ts';
import { expect, sessionName, test } from './fixtures.ts';

const COLORS: readonly Rgb[] = [
  [220, 30, 30],
  [30, 200, 40],
  [40, 60, 220],
];
const SIZE = 32;
/** One picture's floats as bytes: a frame that could hold a picture is at least this large. */
const PICTURE_BYTES = SIZE * SIZE * 3 * 4;
/** A 1 x 1 PNG (a red pixel): a file the browser decodes. */
const PNG = Buffer.from('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==', 'base64');

let browser: Browser;
let dir: string;

test.beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'ddp-camera-'));
  // 1.5 s of each colour at 10 frames a second; the fake device loops the file.
  const video = writeY4m(join(dir, 'classes.y4m'), { width: 64, height: 48, fps: 10, colors: COLORS, framesEach: 15 });
  // This spec's own browser: a fake camera playing the video. Not --use-fake-ui-for-media-stream,
  // which would accept every request: each context grants the camera or not, so a tab can be refused.
  browser = await chromium.launch({
    executablePath: chromiumPath(),
    headless: true,
    args: [...CHROMIUM_ARGS, '--use-fake-device-for-media-stream', `--use-file-for-fake-video-capture=${video}`],
  });
});

test.afterAll(async () => {
  await browser?.close();
  rmSync(dir, { recursive: true, force: true });
});

interface Tab {
  page: Page;
  result: Promise<Record<string, unknown>>;
  /** What the page sent: HTTP requests with a body, and WebSocket frames' sizes, from the moment it opened. */
  sent: { bodies: string[]; frames: number[] };
}

async function openTab(context: BrowserContext, url: string): Promise<Tab> {
  const page = await context.newPage();
  let settle!: { resolve(r: Record<string, unknown>): void; reject(e: Error): void };
  const result = new Promise<Record<string, unknown>>((resolve, reject) => (settle = { resolve, reject }));
  result.catch(() => {});
  await page.exposeFunction('__ddpReport', (r: Report) => {
    if (r.type === 'result') settle.resolve(r.result);
    if (r.type === 'error') settle.reject(Object.assign(new Error(r.message), { name: r.name }));
  });
  const sent: Tab['sent'] = { bodies: [], frames: [] };
  page.on('request', (r) => {
    const body = r.postDataBuffer();
    if (body && body.length > 0) sent.bodies.push(`${r.method()} ${r.url()} (${body.length} bytes)`);
  });
  page.on('websocket', (ws) =>
    ws.on('framesent', (f) => sent.frames.push(typeof f.payload === 'string' ? Buffer.byteLength(f.payload) : f.payload.length)),
  );
  await page.goto(url);
  return { page, result, sent };
}

/** The colour class the camera's preview shows now (its centre pixel), or -1 between colours. */
async function colourShown(page: Page): Promise<number> {
  return page.getByTestId('camera-preview').evaluate((v: HTMLVideoElement, colors: readonly Rgb[]) => {
    const c = document.createElement('canvas');
    c.width = 1;
    c.height = 1;
    const ctx = c.getContext('2d')!;
    ctx.drawImage(v, v.videoWidth / 2, v.videoHeight / 2, 1, 1, 0, 0, 1, 1);
    const [r, g, b] = ctx.getImageData(0, 0, 1, 1).data;
    return colors.findIndex(([cr, cg, cb]) => Math.abs(cr - r!) + Math.abs(cg - g!) + Math.abs(cb - b!) < 60);
  }, COLORS);
}

/** Holds class k's button from the moment colour k starts showing until the class has `n` pictures. */
async function recordClass(page: Page, k: number, n: number): Promise<void> {
  await expect.poll(() => colourShown(page), { timeout: 10_000, intervals: [50], message: `the camera shows colour ${k}` }).toBe(k);
  await page.getByTestId(`hold-${k}`).hover();
  await page.mouse.down();
  await expect
    .poll(async () => Number(await page.getByTestId(`class-${k}`).getAttribute('data-count')), {
      timeout: 5_000,
      intervals: [25],
      message: `class ${k} has ${n} pictures`,
    })
    .toBeGreaterThanOrEqual(n);
  await page.mouse.up();
}

/** Each class in the order its colour comes next, each from its colour's start: no wait for a colour to come round again. */
async function recordAll(page: Page, n: number): Promise<void> {
  let now = -1;
  await expect.poll(async () => (now = await colourShown(page)), { timeout: 10_000, message: 'the camera shows a colour' }).not.toBe(-1);
  for (let i = 1; i <= COLORS.length; i++) await recordClass(page, (now + i) % COLORS.length, n);
}

test('tabs train one model on their own pictures from the camera and files; no picture leaves its tab; the model exports as with any data', async ({
  server,
}) => {
  test.setTimeout(120_000);
  const session = sessionName('pictures');
  const params = new URLSearchParams({
    session,
    job: 'train',
    world: '4',
    dataset: 'local',
    classes: 'red,green,blue',
    imageSize: String(SIZE),
    color: 'rgb',
    model: 'mlp',
    hidden: '16',
    batchSize: '4',
    // Fewer than an epoch's steps (each camera tab trains 12 or more pictures): the run's end evaluates mid-epoch.
    steps: '2',
    lr: '0.01',
    backend: 'cpu',
    checkWeights: 'true',
  });
  const url = withToken(new URL(`/?${params}`, server.url), tokenFor(session));
  const origin = new URL(server.url).origin;
  // A context (a window) per tab: a tab in the background of a window gets its timers and video slowed.
  const cameras = await Promise.all(
    [0, 1, 2].map(async () => {
      const context = await browser.newContext();
      await context.grantPermissions(['camera'], { origin });
      return context;
    }),
  );
  const refused = await browser.newContext();
  try {
    await trainOnPictures(url, cameras, refused);
  } finally {
    await Promise.all([...cameras, refused].map((c) => c.close()));
  }
});

/** Three camera tabs and a refused one take their pictures, join, and train; what each sent is checked. */
async function trainOnPictures(url: string, cameras: BrowserContext[], refused: BrowserContext): Promise<void> {
  const tabs = await Promise.all(cameras.map((c) => openTab(c, url)));
  const filesTab = await openTab(refused, url);

  // Each camera tab records its own bursts of the three colours, 5 or more pictures a class.
  await Promise.all(
    tabs.map(async ({ page }) => {
      await expect(page.getByTestId('privacy')).toContainText('What never leaves it: the pictures.');
      await page.getByTestId('camera-start').click();
      await expect(page.getByTestId('camera-status')).toContainText('Camera on');
      await recordAll(page, 5);
      for (const k of [0, 1, 2]) await expect(page.getByTestId(`count-${k}`)).toContainText(/to train, [1-9]\d* to test$/);
    }),
  );
  // The refused tab says so, and files still work; a text file is refused, nothing added.
  const fp = filesTab.page;
  await fp.getByTestId('camera-start').click();
  await expect(fp.getByTestId('camera-status')).toContainText('The camera was not allowed in this tab');
  await expect(fp.getByTestId('hold-0')).toBeDisabled();
  await fp.getByTestId('files-1').setInputFiles([
    { name: 'red.png', mimeType: 'image/png', buffer: PNG },
    { name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from('not a picture') },
  ]);
  await expect(fp.getByTestId('capture-message')).toHaveText(
    '1 picture added to green. “notes.txt” is not a picture (a text/plain file): choose a photo (JPEG, PNG, WebP or GIF); nothing was added.',
  );
  await expect(fp.getByTestId('count-1')).toHaveText('1 picture: 1 to train, 0 to test');
  await fp.getByRole('button', { name: 'Remove picture 1 of green' }).click();
  await expect(fp.getByTestId('count-1')).toHaveText('no pictures yet');

  // Nothing has left any tab while it took pictures: no socket, no request with a body.
  for (const t of [...tabs, filesTab]) expect(t.sent).toEqual({ bodies: [], frames: [] });

  for (const { page } of tabs) await page.getByTestId('join-training').click();
  await expect(fp.getByTestId('join-training')).toHaveText('Join the training with no pictures');
  await fp.getByTestId('join-training').click();
  const results = await Promise.all([...tabs, filesTab].map((t) => t.result));

  // One model: identical replicas at every step, on every tab.
  for (const r of results) {
    expect(r.identicalEveryStep).toBe(true);
    expect(r.weightHash).toBe(results[0]!.weightHash);
  }
  // Every tab shows the group's accuracy on all held-out pictures, and its own (none on the files tab).
  const heldOut = await tabs[0]!.page.getByTestId('local-group-accuracy').textContent();
  expect(heldOut).toMatch(/^The group: \d+\.\d% \(\d+ of (9|1\d)\) at step 2$/);
  for (const { page } of [...tabs, filesTab]) await expect(page.getByTestId('local-group-accuracy')).toHaveText(heldOut!);
  await expect(tabs[0]!.page.getByTestId('local-own-accuracy')).toHaveText(/^This tab: \d+\.\d% \(\d+ of [3-9]\)$/);
  await expect(fp.getByTestId('local-own-accuracy')).toHaveText('This tab: no test pictures');
  await expect(fp.locator('[data-testid="local-table"] tbody tr')).toHaveCount(4);
  // The pictures stayed: no request body at all, and no WebSocket frame as large as one picture.
  for (const t of [...tabs, filesTab]) {
    expect(t.sent.bodies).toEqual([]);
    expect(t.sent.frames.length, 'the tab spoke to the server once it joined').toBeGreaterThan(0);
    expect(Math.max(...t.sent.frames)).toBeLessThan(PICTURE_BYTES);
  }
  await expect(tabs[0]!.page.getByTestId('capture-panel')).toContainText('fixed while the group trains');

  // Export as with every dataset: the TF.js files load and predict what the page predicted on its
  // held-out pictures; "For PyTorch" gives the module and its weights.
  const page = tabs[0]!.page;
  const tfjsFiles = await downloads(page, 'download-button');
  const json = JSON.parse(tfjsFiles.find((f) => f.name.endsWith('.json'))!.bytes.toString('utf8')) as {
    modelTopology: object;
    weightsManifest: Array<{ weights: tf.io.WeightsManifestEntry[] }>;
  };
  const bin = tfjsFiles.find((f) => f.name.endsWith('.bin'))!.bytes;
  await tf.setBackend('cpu');
  const model = await tf.loadLayersModel(
    tf.io.fromMemory({
      modelTopology: json.modelTopology,
      weightSpecs: json.weightsManifest[0]!.weights,
      weightData: bin.buffer.slice(bin.byteOffset, bin.byteOffset + bin.byteLength),
    }),
  );
  const probe = results[0]!.probe as { inputs: number[]; inputShape: number[]; logits: number[] };
  expect(probe.inputShape).toEqual([SIZE, SIZE, 3]);
  const rows = probe.logits.length / COLORS.length;
  expect(rows, 'the page predicted some held-out pictures').toBeGreaterThan(0);
  const out = model.predict(tf.tensor(probe.inputs, [rows, ...probe.inputShape])) as tf.Tensor;
  const logits = await out.data();
  out.dispose();
  model.dispose();
  expect(Math.max(...Array.from(logits, (v, i) => Math.abs(v - probe.logits[i]!))), 'downloaded model vs page').toBeLessThan(1e-4);
  const torchFiles = await downloads(page, 'download-torch-button');
  expect(torchFiles.map((f) => f.name.replace(/^.*\./, '')).sort()).toEqual(['py', 'safetensors']);
}

/** The two files a download button gives, read into memory. */
async function downloads(page: Page, button: string): Promise<Array<{ name: string; bytes: Buffer }>> {
  const files: Array<{ name: string; bytes: Buffer }> = [];
  const both = new Promise<void>((resolve) => {
    page.removeAllListeners('download');
    page.on('download', async (d) => {
      files.push({ name: d.suggestedFilename(), bytes: await readFile((await d.path())!) });
      if (files.length === 2) resolve();
    });
  });
  await expect(page.getByTestId(button)).toBeEnabled();
  await page.getByTestId(button).click();
  await Promise.race([
    both,
    new Promise((_, reject) => setTimeout(() => reject(new Error(`two files from ${button} within 20 s`)), 20_000)),
  ]);
  return files;
}
