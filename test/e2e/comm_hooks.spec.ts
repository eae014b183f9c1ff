/**
 * DDP communication hooks on real pages (WebGPU through SwiftShader, WebRTC): on the job's CNN,
 * fp16 halves the bytes each rank sends per step and PowerSGD rank 2 sends a fifth (a tenth with
 * a 16-bit wire), with replicas bit-identical at every step; local SGD's replicas are identical
 * after each averaging. bf16 is fp16's code path with another codec (test/comm_hooks.test.ts).
 */
import { expect, openRanks, sessionName, test } from './fixtures.ts';

type Result = Record<string, unknown>;
const base = { job: 'train', dataset: 'synthetic', model: 'mlp', optimizer: 'sgd', lr: '0.1', seed: '7', steps: '12', batchSize: '32', checkWeights: 'true' };
// The measure: the job's MNIST CNN (5258 parameters), a few steps on a slice of MNIST. On
// the cpu backend: the bytes do not depend on it, and SwiftShader takes seconds per CNN step, which
// made this test (eight pages in turn) run past its time limit on a busy 2-core machine.
const cnn = { ...base, dataset: 'mnist', model: 'cnn', backend: 'cpu', steps: '4', batchSize: '32', trainSize: '512', testSize: '100' };

async function run(browser: Parameters<typeof openRanks>[0], server: Parameters<typeof openRanks>[1], commHook: string, params: Record<string, string> = base): Promise<Result[]> {
  const pages = await openRanks(browser, server, 2, { session: sessionName('hook'), ...params, commHook });
  return Promise.all(pages.map((p) => p.result));
}

test('on the CNN, fp16 and PowerSGD keep replicas bit-identical every step; fp16 sends <= 0.55 and PowerSGD rank 2 with a 16-bit wire <= 0.2 of the plain all-reduce', async ({ browser, server }) => {
  const none = await run(browser, server, 'none', cnn);
  const noneBytes = none[0]!.bytesPerStep as number;
  expect(noneBytes).toBeGreaterThan(0);
  // START 0: every step compressed, so bytesPerStep is PowerSGD's own.
  const limits: Record<string, [number, number]> = { fp16: [0.5, 0.55], 'powersgd:2:0': [0.2, 0.22], 'powersgd:2:0:fp16': [0.1, 0.2] };
  for (const [hook, [least, most]] of Object.entries(limits)) {
    const runs = await run(browser, server, hook, cnn);
    for (const r of runs) expect(r.identicalEveryStep).toBe(true);
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    const ratio = (runs[0]!.bytesPerStep as number) / noneBytes;
    console.log(`cnn ${hook}: ${runs[0]!.bytesPerStep} bytes per step per rank, ${ratio.toFixed(3)} of the plain all-reduce's`);
    // The ratio the summary reports is the same figure, against the computed float32 baseline.
    expect(runs[0]!.compressionRatio as number).toBeCloseTo(ratio, 6);
    expect(ratio).toBeGreaterThan(least);
    expect(ratio).toBeLessThanOrEqual(most);
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
