/**
 * PyTorch's tutorial "Implementing a Parameter Server Using Distributed RPC Framework", ported:
 * rank 0 is the parameter server, holding the model; the other ranks are trainers whose network
 * calls the server's forward pass through RPC, takes the gradients back to the server with
 * distributed autograd, and steps the server's parameters with a DistributedOptimizer. The
 * structure follows the tutorial's, name for name (ParameterServer, getParameterServer,
 * TrainerNet, getGlobalParamRRefs, runTrainingLoop, getAccuracy).
 *
 *   npm run launch -- --nproc 3 examples/09_rpc_parameter_server.ts [--dataset mnist] [--steps 40] [--batch-size 32] [--eval 512]
 *
 * The accuracy is measured on MNIST's test split (its first --eval images); on the synthetic set,
 * on its first --eval samples. bench/rpc_ps_accuracy.ts sets it beside the same model trained in
 * one tab on the same batches.
 */
import * as tf from '@tensorflow/tfjs';
import {
  buildModel,
  classificationLoss,
  DistributedOptimizer,
  distAutograd,
  initRpc,
  intArg,
  loadMnistSplits,
  rpc,
  SGD,
  syntheticDataset,
  type Dataset,
  type LaunchContext,
} from '../src/index.ts';

/** The server's side: the model, its forward pass, and RRefs to its parameters. */
class ParameterServer {
  readonly model: tf.LayersModel;

  constructor(inputShape: number[], numClasses: number) {
    this.model = buildModel({ kind: 'mlp', inputShape, numClasses, seed: 0 });
  }

  forward(x: tf.Tensor): tf.Tensor {
    return this.model.apply(x) as tf.Tensor;
  }

  /** torch's `[rpc.RRef(param) for param in self.model.parameters()]`. */
  getParamRRefs(): Array<rpc.RRef<tf.Variable>> {
    return this.model.trainableWeights.map((w) => rpc.localRRef(w.read() as tf.Variable));
  }
}

let server: ParameterServer | undefined;

/** The tutorial's get_parameter_server: one server per run, made on first use. */
function getParameterServer(inputShape: number[], numClasses: number): ParameterServer {
  server ??= new ParameterServer(inputShape, numClasses);
  return server;
}

/** The trainer's network: its forward pass is the server's, reached through the server's RRef. */
class TrainerNet {
  readonly paramServerRRef: rpc.RRef<ParameterServer>;

  constructor(inputShape: number[], numClasses: number) {
    this.paramServerRRef = rpc.remote<ParameterServer>('parameter_server', 'getParameterServer', [inputShape, numClasses]);
  }

  getGlobalParamRRefs(): Promise<Array<rpc.RRef<tf.Variable>>> {
    return this.paramServerRRef.rpcSync().getParamRRefs();
  }

  forward(x: tf.Tensor): Promise<tf.Tensor> {
    return this.paramServerRRef.rpcSync().forward(x);
  }
}

async function runTrainingLoop(net: TrainerNet, data: Dataset, indices: number[], batchSize: number, log: (l: string) => void) {
  const paramRRefs = await net.getGlobalParamRRefs();
  const opt = new DistributedOptimizer(SGD, paramRRefs, { lr: 0.05 });
  let loss = NaN;
  for (let i = 0; i + batchSize <= indices.length; i += batchSize) {
    const { x, y } = data.batch(indices.slice(i, i + batchSize));
    const xs = tf.tensor(x, [batchSize, ...data.inputShape]);
    const ys = tf.tensor1d(y, 'int32');
    await distAutograd.context(async (contextId) => {
      const modelOutput = await net.forward(xs);
      loss = await distAutograd.backward(contextId, () => classificationLoss(modelOutput, ys, data.numClasses));
      await opt.step(contextId);
    });
    tf.dispose([xs, ys]);
    if ((i / batchSize) % 10 === 0) log(`step ${i / batchSize}: loss ${loss.toFixed(4)}`);
  }
  for (const r of paramRRefs) r.release();
  return loss;
}

async function getAccuracy(net: TrainerNet, data: Dataset, size: number): Promise<number> {
  const n = Math.min(data.length, size);
  let correct = 0;
  // In chunks of 1000: each crosses to the server and back as one call.
  for (let start = 0; start < n; start += 1000) {
    const count = Math.min(1000, n - start);
    const { x, y } = data.batch(Array.from({ length: count }, (_, i) => start + i));
    const xs = tf.tensor(x, [count, ...data.inputShape]);
    const out = await net.forward(xs);
    const predicted = await out.argMax(1).data();
    tf.dispose([xs, out]);
    correct += y.filter((label, i) => predicted[i] === label).length;
  }
  return correct / n;
}

export default async function main(ctx: LaunchContext) {
  const synthetic = syntheticDataset({ length: 2048, inputSize: 16, numClasses: 4, seed: 0 });
  const { train: data, test } =
    ctx.args.dataset === 'mnist'
      ? await loadMnistSplits({ baseUrl: new URL('/datasets/mnist/', ctx.url).href })
      : { train: synthetic, test: synthetic };
  const reports: Array<Record<string, unknown>> = [];
  const agent = await initRpc({
    name: (rank) => (rank === 0 ? 'parameter_server' : `trainer_${rank}`),
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    worldSize: ctx.nproc,
    timeoutMs: ctx.timeoutMs,
    // `report`: each trainer's figures, for the launcher's summary (rank 0's result).
    functions: { getParameterServer, report: (r: Record<string, unknown>) => void reports.push(r) },
  });
  let result: Record<string, unknown> = { role: 'parameter_server' };
  if (agent.rank > 0) {
    // Each trainer its own share of the data, as the tutorial's DataLoader gives each trainer MNIST.
    const trainers = ctx.nproc - 1;
    const steps = intArg(ctx.args, 'steps', 40);
    const batchSize = intArg(ctx.args, 'batch-size', 32);
    const indices = Array.from({ length: steps * batchSize }, (_, i) => (i * trainers + agent.rank - 1) % data.length);
    const net = new TrainerNet(data.inputShape, data.numClasses);
    const finalLoss = await runTrainingLoop(net, data, indices, batchSize, ctx.log);
    const accuracy = await getAccuracy(net, test, intArg(ctx.args, 'eval', 512));
    ctx.log(`final loss ${finalLoss.toFixed(4)}, accuracy ${(accuracy * 100).toFixed(1)}%`);
    net.paramServerRRef.release();
    result = { role: 'trainer', rank: agent.rank, finalLoss, accuracy };
    await rpc.rpcSync('parameter_server', 'report', [{ rank: agent.rank, finalLoss, accuracy }]);
  }
  // Graceful: waits for every trainer, then the server has nothing left to keep.
  await rpc.shutdown();
  const trainers = reports.sort((a, b) => Number(a.rank) - Number(b.rank));
  return { ...result, ...(agent.rank === 0 ? { trainers } : {}), ownedAfterShutdown: agent.ownedRRefs().length };
}
