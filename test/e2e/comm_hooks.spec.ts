/**
 * DDP communication hooks on real pages (WebRTC, the cpu backend: a hook works on the gradients and
 * weights read back to the page, whatever computed them; DDP's exactness on WebGPU is
 * test/e2e/train.spec.ts's, and DiLoCo and PowerSGD run on WebGPU in test/e2e/examples.spec.ts):
 * on the usual MNIST CNN fp16 halves the bytes each rank sends per step and
 * PowerSGD rank 2 sends a few percent, with replicas bit-identical at every step; local SGD's
 * replicas are identical after each averaging. bf16 is fp16's code path with another codec
 * (test/comm_hooks.test.ts).
 */
import { launch } from '../../launcher/run.ts';
import { expect, heldSteps, openRanks, sessionName, test } from './fixtures.ts';

type Result = Record<string, unknown>;
const base = {
  job: 'train',
  dataset: 'synthetic',
  model: 'mlp',
  // A SwiftShader page spends seconds compiling shaders at its first step and at its first evaluation.
  backend: 'cpu',
  optimizer: 'sgd',
  lr: '0.1',
  seed: '7',
  steps: '12',
  batchSize: '32',
  checkWeights: 'true',
};
// The measure: the usual MNIST CNN (the job's cnn with a hidden layer of 128, 53,866
// parameters), a few steps on a slice of MNIST. The bytes depend on neither the backend nor the
// batch: 8 images a step (the cpu backend's convolutions take time in proportion).
const cnn = {
  ...base,
  dataset: 'mnist',
  model: 'cnn',
  hidden: '128',
  steps: '4',
  batchSize: '8',
  trainSize: '512',
  testSize: '100',
};
// The job's default cnn (5,258 parameters, no hidden layer): its 400 x 10 classifier alone keeps
// PowerSGD rank 2 above a fifth ((400 + 10) x 2 of 4,000 values), in torch as here.
const smallCnn = { ...cnn, hidden: '0' };

async function run(
  browser: Parameters<typeof openRanks>[0],
  server: Parameters<typeof openRanks>[1],
  commHook: string,
  params: Record<string, string> = base,
): Promise<Result[]> {
  const pages = await openRanks(browser, server, 2, { session: sessionName('hook'), ...params, commHook });
  return Promise.all(pages.map((p) => p.result));
}

test('on the CNN, fp16 and PowerSGD keep replicas bit-identical every step; fp16 sends <= 0.55 and PowerSGD rank 2 <= 0.2 of the plain all-reduce', async ({
  browser,
  server,
}) => {
  const none = await run(browser, server, 'none', cnn);
  const noneBytes = none[0]!.bytesPerStep as number;
  expect(none[0]!.parameters).toBe(53_866);
  // The plain ring all-reduce of 2 ranks: each rank sends the gradients once, plus frame headers.
  expect(noneBytes).toBeGreaterThanOrEqual(53_866 * 4);
  expect(noneBytes).toBeLessThan(53_866 * 4 * 1.01);
  // The step's vote rides on the last bucket (its bytes in both figures): no hook sends what the plain all-reduce does.
  expect(none[0]!.compressionRatio as number).toBeCloseTo(1, 6);
  // START 0: every step compressed, so bytesPerStep is PowerSGD's own. The bounds are the
  // elements each sends (rank 2: (n + m) x 2 per matrix, the 162 biases whole) with their headers.
  const limits: Record<string, [number, number, typeof cnn]> = {
    fp16: [0.5, 0.55, cnn],
    'powersgd:2:0': [0.03, 0.04, cnn],
    'powersgd:2:0:fp16': [0.015, 0.025, cnn],
    'powersgd:2:0@small': [0.2, 0.22, smallCnn],
  };
  for (const [name, [least, most, params]] of Object.entries(limits)) {
    const hook = name.split('@')[0]!;
    const runs = await run(browser, server, hook, params);
    for (const r of runs) expect(r.identicalEveryStep).toBe(true);
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    // The small CNN's ratio is the summary's, against the float32 all-reduce computed from the ring's schedule.
    const ratio = params === cnn ? (runs[0]!.bytesPerStep as number) / noneBytes : (runs[0]!.compressionRatio as number);
    console.log(
      `cnn (hidden ${params.hidden}) ${hook}: ${runs[0]!.bytesPerStep} bytes per step per rank, ${ratio.toFixed(3)} of the plain all-reduce's`,
    );
    // The ratio the summary reports is the same figure, against the computed float32 baseline
    // (the plain run's bytes also hold its vote, which rides on its last bucket: ~0.1% here).
    expect(Math.abs((runs[0]!.compressionRatio as number) - ratio)).toBeLessThan(0.002 * ratio);
    expect(runs[0]!.compressionRatio as number).toBeGreaterThanOrEqual(least);
    expect(runs[0]!.compressionRatio as number).toBeLessThanOrEqual(most);
    // Four steps say nothing of accuracy (bench:comm-hooks measures it); the loss is a number.
    expect(Number.isFinite(runs[0]!.finalLoss as number)).toBe(true);
  }
});

