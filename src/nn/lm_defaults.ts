/**
 * The language model's shape in the training job: its width is `hidden`, the rest fixed (nanoGPT's
 * small char model, smaller). In a module of its own, without TF.js: the job's options
 * (train_config.ts) check the width against it, and the launcher reads those options without
 * loading TF.js (over a second of its start).
 */
export const LM_DEFAULTS = { dModel: 64, heads: 4, blocks: 2 } as const;
