/**
 * The training job's configuration as a schema: every option's kind, range and default, and the
 * rules between options (pp x dp = world, which strategies a hook or devices combine with). The
 * page's URL and the launcher's flags are parsed with it, the create form is built from it (its
 * labels and hints are the page's: client/ui/train_form_labels.ts), and the dashboard and the
 * trainer read the resulting `TrainConfig`; nothing else repeats a default.
 */
import { formatSlow, parseSlow, StragglerSpecError } from '../runtime/straggler.ts';
import { LM_DEFAULTS } from '../nn/lm_defaults.ts';

export { LM_DEFAULTS };
import { ConfigError, parseOption, type OptionKind, type OptionSpec } from './config_option.ts';
import { checkCommHook, COMM_HOOK_RULE, formatCommHook, parseCommHook } from './comm_hook_spec.ts';
import {
  AGGREGATION_PRESETS,
  AGGREGATION_RULE,
  ATTACK_RULE,
  attackPlan,
  checkRobust,
  formatAggregation,
  formatAttack,
  parseAggregation,
} from './aggregation_spec.ts';
import { checkStrategy } from './strategy_spec.ts';
import { checkLocalData, LOCAL_DATA_OPTIONS, localDataParams } from './local_data_spec.ts';
import {
  ACTIVATION_DTYPE_NAMES,
  BACKEND_SETTINGS,
  DATASETS,
  DEFAULT_CONTEXT,
  DEFAULT_LR,
  MAX_CONTEXT,
  MAX_DEVICES_PER_TAB,
  MAX_HIDDEN_UNITS,
  MAX_LM_WIDTH,
  MAX_WORLD_SIZE,
  MODELS,
  OPTIMIZERS,
  SCHEDULE_KINDS,
  STRATEGIES,
  STREAM_MODES,
  type ActivationDtypeName,
  type BackendSetting,
  type DatasetKind,
  type ModelKind,
  type OptimizerKind,
  type ScheduleName,
  type StrategyName,
  type StreamModeName,
  type TrainConfig,
} from './train_config_types.ts';

// The schema's parts, importable from here as before.
export { ConfigError, describeRule, kebabCase, parseOption, urlOption, type OptionKind, type OptionSpec } from './config_option.ts';
export {
  AGGREGATION_PRESETS,
  attackPlanOf,
  formatAggregation,
  formatAttack,
  parseAggregation,
  parseAttack,
  type AggregationConfig,
  type AttackConfig,
} from './aggregation_spec.ts';
export {
  DEFAULT_COMM_HOOK_START,
  MAX_COMM_HOOK_START,
  MAX_LOCALSGD_PERIOD,
  MAX_POWERSGD_RANK,
  formatCommHook,
  parseCommHook,
  type CommHookSpec,
  type PowerSGDWire,
} from './comm_hook_spec.ts';

export {
  CLASSES_RULE,
  COLORS,
  MAX_CLASSES,
  MAX_IMAGE_SIZE,
  MIN_CLASSES,
  MIN_IMAGE_SIZE,
  LOCAL_DATA_OPTION_NAMES,
  localInputShape,
  parseClasses,
  type ColorName,
  type LocalDataConfig,
} from './local_data_spec.ts';

// The configuration as data (its choice lists, bounds, TrainConfig and what the trainer reads off it), importable from here as before.
export * from './train_config_types.ts';

const int = (min: number, max: number): OptionKind => ({ type: 'int', min, max });
const fixed = (v: unknown) => () => v;

