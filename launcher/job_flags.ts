/**
 * The launcher's rules for the job options it passes on to the pages (--pp, --dp,
 * --micro-batches, --strategy, --ps, the staleness options, --slow, --min/--max), checked
 * before anything starts and phrased as the flags the user typed; then every rule of the train
 * job's schema (`src/jobs/train_config.ts`, the pages' own check) before any page opens.
 */
import { formatSlow, parseSlow, StragglerSpecError } from '../src/runtime/straggler.ts';
import {
  ConfigError,
  describeRule,
  kebabCase,
  parseOption,
  parseTrainConfig,
  TRAIN_OPTIONS,
  urlOption,
  type TrainOptionName,
} from '../src/jobs/train_config.ts';
import type { Fault } from './run_options.ts';

/** A job option (its schema name) given as --kebab-case or --camelCase (the page accepts both). */
function jobParam(params: Record<string, string>, name: TrainOptionName): { flag: string; value: string } | undefined {
  for (const spelling of [kebabCase(name), name]) {
    if (params[spelling] !== undefined) return { flag: `--${spelling}`, value: params[spelling] };
  }
  return undefined;
}

/**
 * A flag's value against its option's kind in the train job's schema (the pages' own rule),
 * phrased as the flag: undefined when fine, else the problem; `what` says what the option is for.
 */
function valueProblem(p: { flag: string; value: string }, name: TrainOptionName, what: string): string | undefined {
  const spec = TRAIN_OPTIONS.find((o) => o.name === name)!;
  try {
    parseOption(spec, p.value);
    return undefined;
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    // A flag without a value is true: a yes-or-no option is given bare.
    const rule = spec.kind.type === 'bool' ? 'takes no value (or true or false)' : `must be ${describeRule(spec.kind)} (${what})`;
    return `${p.flag} ${rule}, got "${p.value}"`;
  }
}

/**
 * The train job's pipeline flags against the world, before anything starts: --pp S stages,
 * --dp D replicas (default 1) and --micro-batches M are positive integers, --dp and
 * --micro-batches need --pp, and a pipeline run is a fixed size of exactly S x D ranks (so
 * --min/--max, if given, equal it). Returns the problems in words (none: fine, or no pipeline).
 */
export function pipelineProblems(jobParams: Record<string, string>, world: { nproc: number; nnodes?: number }): string[] {
  const pp = jobParam(jobParams, 'pp');
  const dp = jobParam(jobParams, 'dp');
  const mb = jobParam(jobParams, 'microBatches');
  const problems: string[] = [];
  const count = (p: { flag: string; value: string } | undefined, name: TrainOptionName, what: string): number | undefined => {
    if (p === undefined) return undefined;
    const problem = valueProblem(p, name, what);
    if (problem) problems.push(problem);
    return problem ? undefined : Number(p.value);
  };
  const S = count(pp, 'pp', 'pipeline stages');
  const D = count(dp, 'dp', 'replicas of the pipeline');
  const M = count(mb, 'microBatches', "micro-batches per replica's batch");
  if (problems.length > 0) return problems;
  if (pp === undefined) {
    const without = [dp, mb].filter((p) => p !== undefined).map((p) => p!.flag);
    if (without.length > 0)
      problems.push(
        `${without.join(' and ')} ${without.length > 1 ? 'are' : 'is'} for pipeline runs: add --pp S, the number of pipeline stages`,
      );
    return problems;
  }
  const stages = S!;
  const replicas = D ?? 1;
  const nnodes = world.nnodes ?? 1;
  const ranks = nnodes * world.nproc;
  if (stages === 1) {
    // One stage is plain data parallelism: every rank is a replica, at any (elastic) size.
    if (replicas > 1)
      problems.push(
        `${dp!.flag} ${replicas} needs --pp 2 or more: with --pp 1 every rank is a data-parallel replica already (leave out ${dp!.flag})`,
      );
    return problems;
  }
  if (stages * replicas !== ranks) {
    const have = nnodes > 1 ? `--nnodes ${nnodes} x --nproc ${world.nproc} = ${ranks} ranks` : `--nproc ${world.nproc}`;
    problems.push(
      `${have} must be --pp ${stages} x --dp ${replicas} = ${stages * replicas} ranks${D === undefined ? ' (--dp defaults to 1)' : ''}`,
    );
  }
  for (const bound of ['min', 'max']) {
    const b = jobParams[bound];
    if (b !== undefined && Number(b) !== ranks)
      problems.push(`a pipeline run is a fixed size: --${bound} ${b} must be left out or equal the ${ranks} ranks`);
  }
  const batch = jobParam(jobParams, 'batchSize');
  if (M !== undefined && batch !== undefined && Number(batch.value) >= 1 && M > Number(batch.value)) {
    problems.push(`${mb!.flag} ${M} must be at most ${batch.flag} ${batch.value}: each micro-batch needs a sample of the replica's batch`);
  }
  return problems;
}

