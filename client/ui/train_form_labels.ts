/**
 * The train job's options in words, for the create form (session_link.ts): each option's label
 * and hint, keyed by its name in the job's schema (src/jobs/train_config.ts, which holds the
 * rules and is shared with the launcher). A Record over TrainOptionName: an option without a
 * label, or a label for no option, does not compile.
 */
import { DEFAULT_LR, type TrainOptionName } from '../../src/jobs/train_config.ts';
import {
  COMM_HOOK_FORMS,
  COMM_HOOK_NAMES,
  DEFAULT_COMM_HOOK_START,
  DEFAULT_DILOCO_OUTER_LR,
  DEFAULT_DILOCO_OUTER_MOMENTUM,
  type CommHookSpec,
} from '../../src/jobs/comm_hook_spec.ts';

export interface OptionText {
  label: string;
  hint?: string;
  /** A select's words for its values (the schema's presets or choices), where they differ from the values. */
  choiceLabels?: Readonly<Record<string, string>>;
}

/**
 * What each communication hook does, in words; its form (names, items, wire words) is printed
 * from the grammar's one rule. A Record over the hooks' kinds: a new hook without words does not compile.
 */
const COMM_HOOK_WORDS: Readonly<Record<CommHookSpec['kind'], string>> = {
  none: 'the float32 all-reduce',
  fp16: '16-bit values on the wire, half the bytes',
  bf16: 'the same with bfloat16 values',
  powersgd: `low-rank compression (PowerSGD) of rank RANK after START plain steps (default ${DEFAULT_COMM_HOOK_START}); a last wire item sends its matrices 16-bit`,
  localsgd: `local steps, the models averaged every H steps, after START averaged steps (default ${DEFAULT_COMM_HOOK_START})`,
  diloco: `DiLoCo, for slow links: H inner steps of the optimizer on each tab’s own samples, then an outer step with the averaged change of the weights (Nesterov SGD, OUTER_LR default ${DEFAULT_DILOCO_OUTER_LR}, MOMENTUM ${DEFAULT_DILOCO_OUTER_MOMENTUM}); streamP: P fragments with staggered outer steps, each all-reduce behind the next D inner steps; a last wire item sends it 16-bit or int8`,
};

/** The commHook option's hint: every form of the grammar, with what it does. */
function commHookHint(): string {
  const forms = COMM_HOOK_NAMES.map((k) => `${COMM_HOOK_FORMS[k]}: ${COMM_HOOK_WORDS[k]}.`);
  return `How DDP sends each step’s gradients. ${forms.join(' ')} Not with parameter servers or pipelines.`;
}

