import { defineConfig } from '@playwright/test';
import { CHROMIUM_ARGS, chromiumPath } from './launcher/browser.ts';

// End-to-end tests: real server, real Chromium pages, real WebGPU (SwiftShader), real WebRTC.
export default defineConfig({
  testDir: 'test/e2e',
  globalSetup: './test/e2e/global-setup.ts',
  // One worker on CI's two cores: the pages (SwiftShader, Chromium) use both, so two workers made
  // each test 2-3x slower and the run no shorter (docs/testing.md). E2E_WORKERS=2 on a bigger machine:
  // a test may then run beside another, but a file or test marked solo (timings, bounds) runs alone
  // (test/e2e/lanes.ts).
  workers: Number(process.env.E2E_WORKERS ?? 1),
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
  use: {
    browserName: 'chromium',
    launchOptions: { executablePath: chromiumPath(), args: CHROMIUM_ARGS },
    headless: true,
    viewport: { width: 1280, height: 800 },
  },
});
