/**
 * `rpc`: torch.distributed.rpc (docs/rpc.md). `initRpc` (also at the top), then the module
 * functions act through this page's agent; RRef, the agent, the errors; DistributedOptimizer
 * (torch.distributed.optim) and RemoteModule (torch.distributed.nn) are also at the top.
 */
export {
  initRpc,
  shutdown,
  rpcSync,
  rpcAsync,
  remote,
  register,
  getWorkerInfo,
  localRRef,
  currentAgent,
  type InitRpcOptions,
} from './rpc/api.ts';
export { RpcAgent, type RpcAgentOptions, type RpcFunction } from './rpc/agent.ts';
export { DEFAULT_RPC_TIMEOUT_MS } from './rpc/agent_options.ts';
export { RRef, type RRefProxy, type RRefRemoteProxy, type WorkerInfo } from './rpc/rref.ts';
export { RpcError, RpcTimeoutError, RpcRemoteError, RpcUnreachableError, RpcSerializationError, RpcLimitError } from './rpc/errors.ts';
export { DistributedOptimizer, type OptimizerClass } from './rpc/distributed_optimizer.ts';
export { RemoteModule, type RemoteModuleValue } from './rpc/remote_module.ts';
