/**
 * A Playwright reporter beside `list`: at the end of a run, the ten slowest spec files and the ten
 * slowest tests, so the suite's time is seen where it goes (docs/testing.md).
 */
import type { FullResult, Reporter, TestCase, TestResult } from '@playwright/test/reporter';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';

/** How many of each to print. */
const TOP = 10;

export default class SlowestReporter implements Reporter {
  private readonly tests: Array<{
    title: string;
    file: string;
    ms: number;
    startMs: number;
    endMs: number;
    worker: number;
    waitedMs: number;
  }> = [];
  private readonly started = Date.now();

  onTestEnd(test: TestCase, result: TestResult): void {
    const file = relative(process.cwd(), test.location.file);
    // A retried test counts every try: each one took the suite's time.
    // Time spent waiting for the other worker's test (test/e2e/lanes.ts) is not this test's.
    const waited = Number(result.annotations.find((a) => a.type === 'lane-wait')?.description ?? 0);
    const startMs = result.startTime.getTime() - this.started;
    this.tests.push({
      title: `${file}:${test.location.line} › ${test.title}`,
      file,
      ms: result.duration - waited,
      startMs,
      endMs: startMs + result.duration,
      worker: result.parallelIndex,
      waitedMs: waited,
    });
  }

  onEnd(_result: FullResult): void {
    if (this.tests.length === 0) return;
    const perFile = new Map<string, number>();
    for (const t of this.tests) perFile.set(t.file, (perFile.get(t.file) ?? 0) + t.ms);
    const files = [...perFile].sort((a, b) => b[1] - a[1]).slice(0, TOP);
    const tests = [...this.tests].sort((a, b) => b.ms - a.ms).slice(0, TOP);
    const own = this.tests.reduce((sum, t) => sum + t.ms, 0);
    const wall = Date.now() - this.started;
    const lines = [
      '',
      `Tests' own time ${seconds(own)} in a run of ${seconds(wall)} (${(own / wall).toFixed(2)} at a time on average; waits for a solo test left out).`,
      `Slowest spec files (of ${perFile.size}; their tests' own time):`,
      ...files.map(([file, ms]) => `  ${seconds(ms).padStart(7)}  ${file}`),
      `Slowest tests (of ${this.tests.length}):`,
      ...tests.map((t) => `  ${seconds(t.ms).padStart(7)}  ${t.title.length > 150 ? `${t.title.slice(0, 149)}…` : t.title}`),
    ];
    console.log(lines.join('\n'));
    // Every test's own time, slowest first, for a closer look than the ten above (docs/testing.md);
    // when it ran, on which worker, and how long it waited for a solo test: where the lanes idled.
    mkdirSync('test-results', { recursive: true });
    const s = (ms: number) => Number((ms / 1000).toFixed(1));
    const all = [...this.tests]
      .sort((a, b) => b.ms - a.ms)
      .map((t) => ({ test: t.title, seconds: s(t.ms), worker: t.worker, start: s(t.startMs), end: s(t.endMs), waited: s(t.waitedMs) }));
    writeFileSync(join('test-results', 'timings.json'), `${JSON.stringify(all, null, 1)}\n`);
  }

  printsToStdio(): boolean {
    // The list reporter prints the run; this one only adds its summary.
    return false;
  }
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)} s`;
}
