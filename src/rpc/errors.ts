/**
 * The RPC framework's errors: each names the worker and the function, and says why the call
 * failed (it timed out, the worker is gone, the function threw there, or it is not registered),
 * as torch's RPC errors carry the callee's name and the remote exception's text.
 */

/** Any failed RPC: which worker, which function. */
export class RpcError extends Error {
  constructor(
    message: string,
    /** The callee's name. */
    readonly worker: string,
    /** The function called (or the RRef operation: toHere, a method's name). */
    readonly fn: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'RpcError';
  }
}

/** No reply within the call's timeout (torch's default is 60 s; `rpcTimeoutMs`). */
export class RpcTimeoutError extends RpcError {
  constructor(
    worker: string,
    fn: string,
    readonly timeoutMs: number,
  ) {
    super(`rpc to ${worker} calling "${fn}" timed out after ${timeoutMs} ms with no reply`, worker, fn);
    this.name = 'RpcTimeoutError';
  }
}

/** The function threw on the callee: its error's type and message, as the callee reported them. */
export class RpcRemoteError extends RpcError {
  constructor(
    worker: string,
    fn: string,
    /** The remote error's class name (e.g. "TypeError"). */
    readonly remoteType: string,
    readonly remoteMessage: string,
  ) {
    super(`rpc to ${worker} calling "${fn}" failed there with ${remoteType}: ${remoteMessage}`, worker, fn);
    this.name = 'RpcRemoteError';
  }
}

/**
 * The callee (or the RRef's owner) cannot be reached: its tab closed or froze, the links broke,
 * or this agent shut down. `cause` is the group's error (PeerLostError names the rank).
 */
export class RpcUnreachableError extends RpcError {
  constructor(worker: string, fn: string, why: string, options?: { cause?: unknown }) {
    super(`rpc to ${worker} calling "${fn}" failed: ${why}`, worker, fn, options);
    this.name = 'RpcUnreachableError';
  }
}

/** A value that cannot cross to another worker (a function, a class instance other than a tensor or an RRef, ...). */
export class RpcSerializationError extends TypeError {
  constructor(
    message: string,
    /** Where in the arguments or result: "args[1].weights", say. */
    readonly path: string,
  ) {
    super(`${path}: ${message}`);
    this.name = 'RpcSerializationError';
  }
}

/**
 * A caller reached one of a worker's per-caller bounds (the RRefs it makes the worker keep, its
 * autograd contexts there): which worker refused, for which caller, which bound and what to do.
 * Each caller has its own share, so one member filling its own leaves every other one served.
 * It crosses to the caller as an RpcRemoteError whose remoteType is "RpcLimitError".
 */
export class RpcLimitError extends RangeError {
  constructor(
    /** The worker that refused. */
    readonly worker: string,
    /** The caller whose share is full (the rank the link attests, never a name from the message). */
    readonly caller: string,
    /** The option that sets the bound: "maxOwnedRRefs", "maxAutogradContexts". */
    readonly bound: string,
    readonly limit: number,
    what: string,
    advice: string,
  ) {
    super(`${worker} already keeps ${limit} ${what} for ${caller}, its bound per caller (${bound}): ${advice}`);
    this.name = 'RpcLimitError';
  }
}
