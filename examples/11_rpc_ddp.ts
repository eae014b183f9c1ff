/**
 * PyTorch's tutorial "Combining Distributed DataParallel with Distributed RPC Framework", ported:
 * rank 0 is the parameter server, holding an embedding table as a RemoteModule; ranks 1 and 2
 * are trainers, each with a local dense layer under DistributedDataParallel (in a subgroup of the
 * two trainers). A step looks the batch up in the remote table, runs the dense layer here, and
 * takes the gradients back: DDP averages the dense layer's across the trainers, distributed
 * autograd carries the table's to the server, where a DistributedOptimizer steps it. Names follow
 * the tutorial's (HybridModel, remote_emb_module, fc, _run_trainer).
 *
 * One difference: torch's DDP reduces inside dist_autograd.backward, and one DistributedOptimizer
 * steps both parts; here DDP's backward returns the gradient of the looked-up embeddings (its
 * `inputs`), distributed autograd takes that to the server, and DDP's own step updates the dense
 * layer (docs/rpc.md).
 *
 *   npm run launch -- --nproc 3 examples/11_rpc_ddp.ts [--steps 40] [--batch-size 32]
 */
import * as tf from '@tensorflow/tfjs';
import {
  DistributedDataParallel,
  DistributedOptimizer,
  classificationLoss,
  distAutograd,
  initProcessGroup,
  initRpc,
  intArg,
  RemoteModule,
  rpc,
  SGD,
  type LaunchContext,
} from '../src/index.ts';

const NUM_EMBEDDINGS = 100;
const EMBEDDING_DIM = 16;
const NUM_CLASSES = 4;

/** torch.nn.EmbeddingBag(mode="sum") with one index per bag: a table lookup. */
class EmbeddingBag {
  readonly weight = tf.variable(tf.randomNormal([NUM_EMBEDDINGS, EMBEDDING_DIM], 0, 0.3, 'float32', 1));
  forward(indices: tf.Tensor): tf.Tensor {
    return tf.gather(this.weight, indices);
  }
  parameters(): tf.Variable[] {
    return [this.weight];
  }
}

/** The trainer's model: the remote table, then the local dense layer (DDP-wrapped by the caller). */
class HybridModel {
  readonly remoteEmbModule = new RemoteModule<EmbeddingBag>('ps', 'EmbeddingBag');
  readonly fc = tf.sequential({
    layers: [
      tf.layers.dense({ inputShape: [EMBEDDING_DIM], units: NUM_CLASSES, kernelInitializer: tf.initializers.glorotUniform({ seed: 2 }) }),
    ],
  });

  async embed(indices: tf.Tensor): Promise<tf.Variable> {
    return (await this.remoteEmbModule.forward(indices)) as tf.Variable;
  }
}

/** A batch: indices, and a label each index always has (the table must learn it). */
function batch(step: number, rank: number, size: number): { indices: tf.Tensor; labels: tf.Tensor } {
  const idx = Array.from({ length: size }, (_, i) => (step * 31 + rank * 17 + i * 7) % NUM_EMBEDDINGS);
  return {
    indices: tf.tensor1d(idx, 'int32'),
    labels: tf.tensor1d(
      idx.map((i) => (i * 7) % NUM_CLASSES),
      'int32',
    ),
  };
}

async function runTrainer(ctx: LaunchContext, rank: number, trainers: Awaited<ReturnType<typeof initProcessGroup>>) {
  const model = new HybridModel();
  const ddp = await DistributedDataParallel.create(model.fc, trainers);
  const opt = new DistributedOptimizer(SGD, await model.remoteEmbModule.remoteParameters(), { lr: 2 });
  const fcOptimizer = new SGD({ lr: 2 });
  const steps = intArg(ctx.args, 'steps', 40);
  const size = intArg(ctx.args, 'batch-size', 32);
  let loss = NaN;
  for (let step = 0; step < steps; step++) {
    const { indices, labels } = batch(step, rank, size);
    await distAutograd.context(async (contextId) => {
      const emb = await model.embed(indices);
      const out = await ddp.backward(() => classificationLoss(model.fc.apply(emb) as tf.Tensor, labels, NUM_CLASSES), { inputs: [emb] });
      const [embGrad] = out.inputGrads;
      loss = out.loss;
      // The embeddings' gradient, carried back to the table on the server.
      await distAutograd.backward(contextId, () => tf.sum(tf.mul(emb, embGrad!)) as tf.Scalar);
      embGrad!.dispose();
      await opt.step(contextId);
      await ddp.step(fcOptimizer);
    });
    tf.dispose([indices, labels]);
    if (step % 10 === 0) ctx.log(`step ${step}: loss ${loss.toFixed(4)}`);
  }
  const { indices, labels } = batch(0, 0, NUM_EMBEDDINGS);
  const emb = await model.embed(indices);
  const predicted = await (model.fc.apply(emb) as tf.Tensor).argMax(1).data();
  const truth = await labels.data();
  const accuracy = predicted.filter((p, i) => p === truth[i]).length / NUM_EMBEDDINGS;
  model.remoteEmbModule.release();
  return { finalLoss: loss, accuracy, fcHash: await ddp.weightsHash() };
}

export default async function main(ctx: LaunchContext) {
  const pg = await initProcessGroup({
    url: ctx.url,
    session: ctx.session,
    token: ctx.token,
    worldSize: ctx.nproc,
    timeoutMs: ctx.timeoutMs,
  });
  // Every rank makes the trainers' subgroup, in the same order (torch's new_group rule); the server is not in it.
  const trainerGroup = await pg.newGroup(Array.from({ length: ctx.nproc - 1 }, (_, i) => i + 1));
  const reports: Array<Record<string, unknown>> = [];
  const agent = await initRpc({
    group: pg,
    name: (rank) => (rank === 0 ? 'ps' : `trainer${rank}`),
    // `report`: each trainer's figures, for the launcher's summary (rank 0's result).
    functions: { EmbeddingBag: () => new EmbeddingBag(), report: (r: Record<string, unknown>) => void reports.push(r) },
  });
  const result = trainerGroup ? await runTrainer(ctx, agent.rank, trainerGroup) : undefined;
  if (result) {
    ctx.log(`final loss ${result.finalLoss.toFixed(4)}, accuracy ${(result.accuracy * 100).toFixed(1)}%`);
    await rpc.rpcSync('ps', 'report', [{ rank: agent.rank, ...result }]);
  }
  await rpc.shutdown();
  await pg.destroy();
  const trainers = reports.sort((a, b) => Number(a.rank) - Number(b.rank));
  return { role: agent.name, ...result, ...(agent.rank === 0 ? { trainers } : {}), ownedAfterShutdown: agent.ownedRRefs().length };
}
