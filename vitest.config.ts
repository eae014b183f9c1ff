import { defineConfig } from 'vitest/config';

// Unit and integration tests (Node, real server over real WebSockets).
// Browser end-to-end tests live in test/e2e and run under Playwright.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    exclude: ['test/e2e/**', 'node_modules/**'],
    testTimeout: 20_000,
    hookTimeout: 20_000,
    // Two files at a time, also on two cores (Vitest's default there is one: cores - 1): most
    // files wait on sockets, timers and child processes rather than compute, so two overlap.
    maxWorkers: 2,
    // The default reporter, then the ten slowest files and tests (docs/testing.md).
    reporters: ['default', './test/slowest_vitest_reporter.ts'],
  },
});