// `as const`: the names stay literal types, so TrainOptionName lists them.
const OPTIONS = [
  { name: 'world', kind: int(1, MAX_WORLD_SIZE), inForm: true, defaultValue: fixed(1) },
  // A link without min keeps the fixed size it always meant; the create form starts at 1 (client/ui/train_form_labels.ts).
  { name: 'min', kind: int(1, MAX_WORLD_SIZE), inForm: true, defaultValue: (p) => p.world },
  { name: 'max', kind: int(1, MAX_WORLD_SIZE), inForm: false, defaultValue: (p) => p.world },
  { name: 'model', kind: { type: 'choice', choices: MODELS }, inForm: true, defaultValue: fixed('mlp') },
  { name: 'hidden', kind: int(0, MAX_HIDDEN_UNITS), inForm: false, optional: true, defaultValue: fixed(null) },
  {
    name: 'dataset',
    kind: { type: 'choice', choices: DATASETS },
    inForm: true,
    defaultValue: (p) => (p.model === 'lm' ? 'text' : 'mnist'),
  },
  // Each tab's own pictures (dataset local): their classes, size and colour.
  ...LOCAL_DATA_OPTIONS,
  {
    name: 'context',
    kind: int(2, MAX_CONTEXT),
    inForm: false,
    optional: true,
    defaultValue: (p) => (p.model === 'lm' ? DEFAULT_CONTEXT : null),
  },
  { name: 'streamData', kind: { type: 'choice', choices: STREAM_MODES }, inForm: false, defaultValue: fixed('auto') },
  // The language model's sample is a window of 64 characters: 16 of them are already 1,024 predictions.
  { name: 'batchSize', kind: int(1, 4096), inForm: true, defaultValue: (p) => (p.model === 'lm' ? 16 : 64) },
  { name: 'optimizer', kind: { type: 'choice', choices: OPTIMIZERS }, inForm: true, defaultValue: fixed('adam') },
  {
    name: 'lr',
    kind: { type: 'number', min: Number.MIN_VALUE, max: 10 },
    inForm: true,
    defaultValue: (p) => DEFAULT_LR[(p.optimizer as OptimizerKind | undefined) ?? 'adam'],
  },
  { name: 'epochs', kind: int(1, 1000), inForm: true, defaultValue: fixed(1) },
  { name: 'steps', kind: int(1, 10_000_000), inForm: true, optional: true, defaultValue: fixed(null) },
  { name: 'timeLimit', kind: { type: 'number', min: Number.MIN_VALUE, max: 1_000_000 }, inForm: false, defaultValue: fixed(null) },
  { name: 'trainSize', kind: int(0, 10_000_000), inForm: true, optional: true, defaultValue: fixed(0) },
  { name: 'testSize', kind: int(0, 10_000_000), inForm: false, defaultValue: fixed(0) },
  // auto for the language model, whose speed differs most between backends (SwiftShader's WebGPU
  // took 20-27 s a step where the cpu backend takes well under one); the small models keep WebGPU.
  {
    name: 'backend',
    kind: { type: 'choice', choices: BACKEND_SETTINGS },
    inForm: true,
    defaultValue: (p) => (p.model === 'lm' ? 'auto' : 'webgpu'),
  },
  // The syntax here; what each item may be in parseAggregation. The form offers the presets as a select.
  {
    name: 'aggregation',
    kind: { type: 'text', pattern: /^[a-z-]{1,16}(:[0-9A-Za-z.+-]{1,24}){0,2}$/, rule: AGGREGATION_RULE, presets: AGGREGATION_PRESETS },
    inForm: true,
    defaultValue: fixed('mean'),
  },
  { name: 'seed', kind: int(Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER), inForm: false, defaultValue: fixed(0) },
  { name: 'shuffle', kind: { type: 'bool' }, inForm: false, defaultValue: fixed(true) },
  { name: 'voteWithGradients', kind: { type: 'bool' }, inForm: false, defaultValue: fixed(true) },
  { name: 'checkpointEvery', kind: int(0, 10_000_000), inForm: false, defaultValue: fixed(0) },
  { name: 'evalEvery', kind: int(0, 10_000_000), inForm: false, defaultValue: fixed(100) },
  // 10 steps of the default language model on the cpu backend of a 2-core machine (~3-5 s each): its first sample within the first minute.
  { name: 'firstSample', kind: int(0, 10_000_000), inForm: false, defaultValue: (p) => (p.model === 'lm' ? 10 : 0) },
  { name: 'pp', kind: int(1, MAX_WORLD_SIZE), inForm: false, defaultValue: fixed(1) },
  { name: 'dp', kind: int(1, MAX_WORLD_SIZE), inForm: false, defaultValue: fixed(1) },
  {
    name: 'microBatches',
    // A stage sends a step's micro-batches before the next takes any: see MAX_MICRO_BATCHES in src/parallel/pipeline/stage.ts.
    kind: int(1, 64),
    inForm: false,
    defaultValue: (p) => ((p.pp as number) > 1 ? 4 : 1),
  },
  { name: 'schedule', kind: { type: 'choice', choices: SCHEDULE_KINDS }, inForm: false, defaultValue: fixed('gpipe') },
  { name: 'activationDtype', kind: { type: 'choice', choices: ACTIVATION_DTYPE_NAMES }, inForm: false, defaultValue: fixed('float32') },
  {
    name: 'splitPoints',
    kind: { type: 'text', pattern: /^\d{1,4}(,\d{1,4}){0,62}$/, rule: 'layer indices separated by commas (e.g. 1,3)' },
    inForm: false,
    defaultValue: fixed(null),
  },
  { name: 'strategy', kind: { type: 'choice', choices: STRATEGIES }, inForm: false, defaultValue: fixed('ddp') },
  { name: 'ps', kind: int(1, MAX_WORLD_SIZE - 1), inForm: false, defaultValue: fixed(1) },
  { name: 'maxStaleness', kind: int(0, 1_000_000), inForm: false, defaultValue: fixed(null) },
  { name: 'stalenessLr', kind: { type: 'bool' }, inForm: false, defaultValue: fixed(false) },
  // DDP's (the only strategy that splits a global batch): true there, false where it would do nothing (refused if given).
  // Not with each tab's own pictures (dataset local), whose steps are split by the pictures each tab has left.
  {
    name: 'balance',
    kind: { type: 'bool' },
    inForm: false,
    defaultValue: (p) => p.strategy === 'ddp' && p.pp === 1 && p.dataset !== 'local',
  },
  {
    name: 'slow',
    // The syntax here; ranks against the world size, each once, and factors >= 1 in parseTrainConfig.
    kind: {
      type: 'text',
      pattern: /^\d{1,4}:[0-9.eE+-]{1,24}(,\d{1,4}:[0-9.eE+-]{1,24}){0,63}$/,
      rule: 'RANK:FACTOR items separated by commas (e.g. 3:4 or 1:2.5,3:4)',
    },
    inForm: false,
    defaultValue: fixed(null),
  },
  {
    name: 'commHook',
    // The syntax here; what each item may be in parseCommHook (which names the item).
    kind: { type: 'text', pattern: /^[A-Za-z0-9]{1,16}(:[0-9A-Za-z.+-]{0,24}){0,5}$/, rule: COMM_HOOK_RULE },
    inForm: false,
    defaultValue: fixed('none'),
  },
  { name: 'devices', kind: int(1, MAX_DEVICES_PER_TAB), inForm: false, defaultValue: fixed(1) },
  {
    name: 'attack',
    kind: { type: 'text', pattern: /^[a-z]{1,8}(:-?[0-9.]{1,24})?$/, rule: ATTACK_RULE },
    inForm: false,
    defaultValue: fixed(null),
  },
  // The last K ranks attack: 1 when an attack is given, else none.
  { name: 'attackers', kind: int(0, MAX_WORLD_SIZE - 1), inForm: false, defaultValue: (p) => (p.attack == null ? 0 : 1) },
  // The links' credit window (src/transport/flow_control.ts), bytes; 0: none. Left out: the library's 128 KiB.
  { name: 'linkWindowBytes', kind: int(0, 64 << 20), inForm: false, optional: true, defaultValue: fixed(null) },
  {
    name: 'resumeFrom',
    kind: { type: 'text', pattern: /^[A-Za-z0-9_.-]{1,64}$/, rule: '1-64 of A-Z a-z 0-9 _ . -' },
    inForm: false,
    defaultValue: fixed(null),
  },
] as const satisfies readonly OptionSpec[];

