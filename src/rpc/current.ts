/**
 * This page's RPC agent, once initRpc made it (api.ts), for the classes torch builds without
 * naming an agent (DistributedOptimizer, RemoteModule). Held untyped here so that those modules
 * and the agent do not import each other; each reads it through the interface it needs.
 */
let current: unknown;

export function setCurrentAgent(agent: unknown): void {
  current = agent;
}

/** The page's agent, as the interface `T` its caller needs; throws if initRpc has not run. */
export function currentAgentAs<T>(): T {
  if (current === undefined) throw new Error('RPC is not initialized on this page: call initRpc({ name, ... }) first');
  return current as T;
}
