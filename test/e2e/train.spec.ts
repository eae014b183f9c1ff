/**
 * Data-parallel training on real pages (WebGPU through SwiftShader, WebRTC): replicas identical
 * after every step; N ranks at batch B equal 1 rank at batch N*B; each sample once per epoch;
 * no tensor leak; MNIST learns.
 */
import type { ElasticEvent } from '../../src/parallel/events.ts';
import { expect, openRanks, sessionName, test, type RankPage, relativeError, weightsOf } from './fixtures.ts';

type Result = Record<string, unknown>;

async function run(
  browser: Parameters<typeof openRanks>[0],
  server: Parameters<typeof openRanks>[1],
  n: number,
  params: Record<string, string>,
): Promise<Result[]> {
  return Promise.all((await start(browser, server, n, params)).map((r) => r.result));
}

function start(
  browser: Parameters<typeof openRanks>[0],
  server: Parameters<typeof openRanks>[1],
  n: number,
  params: Record<string, string>,
): Promise<RankPage[]> {
  return openRanks(browser, server, n, { session: sessionName('train'), job: 'train', ...params });
}

// testSize 32: these tests check weights, not test figures, and an evaluation in batches of the
// training's shapes reuses its compiled shaders (the default 1,024 doubled the wait after a WebGPU run).
const sgd = {
  dataset: 'synthetic',
  model: 'mlp',
  optimizer: 'sgd',
  lr: '0.1',
  steps: '12',
  seed: '7',
  returnWeights: 'true',
  testSize: '32',
};

test('2 ranks at batch B train to the same weights as 1 rank at 2B, replicas identical every step; a tab opened after the end is told the run ended', async ({
  browser,
  server,
}) => {
  const [single] = await run(browser, server, 1, { ...sgd, batchSize: '32' });
  const session = sessionName('train');
  const pairParams = { session, job: 'train', ...sgd, batchSize: '16', checkWeights: 'true' };
  const pair = await Promise.all((await openRanks(browser, server, 2, pairParams)).map((r) => r.result));
  for (const r of pair) {
    expect(r.identicalEveryStep).toBe(true);
    expect(r.checkedSteps).toBe(12);
    expect(r.weightHash).toBe(pair[0].weightHash);
  }
  const err = relativeError(weightsOf(pair[0]), weightsOf(single));
  console.log(`2 ranks x 16 vs 1 rank x 32 after 12 SGD steps: relative error ${err.toExponential(2)}`);
  expect(err).toBeLessThan(1e-5);
  // And the weights really moved: the comparison is not between two untrained models. The
  // seeded initial weights do not depend on the backend: cpu spares a page's shader compilation.
  const [untrained] = await run(browser, server, 1, { ...sgd, batchSize: '32', steps: '1', lr: '0.000001', backend: 'cpu' });
  expect(relativeError(weightsOf(untrained), weightsOf(single))).toBeGreaterThan(1e-2);
  // The link opened once the run is over (the pair's tabs still open): the run closed its
  // rendezvous, so the tab learns at once that it ended instead of waiting 300 s for a group.
  const [late] = await openRanks(browser, server, 1, { ...pairParams, world: '2' });
  const refused = await late.result.then(
    () => new Error('the late tab trained'),
    (e: Error) => e,
  );
  expect(`${refused.name}: ${refused.message}`).toContain(`RendezvousClosedError: the run of session "${session}" has ended`);
  // A run that ended well is no failure of this tab: it says so plainly.
  await expect(late.page.getByTestId('status')).toContainText('The run finished before this tab got a rank');
  await expect(late.page.getByTestId('phase-pill')).toHaveAttribute('data-phase', 'done');
  await expect(late.page.getByTestId('error-banner')).toBeHidden();
});

