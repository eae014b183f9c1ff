/**
 * torch.distributed.nn.RemoteModule: a module made on another worker and called from here, its
 * forward pass running where its parameters live (and, in a distributed autograd context, its
 * backward pass too). A module is any object with a `forward` method and its parameters as
 * `parameters()` (tf.Variable[]) or a TF.js layer's or model's `trainableWeights`.
 *
 * `remoteParameters()` gives RRefs to the parameters, for a DistributedOptimizer, as torch's
 * remote_parameters() does.
 */
import type * as tf from '@tensorflow/tfjs';
import type { RRef } from './rref.ts';
import { currentAgentAs } from './current.ts';

/** What a module made remotely has: a forward pass, and its parameters one of two ways. */
export interface RemoteModuleValue {
  forward(...args: never[]): unknown;
  parameters?(): tf.Variable[];
  trainableWeights?: Array<{ read(): tf.Variable }>;
}

/** What RemoteModule needs of the agent (agent.ts). */
export interface ModuleHost {
  remote<R>(to: string | number, fn: string, args: unknown[]): RRef<R>;
  rpcAsync<R>(to: number, fn: string, args: unknown[]): Promise<R>;
  registerInternal(name: string, fn: (...args: never[]) => unknown): void;
  /** An RRef of this worker to a value it owns, released once the reply carrying it is sent. */
  ownForReply<T>(value: T): RRef<T>;
}

const PARAMS = '__remote_module_parameters';

export class RemoteModule<M extends RemoteModuleValue = RemoteModuleValue> {
  /** The module on its worker (torch's module_rref). */
  readonly moduleRRef: RRef<M>;

  /**
   * Makes the module on worker `on` with the registered function `factory`, called with `args`
   * (torch's RemoteModule(remote_device, module_cls, args)); `host` is this page's agent unless given.
   */
  constructor(
    on: string | number,
    factory: string,
    args: unknown[] = [],
    private readonly host: ModuleHost = currentAgentAs<ModuleHost>(),
  ) {
    this.moduleRRef = host.remote<M>(on, factory, args);
  }

  /** The module's forward pass on its worker. */
  forward(...args: unknown[]): Promise<unknown> {
    return (this.moduleRRef.rpcSync() as unknown as { forward(...a: unknown[]): Promise<unknown> }).forward(...args);
  }

  /** RRefs to the module's parameters, where they live (torch's remote_parameters()). */
  remoteParameters(): Promise<Array<RRef<tf.Variable>>> {
    return this.host.rpcAsync(this.moduleRRef.ownerRank, PARAMS, [this.moduleRRef]);
  }

  /** Ends this reference to the module: its worker deletes it once no reference is left. */
  release(): void {
    this.moduleRRef.release();
  }
}

/** The owner's side: the parameters of a module it holds, as RRefs for the caller. */
export function serveRemoteModules(host: ModuleHost): void {
  const parameters = (module: RRef<RemoteModuleValue>) => {
    try {
      const m = module.localValue();
      const vars = typeof m.parameters === 'function' ? m.parameters() : (m.trainableWeights ?? []).map((w) => w.read());
      return vars.map((v) => host.ownForReply(v));
    } finally {
      module.release();
    }
  };
  host.registerInternal(PARAMS, parameters as (...args: never[]) => unknown);
}
