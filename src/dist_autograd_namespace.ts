/**
 * `distAutograd`: torch.distributed.autograd through this page's RPC agent (`context`, `backward`,
 * `getGradients`); how gradients cross workers is in src/rpc/dist_autograd.ts and docs/rpc.md.
 */
import { distAutograd } from './rpc/api.ts';

export const { context, backward, getGradients } = distAutograd;
