/**
 * Whether this tab can take part at all, asked before it joins anything: a tab that cannot is
 * told why in plain words and never joins the group, so the others are not held up by a member
 * that fails at its first collective (no WebRTC), crashes mid-run (too little memory), or has no
 * backend that computes. Pure, apart from `tabAbilities` and `deviceMemoryGB`, which read the page.
 */
import { DEFAULT_CONTEXT, LM_DEFAULTS, localInputShape, type TrainConfig } from '../../src/jobs/train_config.ts';

/** A reason this tab cannot take part: a title, what happened, and what the person can do. */
export class CannotTrainError extends Error {
  override name = 'CannotTrainError';
  constructor(
    readonly title: string,
    detail: string,
    readonly action: string,
  ) {
    super(detail);
  }
}

/** What the page offers that training needs. */
export interface TabAbilities {
  /** `RTCPeerConnection` exists: the tabs exchange gradients over WebRTC data channels. */
  webrtc: boolean;
  /** `navigator.deviceMemory` in GB (Chromium only; rounded down, at most 8 in most versions), or null. */
  deviceMemoryGB: number | null;
  /** "Firefox 128", for the messages (optional). */
  browser?: string;
}

/** The datasets' shapes and sizes as the trainer loads them (trainer.ts: loadData). */
const DATA: Readonly<Record<Exclude<TrainConfig['dataset'], 'local'>, { inputShape: number[]; classes: number }>> = {
  mnist: { inputShape: [28, 28, 1], classes: 10 },
  synthetic: { inputShape: [16], classes: 4 },
  // The host's images, resized for the built-in models (harness.ts: OFFERED_IMAGE_SHAPE); a CSV's size is not known here.
  user: { inputShape: [28, 28, 1], classes: 10 },
  // Moby-Dick's chapters 1-20: 76 distinct characters; windows of `context` (64 when left out).
  text: { inputShape: [DEFAULT_CONTEXT], classes: 76 },
};

/** Every float of a model kept several times over: weights, gradients, optimizer slots, DDP's flat buffers, bucket copies and the all-reduce's chunks. */
export const PARAMETER_COPIES = 16;
/** TF.js, the backend and the page itself, whatever the job. */
export const BASELINE_BYTES = 64 * 2 ** 20;
/** A tab can count on this share of the device's memory (the browser, the system and other tabs hold the rest). */
export const MEMORY_SHARE = 0.5;

/** The model's parameters and the floats one sample's forward pass produces, as src/nn/models.ts builds it. */
export function modelSize(
  config: Pick<TrainConfig, 'model' | 'dataset' | 'hidden'> & { context?: number | null; local?: TrainConfig['local'] },
): {
  parameters: number;
  activationsPerSample: number;
} {
  // The host's model is known once loaded: not counted here (the baseline and the data still are).
  if (config.model === 'user') return { parameters: 0, activationsPerSample: 0 };
  // Each tab's own pictures: the session's size, colour and classes.
  const { inputShape, classes } =
    config.dataset === 'local'
      ? { inputShape: config.local ? localInputShape(config.local) : [32, 32, 3], classes: config.local?.classes.length ?? 2 }
      : DATA[config.dataset];
  if (config.model === 'lm') {
    // Embeddings, blocks of 12 d^2 + 13 d (qkv, projection, 4d MLP, two layer norms), final norm and head.
    const t = config.context ?? DEFAULT_CONTEXT;
    const d = config.hidden ?? LM_DEFAULTS.dModel;
    const blocks = LM_DEFAULTS.blocks;
    return {
      parameters: classes * d + t * d + blocks * (12 * d * d + 13 * d) + 2 * d + d * classes + classes,
      // Per block about 16 d per position (norms, q/k/v, MLP) and the heads' T x T scores twice; the logits.
      activationsPerSample: t * d + blocks * (t * 16 * d + 2 * LM_DEFAULTS.heads * t * t) + t * classes * 2,
    };
  }
  const inputs = inputShape.reduce((a, b) => a * b, 1);
  if (config.model === 'mlp') {
    const hidden = config.hidden ?? (inputShape.length > 1 ? 128 : 32);
    return { parameters: inputs * hidden + hidden + hidden * classes + classes, activationsPerSample: inputs + hidden + classes };
  }
  // cnn: conv 3x3x8, pool 2, conv 3x3x16, pool 2, flatten, [dense hidden], dense classes.
  const [h, w, c] = inputShape.length === 3 ? (inputShape as [number, number, number]) : [inputShape[0] ?? 1, 1, 1];
  const c1 = { h: h - 2, w: w - 2 };
  const p1 = { h: Math.floor(c1.h / 2), w: Math.floor(c1.w / 2) };
  const c2 = { h: p1.h - 2, w: p1.w - 2 };
  const p2 = { h: Math.floor(c2.h / 2), w: Math.floor(c2.w / 2) };
  const flat = p2.h * p2.w * 16;
  const hidden = config.hidden ?? 0;
  const head = hidden > 0 ? flat * hidden + hidden + hidden * classes + classes : flat * classes + classes;
  return {
    parameters: 9 * c * 8 + 8 + 9 * 8 * 16 + 16 + head,
    activationsPerSample: inputs + c1.h * c1.w * 8 + p1.h * p1.w * 8 + c2.h * c2.w * 16 + flat * 2 + hidden + classes,
  };
}