/** An option's name (its URL parameter): what the page's labels are keyed by. */
export type TrainOptionName = (typeof OPTIONS)[number]['name'];

/** Every option, in the order the form shows them. */
export const TRAIN_OPTIONS: readonly OptionSpec<TrainOptionName>[] = OPTIONS;

/** Each option's value: parsed from its raw text, or its default (which may depend on the options before it). */
type Values = Record<string, unknown>;

/** The job's configuration from raw values (URL parameters or form fields); throws ConfigError. */
export function parseTrainConfig(get: (name: string) => string | null): TrainConfig {
  const values: Values = {};
  for (const spec of TRAIN_OPTIONS) {
    const raw = get(spec.name);
    values[spec.name] = raw === null || raw === '' ? spec.defaultValue(values) : parseOption(spec, raw);
  }
  const layout = checkLayout(values);
  const slow = slowOf(values.slow as string | null, layout.max);
  const ddp = checkDdpOptions(values, layout);
  checkModel(values);
  const local = checkLocalData(values);
  const devices = values.devices as number;
  const { strategy, pp } = layout;
  if (devices > 1 && (strategy !== 'ddp' || pp > 1)) {
    const other = strategy !== 'ddp' ? `strategy ${strategy}` : `pipeline stages (pp ${pp})`;
    throw new ConfigError(
      'devices',
      String(devices),
      `1 (or left out) with ${other}: devices per tab (DataParallel) work with DDP for now (leave out devices, or ${strategy !== 'ddp' ? 'strategy' : 'pp'})`,
    );
  }
  return configOf(values, { ...layout, ...ddp, slow, local });
}

