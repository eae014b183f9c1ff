/**
 * DDP communication hooks on real pages (WebGPU through SwiftShader, WebRTC): fp16 and bf16
 * halve the bytes each rank sends per step and PowerSGD sends a fraction, with replicas
 * bit-identical at every step; local SGD's replicas are identical after each averaging.
 */
import { expect, openRanks, sessionName, test } from './fixtures.ts';

type Result = Record<string, unknown>;
const base = { job: 'train', dataset: 'synthetic', model: 'mlp', optimizer: 'sgd', lr: '0.1', seed: '7', steps: '12', batchSize: '32', checkWeights: 'true' };

async function run(browser: Parameters<typeof openRanks>[0], server: Parameters<typeof openRanks>[1], commHook: string): Promise<Result[]> {
  const pages = await openRanks(browser, server, 2, { session: sessionName('hook'), ...base, commHook });
  return Promise.all(pages.map((p) => p.result));
}

test('fp16, bf16 and PowerSGD keep replicas bit-identical every step and send fewer bytes than the plain all-reduce', async ({ browser, server }) => {
  const none = await run(browser, server, 'none');
  const noneBytes = none[0]!.bytesPerStep as number;
  expect(noneBytes).toBeGreaterThan(0);
  for (const hook of ['fp16', 'bf16', 'powersgd:2:2']) {
    const runs = await run(browser, server, hook);
    for (const r of runs) expect(r.identicalEveryStep).toBe(true);
    expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
    const ratio = (runs[0]!.bytesPerStep as number) / noneBytes;
    console.log(`${hook}: ${runs[0]!.bytesPerStep} bytes per step per rank, ${ratio.toFixed(3)} of the plain all-reduce's`);
    if (hook !== 'powersgd:2:2') expect(ratio).toBeLessThanOrEqual(0.55);
    else expect(ratio).toBeLessThan(1);
    expect(runs[0]!.testAccuracy as number).toBeGreaterThan(0.6);
  }
});

test('local SGD: replicas drift between averagings and are identical at the end of a run that ends on one', async ({ browser, server }) => {
  const runs = await run(browser, server, 'localsgd:4:4');
  // 12 steps: averaged gradients for steps 1-4, then local steps averaged at 8 and 12.
  expect(new Set(runs.map((r) => r.weightHash)).size).toBe(1);
  const comm = runs[0]!.commHook as { averagings?: number };
  expect(comm.averagings).toBe(2);
});