// '@solo' (test/e2e/lanes.ts): which rank gets no samples follows the costs measured as it runs;
// beside two other workers' tests on a loaded machine rank 3 was starved at 0 of 12 steps (9 alone).
test('4 ranks at batch B train to the same weights as 1 rank at 4B (cpu backend), a 20x slower one given no samples: no loss for it, a gap in its line, the headline sample-weighted, and its tab says why', {
  tag: '@solo',
}, async ({ browser, server }) => {
  // The cpu backend: 4 SwiftShader devices on two cores take most of a minute, and WebGPU's
  // exactness is the 2-rank test's; this one is about the ring of 4.
  const [single] = await run(browser, server, 1, { ...sgd, batchSize: '32', backend: 'cpu' });
  // Rank 3 is made 20 times slower: once measured, balanced batches give it no samples (the
  // others finish the whole batch before it would finish one), and the sum stays exact.
  const pages = await start(browser, server, 4, { ...sgd, batchSize: '8', backend: 'cpu', slow: '3:20' });
  const four = await Promise.all(pages.map((r) => r.result));
  expect(new Set(four.map((r) => r.weightHash)).size).toBe(1);
  const err = relativeError(weightsOf(four[0]), weightsOf(single));
  console.log(`4 ranks x 8 vs 1 rank x 32 after 12 SGD steps: relative error ${err.toExponential(2)}`);
  expect(err).toBeLessThan(1e-5);

  // The steps as rank 0 heard them: rank 3's steps without samples have no loss and no accuracy (null, not 0), and say why.
  type Step = Extract<ElasticEvent, { type: 'step' }>;
  const steps = pages[0]!.reports.flatMap((r) => (r.type === 'elastic' && r.event.type === 'step' ? [r.event as Step] : []));
  expect(steps.map((e) => e.step)).toEqual(Array.from({ length: 12 }, (_, i) => i + 1));
  // Every rank-step without samples (rank 3's, and any other rank a noisy measurement starved).
  const zeros = steps.flatMap((e) => e.metrics.flatMap((m, rank) => (m.samples === 0 ? [{ e, m, rank }] : [])));
  const rank3 = zeros.filter((z) => z.rank === 3).map((z) => z.e.step);
  console.log(
    `rank 3 (20x slower) trained no samples at ${rank3.length} of 12 steps: ${rank3.join(', ')}; other ranks at ${zeros.length - rank3.length} steps`,
  );
  expect(rank3.length).toBeGreaterThanOrEqual(1);
  for (const { e, m, rank } of zeros) {
    expect([m.loss, m.accuracy]).toEqual([null, null]);
    expect(e.balance?.counts[rank]).toBe(0);
  }
  // The loss chart: a point per rank and step with samples, a gap at each step without.
  await expect(pages[0]!.page.getByTestId('loss-chart')).toHaveAttribute('data-points', String(12 * 4 - zeros.length));
  // The headline train loss and accuracy: over the last 20 steps (all 12), each rank weighted by its samples.
  const weighted = (key: 'loss' | 'accuracy') => {
    const all = steps.flatMap((e) => e.metrics).filter((m) => (m.samples ?? 0) > 0);
    return all.reduce((s, m) => s + m[key]! * m.samples!, 0) / all.reduce((s, m) => s + m.samples!, 0);
  };
  const loss = weighted('loss');
  await expect(pages[0]!.page.locator('[data-stat=loss] .stat-value')).toHaveText(
    loss.toLocaleString('en-US', { maximumFractionDigits: loss < 1 ? 4 : 3 }),
  );
  await expect(pages[0]!.page.locator('[data-stat=acc] .stat-value')).toHaveText(`${(weighted('accuracy') * 100).toFixed(1)}%`);
  // The last step gave rank 3 nothing: its own tab and the group's table say so, and why.
  const idleLast = steps.at(-1)!.metrics.flatMap((m, rank) => (m.samples === 0 ? [rank] : []));
  expect(idleLast).toContain(3);
  const why =
    /no samples this step: the group gave them to faster tabs \(measured cost [\d.]+ ms\/sample.*; the run ends at step 12, before its next measurement at step 64\)/;
  await expect(pages[3]!.page.getByTestId('idle-note')).toHaveText(new RegExp(`This tab trained ${why.source}`));
  await expect(pages[0]!.page.getByTestId('idle-note')).toBeVisible({ visible: idleLast.includes(0) });
  await expect(pages[0]!.page.locator('[data-testid=fleet-table] tr[data-rank="3"] [data-testid=fleet-no-samples]')).toHaveText(why);
  await expect(pages[0]!.page.locator('[data-testid=fleet-no-samples]')).toHaveCount(idleLast.length);
});

test('across one epoch the ranks see every sample exactly once apart from padding; tensors do not leak', async ({ browser, server }) => {
  // 1030 samples over 4 ranks: torch pads to 1032 by repeating the first 2 indices of the order.
  // balance=false: torch's DistributedSampler shards (balanced batches are checked in test/balance.test.ts).
  // The cpu backend: the sampler and the tensor count are the subject (the WebGPU backend's count is the MNIST test's).
  const ranks = await start(browser, server, 4, {
    dataset: 'synthetic',
    trainSize: '1030',
    batchSize: '50',
    epochs: '1',
    seed: '3',
    balance: 'false',
    backend: 'cpu',
  });
  const results = await Promise.all(ranks.map((r) => r.result));
  // The samples each rank reported training, step by step.
  const counts = new Map<number, number>();
  for (const r of ranks) {
    for (const report of r.reports) {
      if (report.type === 'elastic' && report.event.type === 'batch')
        for (const i of report.event.indices) counts.set(i, (counts.get(i) ?? 0) + 1);
    }
  }
  // Should this fail, the rounds each rank went through say why (a regroup trains steps again).
  const rounds = ranks.map((r) =>
    r.reports.flatMap((report) =>
      report.type === 'elastic' && report.event.type === 'round' ? [`round ${report.event.round} from step ${report.event.step}`] : [],
    ),
  );
  const why = `rounds per rank: ${JSON.stringify(rounds)}`;
  expect(counts.size, why).toBe(1030);
  const twice = [...counts.values()].filter((c) => c === 2).length;
  expect(twice, why).toBe(2);
  expect([...counts.values()].every((c) => c === 1 || c === 2)).toBe(true);
  for (const r of results) {
    const live = r.liveTensors as { steps: number; min: number; max: number };
    expect(live.steps).toBe(6);
    expect(live.max, `live tensors per step ranged ${live.min}..${live.max}`).toBe(live.min);
  }
});

test('MNIST: an MLP on 2 ranks learns on WebGPU (CI size: 6000 training images, 2000 test images); tensors do not leak', async ({
  browser,
  server,
}) => {
  // The 47 steps are what learns (23 steps at twice the batch or on half the images stay near 82-85%,
  // measured); the evaluation is only the measure: its first 2000 images cost a fifth of the 10,000's
  // time on SwiftShader (14 s on a busy 2-core machine) and read 87.7% where all 10,000 read 90.1%.
  const results = await run(browser, server, 2, { dataset: 'mnist', trainSize: '6000', testSize: '2000', epochs: '1' });
  for (const r of results) {
    expect(r.backend).toBe('webgpu');
    expect(r.weightHash).toBe(results[0].weightHash);
    // No tensor leaks on WebGPU either: the live count is flat from step to step.
    const live = r.liveTensors as { min: number; max: number };
    expect(live.max, `live tensors per step ranged ${live.min}..${live.max}`).toBe(live.min);
  }
  console.log(`MNIST 6000 images, 2 ranks: test accuracy on 2000 images ${((results[0].testAccuracy as number) * 100).toFixed(2)}%`);
  expect(results[0].testAccuracy as number).toBeGreaterThan(0.85);
});