/** Bytes the dataset takes in the tab: MNIST is loaded whole (60k + 10k) as float32 plus its raw bytes while parsing. */
function datasetBytes(config: Pick<TrainConfig, 'dataset' | 'trainSize'>): number {
  if (config.dataset === 'mnist') return 70_000 * (784 * (4 + 1) + 5);
  // The text (UTF-16) and its ids (int32).
  if (config.dataset === 'text') return 201_646 * (2 + 4);
  const samples = (config.trainSize > 0 ? config.trainSize : 4096) + 1024;
  return samples * (16 * 4 + 4);
}

/** A generous estimate of the bytes this job holds in one tab. */
export function memoryNeedBytes(
  config: Pick<TrainConfig, 'model' | 'dataset' | 'hidden' | 'trainSize' | 'batchSize' | 'devices'> & { context?: number | null },
): number {
  const { parameters, activationsPerSample } = modelSize(config);
  const copies = Math.max(1, config.devices ?? 1);
  // Activations are kept for the backward pass, with their gradients: about three floats each.
  const activations = activationsPerSample * config.batchSize * 4 * 3;
  return BASELINE_BYTES + datasetBytes(config) + parameters * 4 * PARAMETER_COPIES * copies + activations;
}

const mb = (bytes: number) => `${Math.max(1, Math.round(bytes / 2 ** 20)).toLocaleString('en-US')} MB`;
const gb = (n: number) => `${n < 1 ? n.toFixed(2).replace(/0$/, '') : String(Math.round(n * 10) / 10)} GB`;

/**
 * Why this tab cannot take part in `config`'s job, or null when it can. Conservative in the
 * sense that matters to a class: it refuses only what would fail for sure (no WebRTC with other
 * tabs to talk to) or is far past what the device reports, since `deviceMemory` is coarse and a
 * wrongly refused laptop is a student who cannot join.
 */
export function preflight(config: TrainConfig, tab: TabAbilities): CannotTrainError | null {
  const others = config.max > 1;
  const theBrowser = tab.browser ? `This browser (${tab.browser})` : 'This browser';
  if (others && !tab.webrtc) {
    return new CannotTrainError(
      'This browser cannot join the training',
      `${theBrowser} has no WebRTC (RTCPeerConnection), which the tabs use to exchange what they learn with each other. This tab did not join, so the other tabs train on without it.`,
      'Open the link in a current Chrome, Edge, Firefox or Safari. If WebRTC was turned off (a privacy setting or an extension), turn it back on and reload this tab.',
    );
  }
  if (tab.deviceMemoryGB !== null && tab.deviceMemoryGB > 0) {
    const need = memoryNeedBytes(config);
    const budget = tab.deviceMemoryGB * 2 ** 30 * MEMORY_SHARE;
    if (need > budget) {
      const { parameters } = modelSize(config);
      return new CannotTrainError(
        'Not enough memory on this device',
        `This job needs about ${mb(need)} of memory in a tab (the ${config.dataset} data set, and the model's ${parameters.toLocaleString('en-US')} parameters with their gradients and optimizer state), and this device reports ${gb(tab.deviceMemoryGB)} in all, of which a tab can count on about half. This tab did not join${others ? ', so the other tabs train on without it' : ''}.`,
        'Join from a computer with more memory, or ask the host for a smaller job (fewer training samples, a smaller batch or model).',
      );
    }
  }
  return null;
}

/** When no backend could start (they all failed their start or their probe computation). */
export function noBackendError(reasons: readonly string[]): CannotTrainError {
  return new CannotTrainError(
    'This browser cannot run the model',
    `None of the ways to compute (WebGPU, WebGL, the CPU) worked in this tab: ${reasons.join('; ')}. This tab did not join, so the other tabs train on without it.`,
    'Reload this tab; if it happens again, open the link in another browser or on another computer, or update this browser.',
  );
}

/** `navigator.deviceMemory` (Chromium's, in GB), or null where the browser does not say. */
export function deviceMemoryGB(): number | null {
  const m = (navigator as Navigator & { deviceMemory?: unknown }).deviceMemory;
  return typeof m === 'number' && Number.isFinite(m) && m > 0 ? m : null;
}

/** This page's abilities. */
export function tabAbilities(browser?: string): TabAbilities {
  return {
    webrtc: typeof RTCPeerConnection !== 'undefined',
    deviceMemoryGB: deviceMemoryGB(),
    ...(browser === undefined ? {} : { browser }),
  };
}
