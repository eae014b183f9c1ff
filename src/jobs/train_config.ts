/**
 * The training job's configuration: one schema for every option, with its label, default and
 * rule. The page's URL is parsed with it, the create form is built from it, and the dashboard
 * and the trainer read the resulting `TrainConfig`; nothing else repeats a default.
 */
import { formatSlow, parseSlow, StragglerSpecError } from '../runtime/straggler.ts';
import { Adam, SGD, type HostOptimizer } from '../optim.ts';

export const MODELS = ['mlp', 'cnn'] as const;
export const DATASETS = ['mnist', 'synthetic'] as const;
export const OPTIMIZERS = ['adam', 'sgd'] as const;
export const BACKENDS = ['webgpu', 'webgl', 'wasm', 'cpu'] as const;
export const SCHEDULE_KINDS = ['gpipe', '1f1b'] as const;
export const ACTIVATION_DTYPE_NAMES = ['float32', 'float16'] as const;
/** ddp: every rank a replica; ps: asynchronous parameter servers; central: CentralStorageStrategy (one server, synchronous). */
export const STRATEGIES = ['ddp', 'ps', 'central'] as const;

export type ModelKind = (typeof MODELS)[number];
export type DatasetKind = (typeof DATASETS)[number];
export type OptimizerKind = (typeof OPTIMIZERS)[number];
export type BackendName = (typeof BACKENDS)[number];
export type ScheduleName = (typeof SCHEDULE_KINDS)[number];
export type ActivationDtypeName = (typeof ACTIVATION_DTYPE_NAMES)[number];
export type StrategyName = (typeof STRATEGIES)[number];

/**
 * DDP's communication hook (the launcher's --comm-hook), parsed: how each step's gradients travel.
 * 'none': the plain float32 ring all-reduce. 'fp16' / 'bf16': the same all-reduce with 16-bit
 * values on the wire (torch's fp16_compress_hook, bf16_compress_hook). 'powersgd': low-rank
 * compression of rank `rank`, plain all-reduces for steps 1 .. startIter (torch's powerSGD_hook,
 * start_powerSGD_iter), its all-reduces float32 or, with `wire`, 16-bit (torch's fp16_compress_wrapper
 * around the hook). 'localsgd': averaged gradients for steps 1 .. startStep, then local steps
 * with the models averaged every `period` steps (torch's post_localSGD_hook with a
 * PeriodicModelAverager).
 */
export type CommHookSpec =
  | { kind: 'none' }
  | { kind: 'fp16' }
  | { kind: 'bf16' }
  | { kind: 'powersgd'; rank: number; startIter: number; wire: PowerSGDWire }
  | { kind: 'localsgd'; period: number; startStep: number };
/** What PowerSGD's all-reduces send: float32, or 16-bit as under torch's fp16/bf16_compress_wrapper (`powersgd:R:fp16`, `powersgd:R:bf16`). */
export type PowerSGDWire = 'float32' | 'float16' | 'bfloat16';
const POWERSGD_WIRES: Record<string, PowerSGDWire> = { fp16: 'float16', bf16: 'bfloat16' };
/** torch's start_powerSGD_iter default, and the same warm-up for local SGD. */
export const DEFAULT_COMM_HOOK_START = 10;
/** Bounds: a rank beyond the model's widest matrix compresses nothing; a START beyond any run. */
export const MAX_POWERSGD_RANK = 1024;
export const MAX_LOCALSGD_PERIOD = 1_000_000;
export const MAX_COMM_HOOK_START = 10_000_000;

