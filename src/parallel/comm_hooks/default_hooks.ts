/**
 * torch's built-in DDP communication hooks (torch.distributed.algorithms.ddp_comm_hooks.
 * default_hooks): the plain all-reduce DDP uses without a hook, and the 16-bit compressions
 * `fp16_compress_hook` and `bf16_compress_hook`. None keeps state.
 */
import type { ProcessGroup, WireDtype } from '../../c10d/process_group.ts';
import type { CommHook, GradBucket } from './types.ts';

/**
 * The default (torch's `allreduce_hook`): a float32 ring all-reduce of the bucket, in place,
 * with 'avg'. The sum is divided by the world size on the owner of each segment, before the
 * all-gather, which is exactly what DDP does without a hook (torch divides by the world size
 * too: before, in its case; the same float32 values either way when the size is a power of two).
 */
export function allreduceHook(): CommHook {
  const hook: CommHook = {
    name: 'allreduce',
    reduce: (pg: ProcessGroup, bucket: GradBucket) => pg.allReduce(bucket.buffer, 'avg'),
  };
  plainHooks.add(hook);
  return hook;
}

const plainHooks = new WeakSet<CommHook>();

/**
 * Whether `hook` is one that `allreduceHook()` made: the float32 'avg' all-reduce, which DDP may
 * widen by a few values that ride along (`DistributedDataParallel.carry`) and still get the same bits.
 */
export function isPlainAllreduce(hook: CommHook): boolean {
  return plainHooks.has(hook);
}

/**
 * torch's `fp16_compress_hook`: the bucket travels as IEEE float16, half the bytes of float32.
 * The reduction itself is in float32: each hop's partial sums are decoded and added in float32;
 * the owner of each segment divides its float32 sum by the world size and only then encodes it
 * once, and every rank decodes those same 16-bit values. So every rank ends with the same bits,
 * rounded once to float16 (torch divides before the all-reduce, in float16, so that the sum
 * cannot overflow; here the division comes after decoding, in float32, which rounds the average
 * rather than the pre-divided contributions and keeps small gradients out of float16's
 * subnormal range; the partial sums on the wire can reach float16's limit of 65504 only when
 * the gradients themselves nearly do).
 */
export function fp16CompressHook(): CommHook {
  return compressHook('fp16_compress', 'float16');
}

/**
 * torch's `bf16_compress_hook`: as `fp16CompressHook`, in bfloat16 (float32's range, 8 bits of
 * precision): the same float32 reduction and single encoding per segment, every rank
 * bit-identical, the average divided by the world size in float32 before it is encoded.
 */
export function bf16CompressHook(): CommHook {
  return compressHook('bf16_compress', 'bfloat16');
}

function compressHook(name: string, wire: WireDtype): CommHook {
  return {
    name,
    reduce: (pg: ProcessGroup, bucket: GradBucket) => pg.allReduce(bucket.buffer, 'avg', { wire }),
  };
}