/** The job options of a parameter-server run (their schema names; given as --kebab-case or --camelCase). */
const PS_FLAGS = ['strategy', 'ps', 'maxStaleness', 'stalenessLr'] as const satisfies readonly TrainOptionName[];

/**
 * A parameter-server run's strategy and number of servers (--strategy ps|central, --ps K; central
 * has one), or null for a DDP run or flags that parameterServerProblems refuses.
 */
export function parameterServerRun(jobParams: Record<string, string>): { strategy: 'ps' | 'central'; servers: number } | null {
  const strategy = jobParam(jobParams, 'strategy')?.value;
  if (strategy !== 'ps' && strategy !== 'central') return null;
  if (strategy === 'central') return { strategy, servers: 1 };
  const ps = jobParam(jobParams, 'ps')?.value ?? '1';
  const servers = /^\d+$/.test(ps) ? Number(ps) : NaN;
  return Number.isSafeInteger(servers) && servers >= 1 ? { strategy, servers } : null;
}

/**
 * The train job's parameter-server flags against each other and the world, before anything
 * starts: --strategy ddp|ps|central, --ps K (a positive integer; only with --strategy ps, and 1
 * with central), --max-staleness S (an integer >= 0) and --staleness-lr (only with --strategy
 * ps), no --pp/--dp with a PS strategy, and at least one worker besides the K servers: in the
 * ranks opened (--nproc, x --nnodes) and in the smallest and largest world (--min, --max).
 * Returns the problems in words (none: fine, or a DDP run).
 */
export function parameterServerProblems(jobParams: Record<string, string>, world: { nproc: number; nnodes?: number }): string[] {
  const strategy = jobParam(jobParams, 'strategy');
  const ps = jobParam(jobParams, 'ps');
  const staleness = jobParam(jobParams, 'maxStaleness');
  const stalenessLr = jobParam(jobParams, 'stalenessLr');
  const what: Record<(typeof PS_FLAGS)[number], string> = {
    strategy: 'ps: asynchronous parameter servers, central: one server, synchronous',
    ps: 'the number of parameter-server ranks',
    maxStaleness: 'the most updates a push may be behind',
    stalenessLr: 'scale by staleness',
  };
  const given = { strategy, ps, maxStaleness: staleness, stalenessLr };
  const problems = PS_FLAGS.flatMap((name) => {
    const p = given[name];
    const problem = p === undefined ? undefined : valueProblem(p, name, what[name]);
    return problem ? [problem] : [];
  });
  if (problems.length > 0) return problems;
  const K = ps === undefined ? undefined : Number(ps.value);
  const name = strategy?.value ?? 'ddp';
  const asyncOnly = [staleness, stalenessLr?.value === 'true' ? stalenessLr : undefined].filter((p) => p !== undefined).map((p) => p!.flag);
  if (name === 'ddp') {
    if (K !== undefined && K !== 1)
      problems.push(`${ps!.flag} ${K} needs --strategy ps: parameter servers are a strategy of their own (add --strategy ps)`);
    if (asyncOnly.length > 0)
      problems.push(
        `${asyncOnly.join(' and ')} ${asyncOnly.length > 1 ? 'are' : 'is'} for asynchronous parameter servers: add --strategy ps (and --ps K)`,
      );
    return problems;
  }
  if (name === 'central') {
    if (K !== undefined && K !== 1)
      problems.push('--strategy central keeps every variable on one server: --ps must be 1 (for several servers, use --strategy ps)');
    if (asyncOnly.length > 0)
      problems.push(
        `${asyncOnly.join(' and ')} ${asyncOnly.length > 1 ? 'are' : 'is'} for --strategy ps: --strategy central is synchronous, its pushes are never stale`,
      );
  }
  for (const p of [jobParam(jobParams, 'pp'), jobParam(jobParams, 'dp')]) {
    if (p !== undefined && p.value !== '1') {
      problems.push(
        `--strategy ${name} does not combine with ${p.flag} ${p.value}: a pipeline splits the model between ranks while parameter servers hold all of it; drop ${p.flag} or --strategy ${name}`,
      );
    }
  }
  const servers = name === 'central' ? 1 : (K ?? 1);
  const withServers =
    name === 'central'
      ? '--strategy central (one server)'
      : K === undefined
        ? '--strategy ps (one server: --ps defaults to 1)'
        : `--ps ${K}`;
  const nnodes = world.nnodes ?? 1;
  const ranks = nnodes * world.nproc;
  if (ranks < servers + 1) {
    const have = nnodes > 1 ? `--nnodes ${nnodes} x --nproc ${world.nproc} = ${ranks} ranks` : `--nproc ${world.nproc}`;
    problems.push(`${have} with ${withServers} leaves no worker: give --nproc at least ${Math.ceil((servers + 1) / nnodes)}`);
  }
  for (const bound of ['min', 'max']) {
    const b = jobParams[bound];
    if (b !== undefined && Number(b) < servers + 1) {
      problems.push(
        `--${bound} ${b} with ${withServers} leaves no worker in a world that small: give --${bound} at least ${servers + 1} (the server${servers === 1 ? '' : 's'} and a worker)${bound === 'min' ? `, or leave it out (${servers + 1} by default)` : ''}`,
      );
    }
  }
  return problems;
}