/** The world and how it is split: min..max, the pipeline (pp x dp, split points, micro-batches) and the strategy's servers. Throws ConfigError. */
function checkLayout(values: Values): Pick<TrainConfig, 'min' | 'max' | 'pp' | 'dp' | 'strategy' | 'ps' | 'splitPoints'> {
  const min = values.min as number;
  const max = values.max as number;
  if (min > max) throw new ConfigError('min', String(min), `at most the session's largest size (${max})`);
  const pp = values.pp as number;
  const dp = values.dp as number;
  const strategy = values.strategy as StrategyName;
  const ps = values.ps as number;
  checkStrategy(strategy, ps, values.maxStaleness as number | null, values.stalenessLr as boolean, { min, max, pp, dp });
  if (pp > 1 && (pp * dp !== max || min !== max)) {
    throw new ConfigError(
      'pp',
      String(pp),
      `such that stages x replicas is the world size, a fixed one: pp ${pp} x dp ${dp} = ${pp * dp} ranks, but the world is ${min === max ? max : `${min}..${max}`}`,
    );
  }
  if (pp === 1 && dp !== 1)
    throw new ConfigError('dp', String(dp), '1 without pipeline stages (pp): plain data parallelism uses every rank as a replica');
  const splitPoints = values.splitPoints === null ? null : (values.splitPoints as string).split(',').map(Number);
  if (splitPoints && splitPoints.length !== pp - 1) {
    throw new ConfigError('splitPoints', splitPoints.join(','), `${pp - 1} layer index(es) for ${pp} stages (pp)`);
  }
  if (pp > 1 && (values.microBatches as number) > (values.batchSize as number)) {
    throw new ConfigError(
      'microBatches',
      String(values.microBatches),
      `at most the batch size per replica (${values.batchSize as number})`,
    );
  }
  return { min, max, pp, dp, strategy, ps, splitPoints };
}

/** `slow` against the world (`max` ranks); null when not set. Throws ConfigError. */
function slowOf(raw: string | null, max: number): Record<number, number> | null {
  if (raw === null) return null;
  try {
    return parseSlow(raw, max);
  } catch (err) {
    if (!(err instanceof StragglerSpecError)) throw err;
    throw new ConfigError(
      'slow',
      raw,
      `RANK:FACTOR items with RANK from 0 to ${max - 1} (the world size - 1), each rank once, and FACTOR a finite number of at least 1: ${err.problem}`,
    );
  }
}

/** DDP's own options (the hook, balanced batches, robust aggregation and attacks), refused where they would do nothing. Throws ConfigError. */
function checkDdpOptions(
  values: Values,
  layout: { min: number; strategy: StrategyName; pp: number },
): Pick<TrainConfig, 'commHook' | 'aggregation' | 'attack'> {
  const { min, strategy, pp } = layout;
  const commHook = parseCommHook(values.commHook as string);
  checkCommHook(values.commHook as string, commHook, strategy, pp);
  if (values.balance === true && (strategy !== 'ddp' || pp > 1)) {
    const other =
      strategy !== 'ddp'
        ? `strategy ${strategy}, whose workers each take their own batches`
        : `pipeline stages (here pp ${pp}), where every stage of a replica takes the same batch`;
    throw new ConfigError(
      'balance',
      'true',
      `false (or left out) with ${other}: balanced batches split DDP's global batch between its ranks (leave out balance, or ${strategy !== 'ddp' ? 'strategy' : 'pp'})`,
    );
  }
  const aggregation = parseAggregation(values.aggregation as string);
  const attack = attackPlan(values.attack as string | null, values.attackers as number, min);
  checkRobust(values.aggregation as string, aggregation, attack, commHook, strategy, pp);
  return { commHook, aggregation, attack };
}

