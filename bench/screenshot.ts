/**
 * `npm run screenshot`: the README's pictures of a class session. Starts a server, fills the
 * create form (saved to docs/create-session.png), opens the host's tab and two students' tabs
 * training MNIST with the form's defaults, and saves the host's dashboard at step --step
 * (default 60) to docs/dashboard.png.
 */
import { dirname, join } from 'node:path';
import { parseArgs } from 'node:util';
import { launchChromium } from '../launcher/browser.ts';
import { ensureBuilt } from '../signaling/build.ts';
import { PROJECT_ROOT, startServer } from '../signaling/server.ts';

const { values } = parseArgs({ options: { step: { type: 'string', default: '60' }, out: { type: 'string' } } });
const atStep = Number(values.step);
const out = values.out ?? join(PROJECT_ROOT, 'docs', 'dashboard.png');
await ensureBuilt();
const server = await startServer({ port: 0, log: () => {} });
const browser = await launchChromium();
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const form = await context.newPage();
  await form.goto(server.url);
  await form.getByLabel('Session name').fill(`class-${Date.now().toString(36)}`);
  await form.getByLabel('World size (tabs)').fill('3');
  await form.getByRole('button', { name: 'Create session' }).click();
  await form.getByTestId('share-link').waitFor();
  await form.screenshot({ path: join(dirname(out), 'create-session.png'), fullPage: true });
  const shared = await form.getByTestId('share-link').inputValue();
  // The host's tab opens the form's join link (with the host secret); two students open the shared one.
  await form.getByTestId('join-link').click();
  const pages = [form];
  for (let i = 0; i < 2; i++) {
    const page = await context.newPage();
    await page.goto(shared);
    pages.push(page);
  }
  const progress = pages[0].getByTestId('progress');
  const deadline = Date.now() + 15 * 60_000;
  while (Number((await progress.getAttribute('data-step')) ?? 0) < atStep) {
    if (Date.now() > deadline) throw new Error(`the run did not reach step ${atStep} within 15 minutes`);
    await pages[0].waitForTimeout(1000);
  }
  await pages[0].waitForTimeout(1500); // let the charts redraw
  await pages[0].screenshot({ path: out, fullPage: true });
  console.log(`saved ${out}`);
} finally {
  await browser.close();
  await server.close();
}