/** The job every tab of a session runs; all tabs of a session must agree on it. */
export interface TrainConfig {
  model: ModelKind;
  /** Width of the model's hidden dense layer (ModelSpec.hidden); null: the model's default (mlp 128 on MNIST, cnn none). */
  hidden: number | null;
  dataset: DatasetKind;
  /** Per-rank batch size. */
  batchSize: number;
  lr: number;
  optimizer: OptimizerKind;
  /** Train this many epochs, unless `steps` is set. */
  epochs: number;
  /** Stop after this many steps in all (overrides epochs when set). */
  steps: number | null;
  /**
   * Stop once this many seconds have passed since the tab joined (the page asks every rank to
   * stop: DDP at the next step, a parameter-server run when server 0 next answers a worker).
   * null: no limit.
   */
  timeLimit: number | null;
  /** Train on the first N samples only (0: the whole training set). */
  trainSize: number;
  /** Evaluate on the first N test samples only (0: the whole test set). */
  testSize: number;
  seed: number;
  shuffle: boolean;
  /**
   * DDP: split each step's global batch between the ranks by their measured speed, gradients
   * weighed by share (runElastic's balanceBatches). false: DistributedSampler's equal shards, as torch.
   */
  balance: boolean;
  backend: BackendName;
  /**
   * How many ranks the session trains with, like torchrun's --nnodes MIN:MAX: it starts with
   * `max` (or `min` once no more arrive) and keeps going down to `min`. Equal for a fixed size.
   */
  min: number;
  max: number;
  /** Rank 0 saves a checkpoint every this many steps (0: only at epoch ends of elastic runs). */
  checkpointEvery: number;
  /** Evaluate on the test set every this many steps (0: only at epoch ends). */
  evalEvery: number;
  /** Start from the latest checkpoint of this session instead of from scratch. */
  resumeFrom: string | null;
  /** Pipeline stages (model parallel): 1 is plain data parallel. The world is pp x dp ranks, a fixed size. */
  pp: number;
  /** Replicas of the pipeline (data parallel over pipelines); `batchSize` is per replica. */
  dp: number;
  /** Micro-batches each replica's batch is cut into (pipeline runs). */
  microBatches: number;
  schedule: ScheduleName;
  /** How activations travel between stages. */
  activationDtype: ActivationDtypeName;
  /** Where stages 1 .. S-1 start (layer indices); null: balanced by parameter count. */
  splitPoints: number[] | null;
  /**
   * How the ranks train together. 'ddp': every rank holds the model and gradients are averaged
   * each step (DistributedDataParallel). 'ps': `ps` ranks are parameter servers holding the
   * variables (split between them) and the others are workers that pull them and push gradients
   * without waiting for each other (asynchronous). 'central': TensorFlow's
   * CentralStorageStrategy, one server applying the workers' averaged gradients each step
   * (synchronous). Neither PS strategy combines with pipelines (pp, dp).
   */
  strategy: StrategyName;
  /** Parameter-server ranks ('ps': 1 .. world - 1, at least one worker; always 1 otherwise). */
  ps: number;
  /** 'ps' only: a server drops a push whose staleness (updates since the weights it was computed from) exceeds this; null: no bound. */
  maxStaleness: number | null;
  /** 'ps' only: scale each push's gradients (the learning rate, for SGD) by 1 / (1 + staleness). */
  stalenessLr: boolean;
  /**
   * Stragglers on demand (the launcher's --slow RANK:FACTOR): rank -> factor. That rank waits
   * (factor - 1) x its own compute each step, after the compute (src/runtime/straggler.ts). The rank is the
   * one in the current round, which can change between rounds of an elastic run. null: none.
   */
  slow: Record<number, number> | null;
  /** DDP's communication hook (see CommHookSpec); `{ kind: 'none' }` unless asked for. DDP only: not with ps/central or pipelines. */
  commHook: CommHookSpec;
  /**
   * Devices per tab (DataParallel): 1 computes on the page's own backend; K > 1 starts K Workers,
   * each a replica of the model on its own backend (`backend`, falling back per Worker), scatters
   * each batch over them and gathers their gradients. DDP only: not with ps/central or pipelines.
   */
  devices: number;
}

/** Most devices (Workers) a tab may run: each holds its own copy of the model and its backend. */
export const MAX_DEVICES_PER_TAB = 16;

/** Widest hidden layer the job builds (a 784 x 4096 matrix is 12.8 MB of gradients per step). */
export const MAX_HIDDEN_UNITS = 4096;

/** Largest session the page offers (the form's bound and the URL's). */
export const MAX_WORLD_SIZE = 64;

/** The learning rate each optimizer defaults to (measured on MNIST, see README). */
export const DEFAULT_LR: Record<OptimizerKind, number> = { adam: 0.003, sgd: 0.05 };

/**
 * The job's optimizer for replicated weights (DDP, pipeline stages): torch's formulas on the host
 * (src/optim.ts), so that tabs on different backends and browsers keep bit-identical replicas.
 */
export function hostOptimizer(config: Pick<TrainConfig, 'optimizer' | 'lr'>): HostOptimizer {
  return config.optimizer === 'adam' ? new Adam({ lr: config.lr }) : new SGD({ lr: config.lr });
}

