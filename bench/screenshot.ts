/**
 * `npm run screenshot`: the README's picture of a session in progress. Starts a server, opens
 * three ranks training MNIST, and saves rank 0's dashboard at step --step (default 60) to
 * docs/dashboard.png.
 */
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { launchChromium } from '../launcher/browser.ts';
import { ensureBuilt } from '../signaling/build.ts';
import { PROJECT_ROOT, startServer } from '../signaling/server.ts';
import { newSessionToken, withToken } from '../src/session_token.ts';

const { values } = parseArgs({ options: { step: { type: 'string', default: '60' }, out: { type: 'string' } } });
const atStep = Number(values.step);
const out = values.out ?? join(PROJECT_ROOT, 'docs', 'dashboard.png');
await ensureBuilt();
const server = await startServer({ port: 0, log: () => {} });
const browser = await launchChromium();
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const session = `screenshot-${Date.now().toString(36)}`;
  const token = newSessionToken();
  const pages = [];
  for (let i = 0; i < 3; i++) {
    const page = await context.newPage();
    await page.goto(withToken(`${server.url}?session=${session}&world=3&job=train&model=mlp&dataset=mnist&batchSize=64&epochs=1`, token));
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
