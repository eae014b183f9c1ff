/**
 * torch.distributed.optim.DistributedOptimizer: given RRefs to parameters that live on several
 * workers, `step(contextId)` has each owner step its own parameters with the gradients
 * distributed autograd left there in that context. Each owner keeps one host optimizer per
 * DistributedOptimizer (SGD, Adam or AdamW, src/nn/optim.ts: torch's formulas, the same bits on
 * every backend), made at the first step with the options given here.
 */
import * as tf from '@tensorflow/tfjs';
import { Adam, AdamW, SGD, type AdamOptions, type HostOptimizer, type ParamLayout, type SGDOptions } from '../nn/optim.ts';
import type { RRef } from './rref.ts';
import { currentAgentAs } from './current.ts';

/** The host optimizers a DistributedOptimizer runs, by the name that crosses the wire. */
const OPTIMIZERS = { SGD, Adam, AdamW } as const;
export type OptimizerClass = (typeof OPTIMIZERS)[keyof typeof OPTIMIZERS];
type OptimizerName = keyof typeof OPTIMIZERS;

/** What the optimizer needs of the agent (agent.ts). */
export interface OptimizerHost {
  readonly rank: number;
  rpcAsync<R>(to: number, fn: string, args: unknown[]): Promise<R>;
  registerInternal(name: string, fn: (...args: never[]) => unknown): void;
  readonly autograd: { getGradients(contextId: string): Map<tf.Variable, tf.Tensor> };
}

const STEP = '__distributed_optimizer_step';

export class DistributedOptimizer {
  private static next = 1;
  /** Unique in the group: this worker's rank and a number. */
  readonly id: string;
  private readonly name: OptimizerName;

  /**
   * torch's DistributedOptimizer(optimizer_class, params_rref, **options): `host` is this page's
   * agent (initRpc's) unless given.
   */
  constructor(
    optimizer: OptimizerClass,
    private readonly params: Array<RRef<tf.Variable>>,
    private readonly options: SGDOptions | AdamOptions,
    private readonly host: OptimizerHost = currentAgentAs<OptimizerHost>(),
  ) {
    const name = (Object.keys(OPTIMIZERS) as OptimizerName[]).find((n) => OPTIMIZERS[n] === optimizer);
    if (!name) throw new TypeError('DistributedOptimizer runs SGD, Adam or AdamW (src/nn/optim.ts)');
    if (params.length === 0) throw new RangeError('DistributedOptimizer needs at least one parameter RRef');
    this.name = name;
    this.id = `${host.rank}.${DistributedOptimizer.next++}`;
  }

  /** One step of every parameter, each on its owner, with the gradients of context `contextId`. */
  async step(contextId: string): Promise<void> {
    const byOwner = new Map<number, Array<RRef<tf.Variable>>>();
    for (const p of this.params) byOwner.set(p.ownerRank, [...(byOwner.get(p.ownerRank) ?? []), p]);
    await Promise.all(
      [...byOwner].map(([owner, refs]) => this.host.rpcAsync(owner, STEP, [this.id, this.name, this.options, contextId, refs])),
    );
  }
}

/** The owner's side: one host optimizer per DistributedOptimizer, stepping this worker's parameters. */
export function serveDistributedOptimizer(host: OptimizerHost): void {
  // `last`: each optimizer's steps one after another (a step reads the parameters, awaits, writes them back).
  const optimizers = new Map<string, { name: OptimizerName; optimizer: HostOptimizer; last: Promise<unknown> }>();
  const step = async (id: string, name: OptimizerName, options: SGDOptions & AdamOptions, contextId: string, refs: RRef<tf.Variable>[]) => {
    if (!Object.hasOwn(OPTIMIZERS, name)) throw new TypeError(`no optimizer "${String(name)}" (SGD, Adam, AdamW)`);
    let entry = optimizers.get(id);
    if (!entry) {
      entry = { name, optimizer: name === 'SGD' ? new SGD(options) : new OPTIMIZERS[name](options), last: Promise.resolve() };
      optimizers.set(id, entry);
    }
    if (entry.name !== name) throw new TypeError(`optimizer ${id} is ${entry.name}, not ${name}`);
    try {
      const variables = refs.map((r) => r.localValue());
      if (!variables.every((v) => v instanceof tf.Variable)) throw new TypeError('every parameter RRef holds a tf.Variable');
      const grads = host.autograd.getGradients(contextId);
      const { optimizer } = entry;
      const stepped = entry.last.catch(() => {}).then(() => stepVariables(optimizer, variables, grads));
      entry.last = stepped;
      await stepped;
    } finally {
      for (const r of refs) r.release();
    }
    return null;
  };
  host.registerInternal(STEP, step as (...args: never[]) => unknown);
}

/**
 * One optimizer step of `variables` on the host, with their gradients (zero where the context has
 * none). Read back with data(): dataSync() reads zeros on the WebGPU backend here (PLATFORM.md).
 */
async function stepVariables(optimizer: HostOptimizer, variables: tf.Variable[], grads: Map<tf.Variable, tf.Tensor>): Promise<void> {
  const layout: ParamLayout[] = [];
  let offset = 0;
  for (const v of variables) {
    layout.push({ shape: [...v.shape], offset, size: v.size });
    offset += v.size;
  }
  const params = new Float32Array(offset);
  const flatGrads = new Float32Array(offset);
  for (const [i, v] of variables.entries()) {
    params.set((await v.data()) as Float32Array, layout[i]!.offset);
    const g = grads.get(v);
    if (g) flatGrads.set((await g.data()) as Float32Array, layout[i]!.offset);
  }
  optimizer.stepFlat(params, flatGrads, layout);
  variables.forEach((v, i) => {
    const { offset: at, size, shape } = layout[i]!;
    tf.tidy(() => v.assign(tf.tensor(params.subarray(at, at + size), shape)));
  });
}
