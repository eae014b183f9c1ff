/**
 * The language model in the built-in training job (model lm, dataset text: Moby-Dick's windows of
 * characters) on real pages, the cpu backend (SwiftShader takes seconds per step of even a small
 * transformer; the first test lets each tab measure and choose, backend=auto): DDP keeps the
 * replicas identical every step and the loss falls below a uniform guess; every tab's dashboard shows the same sampled text and the perplexity; a pipeline of
 * two stages trains it to the weights of one rank; DiLoCo's outer steps end on identical replicas.
 */
import { expect, openRanks, sessionName, test, relativeError, weightsOf } from './fixtures.ts';

type Result = Record<string, unknown>;
// A small model for a short test: width 32, windows of 16 characters, 8 windows per rank and step
// (a sample's 120 characters and a step take about half the time of windows of 32, measured).
const lm = {
  job: 'train',
  model: 'lm',
  dataset: 'text',
  backend: 'cpu',
  hidden: '32',
  context: '16',
  batchSize: '8',
  optimizer: 'adam',
  lr: '0.01',
  seed: '3',
  testSize: '64',
};
const VOCABULARY = 76;

type Figure = { backend: string; msPerStep: number | null; steps: number; note?: string };

test('2 tabs train the language model with DDP, each on the backend it measured fastest (auto): identical replicas every step, the loss falls, the first sample after 3 steps, both dashboards show the same sample and the perplexity', async ({
  browser,
  server,
}) => {
  // The probe (at most 4 x 3 s per tab) comes before the 12 steps.
  test.setTimeout(300_000);
  // backend auto (the language model's default): each tab times this model on its backends and keeps the fastest.
  const pages = await openRanks(browser, server, 2, {
    session: sessionName('lm'),
    ...lm,
    backend: 'auto',
    steps: '12',
    evalEvery: '6',
    firstSample: '3',
    checkWeights: 'true',
  });
  const results = await Promise.all(pages.map((p) => p.result));
  for (const r of results) {
    // Whatever each tab chose, the host optimizer keeps the replicas bit-identical.
    expect(r.identicalEveryStep).toBe(true);
    expect(r.checkedSteps).toBe(12);
    expect(r.weightHash).toBe(results[0]!.weightHash);
    // Every backend the tab has was timed (or says why not), and the fastest is the one it trained on.
    const figures = r.backendProbe as Figure[];
    expect(figures.map((f) => f.backend).sort()).toEqual(['cpu', 'wasm', 'webgl', 'webgpu']);
    for (const f of figures) expect(f.msPerStep !== null || (f.note ?? '').length > 0).toBe(true);
    const timed = figures.filter((f) => f.msPerStep !== null);
    expect(timed.length).toBeGreaterThan(0);
    expect(r.backend).toBe(timed.reduce((a, f) => (f.msPerStep! < a.msPerStep! ? f : a)).backend);
    // The first sample before the first evaluation (3), then at the evaluations (6, 12); 9 is not 3 x 2^k.
    expect(r.sampleSteps).toEqual([3, 6, 12]);
  }
  const r = results[0]!;
  console.log(
    `language model, 2 tabs, 12 steps: loss ${(r.finalLoss as number).toFixed(3)}, test loss ${(r.testLoss as number).toFixed(3)} (perplexity ${(r.perplexity as number).toFixed(2)}), ${Math.round(r.tokensPerSec as number)} characters/s; ${JSON.stringify(r.sample)}`,
  );
  for (const q of results) console.log(`rank ${q.rank as number} chose ${q.backend as string}: ${JSON.stringify(q.backendProbe)}`);
  expect(r.model).toBe('lm');
  expect(r.context).toBe(16);
  // A uniform guess over the vocabulary is ln 76 = 4.33 nats per character; 12 steps of Adam are well below it
  // (2.92 at step 12 with this seed, test loss 3.19, measured).
  expect(r.finalLoss as number).toBeLessThan(Math.log(VOCABULARY) - 0.8);
  expect(r.testLoss as number).toBeLessThan(Math.log(VOCABULARY) - 0.8);
  expect(r.perplexity as number).toBeCloseTo(Math.exp(r.testLoss as number), 6);
  expect(r.unigram as number).toBeGreaterThan(2.9);
  expect(r.unigram as number).toBeLessThan(3.2);
  // The sample: the prompt and 120 characters, the same on both tabs (identical replicas, seeded by the step).
  expect(r.sample).toMatch(/^Call me [\s\S]{120}$/);
  expect(results[1]!.sample).toBe(r.sample);
  for (const { page } of pages) {
    await expect(page.getByTestId('sample')).toBeVisible();
    await expect(page.getByTestId('sample-text')).toHaveText(r.sample as string, { useInnerText: false });
    await expect(page.getByTestId('sample')).toContainText('After step 12');
    await expect(page.getByTestId('backend-probe')).toContainText(/auto, measured on this model: .*\(chosen\)/);
    await expect(page.locator('[data-stat="test"]')).toContainText('perplexity');
    await expect(page.locator('[data-stat="speed"]')).toContainText('characters/s');
  }
});

test('the language model as a pipeline of 2 stages equals one rank; with DiLoCo the replicas end identical', async ({
  browser,
  server,
}) => {
  const sgdLm = { ...lm, optimizer: 'sgd', lr: '0.5', steps: '8', returnWeights: 'true' };
  const [single] = await Promise.all((await openRanks(browser, server, 1, { session: sessionName('lm1'), ...sgdLm })).map((p) => p.result));
  const staged = await Promise.all(
    (await openRanks(browser, server, 2, { session: sessionName('lmpp'), ...sgdLm, pp: '2', microBatches: '2' })).map((p) => p.result),
  );
  const err = relativeError(weightsOf(staged.find((r) => r.rank === 0)!), weightsOf(single!));
  console.log(`language model, 2 stages x 2 micro-batches vs 1 rank, 8 SGD steps: relative error ${err.toExponential(2)}`);
  expect(err).toBeLessThanOrEqual(1e-5);
  expect(staged.find((r) => r.rank === 0)!.testLoss as number).toBeCloseTo(single!.testLoss as number, 4);
  for (const r of staged) expect(r.perplexity as number).toBeCloseTo(Math.exp(r.testLoss as number), 6);
  expect(single!.finalLoss as number).toBeLessThan(Math.log(VOCABULARY));

  // DiLoCo: 8 inner steps, an outer step after every 4 (the last after step 8).
  const diloco: Result[] = await Promise.all(
    (await openRanks(browser, server, 2, { session: sessionName('lmdiloco'), ...lm, steps: '8', commHook: 'diloco:4' })).map(
      (p) => p.result,
    ),
  );
  expect(new Set(diloco.map((r) => r.weightHash)).size).toBe(1);
  expect(diloco[0]!.commHook).toMatchObject({ name: 'diloco', outerSteps: 2 });
  expect(diloco[0]!.finalLoss as number).toBeLessThan(Math.log(VOCABULARY));
});
