import { defineConfig } from '@playwright/test';
import { CHROMIUM_ARGS, chromiumPath } from './launcher/browser.ts';

// End-to-end tests: real server, real Chromium pages, real WebGPU (SwiftShader), real WebRTC.
export default defineConfig({
  testDir: 'test/e2e',
  globalSetup: './test/e2e/global-setup.ts',
  // Each test drives several pages at once; the machine has two cores.
  workers: 1,
  fullyParallel: false,
  timeout: 180_000,
  expect: { timeout: 30_000 },
  reporter: process.env.CI ? [['list'], ['html', { open: 'never' }]] : 'list',
  outputDir: 'test-results',
  use: {
    browserName: 'chromium',
    launchOptions: { executablePath: chromiumPath(), args: CHROMIUM_ARGS },
    headless: true,
    viewport: { width: 1280, height: 800 },
  },
});
