/**
 * The class scenario on real pages: a session made with the form (elastic by default), a host tab
 * and students; a tab that closes, comes back or reloads; a fourth tab that spectates and takes a
 * freed rank; only the host stops or ends the run, after a confirmation; nothing trained is lost.
 */
import type { BrowserContext, Locator, Page } from '@playwright/test';
import { startServer } from '../../signaling/server.ts';
import { expect, sessionName, test } from './fixtures.ts';

const stepOf = async (page: Page) => Number((await page.getByTestId('progress').getAttribute('data-step')) ?? 0);
/** Waits until the page's dashboard shows a step past `beyond`. */
const passes = (page: Page, beyond: number, timeout = 90_000) =>
  expect.poll(() => stepOf(page), { timeout, message: `${page.url()} past step ${beyond}` }).toBeGreaterThan(beyond);

/** The teacher fills the form: 3 tabs, a long synthetic run on the cpu backend; returns the shared link, and the teacher's tab joins with the host link. */
async function createSession(context: BrowserContext, serverUrl: string): Promise<{ teacher: Page; shared: string; session: string }> {
  const teacher = await context.newPage();
  await teacher.goto(serverUrl);
  const session = sessionName('class');
  await teacher.getByLabel('Session name').fill(session);
  await teacher.getByLabel('World size (tabs)').fill('3');
  await expect(teacher.getByLabel('Keep training with at least (tabs)')).toHaveValue('1');
  await teacher.getByLabel('Model').selectOption('mlp');
  await teacher.getByLabel('Dataset').selectOption('synthetic');
  await teacher.getByLabel('Batch size per rank').fill('16');
  // The cpu backend: the class is the subject, not the device (each SwiftShader WebGPU tab, a
  // reloaded or late one too, compiles its shaders for seconds at its first step). Steps the run
  // never reaches: only the host ends it.
  await teacher.getByLabel('Backend').selectOption('cpu');
  await teacher.getByLabel('Steps (optional)').fill('100000');
  await teacher.getByLabel('Training samples (optional)').fill('4096');
  await teacher.getByRole('button', { name: 'Create session' }).click();
  const shared = await teacher.getByTestId('share-link').inputValue();
  expect(shared).toMatch(/#token=[A-Za-z0-9_-]{43}$/);
  await teacher.getByTestId('join-link').click();
  await expect(teacher).toHaveURL(/&host=[A-Za-z0-9_-]{43}$/);
  return { teacher, shared, session };
}

/**
 * Every tab shows the same fault summary (matching `shape`) and the same fault history, line for
 * line. Read together until they agree: a regroup's record reaches the tabs a moment apart.
 */
async function expectSameFaults(tabs: Page[], summary: (page: Page) => Locator, shape: RegExp): Promise<void> {
  await expect(summary(tabs[0]!)).toHaveText(shape);
  const read = () =>
    Promise.all(
      tabs.map(async (page) => ({
        summary: (await summary(page).textContent()) ?? '',
        history: await page.locator('[data-testid="fault-history"] li').allTextContents(),
      })),
    );
  let views = await read();
  await expect
    .poll(
      async () => {
        views = await read();
        return views.every((v) => v.summary === views[0]!.summary && v.history.join('\n') === views[0]!.history.join('\n'));
      },
      { message: 'every tab shows the same fault summary and history' },
    )
    .toBe(true)
    .catch((e: Error) => {
      throw new Error(`${e.message}\n${tabs.map((p, i) => `${p.url()}: ${JSON.stringify(views[i])}`).join('\n')}`);
    });
  expect(views[0]!.summary).toMatch(shape);
  expect(views[0]!.history.length, 'the fault history lists each fault').toBeGreaterThanOrEqual(3);
}

test('a class session survives a closed tab, a reload and a fourth tab; only the host stops it', async ({ browser, server }) => {
  test.setTimeout(360_000);
  const context = await browser.newContext();
  const { teacher, shared } = await createSession(context, server.url);
  const alice = await context.newPage();
  await alice.goto(shared);
  const bob = await context.newPage();
  await bob.goto(shared);
  await passes(teacher, 3);

  // The tab strip shows each tab's progress.
  await expect(alice).toHaveTitle(/^\d+\/100000 · class-/);

  // Students see who is in control, and have no stop button.
  await expect(alice.getByTestId('stop-button')).toBeHidden();
  await expect(alice.getByTestId('role-note')).toContainText('host');
  await expect(teacher.getByTestId('stop-button')).toBeVisible();

  // Bob's tab closes: the others train on, nobody fails.
  const atClose = await stepOf(teacher);
  await bob.close();
  await passes(teacher, atClose + 3);
  await passes(alice, atClose + 3);
  await expect(teacher.getByTestId('error-banner')).toBeHidden();

  // Bob opens the link again: he rejoins the running session and goes on from its step, not from 0.
  const bobAgain = await context.newPage();
  await bobAgain.goto(shared);
  await passes(bobAgain, atClose + 3);

  // Alice reloads: she rejoins too.
  const atReload = await stepOf(teacher);
  await alice.reload();
  await passes(alice, atReload);

  // A fourth tab on the full session watches, then takes the rank Bob frees.
  const carol = await context.newPage();
  await carol.goto(shared);
  await expect(carol.getByTestId('phase-pill')).toHaveAttribute('data-phase', 'spectating');
  await passes(carol, 0); // the charts fill from what rank 0 publishes
  await expect(carol.getByTestId('error-banner')).toBeHidden();
  await bobAgain.close();
  await expect(carol.getByTestId('phase-pill')).not.toHaveAttribute('data-phase', 'spectating', { timeout: 60_000 });
  const atTakeover = await stepOf(teacher);
  await passes(carol, atTakeover + 2);

  // The group's faults are one record (the server's): every tab shows the same, while running
  // and at the end, also Alice's reloaded tab and Carol's, which came after most of them.
  const tabs = [teacher, alice, carol];
  await expectSameFaults(
    tabs,
    (page) => page.getByTestId('faults'),
    /^3 tabs closed, \d+ tabs joined mid-run(, \d+ steps? trained again)?$/,
  );

  // Only the host stops, after confirming; every tab ends at the same step and can download.
  await teacher.getByTestId('stop-button').click();
  await expect(teacher.getByTestId('stop-dialog')).toBeVisible();
  await teacher.getByTestId('stop-confirm').click();
  for (const page of [teacher, alice, carol])
    await expect(page.getByTestId('progress')).toHaveAttribute('data-done', 'true', { timeout: 90_000 });
  const finals = await Promise.all([teacher, alice, carol].map(stepOf));
  expect(new Set(finals).size).toBe(1);
  expect(finals[0]).toBeLessThan(100000);
  await expectSameFaults(
    tabs,
    (page) => page.locator('[data-testid="summary"] [data-key="faults"] dd'),
    /^3 tabs closed, \d+ tabs joined mid-run(, \d+ steps? trained again)?$/,
  );
  await expect(alice.getByTestId('download-button')).toBeEnabled();
  await context.close();
});

test('one closed tab is one fault on every tab: one error, about the tab that closed, and "1 tab closed" first in every summary', async ({
  browser,
  server,
}) => {
  test.setTimeout(240_000);
  const context = await browser.newContext();
  const { teacher, shared } = await createSession(context, server.url);
  const [alice, bob] = [await context.newPage(), await context.newPage()];
  await alice.goto(shared);
  await bob.goto(shared);
  await passes(teacher, 3);
  // Both are in the group (they show a step): a tab that closes before it was let in is no fault of the run.
  await passes(alice, 0);
  await passes(bob, 0);
  const atClose = await stepOf(teacher);
  await bob.close();
  // The two left regroup and train on; then the host stops.
  await passes(teacher, atClose + 3);
  await passes(alice, atClose + 3);
  await teacher.getByTestId('stop-button').click();
  await teacher.getByTestId('stop-confirm').click();
  for (const page of [teacher, alice]) {
    await expect(page.getByTestId('progress')).toHaveAttribute('data-done', 'true', { timeout: 90_000 });
    // Tabs that joined the running session are counted too (this one is elastic from 1 tab); the loss once.
    const faults = page.locator('[data-testid="summary"] [data-key="faults"] dd');
    await expect(faults).toHaveText(/^1 tab closed/);
    const errors = await page.locator('[data-testid="event-log"] [data-level="error"] .log-msg').allTextContents();
    expect(errors, 'the errors the tab logged').toHaveLength(1);
    expect(await faults.textContent()).toMatch(/^1 tab closed(, \d+ tabs? joined mid-run)?(, \d+ steps? trained again)?$/);
    expect(errors[0]).toMatch(/^Lost rank \d: .*its tab closed\.$/);
  }
  await context.close();
});

test('the host ends the session: every tab keeps its replica and downloads it, named after the session and step', async ({
  browser,
  server,
}) => {
  test.setTimeout(240_000);
  const context = await browser.newContext();
  const { teacher, shared, session } = await createSession(context, server.url);
  const student = await context.newPage();
  await student.goto(shared);
  await passes(student, 3);
  await teacher.getByTestId('end-button').click();
  await teacher.getByTestId('end-confirm').click();
  await expect(student.getByTestId('phase-pill')).toHaveAttribute('data-phase', 'ended', { timeout: 60_000 });
  await expect(student.getByTestId('download-button')).toBeEnabled();
  const download = student.waitForEvent('download');
  await student.getByTestId('download-button').click();
  expect((await download).suggestedFilename()).toMatch(new RegExp(`^${session}-step-\\d+\\.json$`));
  // The session is over: its link opens nothing any more.
  const late = await context.newPage();
  await late.goto(shared);
  await expect(late.getByTestId('bad-link')).toContainText('This session has ended');
  await context.close();
});

test('on all interfaces, the form shares a link other machines can open, and it opens; another machine creates sessions only with the admin link', async ({
  browser,
}) => {
  const server = await startServer({ port: 0, host: '0.0.0.0', log: () => {} });
  try {
    const lan = server.urls[0];
    expect(lan, 'this machine has a non-loopback address').toBeDefined();
    expect(new URL(lan!).hostname).not.toMatch(/^(127\.|localhost$)/);
    const context = await browser.newContext();
    const page = await context.newPage();
    await page.goto(`http://127.0.0.1:${server.port}/`);
    await page.getByLabel('Session name').fill(sessionName('lan'));
    await page.getByRole('button', { name: 'Create session' }).click();
    const shared = await page.getByTestId('share-link').inputValue();
    expect(shared.startsWith(lan!)).toBe(true);
    await expect(page.getByTestId('qr-code')).toBeVisible();
    // The link works from that address (the server answers to its own addresses).
    const other = await context.newPage();
    const response = await other.goto(shared);
    expect(response?.status()).toBe(200);
    await expect(other.getByTestId('status')).toBeVisible();
    // From another machine's address only the admin link creates sessions.
    const stranger = await context.newPage();
    await stranger.goto(lan!);
    await stranger.getByLabel('Session name').fill(sessionName('lan-stranger'));
    await stranger.getByRole('button', { name: 'Create session' }).click();
    await expect(stranger.getByTestId('create-error')).toContainText('Only the host creates sessions on this server');
    const admin = await context.newPage();
    await admin.goto(`${lan!}#admin=${server.adminSecret}`);
    await admin.getByLabel('Session name').fill(sessionName('lan-admin'));
    await admin.getByRole('button', { name: 'Create session' }).click();
    await expect(admin.getByTestId('share-link')).toHaveValue(/#token=[A-Za-z0-9_-]{43}$/);
    await context.close();
  } finally {
    await server.close();
  }
});
