/**
 * torch.distributed.rpc's module functions: `initRpc` makes this worker's agent (on a process
 * group it is given, or one it joins), and `rpcSync`, `rpcAsync`, `remote`, `getWorkerInfo` and
 * `shutdown` act through it, as torch's functions act through the agent init_rpc made.
 *
 * JavaScript cannot block, so rpcSync returns a promise like rpcAsync: `await rpc.rpcSync(...)`
 * reads as torch's rpc_sync.
 */
import { initProcessGroup, type InitProcessGroupOptions } from '../c10d/init_process_group.ts';
import type { ProcessGroup } from '../c10d/process_group.ts';
import { RpcAgent, type RpcAgentOptions, type RpcFunction } from './agent.ts';
import { setCurrentAgent } from './current.ts';
import type * as tf from '@tensorflow/tfjs';
import type { RRef, WorkerInfo } from './rref.ts';

export interface InitRpcOptions extends RpcAgentOptions, Partial<InitProcessGroupOptions> {
  /**
   * The process group whose links carry the calls (its top-level group). Left out, initRpc joins
   * one with `url`, `session`, `token`, `worldSize` and `rank`, and shutdown destroys it.
   */
  group?: ProcessGroup;
  /** Functions other workers may call, by name (the same on every worker); more with `register`. */
  functions?: Record<string, RpcFunction>;
}

let current: { agent: RpcAgent; ownGroup: ProcessGroup | undefined } | undefined;

/**
 * torch's init_rpc: starts this worker's agent and waits until every worker of the group has
 * started its own (each says its name to the others). One agent per page at a time.
 */
export async function initRpc(options: InitRpcOptions): Promise<RpcAgent> {
  if (current) throw new Error(`RPC is already initialized on this page (as ${current.agent.name}): call rpc.shutdown() first`);
  const ownGroup = options.group ? undefined : await joinGroup(options);
  const group = options.group ?? ownGroup!;
  try {
    const agent = new RpcAgent(group.openMessageChannel(options.maxMessageBytes), group.worldSize, options);
    for (const [name, fn] of Object.entries(options.functions ?? {})) agent.register(name, fn);
    current = { agent, ownGroup };
    setCurrentAgent(agent);
    await agent.start(options.startTimeoutMs);
    return agent;
  } catch (err) {
    current = undefined;
    setCurrentAgent(undefined);
    await ownGroup?.destroy();
    throw err;
  }
}

async function joinGroup(options: InitRpcOptions): Promise<ProcessGroup> {
  const { url, session, token, worldSize } = options;
  if (url === undefined || session === undefined || token === undefined || worldSize === undefined)
    throw new TypeError('initRpc needs a group, or url, session, token and worldSize to join one');
  return initProcessGroup({ ...options, url, session, token, worldSize });
}

/** This page's agent; throws if initRpc has not run. */
export function currentAgent(): RpcAgent {
  if (!current) throw new Error('RPC is not initialized on this page: call initRpc({ name, ... }) first');
  return current.agent;
}

/** Calls `fn` on `to` and resolves with its result (torch's rpc_sync: await it). */
export function rpcSync<R = unknown>(
  to: string | number | WorkerInfo,
  fn: string,
  args: unknown[] = [],
  options: { timeoutMs?: number } = {},
) {
  return currentAgent().rpcAsync<R>(to, fn, args, options.timeoutMs);
}

/** Calls `fn` on `to`; the promise is torch's Future. */
export function rpcAsync<R = unknown>(
  to: string | number | WorkerInfo,
  fn: string,
  args: unknown[] = [],
  options: { timeoutMs?: number } = {},
) {
  return currentAgent().rpcAsync<R>(to, fn, args, options.timeoutMs);
}

/** Runs `fn` on `to`, keeping the result there; returns its RRef at once. */
export function remote<R = unknown>(
  to: string | number | WorkerInfo,
  fn: string,
  args: unknown[] = [],
  options: { timeoutMs?: number } = {},
): RRef<R> {
  return currentAgent().remote<R>(to, fn, args, options.timeoutMs);
}

/** Makes `fn` callable as `name` on this worker (torch calls functions by qualified name; here, by registered name). */
export function register(name: string, fn: RpcFunction): void {
  currentAgent().register(name, fn);
}

export function getWorkerInfo(name?: string): WorkerInfo {
  return currentAgent().getWorkerInfo(name);
}

/** torch's rpc.RRef(value): an RRef owned by this worker. */
export function localRRef<T>(value: T): RRef<T> {
  return currentAgent().localRRef(value);
}

/** torch.distributed.autograd's functions, through this page's agent. */
export const distAutograd = {
  /** `with dist_autograd.context() as context_id:` — runs `body` in a new context, then ends it everywhere. */
  context<T>(body: (contextId: string) => Promise<T>): Promise<T> {
    return currentAgent().autograd.context(body);
  },
  /** dist_autograd.backward(context_id, [loss]), with the loss as a synchronous function of what the context received. */
  backward(contextId: string, lossFn: () => tf.Scalar): Promise<number> {
    return currentAgent().autograd.backward(contextId, lossFn);
  },
  /** dist_autograd.get_gradients(context_id): this worker's variables and their gradients in the context. */
  getGradients(contextId: string): Map<tf.Variable, tf.Tensor> {
    return currentAgent().autograd.getGradients(contextId);
  },
};

/** torch's rpc.shutdown: graceful by default (see RpcAgent.shutdown); destroys the group initRpc joined. */
export async function shutdown(options: { graceful?: boolean; timeoutMs?: number } = {}): Promise<void> {
  if (!current) return;
  const { agent, ownGroup } = current;
  try {
    await agent.shutdown(options);
  } finally {
    current = undefined;
    setCurrentAgent(undefined);
    await ownGroup?.destroy();
  }
}