const COMM_HOOK_RULE = 'none, fp16, bf16, powersgd:RANK[:START][:fp16|:bf16] or localsgd:H[:START] (e.g. fp16, powersgd:2, powersgd:2:fp16 or localsgd:4)';

type Kind =
  | { type: 'int'; min: number; max: number }
  | { type: 'number'; min: number; max: number }
  | { type: 'choice'; choices: readonly string[] }
  | { type: 'bool' }
  | { type: 'text'; pattern: RegExp; rule: string };

export interface OptionSpec {
  /** The URL parameter (camelCase; the kebab-case spelling is accepted too). */
  name: string;
  label: string;
  hint?: string;
  kind: Kind;
  /** Shown in the create form. */
  inForm: boolean;
  /** May be left empty ("not set": every tab, whole epochs, the whole training set); a link then leaves it out. */
  optional?: boolean;
  /** The value when the URL leaves it out; null means "not set". */
  defaultValue(partial: Partial<Record<string, unknown>>): unknown;
  /**
   * What the create form starts with when that differs from a link's default: a session made on
   * the page is elastic (min 1), while a link without `min` keeps the fixed size it always meant.
   */
  formDefault?: (partial: Partial<Record<string, unknown>>) => unknown;
}

const int = (min: number, max: number): Kind => ({ type: 'int', min, max });
const fixed = (v: unknown) => () => v;

