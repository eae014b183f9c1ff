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
  // are a project of their own, one at a time, queued first: while they run the other worker
  // holds its first shared test back (test/e2e/lanes.ts), and then both run the rest. Interleaved
  // with the others, each solo test left the other worker idle twice, while it waited for that
  // worker's test to end and while it ran: 167 s of the two workers' time in a run of 605 s.
  // Queued last, the last shared file waited out all of them (docs/testing.md). Not a dependency
  // of the shared project: Playwright would run all of a dependency's tests for one solo file.
  projects: [
    { name: 'solo', grep: /@solo/, workers: 1 },
    { name: 'shared', grepInvert: /@solo/ },
  ],
  use: {
    browserName: 'chromium',
    launchOptions: { executablePath: chromiumPath(), args: CHROMIUM_ARGS },
    headless: true,
    viewport: { width: 1280, height: 800 },
  },
});
