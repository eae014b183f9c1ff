/**
 * The functions a worker serves, by registered name (agent.ts): no code crosses, a call names a
 * function registered on every worker. While a served function's synchronous part runs, the table
 * knows for which caller, so that what it makes the worker keep is charged to that caller.
 */
import type { RpcFunction } from './agent_options.ts';

export class FunctionTable {
  private readonly functions = new Map<string, RpcFunction>();
  private servingFor: number | undefined;

  constructor(private readonly workerName: string) {}

  /** Makes `fn` callable by other workers as `name`; names starting with "__" are the agent's own. */
  register(name: string, fn: RpcFunction): void {
    if (typeof fn !== 'function') throw new TypeError(`rpc.register("${name}", ...) needs a function`);
    if (name.startsWith('__')) throw new RangeError(`function names starting with "__" are the agent's own: rename "${name}"`);
    this.functions.set(name, fn);
  }

  /** The agent's own services (DistributedOptimizer, RemoteModule). */
  registerInternal(name: string, fn: RpcFunction): void {
    this.functions.set(name, fn);
  }

  /** The rank whose call runs now (its synchronous part), if any. */
  get caller(): number | undefined {
    return this.servingFor;
  }

  /** Calls the function registered as `fn` for rank `from`; throws naming the registered ones if there is none. */
  invoke(fn: string, args: unknown[], from: number): unknown {
    const f = this.functions.get(fn);
    if (!f) {
      const known = [...this.functions.keys()].filter((n) => !n.startsWith('__')).join(', ') || 'none';
      throw new RangeError(
        `no function "${fn}" is registered on worker ${this.workerName} (registered: ${known}): register it on every worker`,
      );
    }
    return this.serving(from, () => (f as (...a: unknown[]) => unknown)(...args));
  }

  /** Runs `body` (a served function's synchronous part) for caller `from`. */
  serving<T>(from: number, body: () => T): T {
    const outer = this.servingFor;
    this.servingFor = from;
    try {
      return body();
    } finally {
      this.servingFor = outer;
    }
  }
}
