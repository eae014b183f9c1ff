import { defineConfig } from '@playwright/test';
import { CHROMIUM_ARGS, chromiumPath } from './launcher/browser.ts';

// End-to-end tests: real server, real Chromium pages, real WebGPU (SwiftShader), real WebRTC.
export default defineConfig({
  testDir: 'test/e2e',
  globalSetup: './test/e2e/global-setup.ts',
  // Two workers on CI's two cores: a file or test marked solo (timings, bounds) runs with the
  // other worker idle (test/e2e/lanes.ts). Four were tried and lost on a quiet clean clone: each
  // test took about twice as long (docs/testing.md, its figures). E2E_WORKERS=N runs N at a time.
  workers: Number(process.env.E2E_WORKERS ?? 2),
  fullyParallel: false,
  timeout: 180_000,
  expect: { timeout: 30_000 },
  // The ten slowest files and tests at the end (test/slowest_reporter.ts, docs/testing.md).
  reporter: [
    ['list'],
    ['./test/slowest_reporter.ts'],
    ...(process.env.CI ? [['html', { open: 'never' }] as ['html', { open: 'never' }]] : []),
  ],
  outputDir: 'test-results',
  // The tests tagged '@solo' (they time heartbeats, stalls, faults, throttling or a shaped link)
  // come after all the others, one at a time: their project is queued last. Interleaved, each
  // made the other worker idle twice, while it waited for that worker's test to end and while it
  // ran: 167 s of the two workers' time in a run of 605 s (docs/testing.md). The lanes
  // (test/e2e/lanes.ts) still hold the first one back until the other worker's last test ends.
  projects: [
    { name: 'shared', grepInvert: /@solo/ },
    { name: 'solo', grep: /@solo/, workers: 1 },
  ],
  use: {
    browserName: 'chromium',
    launchOptions: { executablePath: chromiumPath(), args: CHROMIUM_ARGS },
    headless: true,
    viewport: { width: 1280, height: 800 },
  },
});
