/**
 * Pipeline parallelism on real pages (WebRTC between the stages; the equality test on the cpu
 * backend, since the schedules are what it tests and SwiftShader made it the slowest test; the
 * launcher test on WebGPU, whose slower steps let its kill at step 6 land before the checkpoint
 * at step 8: a cpu run would be past it):
 * 2 stages x 4 micro-batches train to one rank's weights; 2 stages x 2 replicas at batch 16 to
 * one rank's at batch 32; 1F1B to GPipe's bit for bit; each rank holds only its stage; and, from
 * the launcher, a lost rank stops every rank naming its stage, and the run resumes from every
 * stage's checkpoint when a tab takes its place.
 */
import { expect, launchCommand, openRanks, sessionName, test, relativeError, weightsOf } from './fixtures.ts';

type Result = Record<string, unknown>;
type Pipeline = {
  stage: number;
  stages: number;
  replica: number;
  layers: number[];
  parameters: number;
  weightHash: string;
  bubble: { measured: number; formula: number };
  peakStashedMicroBatches: number;
};

async function run(
  browser: Parameters<typeof openRanks>[0],
  server: Parameters<typeof openRanks>[1],
  n: number,
  params: Record<string, string>,
): Promise<Result[]> {
  return Promise.all((await open(browser, server, n, params)).map((r) => r.result));
}

function open(
  browser: Parameters<typeof openRanks>[0],
  server: Parameters<typeof openRanks>[1],
  n: number,
  params: Record<string, string>,
) {
  return openRanks(browser, server, n, { session: sessionName('pp'), job: 'train', ...params });
}

const sgd = {
  dataset: 'synthetic',
  model: 'mlp',
  optimizer: 'sgd',
  lr: '0.1',
  steps: '20',
  seed: '7',
  returnWeights: 'true',
  backend: 'cpu',
};

test('2 stages x 4 micro-batches, and 2 stages x 2 replicas at batch 16, equal one rank at batch 32 after 20 SGD steps; 1F1B equals GPipe; each rank holds only its stage', async ({
  browser,
  server,
}) => {
  // The four runs side by side, each its own session: one rank, GPipe, 1F1B, and 2 stages x 2 replicas.
  const [[single], pages, oneFOneB, grid] = await Promise.all([
    run(browser, server, 1, { ...sgd, batchSize: '32' }),
    open(browser, server, 2, { ...sgd, batchSize: '32', pp: '2', microBatches: '4' }),
    run(browser, server, 2, { ...sgd, batchSize: '32', pp: '2', microBatches: '4', schedule: '1f1b' }),
    run(browser, server, 4, { ...sgd, batchSize: '16', pp: '2', dp: '2', microBatches: '2', checkWeights: 'true' }),
  ]);
  const gpipe = await Promise.all(pages.map((p) => p.result));
  // The dashboard shows which layers each tab holds, and the schedule as it ran.
  const card = pages[1]!.page.getByTestId('pipeline');
  await expect(card).toBeVisible();
  await expect(card.locator('tr.self-row')).toHaveAttribute('data-stage', '1');
  await expect(card.locator('tr[data-stage="0"] .pp-layers')).toContainText('Dense');
  const timeline = pages[1]!.page.getByTestId('pipeline-timeline');
  await expect(timeline).toBeVisible();
  // 2 stages x (4 forwards + 4 backwards).
  await expect(timeline).toHaveAttribute('data-boxes', '16');
  await expect(timeline.locator('.tl-box[data-phase="B"]').first()).toHaveAttribute('aria-label', /backward of micro-batch/);
  const err = relativeError(weightsOf(gpipe[0]!), weightsOf(single!));
  console.log(`2 stages x 4 micro-batches vs 1 rank, batch 32, 20 SGD steps: relative error ${err.toExponential(2)}`);
  expect(err).toBeLessThanOrEqual(1e-5);
  // Evaluated through the pipeline (stage 0 feeds, stage 1 scores): the same test accuracy as the whole model's.
  expect(gpipe[0]!.testAccuracy).toBeCloseTo(single!.testAccuracy as number, 3);
  // The synthetic MLP is 16 -> 32 (relu) -> 4: 544 parameters on stage 0, 132 on stage 1, 676 in all.
  const stages = gpipe.map((r) => r.pipeline as Pipeline).sort((a, b) => a.stage - b.stage);
  expect(stages.map((p) => [p.layers, p.parameters])).toEqual([
    [[0], 544],
    [[1], 132],
  ]);
  expect(weightsOf(single!).length).toBe(544 + 132);
  for (const p of stages) {
    expect(p.bubble.formula).toBeCloseTo(1 / 5);
    expect(p.bubble.measured).toBeGreaterThan(0);
    expect(p.peakStashedMicroBatches).toBe(4);
  }
  expect(Array.from(weightsOf(oneFOneB[0]!))).toEqual(Array.from(weightsOf(gpipe[0]!)));
  // 1F1B keeps fewer micro-batches on the first stage: S - s = 2.
  expect((oneFOneB.find((r) => (r.pipeline as Pipeline).stage === 0)!.pipeline as Pipeline).peakStashedMicroBatches).toBe(2);

  // DDP x pipeline: each stage's gradients averaged over its 2 replicas.
  for (const r of grid) expect(r.identicalEveryStep).toBe(true);
  const byStage = (s: number) => grid.filter((r) => (r.pipeline as Pipeline).stage === s).map((r) => (r.pipeline as Pipeline).weightHash);
  expect(new Set(byStage(0)).size).toBe(1);
  expect(new Set(byStage(1)).size).toBe(1);
  const gridErr = relativeError(weightsOf(grid.find((r) => r.rank === 0)!), weightsOf(single!));
  console.log(`2 stages x 2 replicas x 16 vs 1 rank x 32 after 20 SGD steps: relative error ${gridErr.toExponential(2)}`);
  expect(gridErr).toBeLessThanOrEqual(1e-5);
});

test("launcher: a lost rank stops every rank naming its stage; the run resumes from every stage's checkpoint", async () => {
  const out = await launchCommand([
    '--nproc',
    '2',
    '--pp',
    '2',
    '--micro-batches',
    '2',
    '--job',
    'train',
    '--model',
    'mlp',
    '--dataset',
    'synthetic',
    '--optimizer',
    'sgd',
    '--steps',
    '12',
    '--batch-size',
    '16',
    '--checkpoint-every',
    '4',
    '--kill',
    '1@6',
    '--join',
    '1@6',
  ]);
  const summary = out.summary;
  if (out.code !== 0) console.log(out.output.split('\n').slice(-40).join('\n'));
  expect(out.code).toBe(0);
  // The survivor said which rank and stage was lost.
  expect(out.output).toMatch(/rank 1, stage 1 of 2, was lost/);
  expect(summary.steps).toBe(12);
  expect(summary.resumes).toEqual([expect.stringMatching(/every stage resumed from its checkpoint at step 4/)]);
});