/**
 * The pages' job options for a parameter-server run: elastic by default, down to its servers
 * and one worker (--min K + 1), so that a lost worker does not pause the others; a --min given
 * stays. Other runs' options are returned as they are.
 */
export function parameterServerParams(jobParams: Record<string, string>): Record<string, string> {
  const run = parameterServerRun(jobParams);
  if (run === null || jobParams.min !== undefined) return jobParams;
  return { ...jobParams, min: String(run.servers + 1) };
}

/**
 * --kill, --freeze and --join change who is in the group, which only some runs survive: an
 * elastic run (--min given), a pipeline run (a fixed size whose lost rank pauses the group until
 * a --join takes its place) and a parameter-server run of the train job (elastic by default:
 * parameterServerParams). A lost device is survived at a fixed size too (the rank rejoins with
 * its own number). Returns what is wrong, or undefined.
 */
export function membershipFaultProblem(faults: Fault[], jobParams: Record<string, string>, train: boolean): string | undefined {
  if (!faults.some((f) => f.kind === 'kill' || f.kind === 'freeze' || f.kind === 'join')) return undefined;
  const pipeline = jobParams.pp !== undefined && jobParams.pp !== '1';
  const parameterServers = train && parameterServerRun(jobParams) !== null;
  if (jobParams.min !== undefined || pipeline || parameterServers) return undefined;
  return '--kill, --freeze and --join need an elastic run (add --min N and --max N), a pipeline run (--pp S, with --join to replace a lost rank) or a parameter-server run (--job train --strategy ps|central)';
}

/** A job option given for a job that does not take it (the parameter-server ones are the train job's). */
export function parameterServerFlagsFor(job: string, jobParams: Record<string, string>): string[] {
  if (job === 'train') return [];
  return PS_FLAGS.map((f) => jobParam(jobParams, f)?.flag).filter((f): f is string => f !== undefined);
}

/**
 * The largest world a run can have, which `--slow` ranks must stay below: nnodes x nproc, or a
 * larger --max (an elastic run's later joiners).
 */
export function largestWorld(jobParams: Record<string, string>, world: { nproc: number; nnodes?: number }): number {
  const ranks = (world.nnodes ?? 1) * world.nproc;
  const max = Number(jobParams.max);
  return Number.isSafeInteger(max) && max > ranks ? max : ranks;
}

/**
 * `--slow RANK:FACTOR`, given once or more, each a comma-separated list: checked as one spec
 * (FACTOR a finite number >= 1, RANK from 0 to `worldSize` - 1, each rank once) and written back
 * as the pages' `slow` URL parameter ("1:2.5,3:4"). Throws an Error naming the bad item.
 */
export function slowParam(values: string[], worldSize: number): string {
  const how = 'it takes RANK:FACTOR, repeated or comma-separated (e.g. --slow 3:4 or --slow 1:2.5,3:4), FACTOR >= 1 times slower';
  for (const v of values) {
    if (v.trim() === '' || v === 'true') throw new Error(`--slow needs a value: ${how}`);
  }
  try {
    return formatSlow(parseSlow(values.join(','), worldSize));
  } catch (err) {
    if (err instanceof StragglerSpecError) throw new Error(`--slow ${err.problem}: ${how}`);
    throw err;
  }
}

/**
 * The train job's options as its pages will read them (`world`, and the job options as given),
 * checked with the job's schema: the first rule broken, named by its flag, or undefined.
 */
export function trainJobProblem(jobParams: Record<string, string>, worldSize: number): string | undefined {
  const params = new URLSearchParams({ ...jobParams, world: String(worldSize) });
  try {
    const config = parseTrainConfig((name) => urlOption(params, name));
    // Headless tabs hold no pictures and no person presses their "Join": they would wait forever.
    if (config.dataset === 'local')
      return "--dataset local: each tab's own pictures are taken by people in their tabs (camera or files); create the session on the page instead (npm start, then the form's dataset \"each tab's own pictures\"), or use runElastic's localData in a script (examples/)";
    return undefined;
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    const flag = err.option === 'world' ? '--nproc (x --nnodes)' : `--${kebabCase(err.option)}`;
    return `${flag} ${err.value}: the train job takes ${err.rule}`;
  }
}

/**
 * Every rule of the train job's flags, in the order a user should hear them: a PS strategy with
 * --pp is named as such before the pipeline's own sizes are. The flag-phrased checks (which know
 * the launcher's world: --nnodes x --nproc, --min, --max) come first; `trainJobProblem` adds the
 * schema's once the world size is known.
 */
export function trainFlagProblems(jobParams: Record<string, string>, world: { nproc: number; nnodes?: number }): string[] {
  const ps = parameterServerProblems(jobParams, world);
  return ps.length > 0 ? ps : pipelineProblems(jobParams, world);
}
