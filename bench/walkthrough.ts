/**
 * `npm run walkthrough`: the README followed as a new teacher would, with pictures in
 * docs/walkthrough/. A server; the create form with its defaults (3 tabs, MNIST); the host's tab
 * and two students, one of them in a Chromium without WebGPU (it trains on WebGL); a student's
 * tab closed mid-run; Stop and a download right after it; the final report; then a language-model
 * session on the default backend. Each picture's figures are printed beside it, read from the
 * page, so that a reader can check them against the picture.
 */
import { mkdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { chromium, type Browser, type Page } from 'playwright-core';
import { chromiumArgs, chromiumPath, launchChromium } from '../launcher/browser.ts';
import { ensureBuilt } from '../signaling/build.ts';
import { PROJECT_ROOT, startServer } from '../signaling/server.ts';

const { values } = parseArgs({
  options: { out: { type: 'string' }, 'lm-steps': { type: 'string', default: '30' }, only: { type: 'string' } },
});
const outDir = values.out ?? join(PROJECT_ROOT, 'docs', 'walkthrough');
const lmSteps = Number(values['lm-steps']);
const NO_WEBGPU_ARGS = chromiumArgs({ webgpu: false });

const stepOf = async (page: Page) => Number((await page.getByTestId('progress').getAttribute('data-step')) ?? 0);

async function until(what: string, check: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${Math.round(timeoutMs / 1000)} s waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 1000));
  }
}

async function shot(page: Page, name: string): Promise<void> {
  await page.waitForTimeout(1500); // the charts redraw at most once a second
  const path = join(outDir, name);
  await page.screenshot({ path, fullPage: true });
  const cards = [
    await page
      .getByTestId('progress')
      .textContent()
      .catch(() => ''),
    await page
      .locator('section.stats')
      .textContent()
      .catch(() => ''),
  ].join(' · ');
  console.log(`saved ${path}\n  ${cards.replace(/\s*\n\s*/g, ' · ')}`);
}

/** The create form with its defaults but for `fields`; returns the form's page (which joins as host) and the shared link. */
async function create(
  browser: Browser,
  url: string,
  fields: Record<string, string>,
  picture?: string,
): Promise<{ host: Page; shared: string }> {
  const host = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
  await host.goto(url);
  await host.getByLabel('Session name').fill(`class-${Date.now().toString(36)}`);
  for (const [label, value] of Object.entries(fields)) {
    const field = host.getByLabel(label, { exact: true });
    if ((await field.evaluate((e) => e.tagName)) === 'SELECT') await field.selectOption(value);
    else await field.fill(value);
  }
  await host.getByRole('button', { name: 'Create session' }).click();
  await host.getByTestId('share-link').waitFor();
  if (picture) await shot(host, picture);
  const shared = await host.getByTestId('share-link').inputValue();
  await host.getByTestId('join-link').click();
  return { host, shared };
}

async function classSession(gpu: Browser, noGpu: Browser, url: string): Promise<void> {
  const { host, shared } = await create(gpu, url, { 'Steps (optional)': '400' }, '1-create-session.png');
  const alice = await (await gpu.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
  await alice.goto(shared);
  const bob = await (await noGpu.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
  await bob.goto(shared);
  await until('the class to pass step 40', async () => (await stepOf(host)) > 40, 10 * 60_000);
  await shot(host, '2-training.png');
  await shot(bob, '3-student-without-webgpu.png');
  const atClose = await stepOf(host);
  await alice.close();
  // Stop away from an evaluation step (every 100), so the picture after Stop shows the evaluation after the run.
  await until(
    'the two left to train 30 more steps',
    async () => {
      const step = await stepOf(host);
      return step > atClose + 30 && step % 100 >= 10 && step % 100 <= 80;
    },
    5 * 60_000,
  );
  await shot(host, '4-after-a-tab-closed.png');
  await host.getByTestId('stop-button').click();
  await host.getByTestId('stop-confirm').click();
  await until('the download to be offered after Stop', async () => host.getByTestId('download-button').isEnabled(), 60_000);
  await shot(host, '5-stopped.png');
  const download = host.waitForEvent('download');
  await host.getByTestId('download-button').click();
  const file = await (await download).path();
  console.log(`  downloaded ${(await download).suggestedFilename()}: ${(await stat(file)).size} bytes`);
  for (const page of [host, bob])
    await until('the final report', async () => (await page.getByTestId('progress').getAttribute('data-done')) === 'true', 5 * 60_000);
  await shot(host, '6-final-host.png');
  await shot(bob, '7-final-student.png');
  await host.context().close();
  await bob.context().close();
}

async function languageModel(gpu: Browser, url: string): Promise<void> {
  const { host, shared } = await create(gpu, url, { Model: 'lm', Dataset: 'text', 'World size (tabs)': '2', 'Steps (optional)': '400' });
  const student = await (await gpu.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
  await student.goto(shared);
  await until(`the language model to pass step ${lmSteps}`, async () => (await stepOf(host)) >= lmSteps, 15 * 60_000);
  await shot(host, '8-language-model.png');
  await host.context().close();
  await student.context().close();
}

await mkdir(outDir, { recursive: true });
await ensureBuilt();
const server = await startServer({ port: 0, log: () => {} });
const gpu = await launchChromium();
const noGpu = await chromium.launch({ executablePath: chromiumPath(), args: NO_WEBGPU_ARGS, headless: true });
try {
  if (values.only !== 'lm') await classSession(gpu, noGpu, server.url);
  if (values.only !== 'class') await languageModel(gpu, server.url);
} finally {
  await gpu.close();
  await noGpu.close();
  await server.close();
}
