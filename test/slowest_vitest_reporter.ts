/**
 * A Vitest reporter beside the default one: at the end of a run, the ten slowest test files (their
 * import and their tests) and the ten slowest tests, so the suite's time is seen where it goes
 * (docs/testing.md).
 */
import type { Reporter, TestModule } from 'vitest/node';

/** How many of each to print. */
const TOP = 10;

export default class SlowestVitestReporter implements Reporter {
  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    if (modules.length < 2) return;
    const files = modules.map((m) => {
      const d = m.diagnostic();
      return { file: m.relativeModuleId, ms: d.collectDuration + d.duration, importMs: d.collectDuration };
    });
    const tests = modules.flatMap((m) =>
      [...m.children.allTests()].map((t) => ({ title: `${m.relativeModuleId} › ${t.fullName}`, ms: t.diagnostic()?.duration ?? 0 })),
    );
    files.sort((a, b) => b.ms - a.ms);
    tests.sort((a, b) => b.ms - a.ms);
    console.log(
      [
        '',
        `Slowest test files (of ${files.length}; import + tests):`,
        ...files.slice(0, TOP).map((f) => `  ${seconds(f.ms).padStart(7)}  ${f.file} (import ${seconds(f.importMs)})`),
        `Slowest tests (of ${tests.length}):`,
        ...tests
          .slice(0, TOP)
          .map((t) => `  ${seconds(t.ms).padStart(7)}  ${t.title.length > 150 ? `${t.title.slice(0, 149)}…` : t.title}`),
      ].join('\n'),
    );
  }
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)} s`;
}
