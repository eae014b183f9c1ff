/**
 * PyTorch's tutorial "Distributed Pipeline Parallelism Using RPC", ported: a model split into two
 * shards, each on its own worker; the master (rank 0) holds their RRefs, cuts each batch into
 * micro-batches and drives them through both shards, so shard 1 works on one micro-batch while
 * shard 2 works on the one before: as the tutorial's, each micro-batch goes as an RRef
 * (`x_rref = RRef(x)`), shard 1 keeps its output where it is (`p1_rref.remote().forward(x_rref)`),
 * and shard 2 fetches it by that RRef inside its own forward (`x_rref.to_here()`). Distributed
 * autograd takes the gradients back through both shards, and a DistributedOptimizer steps each
 * shard's parameters where they live. Names follow the tutorial's (Shard1, Shard2, DistNet,
 * parameterRRefs).
 *
 *   npm run launch -- --nproc 3 examples/10_rpc_pipeline.ts [--steps 30] [--batch-size 32] [--split-size 8]
 */
import * as tf from '@tensorflow/tfjs';
import {
  classificationLoss,
  DistributedOptimizer,
  distAutograd,
  initRpc,
  intArg,
  RemoteModule,
  rpc,
  SGD,
  syntheticDataset,
  type LaunchContext,
} from '../src/index.ts';

/** A dense layer's parameters on the worker that makes it (seeded: the same model on every run). */
function dense(inputs: number, units: number, seed: number) {
  const w = tf.variable(tf.randomNormal([inputs, units], 0, Math.sqrt(2 / inputs), 'float32', seed));
  const b = tf.variable(tf.zeros([units]));
  return { w, b, apply: (x: tf.Tensor) => x.matMul(w).add(b) };
}

/** The first half of the model. */
class Shard1 {
  private readonly l1 = dense(16, 64, 1);
  private readonly l2 = dense(64, 32, 2);
  async forward(xRRef: rpc.RRef<tf.Tensor>): Promise<tf.Tensor> {
    const x = await xRRef.toHere();
    return tf.tidy(() => tf.relu(this.l2.apply(tf.relu(this.l1.apply(x)))));
  }
  parameters(): tf.Variable[] {
    return [this.l1.w, this.l1.b, this.l2.w, this.l2.b];
  }
}

/** The second half. */
class Shard2 {
  private readonly l3 = dense(32, 4, 3);
  async forward(xRRef: rpc.RRef<tf.Tensor>): Promise<tf.Tensor> {
    const x = await xRRef.toHere();
    return tf.tidy(() => this.l3.apply(x));
  }
  parameters(): tf.Variable[] {
    return [this.l3.w, this.l3.b];
  }
}

/** The master's model: the two shards' RRefs, and the pipelined forward pass over them. */
class DistNet {
  readonly p1 = new RemoteModule<Shard1>('worker1', 'Shard1');
  readonly p2 = new RemoteModule<Shard2>('worker2', 'Shard2');

  constructor(private readonly splitSize: number) {}

  async forward(xs: tf.Tensor): Promise<tf.Tensor[]> {
    const outFutures: Array<Promise<tf.Tensor>> = [];
    const refs: rpc.RRef[] = [];
    const micro = tf.split(xs, Math.ceil(xs.shape[0]! / this.splitSize));
    for (const x of micro) {
      const xRRef = rpc.localRRef(x);
      const yRRef = this.p1.moduleRRef.remote().forward(xRRef);
      const zFut = this.p2.moduleRRef.rpcAsync().forward(yRRef);
      outFutures.push(zFut);
      refs.push(xRRef, yRRef);
    }
    const outs = await Promise.all(outFutures);
    // Python drops them when forward returns; here, explicitly (the owners delete the micro-batches).
    for (const r of refs) r.release();
    return outs;
  }

  async parameterRRefs(): Promise<Array<rpc.RRef<tf.Variable>>> {
    return [...(await this.p1.remoteParameters()), ...(await this.p2.remoteParameters())];
  }
}

export default async function main(ctx: LaunchContext) {
  const data = syntheticDataset({ length: 2048, inputSize: 16, numClasses: 4, seed: 0 });
  const agent = await initRpc({
    name: (rank) => (rank === 0 ? 'master' : `worker${rank}`),
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    worldSize: ctx.nproc,
    timeoutMs: ctx.timeoutMs,
    functions: { Shard1: () => new Shard1(), Shard2: () => new Shard2() },
  });
  let result: Record<string, unknown> = { role: agent.name };
  if (agent.rank === 0) {
    const steps = intArg(ctx.args, 'steps', 30);
    const batchSize = intArg(ctx.args, 'batch-size', 32);
    const model = new DistNet(intArg(ctx.args, 'split-size', 8));
    const params = await model.parameterRRefs();
    const opt = new DistributedOptimizer(SGD, params, { lr: 0.05 });
    let loss = NaN;
    for (let step = 0; step < steps; step++) {
      const { x, y } = data.batch(Array.from({ length: batchSize }, (_, i) => (step * batchSize + i) % data.length));
      const xs = tf.tensor(x, [batchSize, 16]);
      const ys = tf.tensor1d(y, 'int32');
      await distAutograd.context(async (contextId) => {
        const outputs = await model.forward(xs);
        loss = await distAutograd.backward(contextId, () => classificationLoss(tf.concat(outputs), ys, 4));
        await opt.step(contextId);
      });
      tf.dispose([xs, ys]);
      if (step % 10 === 0) ctx.log(`step ${step}: loss ${loss.toFixed(4)}`);
    }
    const { x, y } = data.batch(Array.from({ length: 512 }, (_, i) => i));
    const outs = await model.forward(tf.tensor(x, [512, 16]));
    const predicted = await tf.concat(outs).argMax(1).data();
    const accuracy = y.filter((label, i) => predicted[i] === label).length / 512;
    ctx.log(`final loss ${loss.toFixed(4)}, accuracy ${(accuracy * 100).toFixed(1)}%`);
    for (const p of params) p.release();
    model.p1.release();
    model.p2.release();
    result = { ...result, finalLoss: loss, accuracy };
  }
  await rpc.shutdown();
  return { ...result, ownedAfterShutdown: agent.ownedRRefs().length };
}