/** Every option, in the order the form shows them. */
export const TRAIN_OPTIONS: readonly OptionSpec[] = [
  {
    name: 'world',
    label: 'World size (tabs)',
    hint: 'How many tabs train together; training starts when all have joined (or, for an elastic session, once the minimum has and no more arrive).',
    kind: int(1, MAX_WORLD_SIZE),
    inForm: true,
    defaultValue: fixed(1),
  },
  {
    name: 'min',
    label: 'Keep training with at least (tabs)',
    // The form replaces this with a sentence about the numbers typed (session_link.ts's minNote).
    hint: 'Tabs may close, reload or join while the session runs: training goes on while at least this many are in. Set it to the world size for a fixed size, which pauses whenever a tab leaves.',
    kind: int(1, MAX_WORLD_SIZE),
    inForm: true,
    defaultValue: (p) => p.world,
    // A class's tabs come and go: sessions made on the page keep training with whoever is there.
    formDefault: fixed(1),
  },
  {
    name: 'max',
    label: 'Train with at most (tabs)',
    hint: 'Tabs beyond this many are told the session is full. Default: the world size.',
    kind: int(1, MAX_WORLD_SIZE),
    inForm: false,
    defaultValue: (p) => p.world,
  },
  { name: 'model', label: 'Model', kind: { type: 'choice', choices: MODELS }, inForm: true, defaultValue: fixed('mlp') },
  {
    name: 'hidden',
    label: 'Hidden units',
    hint: 'Width of the hidden dense layer: the mlp’s (default 128 on MNIST, 32 on synthetic data), or one the cnn adds before its classifier (default 0, none; 128 is the usual MNIST CNN).',
    kind: int(0, MAX_HIDDEN_UNITS),
    inForm: false,
    optional: true,
    defaultValue: fixed(null),
  },
  { name: 'dataset', label: 'Dataset', kind: { type: 'choice', choices: DATASETS }, inForm: true, defaultValue: fixed('mnist') },
  {
    name: 'batchSize',
    label: 'Batch size per rank',
    hint: 'The global batch is this times the world size.',
    kind: int(1, 4096),
    inForm: true,
    defaultValue: fixed(64),
  },
  { name: 'optimizer', label: 'Optimizer', kind: { type: 'choice', choices: OPTIMIZERS }, inForm: true, defaultValue: fixed('adam') },
  {
    name: 'lr',
    label: 'Learning rate',
    hint: `Default ${DEFAULT_LR.adam} for adam, ${DEFAULT_LR.sgd} for sgd.`,
    kind: { type: 'number', min: Number.MIN_VALUE, max: 10 },
    inForm: true,
    defaultValue: (p) => DEFAULT_LR[(p.optimizer as OptimizerKind | undefined) ?? 'adam'],
  },
  { name: 'epochs', label: 'Epochs', kind: int(1, 1000), inForm: true, defaultValue: fixed(1) },
  {
    name: 'steps',
    label: 'Steps (optional)',
    hint: 'Stop after this many steps in all, whatever the epochs say. Leave empty to train whole epochs.',
    kind: int(1, 10_000_000),
    inForm: true,
    optional: true,
    defaultValue: fixed(null),
  },
  {
    name: 'timeLimit',
    label: 'Time limit (seconds)',
    hint: 'Stop training once this many seconds have passed since the tab joined, whatever the epochs say: every tab asks to stop, and the run ends at its next step (with parameter servers, when server 0 next answers a worker) and evaluates as usual. Leave empty for no limit.',
    kind: { type: 'number', min: Number.MIN_VALUE, max: 1_000_000 },
    inForm: false,
    defaultValue: fixed(null),
  },
  {
    name: 'trainSize',
    label: 'Training samples (optional)',
    hint: 'Train on the first N samples only, for a short run. Leave empty for the whole training set.',
    kind: int(0, 10_000_000),
    inForm: true,
    optional: true,
    defaultValue: fixed(0),
  },
  {
    name: 'testSize',
    label: 'Test samples',
    hint: 'Evaluate on the first N test samples only (a slow device, a short run). 0: the whole test set.',
    kind: int(0, 10_000_000),
    inForm: false,
    defaultValue: fixed(0),
  },
  {
    name: 'backend',
    label: 'Backend',
    hint: 'If a tab has no WebGPU it falls back and says which backend it uses.',
    kind: { type: 'choice', choices: BACKENDS },
    inForm: true,
    defaultValue: fixed('webgpu'),
  },
  { name: 'seed', label: 'Seed', kind: int(Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER), inForm: false, defaultValue: fixed(0) },
  { name: 'shuffle', label: 'Shuffle', kind: { type: 'bool' }, inForm: false, defaultValue: fixed(true) },
  {
    name: 'balance',
    label: 'Balance batches by speed',
    hint: 'DDP: a slower tab gets fewer of each step’s samples (gradients weighed by share, so the result equals one rank at the global batch); false gives every rank the same batch, as torch.',
    kind: { type: 'bool' },
    inForm: false,
    defaultValue: fixed(true),
  },
  { name: 'checkpointEvery', label: 'Checkpoint every (steps)', kind: int(0, 10_000_000), inForm: false, defaultValue: fixed(0) },
  { name: 'evalEvery', label: 'Evaluate every (steps)', kind: int(0, 10_000_000), inForm: false, defaultValue: fixed(100) },
  {
    name: 'pp',
    label: 'Pipeline stages',
    hint: 'Split the model into this many stages, one per tab (model parallelism); the world is stages x replicas tabs.',
    kind: int(1, MAX_WORLD_SIZE),
    inForm: false,
    defaultValue: fixed(1),
  },
  { name: 'dp', label: 'Pipeline replicas', kind: int(1, MAX_WORLD_SIZE), inForm: false, defaultValue: fixed(1) },
  {
    name: 'microBatches',
    label: 'Micro-batches',
    hint: 'Each batch is cut into this many micro-batches that flow through the pipeline one after another.',
    // A stage sends a step's micro-batches before the next takes any: see MAX_MICRO_BATCHES in src/parallel/pipeline/stage.ts.
    kind: int(1, 64),
    inForm: false,
    defaultValue: (p) => ((p.pp as number) > 1 ? 4 : 1),
  },
  { name: 'schedule', label: 'Pipeline schedule', kind: { type: 'choice', choices: SCHEDULE_KINDS }, inForm: false, defaultValue: fixed('gpipe') },
  { name: 'activationDtype', label: 'Activations on the wire', kind: { type: 'choice', choices: ACTIVATION_DTYPE_NAMES }, inForm: false, defaultValue: fixed('float32') },
  {
    name: 'splitPoints',
    label: 'Pipeline split points',
    hint: 'The layer index where each stage after the first starts (pp - 1 of them, comma-separated). Default: balanced by parameter count.',
    kind: { type: 'text', pattern: /^\d{1,4}(,\d{1,4}){0,62}$/, rule: 'layer indices separated by commas (e.g. 1,3)' },
    inForm: false,
    defaultValue: fixed(null),
  },
  {
    name: 'strategy',
    label: 'Training strategy',
    hint: 'ddp: every tab holds the model and the gradients are averaged each step. ps: some tabs (parameter servers) hold the variables and the others (workers) pull them and push gradients without waiting for each other (asynchronous). central: one server, and each step applies the workers’ averaged gradients (TensorFlow’s CentralStorageStrategy).',
    kind: { type: 'choice', choices: STRATEGIES },
    inForm: false,
    defaultValue: fixed('ddp'),
  },
  {
    name: 'ps',
    label: 'Parameter servers (tabs)',
    hint: 'With strategy ps: how many tabs hold the variables, split between them; every other tab is a worker, so at most the world size - 1. Strategy central has exactly one.',
    kind: int(1, MAX_WORLD_SIZE - 1),
    inForm: false,
    defaultValue: fixed(1),
  },
  {
    name: 'maxStaleness',
    label: 'Max staleness (updates)',
    hint: 'With strategy ps: a server drops a push computed from weights more than this many updates old (its samples count as stale). Leave empty for no bound.',
    kind: int(0, 1_000_000),
    inForm: false,
    defaultValue: fixed(null),
  },
  {
    name: 'stalenessLr',
    label: 'Scale stale gradients',
    hint: 'With strategy ps: each push’s gradients are scaled by 1/(1 + staleness), so a stale push moves the weights less (for SGD, a smaller learning rate).',
    kind: { type: 'bool' },
    inForm: false,
    defaultValue: fixed(false),
  },
  {
    name: 'slow',
    label: 'Slow ranks',
    hint: 'RANK:FACTOR, comma-separated: that rank waits in proportion to its own compute, FACTOR times slower in all (a straggler on demand, e.g. 3:4).',
    // The syntax here; ranks against the world size, each once, and factors >= 1 in parseTrainConfig.
    kind: { type: 'text', pattern: /^\d{1,4}:[0-9.eE+-]{1,24}(,\d{1,4}:[0-9.eE+-]{1,24}){0,63}$/, rule: 'RANK:FACTOR items separated by commas (e.g. 3:4 or 1:2.5,3:4)' },
    inForm: false,
    defaultValue: fixed(null),
  },
  {
    name: 'commHook',
    label: 'Gradient communication',
    hint: 'How DDP sends each step’s gradients. none: float32 all-reduce. fp16 or bf16: 16-bit values on the wire, half the bytes. powersgd:RANK: low-rank compression (PowerSGD) after 10 plain steps (powersgd:RANK:START for START; a last :fp16 or :bf16 sends its matrices 16-bit). localsgd:H: local steps, the models averaged every H steps, after 10 averaged steps (localsgd:H:START). Not with parameter servers or pipelines.',
    // The syntax here; what each item may be in parseCommHook (which names the item).
    kind: { type: 'text', pattern: /^[A-Za-z0-9]{1,16}(:[0-9A-Za-z.+-]{0,24}){0,3}$/, rule: COMM_HOOK_RULE },
    inForm: false,
    defaultValue: fixed('none'),
  },
  {
    name: 'devices',
    label: 'Devices per tab',
    hint: 'Workers per tab, each with its own copy of the model on its own backend; every batch is split between them and their gradients combined (DataParallel). On the cpu and wasm backends each Worker uses another CPU core. Not with parameter servers or pipelines.',
    kind: int(1, MAX_DEVICES_PER_TAB),
    inForm: false,
    defaultValue: fixed(1),
  },
  {
    name: 'resumeFrom',
    label: 'Resume from session',
    kind: { type: 'text', pattern: /^[A-Za-z0-9_.-]{1,64}$/, rule: '1-64 of A-Z a-z 0-9 _ . -' },
    inForm: false,
    defaultValue: fixed(null),
  },
];

