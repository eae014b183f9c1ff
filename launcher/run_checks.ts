/**
 * What launch() refuses before anything starts (no server, no browser): the train job's flags
 * against the world and the schema, and the launcher's own options against each other. Each
 * refusal is an Error saying what to change.
 */
import { firefoxProblems, opensIn } from './rank_browsers.ts';
import { checkLanSupport } from './lan.ts';
import { findTurnserver } from './turn.ts';
import {
  largestWorld,
  parameterServerFlagsFor,
  parameterServerParams,
  parameterServerRun,
  slowParam,
  trainFlagProblems,
  trainJobProblem,
} from './job_flags.ts';
import { describeFault, type Fault, type LaunchOptions } from './run_options.ts';

/** The run as checked: the pages' job options (a parameter-server run elastic by default) and the faults in step order. */
export interface CheckedLaunch {
  jobParams: Record<string, string>;
  faults: Fault[];
}

/** Every check of `opts` before a launch; throws the first problem. `log` hears what a default chose. */
export function checkLaunch(
  opts: LaunchOptions,
  world: { script: boolean; nnodes: number; worldSize: number },
  log: (line: string) => void,
): CheckedLaunch {
  const jobParams = checkJobParams(opts, world, log);
  const faults = [...(opts.faults ?? [])].sort((a, b) => a.step - b.step);
  checkFaults(opts, faults);
  checkBrowsers(opts);
  return { jobParams, faults };
}

/** The job's options against the job and the world (the train job's schema included); returns the pages' options. */
function checkJobParams(
  opts: LaunchOptions,
  world: { script: boolean; nnodes: number; worldSize: number },
  log: (line: string) => void,
): Record<string, string> {
  const { script, nnodes, worldSize } = world;
  const train = opts.job === 'train';
  if (train) {
    const problems = trainFlagProblems(opts.jobParams, { nproc: opts.nproc, nnodes });
    if (problems.length > 0) throw new Error(problems.join('\n'));
  }
  const psFlags = script ? [] : parameterServerFlagsFor(opts.job, opts.jobParams);
  if (psFlags.length > 0)
    throw new Error(`${psFlags.join(', ')} ${psFlags.length > 1 ? 'are' : 'is'} for --job train, not --job ${opts.job}`);
  // A parameter-server run is elastic by default: a lost worker must not pause the others.
  const jobParams = train ? parameterServerParams(opts.jobParams) : opts.jobParams;
  const psRun = train ? parameterServerRun(jobParams) : null;
  if (psRun && opts.jobParams.min === undefined) {
    log(
      `[launch] --strategy ${psRun.strategy}: ${psRun.servers} server${psRun.servers === 1 ? '' : 's'} and ${worldSize - psRun.servers} worker${worldSize - psRun.servers === 1 ? '' : 's'}, elastic down to --min ${jobParams.min} (give --min to change it)`,
    );
  }
  if (opts.jobParams.slow !== undefined) {
    if (!script && !train) throw new Error(`--slow is for --job train and scripts, not --job ${opts.job}`);
    slowParam([opts.jobParams.slow], largestWorld(opts.jobParams, { nproc: opts.nproc, nnodes }));
  }
  if (train) {
    // Every other rule of the job's options, as the pages will check them: refused here, before any page opens.
    const problem = trainJobProblem(jobParams, worldSize);
    if (problem) throw new Error(problem);
  }
  return jobParams;
}

/** The faults against the run: each needs what it acts on (the launcher's own server, tabs, a browser that some rank opens in). */
function checkFaults(opts: LaunchOptions, faults: Fault[]): void {
  if (faults.some((f) => f.kind === 'restart-server') && opts.server) {
    throw new Error('--restart-server needs the launcher to run its own server; drop --server');
  }
  if (faults.some((f) => f.kind === 'hide') && !opts.tabs) {
    throw new Error('--hide needs --tabs: headless pages are never in the background');
  }
  for (const f of faults) {
    if (
      (f.kind === 'kill' || f.kind === 'freeze' || f.kind === 'lose-device') &&
      typeof f.rank === 'string' &&
      !opensIn(opts.browsers, f.rank)
    ) {
      throw new Error(`${describeFault(f)}: no rank of this run opens in ${f.rank} (give --browser or --browsers with it)`);
    }
  }
}

/** The browsers, the server's TLS and the virtual LAN against each other. */
function checkBrowsers(opts: LaunchOptions): void {
  if (opts.intensiveThrottlingAfterSec !== undefined && !opts.tabs) {
    throw new Error('--intensive-throttling-after needs --tabs: headless pages are never throttled');
  }
  if (opts.https && opts.server) {
    throw new Error(
      "--https serves the launcher's own server over TLS; for a server already running, give its URL (https://...) and, if self-signed, its certificate with --server-cert FILE",
    );
  }
  const firefoxIssues = firefoxProblems(opts.browsers, {
    tabs: opts.tabs,
    lan: opts.lan !== undefined,
    https: opts.https,
    serverCert: opts.serverCert !== undefined,
    server: opts.server,
  });
  if (firefoxIssues.length > 0) throw new Error(firefoxIssues.join('\n'));
  if (opts.lan) {
    if (opts.tabs) throw new Error('--lan and --tabs do not go together: --tabs runs every rank in one headful Chromium');
    if (opts.server) throw new Error('--lan needs the launcher to run its own server on the virtual LAN; drop --server');
    if (opts.lan.turn) findTurnserver();
    if (opts.lan.rates && opts.lan.rates.length !== opts.nproc) {
      throw new Error(`--lan-rates gives ${opts.lan.rates.length} rate(s) but --nproc is ${opts.nproc}: give one rate per rank`);
    }
    checkLanSupport();
  }
}
