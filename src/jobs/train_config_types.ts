/**
 * The training job's configuration as data: the choices each option offers, the bounds the
 * schema checks against, the resulting `TrainConfig` and what the trainer reads off it (its host
 * optimizer, when the language model writes). Apart from the schema and its rules
 * (train_config.ts), which parse into it, so that that file stays the schema.
 */
import type { CommHookSpec } from './comm_hook_spec.ts';
import type { AggregationConfig, AttackConfig } from './aggregation_spec.ts';
import type { LocalDataConfig } from './local_data_spec.ts';

/** 'lm': a small character-level transformer (src/nn/language_model.ts), on 'text'. 'user': the model the host offers (npm start -- --model DIR; signaling/offer.ts). */
export const MODELS = ['mlp', 'cnn', 'lm', 'user'] as const;
/**
 * 'text': chapters 1-20 of Moby-Dick as windows of characters (datasets/), for 'lm'. 'user': the data the host offers (npm start -- --data DIR|FILE.csv|FILE.txt; a text is for 'lm').
 * 'local': each tab's own pictures, from its camera or files, which never leave it (the classes set by the host: TrainConfig.local).
 */
export const DATASETS = ['mnist', 'synthetic', 'text', 'user', 'local'] as const;
export const OPTIMIZERS = ['adam', 'sgd'] as const;
export const BACKENDS = ['webgpu', 'webgl', 'wasm', 'cpu'] as const;
export const SCHEDULE_KINDS = ['gpipe', '1f1b'] as const;
export const ACTIVATION_DTYPE_NAMES = ['float32', 'float16'] as const;
/** ddp: every rank a replica; ps: asynchronous parameter servers; central: CentralStorageStrategy (one server, synchronous). */
export const STRATEGIES = ['ddp', 'ps', 'central'] as const;
/** The host's images: loaded as the steps need them ('on'), all at the start ('off'), or by their size ('auto': above 256 MiB decoded). */
export const STREAM_MODES = ['auto', 'on', 'off'] as const;

export type ModelKind = (typeof MODELS)[number];
export type DatasetKind = (typeof DATASETS)[number];
export type OptimizerKind = (typeof OPTIMIZERS)[number];
export type BackendName = (typeof BACKENDS)[number];
/**
 * What a job asks for: a backend, or `auto`, which times a few training steps of the job's model
 * on each backend a tab has and keeps the fastest (client/train/backend.ts); tabs may then differ,
 * as in any mixed fleet, with bit-identical replicas.
 */
export const BACKEND_SETTINGS = ['auto', ...BACKENDS] as const;
export type BackendSetting = (typeof BACKEND_SETTINGS)[number];
export type ScheduleName = (typeof SCHEDULE_KINDS)[number];
export type ActivationDtypeName = (typeof ACTIVATION_DTYPE_NAMES)[number];
export type StrategyName = (typeof STRATEGIES)[number];
export type StreamModeName = (typeof STREAM_MODES)[number];

/** The job every tab of a session runs; all tabs of a session must agree on it. */
export interface TrainConfig {
  model: ModelKind;
  /** Width of the model's hidden dense layer (ModelSpec.hidden; the language model's width); null: the model's default (mlp 128 on MNIST, cnn none, lm 64). */
  hidden: number | null;
  dataset: DatasetKind;
  /** Dataset 'local' (each tab's own pictures): the classes, the pictures' size and colour; null for every other dataset. */
  local: LocalDataConfig | null;
  /** The text's window (the language model's context), characters; null unless the model is lm (then 64 when left out). */
  context: number | null;
  /** The host's images (dataset user): streamed as the steps need them, loaded at the start, or by their size (src/datasets/streamed.ts). */
  streamData: StreamModeName;
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
   * weighed by share (runElastic's balance). false: DistributedSampler's equal shards, as torch.
   * Default true with DDP; false, and refused if given true, with pipelines and parameter servers.
   */
  balance: boolean;
  /** DDP: the step's vote rides on the gradients' all-reduce (runElastic's voteWithGradients); false: a vote of its own after each step. */
  voteWithGradients: boolean;
  backend: BackendSetting;
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
  /**
   * The language model writes its first sample after this many steps N, then after 2N, 4N, 8N
   * ..., besides at every evaluation (0: only there): its writing shows early, and the samples,
   * each about 4 steps' time on the cpu backend (120 forwards of one window), soon cost little.
   */
  firstSample: number;
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
  /**
   * DDP: each link's credit window in bytes (how much may be on the way that the peer's page has
   * not taken; 0: no window), null for the library's default. A page busy in a step on the cpu
   * backend takes nothing until it yields, so a link moves at most a window per yield.
   */
  linkWindowBytes: number | null;
  /**
   * DDP: how the tabs' gradients are combined (with DiLoCo, its pseudo-gradients): the mean, or a
   * robust kind (trimmed mean, median, centered clipping) that keeps one hostile or broken tab
   * from moving every replica (src/parallel/robust/). `{ kind: 'mean' }` unless asked for.
   */
  aggregation: AggregationConfig;
  /** FOR MEASURING DEFENCES ONLY: the attack the last `attackers` ranks play on their own gradients (attackPlanOf makes the library's plan); null: none. */
  attack: AttackConfig | null;
}

/** Most devices (Workers) a tab may run: each holds its own copy of the model and its backend. */
export const MAX_DEVICES_PER_TAB = 16;

/** The widest language model the job builds (its width is `hidden`). */
export const MAX_LM_WIDTH = 1024;

/** Widest hidden layer the job builds (a 784 x 4096 matrix is 12.8 MB of gradients per step). */
export const MAX_HIDDEN_UNITS = 4096;

/** The language model's window on the text when left out, and the longest one (attention costs T^2 per head). */
export const DEFAULT_CONTEXT = 64;
export const MAX_CONTEXT = 512;

/** Largest session the page offers (the form's bound and the URL's). */
export const MAX_WORLD_SIZE = 64;

/** The learning rate each optimizer defaults to (measured on MNIST, see README). */
export const DEFAULT_LR: Record<OptimizerKind, number> = { adam: 0.003, sgd: 0.05 };

/** Whether the language model writes after `step` besides at evaluations: after N, 2N, 4N, 8N ... (N = `first`; 0: never). */
export function sampleDue(step: number, first: number): boolean {
  if (first <= 0 || step % first !== 0) return false;
  const k = step / first;
  return (k & (k - 1)) === 0;
}
