/**
 * Runs one job or user script on N headless ranks (the body of the launcher, callable from
 * benchmarks and tests), with fault injection for elastic runs: kill or freeze a rank's page at
 * a step, lose its WebGPU device, open more pages at a step, restart the server at a step.
 * The checks are run_checks.ts's, the run itself rank_run.ts's, its summary run_summary.ts's.
 */
import { newSessionToken } from '../src/wire/session_token.ts';
import { keptCertificate, type TlsOptions } from '../signaling/tls.ts';
import { headlessDriver, type RankDriver } from './driver.ts';
import { trustArgs } from './browser.ts';
import { tabsDriver } from './tabs.ts';
import { mixedDriver, type RankBrowser } from './rank_browsers.ts';
import { createLan, type Lan } from './lan.ts';
import { lanDriver } from './lan_driver.ts';
import { buildScript } from './build_script.ts';
import { checkMultiNode, globalRank } from './multinode.ts';
import { checkLaunch } from './run_checks.ts';
import { RankRun } from './rank_run.ts';
import { isScript, LAST_CALL_MS, printable, type LaunchOptions, type LaunchOutcome } from './run_options.ts';

export {
  describeFault,
  describeTarget,
  isScript,
  LAST_CALL_MS,
  printable,
  type Fault,
  type FaultTarget,
  type LaunchOptions,
  type LaunchOutcome,
} from './run_options.ts';

/** A launch that failed before its run began (a build, a certificate, the LAN): its summary says why. */
class SetupFailure extends Error {}

export async function launch(opts: LaunchOptions): Promise<LaunchOutcome> {
  // Pages' console lines and store values can carry a peer's words (an abort notice): no control
  // characters (terminal escape sequences, fake line breaks) reach the terminal.
  const print = opts.log ?? ((line: string) => console.log(line));
  const log = (line: string) => print(printable(line));
  const script = isScript(opts.job);
  const nnodes = opts.nnodes ?? 1;
  const nodeRank = opts.nodeRank ?? 0;
  const problems = checkMultiNode({ nnodes, nodeRank, server: opts.server, token: opts.token, sessionGiven: true });
  if (problems.length > 0) throw new Error(problems.join('\n'));
  const worldSize = nnodes * opts.nproc;
  const nodes =
    nnodes > 1
      ? { nnodes, nodeRank, localRanks: Array.from({ length: opts.nproc }, (_, i) => globalRank(nodeRank, opts.nproc, i)) }
      : undefined;
  const summaryBase = { [script ? 'script' : 'job']: opts.job, worldSize, ...(nodes ? { nodes } : {}) };
  try {
    // A script is served as its own page, built by Vite next to the built-in one.
    const entry = script ? await setupStep(`could not build ${opts.job}: `, () => buildScript(opts.job, (l) => log(`[launch] ${l}`))) : '/';
    const { jobParams, faults } = checkLaunch(opts, { script, nnodes, worldSize }, log);
    const tls = opts.https
      ? await setupStep('could not make a certificate for --https: ', () => keptCertificate({ log: (l) => log(`[launch] ${l}`) }))
      : undefined;
    // Before the server: it listens on the LAN's bridge.
    const lan = opts.lan ? await setupStep('', () => openLan(opts, log)) : undefined;
    // --turn: the server mints the ranks' credentials for the run's relay (an explicit `ice` wins).
    const lanIce = lan?.iceConfig();
    // The launcher opens its tabs one after another (0.5-2.5 s apart on a loaded machine): its server
    // waits LAST_CALL_MS after the minimum for more before the first round (torch's last call), so
    // that a run of --nproc tabs starts with all of them rather than with the first --min.
    const serverOptions = { settleMs: LAST_CALL_MS, ...(lanIce ? { ice: lanIce } : {}), ...opts.serverOptions };
    const { driver, browserOf } = await rankDriver(opts, tls, lan, log);
    const token = opts.token ?? newSessionToken();
    const run = new RankRun({
      opts,
      token,
      script,
      entry,
      worldSize,
      nodes,
      jobParams,
      faults,
      summaryBase,
      serverOptions,
      tls,
      lan,
      driver,
      browserOf,
      log,
    });
    return await run.run();
  } catch (err) {
    if (!(err instanceof SetupFailure)) throw err;
    log(`[launch] FAILED ${err.message}`);
    return { ok: false, summary: { ...summaryBase, ok: false, errors: [err.message] }, results: [] };
  }
}

/** A setup step whose failure ends the launch with a summary (not a throw): `what` prefixes its message. */
async function setupStep<T>(what: string, step: () => Promise<T>): Promise<T> {
  try {
    return await step();
  } catch (err) {
    throw new SetupFailure(`${what}${(err as Error).message}`);
  }
}

/** --lan: the virtual LAN made, and said. */
async function openLan(opts: LaunchOptions, log: (line: string) => void): Promise<Lan> {
  const o = opts.lan!;
  const lan = await createLan(o, (l) => log(`[launch] ${l}`));
  log(
    `[launch] lan: ${lan.subnet} (${lan.names.lanNs}), server on ${lan.serverAddress} (its link not shaped)${o.isolate ? '; hosts isolated: each reaches only the server' : ''}${o.delayMs ? `; each host's packets out held ${o.delayMs} ms (rank to rank round trip +${2 * o.delayMs} ms)` : ''}`,
  );
  return lan;
}

/** The ranks' browsers: a LAN's, --tabs', the mixed fleet's (--browser, --browsers) or one headless Chromium. */
async function rankDriver(
  opts: LaunchOptions,
  tls: TlsOptions | undefined,
  lan: Lan | undefined,
  log: (line: string) => void,
): Promise<{ driver: RankDriver; browserOf: ((index: number) => RankBrowser | undefined) | undefined }> {
  // The ranks trust the one certificate the server presents, nothing more.
  const trusted = tls ? trustArgs(tls.cert) : opts.serverCert ? trustArgs(opts.serverCert) : [];
  const mixed = opts.browsers ? mixedDriver(opts.browsers, { log, chromiumArgs: trusted }) : undefined;
  const driver: RankDriver = lan
    ? lanDriver(lan, { log, extraArgs: [...(opts.rankChromiumArgs ?? []), ...trusted] })
    : opts.tabs
      ? await tabsDriver(log, { intensiveThrottlingAfterSec: opts.intensiveThrottlingAfterSec, extraArgs: trusted })
      : (mixed ?? (await headlessDriver(trusted)));
  return { driver, browserOf: mixed ? (i) => mixed.browserOf(i) : undefined };
}
