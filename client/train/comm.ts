/**
 * The train job's --comm-hook: the DDP communication hook a CommHookSpec asks for, what goes to
 * runElastic for it, and the bytes the plain float32 all-reduce would have sent, for the
 * compression ratio.
 *
 * The baseline is computed, not measured: the bytes a rank sends in the ring all-reduce of
 * process_group.ts (reduce-scatter then all-gather, `segments` of ring.ts, each message cut into
 * frames by framing.ts's `frames` with its HEADER_BYTES header) follow from the element count,
 * the world size, the rank and the frame size alone. runElastic's groups use framing.ts's
 * DEFAULT_FRAME_BYTES (the train job sets no maxFrameBytes). For the plain hook ('none') the
 * measured bytes (`BackwardResult.commBytes`) equal this baseline exactly (test/comm_bytes.test.ts
 * checks it against `pg.bytesSent()`), so the ratio is 1 by construction, not by approximation.
 */
import { DEFAULT_FRAME_BYTES, HEADER_BYTES } from '../../src/c10d/framing.ts';
import { allGatherStep, reduceScatterStep, segments } from '../../src/c10d/ring.ts';
import { bf16CompressHook, fp16CompressHook } from '../../src/parallel/comm_hooks/default_hooks.ts';
import { PeriodicModelAverager, postLocalSGD } from '../../src/parallel/comm_hooks/local_sgd.ts';
import { powerSGD, type PowerSGDHook } from '../../src/parallel/comm_hooks/powersgd.ts';
import type { CommHook } from '../../src/parallel/comm_hooks/types.ts';
import type { CommHookSpec } from '../../src/jobs/train_config.ts';

/** The frame size of the train job's groups (see the header). */
export const TRAIN_FRAME_BYTES = DEFAULT_FRAME_BYTES;

/** Bytes on the wire for one message of `payload` bytes: the payload plus a header per frame (an empty message is one header-only frame). */
export function messageBytes(payload: number, frameBytes = TRAIN_FRAME_BYTES): number {
  const chunk = Math.floor((frameBytes - HEADER_BYTES) / 4) * 4;
  return payload + HEADER_BYTES * Math.max(1, Math.ceil(payload / chunk));
}

/**
 * Bytes rank `rank` of `worldSize` sends in a float32 ring all-reduce of `elements` values:
 * n - 1 reduce-scatter messages and n - 1 all-gather messages, each one segment (about
 * elements / n values), with their frame headers. About 2(n-1)/n x 4 x elements. 0 for a world
 * of one, which sends nothing.
 */
export function ringAllReduceBytes(elements: number, rank: number, worldSize: number, frameBytes = TRAIN_FRAME_BYTES): number {
  if (worldSize <= 1) return 0;
  const segs = segments(elements, worldSize);
  const sent = (index: number) => messageBytes((segs[index]!.end - segs[index]!.start) * 4, frameBytes);
  let bytes = 0;
  for (let s = 0; s < worldSize - 1; s++) {
    bytes += sent(reduceScatterStep(rank, worldSize, s).send);
    bytes += sent(allGatherStep(rank, worldSize, s).send);
  }
  return bytes;
}

/** What DDP without a hook sends from this rank per synchronised backward: one float32 ring all-reduce per bucket. */
export function denseStepBytes(buckets: ReadonlyArray<{ start: number; end: number }>, rank: number, worldSize: number, frameBytes = TRAIN_FRAME_BYTES): number {
  return buckets.reduce((sum, b) => sum + ringAllReduceBytes(b.end - b.start, rank, worldSize, frameBytes), 0);
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
}

/**
 * The hook for `spec`: fp16CompressHook, bf16CompressHook, powerSGD({ matrixApproximationRank,
 * startIter }), or postLocalSGD({ startStep }) with a model averager every `period` steps after
 * `startStep` (warmupSteps = startStep, so that the replicas stay identical through the warm-up).
 */
export function commSetup(spec: CommHookSpec): CommSetup {
  const none = { spec, hook: undefined, powerSGD: undefined, modelAverager: undefined, averager: undefined };
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
      return { ...none, hook: postLocalSGD({ startStep: spec.startStep }), modelAverager, averager: new PeriodicModelAverager(modelAverager) };
    }
  }
}
