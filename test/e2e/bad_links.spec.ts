/**
 * Bad links on the real page: each one opens a page that names the parameter, its value and
 * what is allowed, with a next step; never a blank page, a dashboard that "failed", or a 404 in
 * the console. Screenshots go to /tmp/badlinks/ to be looked at.
 */
import { mkdir } from 'node:fs/promises';
import type { Page } from '@playwright/test';
import { StoreClient } from '../../src/c10d/store.ts';
import { newSessionToken, withToken } from '../../src/wire/session_token.ts';
import { tokenFor } from '../fixtures/session.ts';
import { expect, sessionName, test } from './fixtures.ts';

const SHOTS = '/tmp/badlinks';

const CASES: Array<{ name: string; query: (session: string) => string; title: string; message: string }> = [
  {
    name: 'world-abc',
    query: (s) => `session=${s}&world=abc&job=train`,
    title: 'This link is not valid',
    message: 'The link says “world=abc”, but the world size (how many tabs train together) must be an integer from 1 to 64.',
  },
  {
    name: 'world-negative',
    query: (s) => `session=${s}&world=-2&job=train`,
    title: 'This link is not valid',
    message: 'The link says “world=-2”, but the world size (how many tabs train together) must be an integer from 1 to 64.',
  },
  {
    name: 'world-100',
    query: (s) => `session=${s}&world=100&job=train`,
    title: 'This link is not valid',
    message: 'The link says “world=100”, but the world size (how many tabs train together) must be an integer from 1 to 64.',
  },
  {
    name: 'min-above-world',
    query: (s) => `session=${s}&world=3&min=5&job=train`,
    title: 'This link is not valid',
    message: "The link says “min=5”, but the minimum number of tabs must be at most the session's largest size (3).",
  },
  {
    name: 'train-without-session',
    query: () => 'world=2&job=train',
    title: 'This link has no session',
    message: 'The link asks for job=train but names no session (session=NAME).',
  },
  {
    name: 'unknown-job',
    query: (s) => `session=${s}&world=2&job=trian`,
    title: 'This link is not valid',
    message: 'The link says “job=trian”, but the job must be one of train, rendezvous, allreduce, collectives.',
  },
  {
    name: 'bad-rank',
    query: (s) => `session=${s}&world=3&job=train&rank=7`,
    title: 'This link is not valid',
    message: 'The link says “rank=7”, but the rank must be an integer from 0 to 2 (this session has 3 ranks).',
  },
  {
    name: 'lobby-world-100',
    query: (s) => `session=${s}&world=100`,
    title: 'This link is not valid',
    message: 'The link says “world=100”, but the world size (how many tabs train together) must be an integer from 1 to 64.',
  },
  {
    name: 'learning-rate',
    query: (s) => `session=${s}&world=2&job=train&lr=fast`,
    title: 'This link is not valid',
    message: 'The link says “lr=fast”, but the learning rate must be a number above 0 and at most 10.',
  },
];

test('every bad link says which value is wrong, what is allowed and what to do', async ({ browser, server }) => {
  await mkdir(SHOTS, { recursive: true });
  const context = await browser.newContext({ viewport: { width: 1000, height: 640 } });
  const page = await context.newPage();
  const notFound: string[] = [];
  page.on('response', (r) => {
    if (r.status() === 404) notFound.push(r.url());
  });
  for (const c of CASES) {
    const session = sessionName('bad');
    await page.goto(withToken(`${server.url}?${c.query(session)}`, tokenFor(session)));
    const card = page.getByTestId('bad-link');
    await expect(card, c.name).toBeVisible();
    await expect(card.getByRole('heading', { level: 1 })).toHaveText(c.title);
    await expect(page.getByTestId('bad-link-message')).toHaveText(c.message);
    await expect(card).toContainText('What to do:');
    await expect(card.getByRole('link', { name: 'Create a new session' })).toHaveAttribute('href', '/');
    // Not a training run that failed: no dashboard, no "failed".
    await expect(page.locator('.dashboard')).toHaveCount(0);
    await expect(page.locator('body')).not.toContainText(/failed/i);
    await page.screenshot({ path: `${SHOTS}/${c.name}.png`, fullPage: true });
  }
  // The favicon is inline: no tab asks the server for anything it does not have.
  expect(notFound).toEqual([]);
  await context.close();
});

/**
 * A tab whose link cannot join shows one page: what is wrong and what to do (ask the host), and
 * nothing of a session it is not in: no dashboard, no "failed", no stop button, no link to share.
 */
