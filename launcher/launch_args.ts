/**
 * The launcher's command line (launcher/launch.ts) read into launch() options, with every check
 * that refuses a command line before anything starts. Kept apart from the command itself so the
 * refusals are tested in process (test/launch_args.test.ts and the launcher tests).
 */ import { parseArgs } from 'node:util';
import { readFileSync } from 'node:fs';
import { isScript, type Fault, type FaultTarget, type LaunchOptions } from './run.ts';
import { largestWorld, membershipFaultProblem, parameterServerFlagsFor, slowParam, trainFlagProblems } from './job_flags.ts';
import { checkMultiNode } from './multinode.ts';
import { isSessionToken } from '../src/wire/session_token.ts';
import { checkLanSupport, parseDelay, parseRate, parseRates, type LanOptions } from './lan.ts';
import { spkiSha256 } from '../signaling/tls.ts';
import { findTurnserver } from './turn.ts';
import {
  firefoxProblems,
  isRankBrowser,
  opensIn,
  parseBrowsers,
  RANK_BROWSERS,
  type BrowserPlan,
  type RankBrowser,
} from './rank_browsers.ts';
import { USAGE } from './usage.ts';

/** Options that take no value: the argument after them is not theirs. */
const FLAGS = new Set(['--help', '--tabs', '--https', '--lan-isolate', '--turn']);

/** Launcher options a script run passes to its pages. */
const SCRIPT_PARAMS = new Set(['min', 'max', 'backend', 'timeoutMs', 'slow']);

/** Splits the command line at the script's path: launcher options before it, the script's own after. */
function splitAtScript(argv: string[]): { launcher: string[]; script?: string; scriptArgs: string[] } {
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a.startsWith('--')) {
      if (!a.includes('=') && !FLAGS.has(a) && i + 1 < argv.length && !argv[i + 1]!.startsWith('--')) i++;
      continue;
    }
    if (!isScript(a)) throw new Error(`"${a}" is not a launcher option or a script (a .ts or .js file)\n${USAGE}`);
    return { launcher: argv.slice(0, i), script: a, scriptArgs: argv.slice(i + 1) };
  }
  return { launcher: argv, scriptArgs: [] };
}

/** RANK@STEP or BROWSER@STEP (the lowest rank in that browser, e.g. firefox@8): what --kill, --freeze and --lose-device take. */
function parseTargetAt(flag: string, value: string): { target: FaultTarget; step: number } {
  const m = /^([a-z]+)@(\d+)$/.exec(value);
  if (m && isRankBrowser(m[1]!)) return { target: m[1]! as RankBrowser, step: Number(m[2]) };
  if (m) throw new Error(`--${flag} takes RANK@STEP or BROWSER@STEP (${RANK_BROWSERS.join(', ')}), got "${value}"`);
  const { n, step } = parseAt(flag, value);
  return { target: n, step };
}

/** RANK@STEP or N@STEP. */
function parseAt(flag: string, value: string): { n: number; step: number } {
  const m = /^(\d+)@(\d+)$/.exec(value);
  if (!m) throw new Error(`--${flag} takes N@STEP (e.g. --${flag} 1@10), got "${value}"`);
  return { n: Number(m[1]), step: Number(m[2]) };
}

