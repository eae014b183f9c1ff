import { defineConfig } from 'vitest/config';

// Unit and integration tests (Node, real server over real WebSockets).
// Browser end-to-end tests live in test/e2e and run under Playwright.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    exclude: ['test/e2e/**', 'node_modules/**'],
    testTimeout: 20_000,
    hookTimeout: 20_000,
  },
});
