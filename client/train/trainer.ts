/**
 * The training loop every tab runs: the library's pieces put together the way a torch DDP script
 * does (init_process_group, DistributedSampler, DistributedDataParallel, optimizer), reporting
 * what happens as TrainEvents for the dashboard and the launcher.
 */
import * as tf from '@tensorflow/tfjs';
import {
  DistributedDataParallel,
  DistributedSampler,
  type StoreClient,
  buildModel,
  classificationLoss,
  hashFloat32,
  initProcessGroup,
  loadMnistSplits,
  subset,
  syntheticDataset,
  type Dataset,
  type ProcessGroup,
} from '../../src/index.ts';
import { selectBackend } from '../backend.ts';
import { probeWebGpu } from '../webgpu.ts';
import type { BackendName, RankStepMetrics, StepBreakdownMs, TrainConfig, TrainEvent } from './events.ts';

/** Reads a job option from the URL, accepting camelCase or kebab-case (batchSize, batch-size). */
function option(params: URLSearchParams, name: string): string | null {
  const kebab = name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
  return params.get(name) ?? params.get(kebab);
}

function oneOf<T extends string>(params: URLSearchParams, name: string, allowed: readonly T[], fallback: T): T {
  const v = option(params, name) ?? fallback;
  if (!allowed.includes(v as T)) throw new Error(`option ${name} must be one of ${allowed.join(', ')}, got "${v}"`);
  return v as T;
}

function num(params: URLSearchParams, name: string, fallback: number, check: (n: number) => boolean, rule: string): number {
  const raw = option(params, name);
  if (raw === null || raw === '') return fallback;
  const n = Number(raw);
  if (!check(n)) throw new Error(`option ${name} must be ${rule}, got "${raw}"`);
  return n;
}

const positiveInt = (n: number) => Number.isInteger(n) && n > 0;

/** The job's configuration from the page's URL; defaults are the ones the README quotes. */
export function parseTrainConfig(params: URLSearchParams, worldSize: number): TrainConfig {
  const optimizer = oneOf(params, 'optimizer', ['sgd', 'adam'] as const, 'adam');
  const stepsRaw = option(params, 'steps');
  return {
    model: oneOf(params, 'model', ['mlp', 'cnn'] as const, 'mlp'),
    dataset: oneOf(params, 'dataset', ['mnist', 'synthetic'] as const, 'mnist'),
    batchSize: num(params, 'batchSize', 64, positiveInt, 'a positive integer'),
    lr: num(params, 'lr', optimizer === 'adam' ? 0.003 : 0.05, (n) => n > 0 && Number.isFinite(n), 'a positive number'),
    optimizer,
    epochs: num(params, 'epochs', 1, positiveInt, 'a positive integer'),
    steps: stepsRaw === null || stepsRaw === '' ? null : num(params, 'steps', 0, positiveInt, 'a positive integer'),
    seed: num(params, 'seed', 0, Number.isSafeInteger, 'an integer'),
    shuffle: oneOf(params, 'shuffle', ['true', 'false'] as const, 'true') === 'true',
    backend: oneOf(params, 'backend', ['webgpu', 'webgl', 'wasm', 'cpu'] as const, 'webgpu'),
    worldSize,
  };
}

export interface TrainerOptions {
  serverUrl: string;
  /** An open connection to the server (the page retries until it has one). */
  store: StoreClient;
  session: string;
  rank: number | undefined;
  timeoutMs: number;
  params: URLSearchParams;
  config: TrainConfig;
  emit(event: TrainEvent): void;
  /** Polled once a step: true once this tab asked everyone to stop. */
  stopRequested(): boolean;
}

export interface TrainResult {
  summary: Record<string, unknown>;
  /** The group, still open: `destroy()` it when done with it. */
  pg: ProcessGroup;
  model: tf.LayersModel;
  /** Predictions of the trained model on the first test samples (to check a download against). */
  probe: { inputs: Float32Array; inputShape: number[]; logits: Float32Array };
}

interface Data {
  train: Dataset;
  test: Dataset;
}

