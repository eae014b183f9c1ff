import type { ProcessGroup } from '../process_group.ts';
/** One DDP bucket as a hook sees it (torch's GradBucket). */
export interface GradBucket {
  /** The bucket's index (0 is the first reduced, holding the last parameters). */
  index: number;
  /** The bucket's flat gradients (this rank's, not yet averaged). The hook may reduce in place. */
  buffer: Float32Array;
  /** The parameters in the bucket: index into the model's trainable weights, shape, and where it starts in `buffer` (elements). */
  parameters: Array<{ index: number; shape: number[]; offset: number; size: number }>;
  /** The step being trained (1-based), for hooks that change behaviour with it (PowerSGD's start_iter, post-local SGD). */
  step: number;
  /** Whether this is the step's last bucket. */
  isLast: boolean;
}
/** State a hook keeps across steps, for checkpoints and joiners: plain numbers in `meta`, arrays in `tensors`. */
export interface CommHookState { name: string; meta: Record<string, number | string | boolean | null>; tensors: Record<string, Float32Array> }
/** torch's comm hook: returns the bucket's gradients averaged over `pg` (the same on every rank). */
export interface CommHook {
  readonly name: string;
  reduce(pg: ProcessGroup, bucket: GradBucket): Promise<Float32Array>;
  stateDict?(): CommHookState;
  loadStateDict?(state: CommHookState): void;
}
