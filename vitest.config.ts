import { defineConfig } from 'vitest/config';

// Unit and integration tests (Node, real server over real WebSockets).
// Browser end-to-end tests live in test/e2e and run under Playwright.

/**
 * Files whose tests time heartbeats, stalls, intervals or a slow rank against a bound: they run
 * after the unit files, with none of those beside them (a unit file's compute starved their
 * timers). Three at a time among themselves: they mostly wait (36 CPU-seconds in 108 s one at a
 * time), and three at a time took 34-41 s instead of 92-108 (docs/testing.md).
 */
const TIMED = [
  'balance',
  'collectives',
  'diloco',
  'elastic_runner',
  'fleet',
  'limits',
  'liveness',
  'offer_sends',
  'ps_runner',
  'rendezvous_handler',
  'straggler',
  'subgroups',
].map((name) => `test/${name}.test.ts`);

/** VITEST_WORKERS: how many `unit` files run at a time (docs/testing.md has the figures behind the default). */
const UNIT_WORKERS = Number(process.env.VITEST_WORKERS ?? 3);
/** TIMED_WORKERS: how many `timed` files run at a time. */
const TIMED_WORKERS = Number(process.env.TIMED_WORKERS ?? 3);

const shared = {
  exclude: ['test/e2e/**', 'node_modules/**'],
  testTimeout: 20_000,
  hookTimeout: 20_000,
};

export default defineConfig({
  test: {
    // The default reporter, then the ten slowest files and tests (docs/testing.md).
    reporters: ['default', './test/slowest_vitest_reporter.ts'],
    projects: [
      {
        // Three files at a time, also on two cores (Vitest's default there is one: cores - 1): most
        // files wait on sockets, timers and child processes rather than compute, so they overlap.
        test: {
          ...shared,
          name: 'unit',
          include: ['test/**/*.test.ts'],
          exclude: [...shared.exclude, ...TIMED],
          maxWorkers: UNIT_WORKERS,
          // One module graph per worker, not per file: each file imported TF.js and the library
          // afresh (74 of the phase's CPU-seconds, 38 shared): on a clean clone, with tsc and the
          // pages' builds beside it, the phase took 134 s instead of 147 (all passing, also shuffled). A file that changes global state (a
          // backend, an env flag) must put it back: the next file in its worker sees it.
          isolate: false,
          sequence: { groupOrder: 0 },
        },
      },
      { test: { ...shared, name: 'timed', include: TIMED, maxWorkers: TIMED_WORKERS, sequence: { groupOrder: 1 } } },
    ],
  },
});
