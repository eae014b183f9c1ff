/** Three tabs open the real page with ?session=x&world=3 and each shows its rank and WebGPU. */
import { expect, sessionName, test } from './fixtures.ts';
import { newSessionToken, withToken } from '../../src/wire/session_token.ts';

test('three pages join one session through the page and each shows its rank and WebGPU', async ({ browser, server }) => {
  const context = await browser.newContext();
  const session = sessionName('lobby');
  // A tab on the server's own machine creates the session with its link's token.
  const link = withToken(`${server.url}?session=${session}&world=3`, newSessionToken());
  const pages = [];
  for (let i = 0; i < 3; i++) {
    const page = await context.newPage();
    await page.goto(link);
    pages.push(page);
  }
  const ranks: string[] = [];
  for (const page of pages) {
    await expect(page.getByRole('status')).toHaveText('Group complete: 3 ranks.');
    await expect(page.locator('dd').nth(2)).toHaveText('3 of 3: ranks 0, 1, 2');
    await expect(page.locator('dd[data-available]')).toHaveAttribute('data-available', 'true');
    await expect(page.locator('dd[data-available]')).toContainText('available: google swiftshader');
    ranks.push((await page.locator('dd').first().textContent()) ?? '');
  }
  expect(ranks.sort()).toEqual(['rank 0', 'rank 1', 'rank 2']);
  // A fourth tab is told the session is full.
  const extra = await context.newPage();
  await extra.goto(link);
  await expect(extra.getByRole('status')).toContainText('is full');
  // A tab without the session's token (the link retyped without it) gets nothing of the session,
  // and a tab with another token is refused.
  const cut = await context.newPage();
  await cut.goto(`${server.url}?session=${session}&world=3`);
  await expect(cut.getByRole('status')).toContainText(/has no #token=\.\.\. at its end/i);
  const stranger = await context.newPage();
  await stranger.goto(withToken(`${server.url}?session=${session}&world=3`, newSessionToken()));
  await expect(stranger.getByRole('status')).toContainText(`wrong token for session "${session}"`);
  await context.close();
});

test('without a session the page offers to create one, with a link to share', async ({ page, server }) => {
  await page.goto(server.url);
  await page.getByLabel('Session name').fill('my-run');
  await page.getByLabel('World size (tabs)').fill('3');
  // Sessions made on the page are elastic by default; a fixed size waits for every tab.
  await expect(page.getByLabel('Keep training with at least (tabs)')).toHaveValue('1');
  await page.getByLabel('Keep training with at least (tabs)').fill('3');
  // This server offers no model or data of the host's own: the form does not offer "user".
  await expect(page.getByLabel('Model').locator('option[value="user"]')).toHaveCount(0);
  await expect(page.getByLabel('Dataset').locator('option[value="user"]')).toHaveCount(0);
  // The language model reads the text, in batches of 16 windows: the form follows when they are not the person's own.
  await page.getByLabel('Model').selectOption('lm');
  await expect(page.getByLabel('Dataset')).toHaveValue('text');
  await expect(page.getByLabel('Batch size per rank')).toHaveValue('16');
  await page.getByLabel('Model').selectOption('mlp');
  await expect(page.getByLabel('Dataset')).toHaveValue('mnist');
  await page.getByLabel('Dataset').selectOption('synthetic');
  await page.getByRole('button', { name: 'Create session' }).click();
  const link = page.getByTestId('share-link');
  await expect(link).toHaveValue(/session=my-run&world=3&job=train&min=3&model=mlp&dataset=synthetic&.*#token=[A-Za-z0-9_-]{43}$/);
  const shared = await link.inputValue();
  // The session exists from now on: a student whose link lost its #token=... part, opening it
  // before the host's own tab, is told so and claims nothing.
  const student = await page.context().newPage();
  await student.goto(shared.replace(/#.*$/, ''));
  await expect(student.getByTestId('bad-link')).toContainText('This link has no #token');
  await student.close();
  await page.getByTestId('join-link').click();
  // The creator's own tab also holds the host's secret; the link it shows others does not.
  await expect(page).toHaveURL(new RegExp(`^${shared.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}&host=[A-Za-z0-9_-]{43}$`));
  await expect(page.getByTestId('status')).toContainText('Waiting for 2 more tabs');
  await expect(page.getByTestId('dash-share-link')).toHaveValue(shared);
});