test('local SGD: replicas drift between averagings and are identical at the end of a run that ends on one', async ({ browser, server }) => {
  const runs = await run(browser, server, 'localsgd:4:4');
  // 12 steps: averaged gradients for steps 1-4, then local steps averaged at 8 and 12.
  expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
  const comm = runs[0]!.commHook as { averagings?: number };
  expect(comm.averagings).toBe(2);
});

test('DiLoCo: identical replicas after the run; with int8 pseudo-gradients, a tab killed between outer steps and one joining cost no sample twice or never', async ({
  browser,
  server,
}) => {
  // Two pages, 12 steps of diloco:4: outer steps after 4, 8 and 12, one pseudo-gradient all-reduce each.
  const runs = await run(browser, server, 'diloco:4');
  expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
  const comm = runs[0]!.commHook as { name?: string; registered?: string; outerSteps?: number; outerStepBytes?: number };
  expect(comm).toMatchObject({ name: 'diloco', registered: 'diloco', outerSteps: 3 });
  expect(comm.outerStepBytes).toBeGreaterThanOrEqual(4 * (runs[0]!.parameters as number));

  // Through the launcher, on the cpu backend, the pseudo-gradients as int8 blocks: 3 tabs, a
  // fourth opened at step 4, rank 1 killed at step 10. The launcher injects the kill once the
  // joiner is in a round (its page can take 10 s to load on a busy machine): the run must still be
  // training then, so 128 steps, each held 4 times its compute (--slow: a wait, not work; as long a
  // run as 256 steps without, for half the CPU).
  const lines: string[] = [];
  const { ok, summary } = await launch({
    nproc: 3,
    job: 'train',
    session: sessionName('diloco'),
    timeoutSec: 240,
    jobParams: {
      dataset: 'synthetic',
      trainSize: '12288',
      batchSize: '32',
      backend: 'cpu',
      min: '2',
      max: '4',
      commHook: 'diloco:4:int8',
      slow: heldSteps(4),
    },
    faults: [
      { kind: 'kill', rank: 1, step: 10 },
      { kind: 'join', count: 1, step: 4 },
    ],
    log: (l) => lines.push(l),
  });
  if (!ok) console.log(lines.slice(-40).join('\n'));
  expect(ok, JSON.stringify(summary)).toBe(true);
  const s = summary as { identical: boolean; worldSize: number; samplesSeen: unknown[]; resumes?: string[]; commHook?: { wire?: string } };
  console.log(JSON.stringify(s));
  expect(s.identical).toBe(true);
  expect(s.commHook?.wire).toBe('int8');
  // 3 - 1 killed + 1 joined: the joiner trained in the last round.
  expect(s.worldSize).toBe(3);
  expect(s.samplesSeen).toEqual([{ samples: 12288, exactlyOnce: true, complete: true }]);
  // Two regroups. The join's, at an outer step's vote: an outer step over the inner steps the 3
  // ranks took since the last one. The kill's: back to the last step every rank finished (the
  // last outer step: the train job votes at outer steps), its inner steps trained again.
  expect(s.resumes?.length, JSON.stringify(s.resumes)).toBe(2);
  const regroups = lines.filter((l) => /New group of \d: .*an outer step over the inner steps since step \d+ of 3 ranks/.test(l));
  if (regroups.length === 0) console.log(lines.filter((l) => /New group|kill|join|round|lost|resum/i.test(l)).join('\n'));
  expect(regroups.length).toBeGreaterThanOrEqual(1);
});
