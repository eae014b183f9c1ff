/** The RPC agent's options (agent.ts) and the rule for worker names. */

/** A function other workers may call by name. Its arguments and result cross as codec.ts allows. */
export type RpcFunction = (...args: never[]) => unknown;

export interface RpcAgentOptions {
  /**
   * This worker's name (torch's rule: letters, digits, "_", "-", ":" and ".", up to 128), or a
   * function of its rank, for a page that learns its rank when the group forms.
   */
  name: string | ((rank: number) => string);
  /** A call's default timeout (torch's default: 60 s); 0: none. */
  rpcTimeoutMs?: number;
  /** How long start() waits for every worker to say its name. Default 60 s. */
  startTimeoutMs?: number;
  /** The largest message either way (arguments or result, with their tensors). Default 64 MiB. */
  maxMessageBytes?: number;
  /** Calls from one worker running here at once; more are refused with an error. Default 1024. */
  maxCallsPerWorker?: number;
  /**
   * RRef values and references this worker keeps at once for one caller (each charged to the rank
   * that made it keep them: the caller of remote(), the worker that forked a reference, ...);
   * more are refused with RpcLimitError naming the caller. Default 65,536 per caller.
   */
  maxOwnedRRefs?: number;
  /** Distributed autograd contexts one worker may have open here at once; more are refused with RpcLimitError. Default 1,024 per caller. */
  maxAutogradContexts?: number;
}

/** A worker's name: torch's rule. */
export const NAME = /^[A-Za-z0-9_\-:.]{1,128}$/;
export const DEFAULT_RPC_TIMEOUT_MS = 60_000;
