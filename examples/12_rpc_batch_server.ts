/**
 * PyTorch's tutorial "Implementing Batch RPC Processing Using Asynchronous Executions", ported:
 * a parameter server that updates its model once every trainer has sent its gradients. Each
 * trainer's call returns a promise the server resolves only then; that promise does not hold the
 * server (torch's @rpc.functions.async_execution): it serves the other trainers' calls meanwhile,
 * applies one update for the whole batch, and answers everybody with the new model. Names follow
 * the tutorial's (BatchUpdateParameterServer, updateAndFetchModel, getModel, Trainer).
 *
 *   npm run launch -- --nproc 3 examples/12_rpc_batch_server.ts [--steps 30] [--batch-size 32]
 */
import * as tf from '@tensorflow/tfjs';
import { buildModel, classificationLoss, initRpc, intArg, type nn, rpc, SGD, syntheticDataset, type LaunchContext } from '../src/index.ts';

const DATA = syntheticDataset({ length: 2048, inputSize: 16, numClasses: 4, seed: 0 });
const model = () => buildModel({ kind: 'mlp', inputShape: DATA.inputShape, numClasses: DATA.numClasses, seed: 0 });

class BatchUpdateParameterServer {
  private readonly model = model();
  private readonly optimizer = new SGD({ lr: 0.05 });
  private readonly sums: Float32Array;
  private readonly waiting: Array<(weights: tf.Tensor[]) => void> = [];
  private updates = 0;

  constructor(private readonly batchUpdateSize: number) {
    this.sums = new Float32Array(this.model.trainableWeights.reduce((n, w) => n + w.read().size, 0));
  }

  getModel(): tf.Tensor[] {
    return this.model.trainableWeights.map((w) => w.read());
  }

  /** The tutorial's update_and_fetch_model: an asynchronous function, answered once the batch is complete. */
  static async updateAndFetchModel(psRRef: rpc.RRef<BatchUpdateParameterServer>, grads: tf.Tensor[]): Promise<tf.Tensor[]> {
    const self = psRRef.localValue();
    psRRef.release();
    let offset = 0;
    for (const g of grads) {
      const values = await g.data();
      for (let i = 0; i < values.length; i++) self.sums[offset + i]! += values[i]!;
      offset += values.length;
    }
    const reply = new Promise<tf.Tensor[]>((resolve) => self.waiting.push(resolve));
    if (++self.updates >= self.batchUpdateSize) await self.update();
    return reply;
  }

  private async update(): Promise<void> {
    const weights = this.model.trainableWeights.map((w) => w.read() as tf.Variable);
    const params = new Float32Array(this.sums.length);
    const layout: nn.ParamLayout[] = [];
    let offset = 0;
    for (const w of weights) {
      params.set((await w.data()) as Float32Array, offset);
      layout.push({ shape: [...w.shape], offset, size: w.size });
      offset += w.size;
    }
    const mean = this.sums.map((s) => s / this.updates);
    this.optimizer.stepFlat(params, mean, layout);
    for (const [i, w] of weights.entries()) {
      const { offset: at, size } = layout[i]!;
      tf.tidy(() => w.assign(tf.tensor(params.subarray(at, at + size), w.shape)));
    }
    this.sums.fill(0);
    this.updates = 0;
    for (const answer of this.waiting.splice(0)) answer(this.getModel());
  }
}

let server: BatchUpdateParameterServer | undefined;

class Trainer {
  private readonly model = model();
  private readonly psRRef: rpc.RRef<BatchUpdateParameterServer>;

  constructor(
    private readonly rank: number,
    trainers: number,
  ) {
    this.psRRef = rpc.remote<BatchUpdateParameterServer>('ps', 'getServer', [trainers]);
  }

  async train(steps: number, batchSize: number, log: (l: string) => void): Promise<number> {
    this.model.setWeights(await this.psRRef.rpcSync().getModel());
    let loss = NaN;
    for (let step = 0; step < steps; step++) {
      const { x, y } = DATA.batch(Array.from({ length: batchSize }, (_, i) => (this.rank * 7919 + step * batchSize + i) % DATA.length));
      const xs = tf.tensor(x, [batchSize, 16]);
      const ys = tf.tensor1d(y, 'int32');
      const { value, grads } = tf.variableGrads(() => classificationLoss(this.model.apply(xs) as tf.Tensor, ys, 4));
      loss = (await value.data())[0]!;
      const ordered = this.model.trainableWeights.map((w) => grads[(w.read() as tf.Variable).name]!);
      const weights = await rpc.rpcSync<tf.Tensor[]>('ps', 'updateAndFetchModel', [this.psRRef, ordered]);
      this.model.setWeights(weights);
      tf.dispose([xs, ys, value, ...Object.values(grads), ...weights]);
      if (step % 10 === 0) log(`step ${step}: loss ${loss.toFixed(4)}`);
    }
    return loss;
  }

  async accuracy(): Promise<number> {
    const { x, y } = DATA.batch(Array.from({ length: 512 }, (_, i) => i));
    const predicted = await tf.tidy(() => (this.model.apply(tf.tensor(x, [512, 16])) as tf.Tensor).argMax(1)).data();
    return y.filter((label, i) => predicted[i] === label).length / 512;
  }

  release(): void {
    this.psRRef.release();
  }
}

export default async function main(ctx: LaunchContext) {
  const reports: Array<Record<string, unknown>> = [];
  const agent = await initRpc({
    name: (rank) => (rank === 0 ? 'ps' : `trainer${rank}`),
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    worldSize: ctx.nproc,
    timeoutMs: ctx.timeoutMs,
    functions: {
      getServer: (trainers: number) => (server ??= new BatchUpdateParameterServer(trainers)),
      updateAndFetchModel: BatchUpdateParameterServer.updateAndFetchModel,
      // Each trainer's figures, for the launcher's summary (rank 0's result).
      report: (r: Record<string, unknown>) => void reports.push(r),
    },
  });
  let result: Record<string, unknown> = { role: agent.name };
  if (agent.rank > 0) {
    const trainer = new Trainer(agent.rank, ctx.nproc - 1);
    const finalLoss = await trainer.train(intArg(ctx.args, 'steps', 30), intArg(ctx.args, 'batch-size', 32), ctx.log);
    const accuracy = await trainer.accuracy();
    ctx.log(`final loss ${finalLoss.toFixed(4)}, accuracy ${(accuracy * 100).toFixed(1)}%`);
    trainer.release();
    result = { ...result, finalLoss, accuracy };
    await rpc.rpcSync('ps', 'report', [{ rank: agent.rank, finalLoss, accuracy }]);
  }
  await rpc.shutdown();
  const trainers = reports.sort((a, b) => Number(a.rank) - Number(b.rank));
  return { ...result, ...(agent.rank === 0 ? { trainers } : {}), ownedAfterShutdown: agent.ownedRRefs().length };
}