async function loadData(config: TrainConfig, params: URLSearchParams): Promise<Data> {
  const trainSize = num(params, 'trainSize', 0, (n) => Number.isInteger(n) && n >= 0, 'a non-negative integer');
  if (config.dataset === 'mnist') {
    const { train, test } = await loadMnistSplits({ baseUrl: new URL('/datasets/mnist/', location.origin).toString() });
    return { train: trainSize > 0 ? subset(train, Array.from({ length: Math.min(trainSize, train.length) }, (_, i) => i)) : train, test };
  }
  // Synthetic: one generated set cut into train and test, so both come from one distribution.
  const length = trainSize > 0 ? trainSize : 4096;
  const all = syntheticDataset({ length: length + 1024, inputSize: 16, numClasses: 4, seed: config.seed });
  const idx = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);
  return { train: subset(all, idx(0, length), 'synthetic-train'), test: subset(all, idx(length, length + 1024), 'synthetic-test') };
}

const METRICS = 10; // loss, accuracy, samples/s, compute, readback, allreduce, apply, stop, hash hi, hash lo

export async function train(opts: TrainerOptions): Promise<TrainResult> {
  const { config, emit, params } = opts;
  emit({ type: 'config', config });
  const backendChoice = await selectBackend(config.backend);
  if (backendChoice.fallbackReason) emit({ type: 'log', level: 'warn', message: `Backend fallback: ${backendChoice.fallbackReason}` });
  const gpu = await probeWebGpu();
  const checkWeights = option(params, 'checkWeights') === 'true';
  const recordIndices = option(params, 'recordIndices') === 'true';
  const returnWeights = option(params, 'returnWeights') === 'true';

  const dataPromise = loadData(config, params);
  dataPromise.catch(() => {});
  const store = opts.store;
  // Every tab of a session must train the same job: the first to arrive sets it.
  const agreed = { ...config } as Record<string, unknown>;
  const mine = JSON.stringify(agreed);
  const theirs = new TextDecoder().decode(await store.compareSet('__train/config', '', mine));
  if (theirs !== mine) {
    const session = JSON.parse(theirs) as Record<string, unknown>;
    const diffs = Object.keys(session)
      .filter((k) => JSON.stringify(session[k]) !== JSON.stringify(agreed[k]))
      .map((k) => `${k}: session ${JSON.stringify(session[k])}, this tab ${JSON.stringify(agreed[k])}`);
    store.close();
    throw new ConfigMismatchError(`this tab's configuration disagrees with session "${opts.session}": ${diffs.join('; ')}`);
  }
  const stopWaiting = store.on('members', (e) => emit({ type: 'waiting', joined: e.ranks, worldSize: e.worldSize }));
  const pg = await initProcessGroup({
    url: opts.serverUrl,
    session: opts.session,
    worldSize: config.worldSize,
    rank: opts.rank,
    timeoutMs: opts.timeoutMs,
    store,
  });
  stopWaiting();
  emit({ type: 'joined', rank: pg.rank, worldSize: pg.worldSize, backend: backendChoice.backend, fallbackReason: backendChoice.fallbackReason, adapter: gpu.adapter });
  watchLinks(pg, emit);

  try {
    // The group stays up after training so the page keeps showing the ring; the caller ends it.
    return { ...(await runLoop(pg, config, await dataPromise, backendChoice.backend, { checkWeights, returnWeights, recordIndices }, opts)), pg };
  } catch (err) {
    pg.destroy();
    throw err;
  }
}

export class ConfigMismatchError extends Error {
  override name = 'ConfigMismatchError';
}

function watchLinks(pg: ProcessGroup, emit: (e: TrainEvent) => void): void {
  const last = new Map<number, { t: number; bytes: number }>();
  pg.on((e) => {
    if (e.type === 'link') emit({ type: 'link', peer: e.peer, state: e.state });
    else emit({ type: 'rank-lost', rank: e.rank, reason: e.reason });
  });
  // Throughput per link from its byte counters, every two seconds.
  const timer = setInterval(() => {
    if (pg.error) return clearInterval(timer);
    const now = performance.now();
    for (const l of pg.linkStats()) {
      const bytes = l.bytesSent + l.bytesReceived;
      const prev = last.get(l.peer);
      last.set(l.peer, { t: now, bytes });
      if (prev && l.state === 'open') {
        emit({ type: 'link', peer: l.peer, state: l.state, throughputMBps: (bytes - prev.bytes) / 1e6 / ((now - prev.t) / 1000) });
      }
    }
  }, 2000);
}

