/**
 * The train job's --comm-hook: the DDP communication hook a CommHookSpec asks for, what goes to
 * runElastic for it, and the bytes the plain float32 all-reduce would have sent, for the
 * compression ratio.
 *
 * The baseline is computed, not measured: the bytes a rank sends in the all-reduce of
 * process_group.ts (the ring, or recursive doubling below the latency threshold; each message cut
 * into frames with a header each) follow from the element count, the world size, the rank and
 * the frame size alone (src/c10d/collective_bytes.ts). runElastic's groups use framing.ts's
 * DEFAULT_FRAME_BYTES and the default threshold (the train job sets neither). For the plain hook ('none') the
 * measured bytes (`BackwardResult.commBytes`) equal this baseline exactly (test/comm_bytes.test.ts
 * checks it against `pg.bytesSent()`), so the ratio is 1 by construction, not by approximation.
 */
import { DEFAULT_FRAME_BYTES } from '../../src/wire/framing.ts';
import { allReduceBytes } from '../../src/c10d/collective_bytes.ts';
import { bf16CompressHook, fp16CompressHook } from '../../src/parallel/comm_hooks/default_hooks.ts';
import { PeriodicModelAverager, postLocalSGD } from '../../src/parallel/comm_hooks/local_sgd.ts';
import { powerSGD, type PowerSGDHook } from '../../src/parallel/comm_hooks/powersgd.ts';
import type { CommHook } from '../../src/parallel/comm_hooks/types.ts';
import type { DiLoCoOptions } from '../../src/parallel/diloco/diloco.ts';
import type { CommHookSpec } from '../../src/jobs/train_config.ts';

/** The frame size of the train job's groups (see the header). */
export const TRAIN_FRAME_BYTES = DEFAULT_FRAME_BYTES;

/**
 * Bytes rank `rank` of `worldSize` sends in a float32 all-reduce of `elements` values in the train
 * job's groups (their frame size and the default latency threshold: the ring, or recursive
 * doubling for small buffers; see src/c10d/collective_bytes.ts). 0 for a world of one.
 */
export function plainAllReduceBytes(elements: number, rank: number, worldSize: number, frameBytes = TRAIN_FRAME_BYTES): number {
  return allReduceBytes(elements, rank, worldSize, { frameBytes });
}

/** What DDP without a hook sends from this rank per synchronised backward: one float32 all-reduce per bucket. */
export function denseStepBytes(
  buckets: ReadonlyArray<{ start: number; end: number }>,
  rank: number,
  worldSize: number,
  frameBytes = TRAIN_FRAME_BYTES,
  carried = 0,
): number {
  // Values that rode on the last bucket (runElastic's vote) count in both the step's bytes and this baseline.
  return buckets.reduce(
    (sum, b, i) => sum + plainAllReduceBytes(b.end - b.start + (i === buckets.length - 1 ? carried : 0), rank, worldSize, frameBytes),
    0,
  );
}

/** A hook made from a spec, with what the trainer needs besides it. */
export interface CommSetup {
  spec: CommHookSpec;
  /** The hook to register (undefined for 'none': DDP's own float32 all-reduce). */
  hook: CommHook | undefined;
  /** The same hook when it is PowerSGD, for its `lastStats`. */
  powerSGD: PowerSGDHook | undefined;
  /** localsgd: runElastic's `modelAverager` option. */
  modelAverager: { period: number; warmupSteps: number } | undefined;
  /** localsgd: which steps the models are averaged after (the same rule runElastic's averager follows). */
  averager: PeriodicModelAverager | undefined;
  /** diloco: runElastic's `diloco` option (DiLoCo is its own hook: `hook` stays undefined). */
  diloco: DiLoCoOptions | undefined;
}

/**
 * The hook for `spec`: fp16CompressHook, bf16CompressHook, powerSGD({ matrixApproximationRank,
 * startIter }), or postLocalSGD({ startStep }) with a model averager every `period` steps after
 * `startStep` (warmupSteps = startStep, so that the replicas stay identical through the warm-up).
 */
export function commSetup(spec: CommHookSpec): CommSetup {
  const none = { spec, hook: undefined, powerSGD: undefined, modelAverager: undefined, averager: undefined, diloco: undefined };
  switch (spec.kind) {
    case 'none':
      return none;
    case 'fp16':
      return { ...none, hook: fp16CompressHook() };
    case 'bf16':
      return { ...none, hook: bf16CompressHook() };
    case 'powersgd': {
      const hook = powerSGD({ matrixApproximationRank: spec.rank, startIter: spec.startIter, wire: spec.wire });
      return { ...none, hook, powerSGD: hook };
    }
    case 'localsgd': {
      const modelAverager = { period: spec.period, warmupSteps: spec.startStep };
      return {
        ...none,
        hook: postLocalSGD({ startStep: spec.startStep }),
        modelAverager,
        averager: new PeriodicModelAverager(modelAverager),
      };
    }
    case 'diloco':
      return {
        ...none,
        diloco: {
          syncEvery: spec.syncEvery,
          outerLr: spec.outerLr,
          outerMomentum: spec.outerMomentum,
          nesterov: spec.outerMomentum > 0,
          wire: spec.wire,
          fragments: Math.max(1, spec.stream),
          overlap: spec.overlap,
        },
      };
  }
}