/** A URL or form value that breaks an option's rule; the message says which and what is allowed. */
export class ConfigError extends Error {
  override name = 'ConfigError';
  constructor(
    readonly option: string,
    readonly value: string,
    readonly rule: string,
  ) {
    super(`option ${option} must be ${rule}, got "${value}"`);
  }
}

/** What an option allows, in words ("an integer from 1 to 64"). */
export function describeRule(kind: Kind): string {
  switch (kind.type) {
    case 'int':
      return kind.min <= Number.MIN_SAFE_INTEGER ? 'an integer' : `an integer from ${kind.min} to ${kind.max}`;
    case 'number':
      return `a number above 0 and at most ${kind.max}`;
    case 'choice':
      return `one of ${kind.choices.join(', ')}`;
    case 'bool':
      return 'true or false';
    case 'text':
      return kind.rule;
  }
}

/** Parses one option's text; throws ConfigError. An empty string means "not set". */
export function parseOption(spec: OptionSpec, raw: string): unknown {
  const k = spec.kind;
  const bad = () => new ConfigError(spec.name, raw, describeRule(k));
  switch (k.type) {
    case 'int':
    case 'number': {
      const n = Number(raw.trim());
      if (raw.trim() === '' || !Number.isFinite(n) || n < k.min || n > k.max || (k.type === 'int' && !Number.isSafeInteger(n))) throw bad();
      return n;
    }
    case 'choice':
      if (!k.choices.includes(raw)) throw bad();
      return raw;
    case 'bool':
      if (raw !== 'true' && raw !== 'false') throw bad();
      return raw === 'true';
    case 'text':
      if (!k.pattern.test(raw)) throw bad();
      return raw;
  }
}