async function expectTokenPage(page: Page, name: string, title: string, message: string | RegExp): Promise<void> {
  const card = page.getByTestId('bad-link');
  await expect(card, name).toBeVisible({ timeout: 30_000 });
  await expect(card.getByRole('heading', { level: 1 })).toHaveText(title);
  await expect(page.getByTestId('bad-link-message')).toHaveText(message);
  await expect(card).toContainText('What to do: Ask the host for the');
  await expect(page.locator('.dashboard')).toHaveCount(0);
  await expect(page.locator('body')).not.toContainText(/failed/i);
  for (const id of ['stop-button', 'dash-share-link', 'error-banner']) await expect(page.getByTestId(id)).toHaveCount(0);
  await expect(page.getByRole('link', { name: 'Create a new session' })).toHaveCount(0);
  // Said once: the page holds the one card and nothing else.
  await expect(page.locator('#app > *')).toHaveCount(1);
  await page.screenshot({ path: `${SHOTS}/${name}.png`, fullPage: true });
}

test('a training link whose token cannot join says what is wrong with it and to ask the host, and nothing else', async ({
  browser,
  server,
}) => {
  await mkdir(SHOTS, { recursive: true });
  const context = await browser.newContext({ viewport: { width: 1000, height: 640 } });
  const page = await context.newPage();
  const train = (session: string) => `${server.url}?session=${session}&world=2&job=train&model=mlp&dataset=synthetic`;

  const cut = sessionName('cut');
  await page.goto(train(cut));
  await expectTokenPage(
    page,
    'token-missing',
    'This link has no #token',
    `The link ends without its #token=..., the secret that lets a tab join session “${cut}”. Chat apps and some editors cut links at the #.`,
  );

  // A token of the wrong form is not "no token".
  await page.goto(`${train(sessionName('abc'))}#token=abc`);
  await expectTokenPage(
    page,
    'token-malformed',
    'This link’s #token is not valid',
    /^The link says “#token=abc”, but a session’s token is 22 to 128 letters, digits, “-” or “_” \(this one has 3\): it is not one this server issued\./,
  );

  // A well-formed token the server did not issue for this session.
  const guarded = sessionName('guarded');
  const owner = await StoreClient.connect(server.url, { session: guarded, token: tokenFor(guarded) });
  await page.goto(withToken(train(guarded), newSessionToken()));
  await expectTokenPage(
    page,
    'token-wrong',
    'This link’s #token does not open this session',
    new RegExp(`^Session “${guarded}” exists on this server, but the #token=\\.\\.\\. in this link is not its token`),
  );
  owner.close();

  // The host ended the session: its link joins nothing any more.
  const ended = sessionName('ended');
  const host = await StoreClient.connect(server.url, { session: ended, token: tokenFor(ended), host: newSessionToken() });
  await host.control('end');
  host.close();
  await page.goto(withToken(train(ended), tokenFor(ended)));
  await expectTokenPage(page, 'session-ended', 'This session has ended', `The host ended session “${ended}”: it takes no more tabs.`);
  await context.close();
});

test('the create form starts elastic, estimates the duration, and shares a link with a QR code', async ({ page, server }) => {
  await mkdir(SHOTS, { recursive: true });
  await page.goto(server.url);
  const min = page.getByLabel('Keep training with at least (tabs)');
  await expect(min).toHaveValue('1');
  // A session is for a class: the world starts at the Quick demo's 3 tabs (issue 52).
  await expect(page.getByLabel('World size (tabs)')).toHaveValue('3');
  await page.getByLabel('World size (tabs)').fill('4');
  await expect(page.getByTestId('hint-min')).toHaveText(
    'Tabs may close, reload or join while it runs: training goes on while at least 1 is in, whereas a fixed size (4 here) would pause whenever one leaves.',
  );
  await expect(page.getByTestId('estimate')).toContainText(
    /^Estimated duration: about .+ for 235 steps with 4 tabs \(longer with fewer\)\. It assumes .+ a step and .+ for each of 3 test-set evaluations, as measured with up to three tabs on each 2-core computer without a GPU/,
  );
  await page.getByTestId('demo-preset').click();
  // A demo of several tabs: every tab opened on its link trains.
  await expect(page.getByLabel('World size (tabs)')).toHaveValue('3');
  await expect(page.getByLabel('Keep training with at least (tabs)')).toHaveValue('2');
  await expect(page.getByLabel('Dataset')).toHaveValue('synthetic');
  await expect(page.getByLabel('Steps (optional)')).toHaveValue('60');
  await expect(page.getByTestId('estimate')).toContainText('for 60 steps');
  await page.getByLabel('Session name').fill('class-demo');
  await page.getByRole('button', { name: 'Create session' }).click();
  const link = page.getByTestId('share-link');
  // Today's server has no /api/info: the link uses the page's own address, and says who can open it.
  await expect(link).toHaveValue(
    new RegExp(
      `^${server.url.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\\?session=class-demo&world=3&job=train&min=2&.*#token=[A-Za-z0-9_-]{43}$`,
    ),
  );
  await expect(page.getByTestId('share-note')).toContainText('HOST=0.0.0.0 npm start');
  await expect(page.getByTestId('qr-code')).toBeVisible();
  await expect(page.getByTestId('join-link')).toHaveAttribute('href', /#token=[A-Za-z0-9_-]{43}&host=[A-Za-z0-9_-]{43}$/);
  await page.screenshot({ path: `${SHOTS}/create-form.png`, fullPage: true });
});