async function runLoop(
  pg: ProcessGroup,
  config: TrainConfig,
  data: Data,
  backend: BackendName,
  flags: { checkWeights: boolean; returnWeights: boolean; recordIndices: boolean },
  opts: TrainerOptions,
): Promise<Omit<TrainResult, 'pg'>> {
  const { emit } = opts;
  const { train: trainSet, test: testSet } = data;
  const model = buildModel({ kind: config.model, inputShape: trainSet.inputShape, numClasses: trainSet.numClasses, seed: config.seed });
  const ddp = await DistributedDataParallel.create(model, pg);
  const optimizer = config.optimizer === 'adam' ? tf.train.adam(config.lr) : tf.train.sgd(config.lr);
  const sampler = new DistributedSampler(trainSet.length, { numReplicas: pg.worldSize, rank: pg.rank, shuffle: config.shuffle, seed: config.seed });
  const stepsPerEpoch = Math.ceil(sampler.numSamples / config.batchSize);
  const totalSteps = config.steps ?? stepsPerEpoch * config.epochs;
  const epochs = Math.ceil(totalSteps / stepsPerEpoch);
  emit({ type: 'log', level: 'info', message: `Model ${config.model}: ${ddp.parameterCount} parameters in ${ddp.buckets.length} bucket(s); ${stepsPerEpoch} steps per epoch` });

  const started = performance.now();
  let step = 0;
  let lastLoss = NaN;
  let stoppedBy: number | null = null;
  const sums: StepBreakdownMs = { compute: 0, readback: 0, allreduce: 0, apply: 0 };
  let timedSteps = 0;
  let samplesPerSecTotal = 0;
  const tensorCounts: number[] = [];
  const hashHistory: boolean[] = [];
  let lastEval: { testAccuracy: number; testLoss: number } | null = null;
  const seenPerEpoch: number[] = [];
  /** With recordIndices: the sample indices this rank trained on, per epoch (exactly-once checks). */
  const trainedOn: number[][] = [];

  outer: for (let epoch = 0; epoch < epochs; epoch++) {
    sampler.setEpoch(epoch);
    const indices = sampler.indices();
    emit({ type: 'shard', epoch, samples: sampler.numSamples, datasetSize: trainSet.length, stepsPerEpoch });
    let seen = 0;
    if (flags.recordIndices) trainedOn.push([]);
    for (let b = 0; b < stepsPerEpoch && step < totalSteps; b++) {
      const batchIdx = indices.slice(b * config.batchSize, (b + 1) * config.batchSize);
      if (flags.recordIndices) trainedOn[trainedOn.length - 1].push(...batchIdx);
      const t0 = performance.now();
      const { x, y } = trainSet.batch(batchIdx);
      const xs = tf.tensor(x, [batchIdx.length, ...trainSet.inputShape]);
      const ys = tf.tensor1d(y, 'int32');
      let correctT: tf.Tensor | undefined;
      const { loss, timings } = await ddp.backward(() => {
        const logits = model.apply(xs, { training: true }) as tf.Tensor;
        // Train accuracy from the same forward pass; kept past the gradient computation's tidy.
        correctT = tf.keep(logits.argMax(-1).equal(ys).sum());
        return classificationLoss(logits, ys, trainSet.numClasses);
      });
      const correct = (await correctT!.data())[0];
      correctT!.dispose();
      const a0 = performance.now();
      ddp.step(optimizer);
      const apply = performance.now() - a0;
      xs.dispose();
      ys.dispose();
      step++;
      seen += batchIdx.length;
      const stepMs = performance.now() - t0;
      const mine = new Float32Array(METRICS);
      mine.set([loss, correct / batchIdx.length, (batchIdx.length / stepMs) * 1000, timings.compute, timings.readback, timings.allreduce, apply, opts.stopRequested() ? 1 : 0]);
      if (flags.checkWeights) {
        const h = parseInt(await ddp.weightsHash(), 16);
        mine[8] = h >>> 16;
        mine[9] = h & 0xffff;
      }
      const all = await pg.allGather(mine);
      const ranks: RankStepMetrics[] = [];
      for (let r = 0; r < pg.worldSize; r++) {
        const m = all.subarray(r * METRICS, (r + 1) * METRICS);
        ranks.push({ rank: r, loss: m[0], accuracy: m[1], samplesPerSec: m[2], breakdownMs: { compute: m[3], readback: m[4], allreduce: m[5], apply: m[6] } });
        if (m[7] === 1 && stoppedBy === null) stoppedBy = r;
      }
      if (flags.checkWeights) {
        const first = all.subarray(8, 10).join();
        hashHistory.push(ranks.every((_, r) => all.subarray(r * METRICS + 8, r * METRICS + 10).join() === first));
      }
      lastLoss = ranks.reduce((s, r) => s + r.loss, 0) / ranks.length;
      if (step > 1) {
        // The first step compiles shaders: leave it out of the averages.
        timedSteps++;
        for (const k of Object.keys(sums) as Array<keyof StepBreakdownMs>) sums[k] += ranks.reduce((s, r) => s + r.breakdownMs[k], 0) / ranks.length;
        samplesPerSecTotal += ranks.reduce((s, r) => s + r.samplesPerSec, 0);
      }
      tensorCounts.push(tf.memory().numTensors);
      emit({ type: 'step', epoch, step, totalSteps, ranks, elapsedSec: (performance.now() - started) / 1000 });
      if (stoppedBy !== null) {
        emit({ type: 'stopped', by: stoppedBy, atStep: step });
        seenPerEpoch.push(seen);
        break outer;
      }
    }
    seenPerEpoch.push(seen);
    lastEval = await evaluate(pg, model, testSet);
    emit({ type: 'eval', epoch, step, ...lastEval });
  }
  if (lastEval === null || stoppedBy !== null) lastEval = await evaluate(pg, model, testSet);

  const weights = await ddp.flatWeights();
  const probeCount = Math.min(8, testSet.length);
  const probeBatch = testSet.batch(Array.from({ length: probeCount }, (_, i) => i));
  const logitsT = tf.tidy(() => model.predict(tf.tensor(probeBatch.x, [probeCount, ...testSet.inputShape])) as tf.Tensor);
  const logits = (await logitsT.data()) as Float32Array;
  logitsT.dispose();
  const seconds = (performance.now() - started) / 1000;
  const summary: Record<string, unknown> = {
    rank: pg.rank,
    worldSize: pg.worldSize,
    backend,
    model: config.model,
    dataset: config.dataset,
    steps: step,
    epochs: seenPerEpoch.length,
    samplesPerSec: timedSteps > 0 ? samplesPerSecTotal / timedSteps : null,
    finalLoss: lastLoss,
    testAccuracy: lastEval.testAccuracy,
    testLoss: lastEval.testLoss,
    weightHash: hashFloat32(weights),
    breakdownMs: Object.fromEntries(Object.entries(sums).map(([k, v]) => [k, timedSteps > 0 ? v / timedSteps : null])),
    seconds,
    samplesSeenPerEpoch: seenPerEpoch,
    // Live tensors after each step: flat when nothing leaks.
    liveTensors: { steps: tensorCounts.length, min: Math.min(...tensorCounts), max: Math.max(...tensorCounts) },
    ...(flags.checkWeights ? { identicalEveryStep: hashHistory.every(Boolean), checkedSteps: hashHistory.length } : {}),
    ...(stoppedBy !== null ? { stoppedBy } : {}),
    ...(flags.recordIndices ? { trainedOn } : {}),
    ...(flags.returnWeights && pg.rank === 0 ? { weights: toBase64(weights) } : {}),
  };
  emit({ type: 'done', summary });
  optimizer.dispose();
  return { summary, model, probe: { inputs: probeBatch.x, inputShape: testSet.inputShape, logits } };
}