/** Reads a parameter in camelCase or kebab-case (batchSize, batch-size). */
export function urlOption(params: URLSearchParams, name: string): string | null {
  const kebab = name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
  return params.get(name) ?? params.get(kebab);
}

/** The job's configuration from raw values (URL parameters or form fields); throws ConfigError. */
export function parseTrainConfig(get: (name: string) => string | null): TrainConfig {
  const values: Record<string, unknown> = {};
  for (const spec of TRAIN_OPTIONS) {
    const raw = get(spec.name);
    values[spec.name] = raw === null || raw === '' ? spec.defaultValue(values) : parseOption(spec, raw);
  }
  const min = values.min as number;
  const max = values.max as number;
  if (min > max) throw new ConfigError('min', String(min), `at most the session's largest size (${max})`);
  const pp = values.pp as number;
  const dp = values.dp as number;
  const strategy = values.strategy as StrategyName;
  const ps = values.ps as number;
  checkStrategy(strategy, ps, values.maxStaleness as number | null, values.stalenessLr as boolean, { min, max, pp, dp });
  if (pp > 1 && (pp * dp !== max || min !== max)) {
    throw new ConfigError('pp', String(pp), `such that stages x replicas is the world size, a fixed one: pp ${pp} x dp ${dp} = ${pp * dp} ranks, but the world is ${min === max ? max : `${min}..${max}`}`);
  }
  if (pp === 1 && dp !== 1) throw new ConfigError('dp', String(dp), '1 without pipeline stages (pp): plain data parallelism uses every rank as a replica');
  const splitPoints = values.splitPoints === null ? null : (values.splitPoints as string).split(',').map(Number);
  if (splitPoints && splitPoints.length !== pp - 1) {
    throw new ConfigError('splitPoints', splitPoints.join(','), `${pp - 1} layer index(es) for ${pp} stages (pp)`);
  }
  if (pp > 1 && (values.microBatches as number) > (values.batchSize as number)) {
    throw new ConfigError('microBatches', String(values.microBatches), `at most the batch size per replica (${values.batchSize as number})`);
  }
  let slow: Record<number, number> | null = null;
  if (values.slow !== null) {
    try {
      slow = parseSlow(values.slow as string, max);
    } catch (err) {
      if (!(err instanceof StragglerSpecError)) throw err;
      throw new ConfigError('slow', values.slow as string, `RANK:FACTOR items with RANK from 0 to ${max - 1} (the world size - 1), each rank once, and FACTOR a finite number of at least 1: ${err.problem}`);
    }
  }
  const commHook = parseCommHook(values.commHook as string);
  checkCommHook(values.commHook as string, commHook, strategy, pp);
  const hidden = values.hidden as number | null;
  if (hidden === 0 && values.model === 'mlp') throw new ConfigError('hidden', '0', `from 1 to ${MAX_HIDDEN_UNITS} for the mlp, whose hidden layer is all it has (0, no hidden layer, is for the cnn)`);
  const devices = values.devices as number;
  if (devices > 1 && (strategy !== 'ddp' || pp > 1)) {
    const other = strategy !== 'ddp' ? `strategy ${strategy}` : `pipeline stages (pp ${pp})`;
    throw new ConfigError('devices', String(devices), `1 (or left out) with ${other}: devices per tab (DataParallel) work with DDP for now (leave out devices, or ${strategy !== 'ddp' ? 'strategy' : 'pp'})`);
  }
  return {
    model: values.model as ModelKind,
    hidden,
    dataset: values.dataset as DatasetKind,
    batchSize: values.batchSize as number,
    lr: values.lr as number,
    optimizer: values.optimizer as OptimizerKind,
    epochs: values.epochs as number,
    steps: values.steps as number | null,
    timeLimit: values.timeLimit as number | null,
    trainSize: values.trainSize as number,
    testSize: values.testSize as number,
    seed: values.seed as number,
    shuffle: values.shuffle as boolean,
    balance: values.balance as boolean,
    backend: values.backend as BackendName,
    min,
    max,
    checkpointEvery: values.checkpointEvery as number,
    evalEvery: values.evalEvery as number,
    resumeFrom: values.resumeFrom as string | null,
    pp,
    dp,
    microBatches: values.microBatches as number,
    schedule: values.schedule as ScheduleName,
    activationDtype: values.activationDtype as ActivationDtypeName,
    splitPoints,
    strategy,
    ps,
    maxStaleness: values.maxStaleness as number | null,
    stalenessLr: values.stalenessLr as boolean,
    slow,
    commHook,
    devices,
  };
}

