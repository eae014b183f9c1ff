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
  /** RRef values this worker keeps at once for others. Default 65,536. */
  maxOwnedRRefs?: number;
}

/** A worker's name: torch's rule. */
export const NAME = /^[A-Za-z0-9_\-:.]{1,128}$/;
export const DEFAULT_RPC_TIMEOUT_MS = 60_000;