/** --lan MBIT and --lan-rates R0,R1,...: checked here, root and iproute2 included, so that the run fails before it starts. */
function parseLan(rate: unknown, rates: unknown, nproc: number, values: Record<string, unknown>): LanOptions | undefined {
  if (rate === undefined && rates === undefined) {
    if (values['lan-isolate'] || values.turn || values['lan-delay'] !== undefined)
      throw new Error(`--lan-isolate, --lan-delay and --turn work on the virtual LAN: add --lan MBIT (root)\n${USAGE}`);
    return undefined;
  }
  if (rate === true || rates === true)
    throw new Error(`--lan takes a rate in Mbit/s (--lan 40), --lan-rates one per rank (--lan-rates 100,100,20)\n${USAGE}`);
  const lan: LanOptions = {
    ...(rate === undefined ? {} : { rateMbit: parseRate('--lan', String(rate)) }),
    ...(rates === undefined ? {} : { rates: parseRates(String(rates), nproc) }),
    ...(values['lan-isolate'] === true ? { isolate: true } : {}),
    ...(values.turn === true ? { turn: true } : {}),
    ...(values['lan-delay'] === undefined ? {} : { delayMs: parseDelay(String(values['lan-delay'])) }),
  };
  if (values.tabs) throw new Error('--lan and --tabs do not go together: --tabs runs every rank in one headful Chromium');
  if (values.server !== undefined) throw new Error('--lan needs the launcher to run its own server on the virtual LAN; drop --server');
  checkLanSupport();
  if (lan.turn) findTurnserver();
  return lan;
}

/** The launcher's own options (each takes a value unless in FLAGS); the rest are the job's. */
const LAUNCHER_OPTIONS = {
  nproc: { type: 'string' },
  job: { type: 'string' },
  server: { type: 'string' },
  session: { type: 'string' },
  token: { type: 'string' },
  timeout: { type: 'string' },
  help: { type: 'boolean' },
  tabs: { type: 'boolean' },
  'intensive-throttling-after': { type: 'string' },
  nnodes: { type: 'string' },
  'node-rank': { type: 'string' },
  lan: { type: 'string' },
  'lan-rates': { type: 'string' },
  'lan-delay': { type: 'string' },
  https: { type: 'boolean' },
  'server-cert': { type: 'string' },
  'lan-isolate': { type: 'boolean' },
  turn: { type: 'boolean' },
  browser: { type: 'string' },
  browsers: { type: 'string' },
} as const;

type Values = Record<string, string | boolean | undefined>;

/** --server-cert FILE (with --server https://...): the certificate's PEM, read and checked. */
function serverCertOf(certFile: unknown, server: string | undefined): string | undefined {
  if (certFile !== undefined && (typeof certFile !== 'string' || !server?.startsWith('https:'))) {
    throw new Error('--server-cert FILE goes with --server https://...: the certificate the ranks should trust for that server');
  }
  if (typeof certFile !== 'string') return undefined;
  let serverCert: string;
  try {
    serverCert = readFileSync(certFile, 'utf8');
  } catch (err) {
    throw new Error(
      `--server-cert: cannot read ${certFile} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}): give the server's certificate file (PEM), e.g. its certs/cert.pem`,
    );
  }
  try {
    spkiSha256(serverCert);
  } catch (err) {
    throw new Error(
      `--server-cert: ${certFile} is not a PEM certificate (${(err as Error).message}): give the server's certificate, e.g. its certs/cert.pem`,
    );
  }
  return serverCert;
}

/** --intensive-throttling-after SEC: whole seconds, with --tabs. */
function intensiveThrottlingOf(values: Values): number | undefined {
  const raw = values['intensive-throttling-after'];
  if (raw === undefined) return undefined;
  const sec = Number(raw);
  if (!(Number.isInteger(sec) && sec >= 1)) throw new Error(`--intensive-throttling-after takes whole seconds >= 1, got "${String(raw)}"`);
  if (!values.tabs) throw new Error('--intensive-throttling-after needs --tabs (headless pages are never throttled)');
  return sec;
}

/** The session's token: --token or SESSION_TOKEN (joining an existing session, from its link's #token=...); a new session gets a new one. */
function tokenOf(values: Values): string | undefined {
  const token = typeof values.token === 'string' ? values.token : process.env.SESSION_TOKEN || undefined;
  if (token !== undefined && !isSessionToken(token)) {
    throw new Error("--token (or SESSION_TOKEN) must be a session token: the 22-128 characters after #token= in the session's link");
  }
  return token;
}

