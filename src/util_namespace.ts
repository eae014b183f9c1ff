/**
 * `util`: small helpers a script may want (as tfjs-core's `tf.util`): random generators with
 * torch's and the sampler's streams, a float32 hash, session tokens, the launcher's argument parsing.
 */
export { Mt19937, randperm, epochOrder } from './datasets/sampler.ts';
export { Mulberry32 } from './datasets/synthetic.ts';
export { hashFloat32 } from './wire/hash.ts';
export { newSessionToken, isSessionToken, withToken, tokenFromFragment } from './wire/session_token.ts';
export { parseScriptArgs } from './jobs/launch_context.ts';
