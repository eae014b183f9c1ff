/**
 * A finished run's outcome: its failures (what the timeout caught, faults never injected, the
 * other nodes'), or its summary with the launcher's lines before the JSON (parameter servers,
 * the communication hook, devices) and the faults', tabs' and last round's parts.
 */
import { summarize, summarizeScript } from './summaries.ts';
import { commLine } from './summary_comm.ts';
import { devicesLine } from './summary_devices.ts';
import { parameterServerLines, type ParameterServerSummary } from './summary_ps.ts';
import type { ElasticEvent } from '../src/parallel/events.ts';
import type { RankTarget } from './driver.ts';
import type { FaultTimes } from './fault_times.ts';
import type { HiddenTab, RankPage } from './rank_page.ts';
import type { RankResult } from './summary_fields.ts';
import type { LaunchOptions, LaunchOutcome } from './run_options.ts';

/** What the summary reads of a run that ended (RankRun keeps it): its setup, pages, events, faults and failures, and the parts every summary has. */
export interface EndedRun {
  readonly s: {
    readonly opts: LaunchOptions;
    readonly script: boolean;
    readonly worldSize: number;
    /** --nnodes: this node's place, copied into the summary. */
    readonly nodes: object | undefined;
    readonly summaryBase: Record<string, unknown>;
    readonly log: (line: string) => void;
  };
  readonly pages: ReadonlyArray<Pick<RankPage, 'index' | 'rank' | 'result' | 'out'>>;
  readonly failures: readonly string[];
  readonly events: ElasticEvent[];
  readonly arrivedAfterEnd: readonly unknown[];
  readonly leftBeforeEnd: readonly unknown[];
  readonly hidden: readonly HiddenTab[];
  readonly hiddenPages: ReadonlyArray<{ entry: HiddenTab; page: Pick<RankTarget, 'timerProbe'> }>;
  readonly faultTimes: Pick<FaultTimes, 'report' | 'lastRound'>;
  /** The server URL the ranks opened. */
  readonly opened: { url?: string };
  /** What ended the run, added to the failures (`how`: every page settled, or the timeout). */
  endFailures(how: 'settled' | 'timeout'): void;
  /** With --nnodes: this node's outcome told to the others, theirs added to the failures. */
  nodeOutcomes(): Promise<void>;
  results(): RankResult[];
  browsersPart(): Record<string, unknown>;
  lanPart(): Record<string, unknown>;
  sampleVisibility(): Promise<Array<{ rank: number; state: string }>>;
}

/** A run that failed (its errors), with what every summary carries: the server it opened, its browsers and addresses. */
export function failedOutcome(run: EndedRun, errors: string[], results: RankResult[]): LaunchOutcome {
  return {
    ok: false,
    summary: { ...run.s.summaryBase, ...run.opened, ok: false, errors, ...run.browsersPart(), ...run.lanPart() },
    results,
  };
}

/** The run's outcome once it ended (`how`: every page settled, or the timeout). */
export async function runSummary(run: EndedRun, how: 'settled' | 'timeout'): Promise<LaunchOutcome> {
  const { opts, script, worldSize, nodes } = run.s;
  const log = run.s.log;
  run.endFailures(how);
  await run.nodeOutcomes();
  const results = run.results();
  if (run.failures.length > 0) {
    for (const f of run.failures) log(`[launch] FAILED ${f}`);
    return failedOutcome(run, [...run.failures], results);
  }
  const visibility = opts.tabs ? await run.sampleVisibility() : undefined;
  if (visibility) log(`[launch] visibility at the end: ${visibility.map((v) => `rank ${v.rank} ${v.state}`).join(', ')}`);
  for (const { entry, page } of run.hiddenPages) {
    const probe = await page.timerProbe();
    if (probe) {
      entry.longestTimerGapMs = probe.longestGapMs;
      log(`[launch] rank ${entry.rank}'s own timers while hidden: longest gap ${probe.longestGapMs} ms over ${probe.ticks} ticks`);
    }
  }
  const summary = script ? summarizeScript(opts.job, worldSize, results, run.events) : summarize(opts.job, worldSize, results, run.events);
  for (const line of jobLines(summary, script)) log(`[launch] ${line}`);
  const faultsOut = run.faultTimes.report();
  const lastRound = lastRoundPart(run, faultsOut.length > 0 || run.leftBeforeEnd.length > 0);
  const { arrivedAfterEnd, leftBeforeEnd, hidden } = run;
  return {
    ok: true,
    summary: {
      ...summary,
      ...run.opened,
      ...(nodes ? { nodes } : {}),
      ...(faultsOut.length ? { faults: faultsOut } : {}),
      ...(arrivedAfterEnd.length ? { arrivedAfterEnd } : {}),
      ...(leftBeforeEnd.length ? { leftBeforeEnd } : {}),
      ...(lastRound ? { lastRound } : {}),
      ...(visibility ? { visibility, hidden } : {}),
      ...run.browsersPart(),
      ...run.lanPart(),
      ok: true,
    },
    results,
  };
}

/** A job's lines before the JSON (which stays the last line): a parameter-server run's figures, a DDP run's hook and bytes per step, its devices. */
function jobLines(summary: Record<string, unknown>, script: boolean): string[] {
  const lines = summary.parameterServer ? parameterServerLines(summary.parameterServer as ParameterServerSummary) : [];
  const comm = script ? null : commLine(summary);
  const devices = script ? null : devicesLine(summary);
  return [...lines, ...(comm ? [comm] : []), ...(devices ? [devices] : [])];
}

/**
 * With faults, the last round's ranks that did not reach the run's end, and why (killed or
 * frozen in its last steps, or its last round failed as the others finished): what the
 * summary's weightHashes (the final ranks' own, from their 'end' events) lack of worldSize.
 */
function lastRoundPart(run: EndedRun, wanted: boolean): Record<string, unknown> | null {
  const last = wanted ? run.faultTimes.lastRound() : null;
  if (!last) return null;
  const { pages } = run;
  return {
    worldSize: last.worldSize,
    // Every page: its last rank, whether it is in the last round and has a result, and what took it out.
    pages: pages.map((p) => ({
      page: p.index,
      rank: p.rank ?? null,
      inLastRound: last.pages.some((x) => x.page === p.index),
      result: p.result !== undefined,
      ...(p.out ? { out: p.out } : {}),
    })),
    without: last.pages.filter((p) => !p.ended).map(({ page, rank }) => ({ page, rank, why: pages[page]?.out ?? 'no end' })),
  };
}