/** What the options after the launcher's own say: faults, server settings, the host's files, --slow, and the job's options. */
interface JobArgs {
  jobParams: Record<string, string>;
  faults: Fault[];
  heartbeatTimeoutMs?: number;
  churnEverySec?: number;
  lastCallMs?: number;
  offer: { modelDir?: string; dataPath?: string; labelColumn?: string };
  slow: string[];
}

/** A fault option (--kill, --freeze, --lose-device, --hide, --join, --restart-server) as its Fault; undefined for any other option. */
function faultOf(name: string, value: string): Fault | undefined {
  switch (name) {
    case 'kill':
    case 'freeze':
    case 'lose-device': {
      const { target, step } = parseTargetAt(name, value);
      return { kind: name, rank: target, step };
    }
    case 'hide': {
      const { n, step } = parseAt(name, value);
      return { kind: name, rank: n, step };
    }
    case 'join': {
      const { n, step } = parseAt(name, value);
      return { kind: 'join', count: n, step };
    }
    case 'restart-server': {
      const step = Number(value);
      if (!Number.isInteger(step) || step < 1) throw new Error(`--restart-server takes a step number, got "${value}"`);
      return { kind: 'restart-server', step };
    }
    default:
      return undefined;
  }
}

/** One option that is not the launcher's own into `args`: a fault, a server setting, the host's files, --slow, or the job's. */
function takeJobArg(args: JobArgs, name: string, value: string, server: string | undefined): void {
  const fault = faultOf(name, value);
  if (fault) {
    args.faults.push(fault);
    return;
  }
  switch (name) {
    case 'slow':
      args.slow.push(value);
      return;
    case 'churn':
      args.churnEverySec = Number(value);
      if (!(args.churnEverySec >= 1 && args.churnEverySec <= 3600))
        throw new Error(`--churn takes seconds between faults (1 to 3600), got "${value}"`);
      return;
    case 'heartbeat-timeout':
      args.heartbeatTimeoutMs = Number(value);
      if (!(args.heartbeatTimeoutMs > 0)) throw new Error(`--heartbeat-timeout takes milliseconds, got "${value}"`);
      return;
    case 'last-call':
      args.lastCallMs = Number(value);
      if (!Number.isSafeInteger(args.lastCallMs) || args.lastCallMs < 0)
        throw new Error(`--last-call takes milliseconds (0 or more), got "${value}"`);
      if (server !== undefined)
        throw new Error("--last-call sets the launcher's own server: with --server, that server decides (its settleMs)");
      return;
    case 'model-dir':
    case 'data-dir':
    case 'label':
      // The host's own model and data (npm start's --model, --data, --label), offered by the launcher's own server.
      if (server !== undefined)
        throw new Error(
          `--${name} is for the launcher's own server: with --server, start that one with npm start -- --model DIR --data DIR`,
        );
      if (name === 'model-dir') args.offer.modelDir = value;
      else if (name === 'data-dir') args.offer.dataPath = value;
      else args.offer.labelColumn = value;
      return;
    default:
      // --min and --max go to the pages too: they make the session elastic.
      args.jobParams[name] = value;
  }
}

/** The options that are not the launcher's own, in order; a flag without a value is "true". */
function jobArgsOf(tokens: ReturnType<typeof parseArgs>['tokens'] & object, server: string | undefined): JobArgs {
  const args: JobArgs = { jobParams: {}, faults: [], offer: {}, slow: [] };
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i]!;
    if (t.kind !== 'option' || Object.hasOwn(LAUNCHER_OPTIONS, t.name)) continue;
    let value = t.value;
    if (value === undefined) {
      const nextToken = tokens[i + 1];
      if (nextToken?.kind === 'positional') {
        value = nextToken.value;
        i++;
      } else value = 'true';
    }
    takeJobArg(args, t.name, value, server);
  }
  return args;
}

