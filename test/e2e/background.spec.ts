/**
 * What a person's browser does: the ranks as headful windows under Xvfb with the browser's default
 * background throttling (the launcher's --tabs), and one rank's tab sent to the background
 * mid-run. It must not hang the run: it finishes, the tab really was hidden, replicas agree.
 * The speed comparison is a benchmark (npm run bench:background), not a timed test.
 */
import { launch } from '../../launcher/run.ts';
import { expect, sessionName, test } from './fixtures.ts';

test('a rank whose tab goes to the background at step 5 trains on to the end (headful, default throttling)', async () => {
  test.setTimeout(240_000);
  const lines: string[] = [];
  const { ok, summary } = await launch({
    nproc: 2,
    job: 'train',
    session: sessionName('background'),
    timeoutSec: 180,
    tabs: true,
    jobParams: { dataset: 'synthetic', trainSize: '2048', batchSize: '32', steps: '60', evalEvery: '0' },
    faults: [{ kind: 'hide', rank: 1, step: 5 }],
    log: (l) => lines.push(l),
  });
  if (!ok) console.log(lines.slice(-30).join('\n'));
  expect(ok, JSON.stringify(summary)).toBe(true);
  expect(summary.steps).toBe(60);
  expect(summary.identical).toBe(true);
  expect(summary.hidden).toEqual([{ rank: 1, atStep: 5 }]);
  expect(summary.visibility).toEqual([
    { rank: 0, state: 'visible' },
    { rank: 1, state: 'hidden' },
  ]);
});
