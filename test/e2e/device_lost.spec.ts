/**
 * A rank's WebGPU device lost mid-run (real pages, real WebGPU on SwiftShader, real WebRTC): the
 * launcher destroys the device as a driver reset would lose it. The rank's step ends with
 * DeviceLostError, it re-creates its backend, rebuilds its model, rejoins the group and gets the
 * group's state; the run finishes with identical replicas, at most one step trained twice.
 */
import { launch, type Fault, type LaunchOptions } from '../../launcher/run.ts';
import type { RankResult } from '../../launcher/summary_fields.ts';
import { expect, sessionName, test } from './fixtures.ts';

type Summary = Record<string, unknown> & {
  worldSize: number;
  steps: number;
  identical: boolean;
  weightHashes: string[];
  stepsRedone: number;
  generations: number;
  backends: string[];
  samplesSeen: Array<{ samples: number; exactlyOnce: boolean; complete: boolean }>;
  faults: Array<{ fault: string; atStep: number; detectedAfterMs?: number; rejoinedAfterMs?: number }>;
};

async function run(
  nproc: number,
  params: Record<string, string>,
  faults: Fault[],
  extra: Partial<LaunchOptions> = {},
): Promise<{ summary: Summary; lines: string[]; results: RankResult[] }> {
  const lines: string[] = [];
  const { ok, summary, results } = await launch({
    nproc,
    job: 'train',
    session: sessionName('device-lost'),
    timeoutSec: 120,
    jobParams: { dataset: 'synthetic', batchSize: '32', backend: 'webgpu', epochs: '1', ...params },
    faults,
    log: (l) => lines.push(l),
    ...extra,
  });
  if (!ok) console.log(lines.slice(-60).join('\n'));
  expect(ok, JSON.stringify(summary)).toBe(true);
  console.log(JSON.stringify(summary));
  return { summary: summary as Summary, lines, results };
}

/** The rejoin is timed (under 20 s): those tests run alone on the machine ('@solo', test/e2e/lanes.ts). */
function expectRejoined(s: Summary, lines: string[], results: RankResult[], rank: number, samples: number): void {
  expect(s.backends).toEqual(['webgpu']);
  expect(s.identical).toBe(true);
  expect(s.stepsRedone).toBeLessThanOrEqual(1);
  expect(s.generations).toBeGreaterThanOrEqual(2);
  for (const epoch of s.samplesSeen) expect(epoch).toEqual({ samples, exactlyOnce: true, complete: true });
  const fault = s.faults[0]!;
  expect(fault.fault).toBe(`lose rank ${rank}'s WebGPU device at step 6`);
  // The rank noticed its loss (a 'device-lost' event) and was in a round again later.
  expect(fault.detectedAfterMs).toBeDefined();
  expect(fault.rejoinedAfterMs).toBeGreaterThanOrEqual(fault.detectedAfterMs!);
  expect(fault.rejoinedAfterMs).toBeLessThan(20_000);
  // The lost device's model and optimizer were disposed: live tensors stay flat on every rank.
  for (const r of results) expect(r.liveTensors, `rank ${r.rank}`).toMatchObject({ min: (r.liveTensors as { max: number }).max });
  // What the person at that tab reads.
  expect(
    lines.some((l) =>
      /\[rank \d\] warn: This tab's GPU was reset \(destroyed: .*\); it rejoined the group with a fresh webgpu backend at step \d+/.test(l),
    ),
    lines.join('\n'),
  ).toBe(true);
}

test('elastic 3 ranks (min 2): rank 1 loses its WebGPU device at step 6, rejoins with a fresh backend, and all finish identical', {
  tag: '@solo',
}, async () => {
  const {
    summary: s,
    lines,
    results,
  } = await run(3, { min: '2', max: '3', trainSize: '1152' }, [{ kind: 'lose-device', rank: 1, step: 6 }]);
  expect(s.worldSize).toBe(3);
  expect(s.weightHashes).toHaveLength(3);
  expectRejoined(s, lines, results, 1, 1152);
});

test('fixed world size 2: rank 0 loses its device at step 6; the other waits, rank 0 takes its number again, and both finish identical', {
  tag: '@solo',
}, async () => {
  // 12 steps: the other rank waits for rank 0 at step 7, so the run cannot end before it rejoins;
  // the 6 after it check the replicas on a fresh backend (16 took 4 WebGPU steps more).
  const { summary: s, lines, results } = await run(2, { trainSize: '768' }, [{ kind: 'lose-device', rank: 0, step: 6 }]);
  expect(s.worldSize).toBe(2);
  expectRejoined(s, lines, results, 0, 768);
});

test('without rebuildState (examples/03_elastic_train.ts) a lost device ends the run with DeviceLostError, saying what to do', async () => {
  const lines: string[] = [];
  const { ok, summary } = await launch({
    nproc: 2,
    job: 'examples/03_elastic_train.ts',
    scriptArgs: ['--dataset', 'synthetic', '--train-size', '1024', '--batch-size', '32', '--epochs', '1'],
    session: sessionName('device-lost-script'),
    timeoutSec: 120,
    jobParams: { min: '1', max: '2' },
    faults: [{ kind: 'lose-device', rank: 1, step: 4 }],
    log: (l) => lines.push(l),
  });
  expect(ok, lines.join('\n')).toBe(false);
  const errors = summary.errors as string[];
  expect(errors).toHaveLength(1);
  expect(errors[0]).toMatch(/^rank 1: DeviceLostError: rank 1's WebGPU device was lost during step \d+: the page destroyed it/);
  expect(errors[0]).toContain('Reload the page to rejoin');
});