/** Every option's label and hint, whether the form shows it (`inForm` in the schema) or not. */
export const TRAIN_FORM_LABELS: Readonly<Record<TrainOptionName, OptionText>> = {
  world: {
    label: 'World size (tabs)',
    hint: 'How many tabs train together; training starts when all have joined (or, for an elastic session, once the minimum has and no more arrive).',
  },
  min: {
    label: 'Keep training with at least (tabs)',
    // The form replaces this with a sentence about the numbers typed (session_link.ts's minNote).
    hint: 'Tabs may close, reload or join while the session runs: training goes on while at least this many are in. Set it to the world size for a fixed size, which pauses whenever a tab leaves.',
  },
  max: {
    label: 'Train with at most (tabs)',
    hint: 'Tabs beyond this many are told the session is full. Default: the world size.',
  },
  model: {
    label: 'Model',
    hint: 'lm: a small transformer that learns to write like its text (dataset text). user: the model the host offers (npm start -- --model DIR).',
  },
  hidden: {
    label: 'Hidden units',
    hint: 'Width of the hidden dense layer: the mlp’s (default 128 on MNIST, 32 on synthetic data), or one the cnn adds before its classifier (default 0, none; 128 is the usual MNIST CNN).',
  },
  dataset: {
    label: 'Dataset',
    hint: "text: Moby-Dick's first 20 chapters, for model lm. user: the images, CSV or text the host offers (npm start -- --data DIR|FILE.csv|FILE.txt; a text goes with model lm). Each tab's own pictures: every tab takes pictures of the classes below with its camera or from files; the pictures never leave the tab, only gradients do.",
    choiceLabels: { local: "each tab's own pictures" },
  },
  classes: {
    label: 'Classes',
    hint: `The things the model tells apart, separated by commas (2 to 10; e.g. rock,paper,scissors). Every tab takes its own pictures of each.`,
  },
  imageSize: {
    label: 'Picture size (px)',
    hint: 'Each picture is cut square and shrunk to this many pixels a side in its tab (32 is quick; 64 sees more detail, 4 times the work).',
  },
  color: {
    label: 'Colours',
    hint: 'rgb keeps the colours; gray keeps only brightness (3 times less work, for shapes whose colour does not matter).',
    choiceLabels: { rgb: 'colour (rgb)', gray: 'grey' },
  },
  streamData: {
    label: 'Stream the data',
    hint: "The host's images: fetched as the steps need them (on), all at the start (off), or on once they would take more than 256 MB in a tab (auto).",
  },
  context: { label: 'Context', hint: 'Characters the language model sees at once (text only; default 64).' },
  batchSize: {
    label: 'Batch size per rank',
    hint: 'The global batch is this times the world size.',
  },
  optimizer: { label: 'Optimizer' },
  lr: {
    label: 'Learning rate',
    hint: `Default ${DEFAULT_LR.adam} for adam, ${DEFAULT_LR.sgd} for sgd.`,
  },
  epochs: { label: 'Epochs' },
  steps: {
    label: 'Steps (optional)',
    hint: 'Stop after this many steps in all, whatever the epochs say. Leave empty to train whole epochs.',
  },
  timeLimit: {
    label: 'Time limit (seconds)',
    hint: 'Stop training once this many seconds have passed since the tab joined, whatever the epochs say: every tab asks to stop, and the run ends at its next step (with parameter servers, when server 0 next answers a worker) and evaluates as usual. Leave empty for no limit.',
  },
  trainSize: {
    label: 'Training samples (optional)',
    hint: 'Train on the first N samples only, for a short run. Leave empty for the whole training set.',
  },
  testSize: {
    label: 'Test samples',
    hint: 'Evaluate on the first N test samples only (a slow device, a short run). 0: the whole test set.',
  },
  backend: {
    label: 'Backend',
    hint: 'auto times a few steps of this model on each backend the tab has and keeps the fastest (the tab shows the figures). If a tab has no WebGPU it falls back and says which backend it uses.',
  },
  seed: { label: 'Seed' },
  shuffle: { label: 'Shuffle' },
  balance: {
    label: 'Balance batches by speed',
    hint: 'DDP: a slower tab gets fewer of each step’s samples (gradients weighed by share, so the result equals one rank at the global batch); false gives every rank the same batch, as torch.',
  },
  voteWithGradients: {
    label: 'Vote with the gradients',
    hint: 'DDP: each step’s stop/join vote and metrics ride on its gradient all-reduce (one meeting point per step); false gives the vote an all-gather of its own.',
  },
  checkpointEvery: { label: 'Checkpoint every (steps)' },
  evalEvery: { label: 'Evaluate every (steps)' },
  firstSample: {
    label: 'First sample after (steps)',
    hint: 'The language model writes a sample after N steps, then after 2N, 4N, 8N ..., besides at every evaluation (0: only there).',
  },
  pp: {
    label: 'Pipeline stages',
    hint: 'Split the model into this many stages, one per tab (model parallelism); the world is stages x replicas tabs.',
  },
  dp: { label: 'Pipeline replicas' },
  microBatches: {
    label: 'Micro-batches',
    hint: 'Each batch is cut into this many micro-batches that flow through the pipeline one after another.',
  },
  schedule: { label: 'Pipeline schedule' },
  activationDtype: { label: 'Activations on the wire' },
  splitPoints: {
    label: 'Pipeline split points',
    hint: 'The layer index where each stage after the first starts (pp - 1 of them, comma-separated). Default: balanced by parameter count.',
  },
  strategy: {
    label: 'Training strategy',
    hint: 'ddp: every tab holds the model and the gradients are averaged each step. ps: some tabs (parameter servers) hold the variables and the others (workers) pull them and push gradients without waiting for each other (asynchronous). central: one server, and each step applies the workers’ averaged gradients (TensorFlow’s CentralStorageStrategy).',
  },
  ps: {
    label: 'Parameter servers (tabs)',
    hint: 'With strategy ps: how many tabs hold the variables, split between them; every other tab is a worker, so at most the world size - 1. Strategy central has exactly one.',
  },
  maxStaleness: {
    label: 'Max staleness (updates)',
    hint: 'With strategy ps: a server drops a push computed from weights more than this many updates old (its samples count as stale). Leave empty for no bound.',
  },
  stalenessLr: {
    label: 'Scale stale gradients',
    hint: 'With strategy ps: each push’s gradients are scaled by 1/(1 + staleness), so a stale push moves the weights less (for SGD, a smaller learning rate).',
  },
  slow: {
    label: 'Slow ranks',
    hint: 'RANK:FACTOR, comma-separated: that rank waits in proportion to its own compute, FACTOR times slower in all (a straggler on demand, e.g. 3:4).',
  },
  commHook: {
    label: 'Gradient communication',
    hint: commHookHint(),
  },
  linkWindowBytes: {
    label: 'Link window (bytes)',
    hint: "How much a link may have on the way that the other tab has not taken yet (0: no limit). The library's 128 KiB keeps both directions of a slow link moving; a larger one lets a busy tab's peers send more while it computes.",
  },
  devices: {
    label: 'Devices per tab',
    hint: 'Workers per tab, each with its own copy of the model on its own backend; every batch is split between them and their gradients combined (DataParallel). On the cpu and wasm backends each Worker uses another CPU core. Not with parameter servers or pipelines.',
  },
  resumeFrom: { label: 'Resume from session' },
  aggregation: {
    label: 'Aggregation',
    hint: 'How the tabs’ gradients are combined each step: the mean, or a robust rule that keeps one hostile or broken tab from steering everyone’s model (each tab then sends its gradients to every other: N/2 times the traffic).',
    choiceLabels: { mean: 'mean', 'trimmed-mean:1': 'trimmed mean', median: 'median', 'centered-clip': 'centered clipping' },
  },
  attack: {
    label: 'Attack (for measuring defences)',
    hint: 'scale, flip, noise or alie: the last tabs (attackers) send hostile gradients, to measure what the aggregation holds off. Never for a real run.',
  },
  attackers: { label: 'Attacking tabs', hint: 'How many of the last ranks play the attack (at least one tab stays honest).' },
};

/**
 * What the create form starts with where that differs from a link's default: a session made on
 * the page is elastic (min 1), while a link without `min` keeps the fixed size it always meant.
 * A class's tabs come and go: sessions made on the page keep training with whoever is there. And
 * a session is made for several tabs: the world starts at 3, as the Quick demo's.
 */
export const FORM_DEFAULTS: Readonly<Partial<Record<TrainOptionName, unknown>>> = { world: 3, min: 1 };
