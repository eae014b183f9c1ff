/**
 * Firefox as a rank (Debian's firefox-esr, a process of its own per rank, driven over WebDriver
 * BiDi by the launcher: launcher/firefox.ts), in a mixed fleet with Chromium, through the
 * launcher as a user runs it (--browsers chromium,firefox). Both browsers' own results come back;
 * each rank trains on its own backend (Chromium on WebGPU, Firefox, which has no WebGPU on
 * Linux, on WebGL), and the replicas stay bit-identical at every step. A Firefox rank killed
 * mid-run is survived like any tab; every Firefox process and profile is gone when a run ends,
 * failed runs included.
 */
import { existsSync } from 'node:fs';
import { launch, type LaunchOptions } from '../../launcher/run.ts';
import type { BrowserPlan } from '../../launcher/rank_browsers.ts';
import { expect, sessionName, test } from './fixtures.ts';

const MIXED: BrowserPlan = { ranks: ['chromium', 'firefox'], join: 'chromium' };

type Run = { ok: boolean; summary: Record<string, unknown>; results: Array<Record<string, unknown>>; lines: string[] };

async function run(opts: Partial<LaunchOptions> & { jobParams: Record<string, string> }): Promise<Run> {
  const lines: string[] = [];
  const started = Date.now();
  const { ok, summary, results } = await launch({
    nproc: 2,
    job: 'train',
    session: sessionName('firefox'),
    timeoutSec: 150,
    browsers: MIXED,
    log: (l) => {
      lines.push(l);
      // DEBUG_PAGES=1: the launcher's lines as they come, with the seconds since the start.
      if (process.env.DEBUG_PAGES) console.log(`${((Date.now() - started) / 1000).toFixed(1)} ${l}`);
    },
    ...opts,
  });
  console.log(`${ok ? 'ok' : 'failed'} in ${((Date.now() - started) / 1000).toFixed(1)} s: ${JSON.stringify(summary)}`);
  return { ok, summary, results, lines };
}

/** Every Firefox the run started (from the launcher's log): its process group and profile must be gone. */
function firefoxLeftovers(lines: string[]): { started: number; left: string[] } {
  const left: string[] = [];
  let started = 0;
  for (const line of lines) {
    const m = /Firefox started: process group (\d+), profile (\S+)/.exec(line);
    if (!m) continue;
    started++;
    try {
      process.kill(-Number(m[1]), 0);
      left.push(`process group ${m[1]} still running`);
    } catch {
      /* gone, as it should be */
    }
    if (existsSync(m[2]!)) left.push(`profile ${m[2]} still there`);
  }
  return { started, left };
}

type BrowserEntry = { page: number; rank: number | null; browser: string; finished: boolean };

test('a Chromium tab (WebGPU) and a Firefox tab (WebGL) train the language model together: identical at every step, each writes a sample', async () => {
  // A tiny transformer (width 16, windows of 16): its attention, layer norms and GELU on two browsers' GPUs
  // (backend webgpu, not the language model's default auto, which picks the cpu here). Firefox has
  // no WebGPU on Linux: it falls back to WebGL, and each browser's own result says so.
  const r = await run({
    jobParams: {
      model: 'lm',
      backend: 'webgpu',
      hidden: '16',
      context: '16',
      batchSize: '4',
      steps: '6',
      evalEvery: '0',
      testSize: '16',
      lr: '0.01',
      checkWeights: 'true',
    },
  });
  if (!r.ok) console.log(r.lines.slice(-40).join('\n'));
  expect(r.ok, JSON.stringify(r.summary)).toBe(true);
  const browsers = r.summary.browsers as BrowserEntry[];
  expect(browsers.map((b) => [b.browser, b.finished])).toEqual([
    ['chromium', true],
    ['firefox', true],
  ]);
  // Each browser's own result, as the page returned it (the Firefox one over WebDriver BiDi).
  expect(r.results).toHaveLength(2);
  const of = (browser: string) => r.results.find((x) => x.rank === browsers.find((b) => b.browser === browser)!.rank)!;
  const chromium = of('chromium');
  const firefox = of('firefox');
  expect(chromium.backend).toBe('webgpu');
  expect(firefox.backend).toBe('webgl');
  for (const x of [chromium, firefox]) {
    expect(x.steps).toBe(6);
    // Every rank compared every rank's weight hash after every step.
    expect(x.checkedSteps).toBe(6);
    expect(x.identicalEveryStep).toBe(true);
    expect(x.weightHash).toBe(chromium.weightHash);
  }
  expect([...(r.summary.backends as string[])].sort()).toEqual(['webgl', 'webgpu']);
  expect(r.summary.identical).toBe(true);
  expect(r.summary.identicalEveryStep).toBe(true);
  expect(r.lines.some((l) => /this browser has no WebGPU \(navigator\.gpu is missing\); using webgl instead/.test(l))).toBe(true);
  // The final evaluation's sample, from each tab's own replica: the same weights and seed, but each
  // backend's own float rounding in the probabilities, so the texts may part where a draw falls on
  // a boundary; each is the prompt and 120 characters.
  for (const x of r.results) expect(x.sample).toMatch(/^Call me [\s\S]{120}$/);
  expect(firefoxLeftovers(r.lines)).toEqual({ started: 1, left: [] });
});