/** Test accuracy and loss, each rank evaluating its share of the test set; sums all-reduced. */
async function evaluate(pg: ProcessGroup, model: tf.LayersModel, test: Dataset): Promise<{ testAccuracy: number; testLoss: number }> {
  const totals = new Float32Array(3); // correct, loss sum, count
  const mine: number[] = [];
  for (let i = pg.rank; i < test.length; i += pg.worldSize) mine.push(i);
  const batch = 500;
  for (let s = 0; s < mine.length; s += batch) {
    const idx = mine.slice(s, s + batch);
    const { x, y } = test.batch(idx);
    const out = tf.tidy(() => {
      const xs = tf.tensor(x, [idx.length, ...test.inputShape]);
      const ys = tf.tensor1d(y, 'int32');
      const logits = model.predict(xs) as tf.Tensor;
      const correct = logits.argMax(-1).equal(ys).sum().cast('float32');
      const loss = tf.losses.softmaxCrossEntropy(tf.oneHot(ys, test.numClasses), logits, undefined, undefined, tf.Reduction.SUM);
      return tf.stack([correct, loss as tf.Scalar]);
    });
    const [c, l] = await out.data();
    out.dispose();
    totals[0] += c;
    totals[1] += l;
    totals[2] += idx.length;
  }
  await pg.allReduce(totals, 'sum');
  return { testAccuracy: totals[0] / totals[2], testLoss: totals[1] / totals[2] };
}

function toBase64(data: Float32Array): string {
  const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}