/** The model against its data: the mlp's hidden layer, the language model's text, the host's model and images. Throws ConfigError. */
function checkModel(values: Values): void {
  const hidden = values.hidden as number | null;
  if (hidden === 0 && values.model === 'mlp')
    throw new ConfigError(
      'hidden',
      '0',
      `from 1 to ${MAX_HIDDEN_UNITS} for the mlp, whose hidden layer is all it has (0, no hidden layer, is for the cnn)`,
    );
  checkLanguageModel(values.model as ModelKind, values.dataset as DatasetKind, values.context as number | null, hidden);
  if (values.streamData !== 'auto' && (values.dataset !== 'user' || values.model === 'lm')) {
    throw new ConfigError(
      'streamData',
      values.streamData as string,
      "auto (or left out) unless the dataset is the host's images (dataset user): the other data sets are held whole",
    );
  }
  if (hidden !== null && values.model === 'user')
    throw new ConfigError('hidden', String(hidden), "left out with model user: the host's model has the layers it was saved with");
}

/** The checked values as a TrainConfig (`checked`: what the checks made of their options). */
function configOf(
  values: Values,
  checked: Pick<
    TrainConfig,
    'min' | 'max' | 'pp' | 'dp' | 'strategy' | 'ps' | 'splitPoints' | 'slow' | 'commHook' | 'aggregation' | 'attack' | 'local'
  >,
): TrainConfig {
  const { min, max, pp, dp, strategy, ps, splitPoints, slow, commHook, aggregation, attack, local } = checked;
  const hidden = values.hidden as number | null;
  const devices = values.devices as number;
  return {
    model: values.model as ModelKind,
    hidden,
    dataset: values.dataset as DatasetKind,
    local,
    context: values.context as number | null,
    streamData: values.streamData as StreamModeName,
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
    voteWithGradients: values.voteWithGradients as boolean,
    backend: values.backend as BackendSetting,
    min,
    max,
    checkpointEvery: values.checkpointEvery as number,
    evalEvery: values.evalEvery as number,
    firstSample: values.firstSample as number,
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
    linkWindowBytes: values.linkWindowBytes as number | null,
    aggregation,
    attack,
  };
}

/**
 * The language model reads windows of text, and only it does: lm with text and text with lm,
 * `context` only with text, and the model's width (hidden) a multiple of its heads. Throws ConfigError.
 */
function checkLanguageModel(model: ModelKind, dataset: DatasetKind, context: number | null, hidden: number | null): void {
  // 'user' with lm is the host's text (npm start -- --data FILE.txt): the tab checks what the server offers.
  if (model === 'lm' && dataset !== 'text' && dataset !== 'user')
    throw new ConfigError(
      'dataset',
      dataset,
      "text (or user, the host's own text) with model lm: the language model predicts the next character of a text (leave out dataset, or choose another model)",
    );
  if (dataset === 'text' && model !== 'lm')
    throw new ConfigError('model', model, 'lm with dataset text: the text is windows of characters, which only the language model reads');
  if (context !== null && model !== 'lm')
    throw new ConfigError('context', String(context), "left out unless model is lm: it is the language model's window on the text");
  if (model === 'lm' && hidden !== null && (hidden < LM_DEFAULTS.heads || hidden % LM_DEFAULTS.heads !== 0 || hidden > MAX_LM_WIDTH)) {
    throw new ConfigError(
      'hidden',
      String(hidden),
      `a multiple of ${LM_DEFAULTS.heads} (the language model's heads) from ${LM_DEFAULTS.heads} to ${MAX_LM_WIDTH}: it is the model's width`,
    );
  }
}

/** The URL parameters that reproduce `config` (what a share link carries), in schema order. */
export function configParams(config: TrainConfig): URLSearchParams {
  const p = new URLSearchParams();
  const byName: Record<string, unknown> = {
    ...config,
    world: config.max,
    slow: config.slow ? formatSlow(config.slow) : null,
    commHook: formatCommHook(config.commHook),
    aggregation: formatAggregation(config.aggregation),
    attack: config.attack ? formatAttack(config.attack) : null,
    attackers: config.attack?.attackers ?? 0,
    ...localDataParams(config.local),
  };
  for (const spec of TRAIN_OPTIONS) {
    const v = byName[spec.name];
    if (v === null || v === undefined) continue;
    if (v === spec.defaultValue(byName) && (!spec.inForm || spec.optional)) continue;
    p.set(spec.name, String(v));
  }
  return p;
}