test('elastic: the Firefox rank is killed mid-run, a tab joins, every sample is trained once and the replicas stay identical', async () => {
  const r = await run({
    jobParams: {
      dataset: 'synthetic',
      model: 'mlp',
      trainSize: '768',
      // A small test set: the evaluation at the end, on each rank's GPU, is not the subject.
      testSize: '64',
      batchSize: '16',
      epochs: '1',
      evalEvery: '0',
      checkWeights: 'true',
      min: '1',
      max: '3',
    },
    faults: [
      { kind: 'kill', rank: 'firefox', step: 5 },
      { kind: 'join', count: 1, step: 6 },
    ],
  });
  if (!r.ok) console.log(r.lines.slice(-40).join('\n'));
  expect(r.ok, JSON.stringify(r.summary)).toBe(true);
  const browsers = r.summary.browsers as BrowserEntry[];
  // The Firefox tab trained (it held a rank) and was killed; the Chromium tab and the one that joined finished.
  expect(browsers.map((b) => [b.page, b.browser, b.finished])).toEqual([
    [0, 'chromium', true],
    [1, 'firefox', false],
    [2, 'chromium', true],
  ]);
  expect(browsers[1]!.rank).not.toBeNull();
  const faults = r.summary.faults as Array<{ fault: string; atStep: number; detectedAfterMs?: number }>;
  expect(faults[0]!.fault).toBe('kill the firefox rank at step 5');
  expect(faults[0]!.detectedAfterMs).toBeLessThan(10_000);
  expect(r.summary.worldSize).toBe(2);
  expect(r.summary.identical).toBe(true);
  expect(r.summary.identicalEveryStep).toBe(true);
  expect(r.summary.stepsRedone as number).toBeLessThanOrEqual(1);
  expect(r.summary.generations as number).toBeGreaterThanOrEqual(3);
  // Exactly once: each of the epoch's samples trained by one rank, none lost with the Firefox tab.
  expect(r.summary.samplesSeen).toEqual([{ samples: 768, exactlyOnce: true, complete: true }]);
  expect(firefoxLeftovers(r.lines)).toEqual({ started: 1, left: [] });
});

test('a run that fails still ends its Firefox rank and removes its profile', async () => {
  // Too short a timeout for the run: it fails, and the launcher cleans up all the same.
  const r = await run({
    timeoutSec: 3,
    jobParams: { dataset: 'synthetic', model: 'mlp', trainSize: '4096', batchSize: '16', epochs: '5', evalEvery: '0', backend: 'cpu' },
  });
  expect(r.ok).toBe(false);
  // Only the timeout: the launcher ending its Firefox afterwards is no crash of the rank.
  expect(r.summary.errors).toEqual([expect.stringMatching(/^timed out after 3 s waiting for rank 0, rank 1 to finish job "train"$/)]);
  // Where each page went quiet: its last report and how long before the timeout.
  for (const rank of [0, 1]) {
    expect(
      r.lines.some((l) =>
        new RegExp(
          `^\\[launch\\] rank ${rank} \\(page ${rank}\\): (last reported .+, \\d+\\.\\d s before the timeout|reported nothing)$`,
        ).test(l),
      ),
      r.lines.join('\n'),
    ).toBe(true);
  }
  expect(firefoxLeftovers(r.lines)).toEqual({ started: 1, left: [] });
});