/**
 * `none`, `fp16`, `bf16`, `powersgd:RANK[:START][:fp16|:bf16]` or `localsgd:H[:START]` as a CommHookSpec.
 * RANK and H are positive integers; START (the steps of plain, averaged gradients first, default
 * 10) an integer >= 0. Throws ConfigError (option commHook) naming the item that is wrong and
 * what to write.
 */
export function parseCommHook(raw: string): CommHookSpec {
  const [kind = '', ...args] = raw.split(':');
  const bad = (rule: string) => new ConfigError('commHook', raw, rule);
  /** `item` (RANK, H, START) of `form` as a whole number in least..most; the error says what it is for and shows `example`. */
  const item = (name: string, text: string | undefined, least: number, most: number, form: string, what: string, example: string): number => {
    const n = text !== undefined && /^\d{1,16}$/.test(text) ? Number(text) : NaN;
    if (Number.isSafeInteger(n) && n >= least && n <= most) return n;
    const range = least === 1 ? `a positive integer up to ${most}` : `an integer from ${least} to ${most}`;
    const problem = text === undefined || text === '' ? `${name} is missing` : `${name} "${text}" is not one`;
    throw bad(`${form} with ${name} ${range}, ${what} (e.g. ${example}); ${problem}`);
  };
  switch (kind) {
    case 'none':
    case 'fp16':
    case 'bf16':
      if (args.length > 0) throw bad(`just ${kind}, without "${args.join(':')}" after it`);
      return { kind };
    case 'powersgd': {
      // A last item fp16 or bf16: P, Q and the rest go 16-bit on the wire.
      const last = args[args.length - 1];
      const wire = last !== undefined && last in POWERSGD_WIRES && args.length > 1 ? POWERSGD_WIRES[last]! : 'float32';
      const numbers = wire === 'float32' ? args : args.slice(0, -1);
      if (numbers.length > 2) throw bad('powersgd:RANK[:START][:fp16|:bf16] (e.g. powersgd:2, powersgd:2:100 or powersgd:2:fp16): at most two numbers after powersgd, then optionally fp16 or bf16');
      const rank = item('RANK', numbers[0], 1, MAX_POWERSGD_RANK, 'powersgd:RANK', 'the rank of the low-rank approximation', 'powersgd:2');
      const startIter = numbers.length < 2 ? DEFAULT_COMM_HOOK_START : item('START', numbers[1], 0, MAX_COMM_HOOK_START, `powersgd:${rank}:START`, 'the steps of plain all-reduce before compression starts', `powersgd:${rank}:100`);
      return { kind: 'powersgd', rank, startIter, wire };
    }
    case 'localsgd': {
      if (args.length > 2) throw bad('localsgd:H or localsgd:H:START (e.g. localsgd:4 or localsgd:4:100): at most two numbers after localsgd');
      const period = item('H', args[0], 1, MAX_LOCALSGD_PERIOD, 'localsgd:H', 'the steps between two averagings of the models', 'localsgd:4');
      const startStep = args.length < 2 ? DEFAULT_COMM_HOOK_START : item('START', args[1], 0, MAX_COMM_HOOK_START, `localsgd:${period}:START`, 'the steps of averaged gradients before local steps start', `localsgd:${period}:100`);
      return { kind: 'localsgd', period, startStep };
    }
    default:
      throw bad(`${COMM_HOOK_RULE}; "${kind}" is not a hook`);
  }
}