/** The job's options as the pages get them: what the host offers, --slow against the largest world. */
function finishJobParams(args: JobArgs, script: string | undefined, job: unknown, world: { nproc: number; nnodes: number }): void {
  const { jobParams, offer } = args;
  // The job trains what is offered unless told otherwise; a script reads it from the server (fetchOffer).
  if (offer.modelDir !== undefined && script === undefined) jobParams.model ??= 'user';
  if (offer.dataPath !== undefined && script === undefined) jobParams.dataset ??= 'user';
  // A text trains the language model.
  if (offer.dataPath !== undefined && /\.txt$/i.test(offer.dataPath) && script === undefined) jobParams.model ??= 'lm';
  if (args.slow.length > 0) {
    // Ranks count from 0 up to the largest world the run can have (an elastic --max beyond --nproc).
    jobParams.slow = slowParam(args.slow, largestWorld(jobParams, world));
    if (script === undefined && job !== 'train')
      throw new Error(`--slow is for --job train and scripts, not --job ${String(job ?? 'rendezvous')}`);
  }
}

/** The faults and the job's options against the run: refused with the usage here, before anything starts (launch() checks them again for callers of the API). */
function checkJobArgs(
  args: JobArgs,
  values: Values,
  split: { script?: string },
  world: { nproc: number; nnodes: number; browsers: BrowserPlan | undefined },
): void {
  const { faults, jobParams } = args;
  if (faults.some((f) => f.kind === 'hide') && !values.tabs)
    throw new Error('--hide RANK@STEP needs --tabs (headless pages are never in the background)');
  for (const f of faults) {
    if (
      (f.kind === 'kill' || f.kind === 'freeze' || f.kind === 'lose-device') &&
      typeof f.rank === 'string' &&
      !opensIn(world.browsers, f.rank)
    ) {
      throw new Error(`--${f.kind} ${f.rank}@${f.step}: no rank opens in ${f.rank} (give --browser ${f.rank} or --browsers with it)`);
    }
  }
  const train = split.script === undefined && values.job === 'train';
  if (train) {
    const problems = trainFlagProblems(jobParams, world);
    if (problems.length > 0) throw new Error(`${problems.join('\n')}\n${USAGE}`);
  } else if (split.script === undefined) {
    const psFlags = parameterServerFlagsFor(String(values.job ?? 'rendezvous'), jobParams);
    if (psFlags.length > 0)
      throw new Error(
        `${psFlags.join(', ')} ${psFlags.length > 1 ? 'are' : 'is'} for --job train, not --job ${String(values.job ?? 'rendezvous')}`,
      );
  }
  // --churn kills, freezes and joins: the run must survive them as it must a --kill.
  const faultProblem = membershipFaultProblem(
    args.churnEverySec === undefined ? faults : [...faults, { kind: 'kill', rank: 0, step: 1 }],
    jobParams,
    train,
  );
  if (faultProblem) throw new Error(faultProblem);
  if (split.script !== undefined) {
    if (typeof values.job === 'string')
      throw new Error(`give either --job or a script, not both (--job ${values.job}, script ${split.script})`);
    const unknown = Object.keys(jobParams).filter((k) => !SCRIPT_PARAMS.has(k));
    if (unknown.length > 0) {
      throw new Error(
        `unknown launcher option ${unknown.map((k) => `--${k}`).join(', ')}: a script's own arguments go after its path\n${USAGE}`,
      );
    }
  }
}

/** --browser or --browsers, each with a value, against the other options. */
function browsersOf(values: Values, nproc: number, lan: LanOptions | undefined, server: string | undefined): BrowserPlan | undefined {
  for (const flag of ['browser', 'browsers'] as const) {
    if (values[flag] === true)
      throw new Error(
        `--${flag} takes a value (${flag === 'browser' ? 'chromium or firefox' : 'one browser per rank, e.g. chromium,firefox'})\n${USAGE}`,
      );
  }
  const browsers = parseBrowsers(values.browser as string | undefined, values.browsers as string | undefined, nproc);
  const firefoxIssues = firefoxProblems(browsers, {
    tabs: values.tabs === true,
    lan: lan !== undefined,
    https: values.https === true,
    serverCert: values['server-cert'] !== undefined,
    server,
  });
  if (firefoxIssues.length > 0) throw new Error(firefoxIssues.join('\n'));
  return browsers;
}

