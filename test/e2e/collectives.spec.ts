/**
 * The collectives over real WebRTC between real pages: every op and collective, odd sizes,
 * bit-identical results on every rank; a peer closed mid-collective makes the others reject.
 */
import { expect, openRanks, sessionName, test } from './fixtures.ts';

interface Case {
  name: string;
  ok: boolean;
  hash: string;
  detail?: string;
}

for (const n of [2, 3, 4]) {
  test(`${n} pages: every collective exact and bit-identical on every rank`, async ({ browser, server }) => {
    const ranks = await openRanks(browser, server, n, { session: sessionName(`coll${n}`), job: 'collectives' });
    const results = await Promise.all(ranks.map((r) => r.result));
    const perRank = results.map((r) => r.cases as Case[]);
    for (const cases of perRank) {
      for (const c of cases) expect(c, `${c.name}: ${c.detail ?? ''}`).toMatchObject({ ok: true });
    }
    for (let i = 0; i < perRank[0].length; i++) {
      const hashes = new Set(perRank.map((cases) => cases[i].hash));
      expect(hashes.size, `${perRank[0][i].name} differs between ranks`).toBe(1);
    }
    expect(perRank[0].length).toBeGreaterThan(20);
  });
}

// '@solo' (test/e2e/lanes.ts): the rejection is timed; alone on the machine.
test('a peer closed mid-collective makes every survivor reject naming it, within the bound', { tag: '@solo' }, async ({
  browser,
  server,
}) => {
  // Large, repeated all-reduces so that the close lands in the middle of one. No link measurement
  // first ('measure-link': seconds of 8 MB transfers): the timed all-reduces begin just after the
  // group forms (two small all-reduces and a barrier), and a second later they are under way.
  const ranks = await openRanks(browser, server, 4, {
    session: sessionName('lost'),
    job: 'allreduce',
    sizes: '2000000',
    iters: '50',
    mesh: 'false',
    'measure-link': 'false',
    timeoutMs: '60000',
  });
  await expect.poll(() => ranks[0].reports.some((r) => r.type === 'rank'), { timeout: 60_000 }).toBe(true);
  await ranks[0].page.waitForTimeout(1_000);
  const closedAt = Date.now();
  await ranks[2].page.close();
  for (const r of [0, 1, 3]) {
    const err = await ranks[r].result.then(
      () => new Error('finished without noticing the lost rank'),
      (e: Error) => e,
    );
    expect(err.name).toBe('PeerLostError');
    expect(err.message).toContain('lost rank 2');
  }
  // The server notices the closed socket at once; 15 s is a generous bound for a loaded machine.
  expect(Date.now() - closedAt).toBeLessThan(15_000);
});