/** A CommHookSpec as the option's text (what parseCommHook reads back), START only when not the default. */
export function formatCommHook(spec: CommHookSpec): string {
  switch (spec.kind) {
    case 'powersgd':
      return `powersgd:${spec.rank}${spec.startIter === DEFAULT_COMM_HOOK_START ? '' : `:${spec.startIter}`}${spec.wire === 'float32' ? '' : spec.wire === 'float16' ? ':fp16' : ':bf16'}`;
    case 'localsgd':
      return `localsgd:${spec.period}${spec.startStep === DEFAULT_COMM_HOOK_START ? '' : `:${spec.startStep}`}`;
    default:
      return spec.kind;
  }
}

/** Hooks are DDP's: refused with a parameter-server strategy and, for now, with pipelines. Throws ConfigError. */
function checkCommHook(raw: string, spec: CommHookSpec, strategy: StrategyName, pp: number): void {
  if (spec.kind === 'none') return;
  if (strategy !== 'ddp') {
    throw new ConfigError('commHook', raw, `none (or left out) with strategy ${strategy}: communication hooks replace DDP's all-reduce, and with parameter servers the workers push their gradients to the servers instead (leave out commHook, or strategy)`);
  }
  if (pp > 1) {
    throw new ConfigError('commHook', raw, `none (or left out) with pipeline stages (here pp ${pp}): communication hooks with pipelines are not supported yet (leave out commHook, or pp)`);
  }
}

/**
 * The parameter-server options against each other and the world: ps and the staleness options
 * only where the strategy uses them, no pipeline with a PS strategy, and at least one worker
 * besides the servers in the largest world and in the smallest (min). Throws ConfigError.
 */
function checkStrategy(strategy: StrategyName, ps: number, maxStaleness: number | null, stalenessLr: boolean, world: { min: number; max: number; pp: number; dp: number }): void {
  const { min, max, pp, dp } = world;
  if (strategy !== 'ddp' && (pp > 1 || dp > 1)) {
    const pipeline = [pp > 1 ? `pp ${pp}` : '', dp > 1 ? `dp ${dp}` : ''].filter(Boolean).join(', ');
    throw new ConfigError('strategy', strategy, `ddp with pipeline stages or replicas (here ${pipeline}): a pipeline splits the model between tabs while parameter servers hold all of it, so leave out pp and dp, or strategy`);
  }
  if (strategy === 'ddp' && ps !== 1) throw new ConfigError('ps', String(ps), '1 (or left out) unless strategy is ps: parameter servers need strategy=ps');
  if (strategy === 'central' && ps !== 1) throw new ConfigError('ps', String(ps), '1 with strategy central, which keeps every variable on one server (for several, use strategy=ps)');
  if (maxStaleness !== null && strategy !== 'ps') {
    throw new ConfigError('maxStaleness', String(maxStaleness), `left out unless strategy is ps: ${strategy === 'central' ? 'strategy central is synchronous, its pushes are never stale' : 'only asynchronous parameter servers take stale pushes'}`);
  }
  if (stalenessLr && strategy !== 'ps') {
    throw new ConfigError('stalenessLr', 'true', `false (or left out) unless strategy is ps: ${strategy === 'central' ? 'strategy central is synchronous, its pushes are never stale' : 'only asynchronous parameter servers take stale pushes'}`);
  }
  if (strategy === 'ddp') return;
  const servers = `${ps} parameter server${ps === 1 ? '' : 's'}`;
  if (ps >= max) {
    // The default single server in a world of one tab: the world is what to change.
    if (ps === 1) throw new ConfigError('world', String(max), `at least 2 with strategy ${strategy}: a parameter server and at least one worker`);
    throw new ConfigError('ps', String(ps), `at most ${max - 1}, the world size (${max}) less one: every tab that is not a server is a worker, and at least one is needed`);
  }
  if (min < ps + 1) throw new ConfigError('min', String(min), `at least ${ps + 1} with strategy ${strategy}: the ${servers} and one worker (with fewer tabs nothing trains)`);
}

/** The URL parameters that reproduce `config` (what a share link carries), in schema order. */
export function configParams(config: TrainConfig): URLSearchParams {
  const p = new URLSearchParams();
  const byName: Record<string, unknown> = { ...config, world: config.max, slow: config.slow ? formatSlow(config.slow) : null, commHook: formatCommHook(config.commHook) };
  for (const spec of TRAIN_OPTIONS) {
    const v = byName[spec.name];
    if (v === null || v === undefined) continue;
    if (v === spec.defaultValue(byName) && (!spec.inForm || spec.optional)) continue;
    p.set(spec.name, String(v));
  }
  return p;
}