/** The launcher's server settings from the job's arguments (undefined: none given). */
function serverOptionsOf(args: JobArgs): LaunchOptions['serverOptions'] {
  const { heartbeatTimeoutMs, lastCallMs, offer } = args;
  if (heartbeatTimeoutMs === undefined && lastCallMs === undefined && Object.keys(offer).length === 0) return undefined;
  return {
    ...(heartbeatTimeoutMs === undefined ? {} : { heartbeatTimeoutMs }),
    ...(lastCallMs === undefined ? {} : { settleMs: lastCallMs }),
    ...(Object.keys(offer).length === 0 ? {} : { offer }),
  };
}

/**
 * The launcher's command line as launch() options; 'help' for --help. Throws an Error whose message
 * says what was wrong and what to give (the command line prints it and exits 2).
 */
export function parseLaunchArgs(argv: string[]): LaunchOptions | 'help' {
  const split = splitAtScript(argv);
  const { values, tokens } = parseArgs({ args: split.launcher, strict: false, tokens: true, options: LAUNCHER_OPTIONS });
  if (values.help) return 'help';
  const nproc = Number(values.nproc);
  if (!Number.isInteger(nproc) || nproc < 1) throw new Error(`--nproc must be a positive integer, got ${String(values.nproc)}\n${USAGE}`);
  const timeoutSec = values.timeout === undefined ? 600 : Number(values.timeout);
  if (!(timeoutSec > 0)) throw new Error(`--timeout must be a positive number of seconds, got ${String(values.timeout)}`);
  const lan = parseLan(values.lan, values['lan-rates'], nproc, values);
  const server = typeof values.server === 'string' ? values.server : undefined;
  if (values.https && server)
    throw new Error(
      "--https serves the launcher's own server over TLS: drop it with --server (give a self-signed server's certificate with --server-cert FILE)",
    );
  const serverCert = serverCertOf(values['server-cert'], server);
  const browsers = browsersOf(values, nproc, lan, server);
  const intensiveThrottlingAfterSec = intensiveThrottlingOf(values);
  const token = tokenOf(values);
  const nnodes = values.nnodes === undefined ? 1 : Number(values.nnodes);
  const nodeRank = values['node-rank'] === undefined ? 0 : Number(values['node-rank']);
  const problems = checkMultiNode({ nnodes, nodeRank, server, token, sessionGiven: typeof values.session === 'string' });
  if (problems.length > 0) throw new Error(`${problems.join('\n')}\n${USAGE}`);
  const args = jobArgsOf(tokens, server);
  finishJobParams(args, split.script, values.job, { nproc, nnodes });
  checkJobArgs(args, values, split, { nproc, nnodes, browsers });
  return {
    nproc,
    job: split.script ?? (typeof values.job === 'string' ? values.job : 'rendezvous'),
    scriptArgs: split.scriptArgs,
    server,
    ...(nnodes > 1 ? { nnodes, nodeRank } : {}),
    ...(values.https === true ? { https: true } : {}),
    ...(serverCert === undefined ? {} : { serverCert }),
    session: typeof values.session === 'string' ? values.session : `launch-${Date.now().toString(36)}`,
    token,
    timeoutSec,
    jobParams: args.jobParams,
    faults: args.faults,
    ...(args.churnEverySec === undefined ? {} : { churnEverySec: args.churnEverySec }),
    tabs: values.tabs === true,
    ...(browsers ? { browsers } : {}),
    ...(intensiveThrottlingAfterSec === undefined ? {} : { intensiveThrottlingAfterSec }),
    ...(lan ? { lan } : {}),
    serverOptions: serverOptionsOf(args),
  };
}
