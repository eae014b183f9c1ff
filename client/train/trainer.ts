/**
 * The training loop every tab runs: the library's pieces put together the way a torch DDP script
 * does (init_process_group, DistributedSampler, DistributedDataParallel, optimizer), reporting
 * what happens as TrainEvents for the dashboard and the launcher.
 *
 * Elastic runs (`min`/`max` in the URL) go through generations: when a rank is lost, or tabs
 * wait to join, the survivors form a new group, take the state of the replica that got furthest
 * (every replica holds the full state), re-shard the rest of the epoch and go on. With no live
 * state (a new session, or every tab gone), rank 0 resumes from the latest checkpoint.
 */
import * as tf from '@tensorflow/tfjs';
import {
  DistributedDataParallel,
  DistributedSampler,
  ElasticAgent,
  buildModel,
  classificationLoss,
  hashFloat32,
  initProcessGroup,
  loadCheckpoint,
  loadModelWeights,
  loadMnistSplits,
  loadOptimizerState,
  modelArtifacts,
  optimizerState,
  saveCheckpoint,
  subset,
  syntheticDataset,
  type Dataset,
  type Generation,
  type ProcessGroup,
  type StoreClient,
  type TensorBundle,
} from '../../src/index.ts';
import { encodeValue } from '../../src/protocol.ts';
import { selectBackend } from '../backend.ts';
import { probeWebGpu } from '../webgpu.ts';
import type { RankStepMetrics, StepBreakdownMs, TrainConfig, TrainEvent } from './events.ts';

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
  const minRaw = option(params, 'min');
  const maxRaw = option(params, 'max');
  let elastic: TrainConfig['elastic'] = null;
  if (minRaw !== null || maxRaw !== null) {
    const min = num(params, 'min', 1, positiveInt, 'a positive integer');
    const max = num(params, 'max', Math.max(min, worldSize), positiveInt, 'a positive integer');
    if (max < min) throw new Error(`option max (${max}) must be at least min (${min})`);
    elastic = { min, max };
  }
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
    elastic,
    checkpointEvery: num(params, 'checkpointEvery', 0, (n) => Number.isInteger(n) && n >= 0, 'a non-negative integer'),
    evalEvery: num(params, 'evalEvery', 100, (n) => Number.isInteger(n) && n >= 0, 'a non-negative integer'),
    resumeFrom: option(params, 'resumeFrom'),
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

export class ConfigMismatchError extends Error {
  override name = 'ConfigMismatchError';
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

/** Where training is: what a surviving replica hands to the others, and what a checkpoint keeps. */
interface Progress {
  /** Steps committed in the whole run. */
  step: number;
  epoch: number;
  /** Position in this epoch's global sample order up to which samples have been trained on. */
  consumed: number;
  /** Per epoch, the [start, end) spans of the order covered by committed steps (exactly-once check). */
  coverage: Array<Array<[number, number]>>;
  /** Generations of the group this run went through. */
  generations: number;
  /** Steps started but not committed before a failure, and so trained again. */
  stepsRedone: number;
  /** How the run resumed, each time it did. */
  resumes: string[];
}

const freshProgress = (): Progress => ({ step: 0, epoch: 0, consumed: 0, coverage: [[]], generations: 0, stepsRedone: 0, resumes: [] });

/** One generation of the group: its process group, and how to get the next one. */
interface Membership {
  elastic: ElasticAgent | undefined;
  first(): Promise<{ id: number; pg: ProcessGroup }>;
  next(after: number): Promise<{ id: number; pg: ProcessGroup }>;
  /** Members waiting to join at the next step boundary. */
  pendingJoins(): number;
  regroup(generation: { id: number; pg: ProcessGroup }): Promise<void>;
}

const METRICS = 11; // loss, accuracy, samples/s, compute, readback, allreduce, apply, stop, join, hash hi, hash lo

export async function train(opts: TrainerOptions): Promise<TrainResult> {
  const { config, emit, params } = opts;
  emit({ type: 'config', config });
  const backendChoice = await selectBackend(config.backend);
  if (backendChoice.fallbackReason) emit({ type: 'log', level: 'warn', message: `Backend fallback: ${backendChoice.fallbackReason}` });
  const gpu = await probeWebGpu();
  const flags = {
    checkWeights: option(params, 'checkWeights') === 'true',
    returnWeights: option(params, 'returnWeights') === 'true',
    recordIndices: option(params, 'recordIndices') === 'true',
  };
  const dataPromise = loadData(config, params);
  dataPromise.catch(() => {});

  await agreeOnConfig(opts);
  /** Generations this tab saw paused below the minimum size (reported in the summary). */
  let pausedGenerations = 0;
  const membership = await joinGroup(opts, () => pausedGenerations++);
  const data = await dataPromise;
  const { train: trainSet, test: testSet } = data;
  const model = buildModel({ kind: config.model, inputShape: trainSet.inputShape, numClasses: trainSet.numClasses, seed: config.seed });
  const makeOptimizer = (): tf.Optimizer => (config.optimizer === 'adam' ? tf.train.adam(config.lr) : tf.train.sgd(config.lr));
  let optimizer = makeOptimizer();
  let progress: Progress | null = null;
  /** The step this rank had started but not committed when its group failed. */
  let inFlight = -1;

  const started = performance.now();
  const sums: StepBreakdownMs = { compute: 0, readback: 0, allreduce: 0, apply: 0 };
  let timedSteps = 0;
  let samplesPerSecTotal = 0;
  const tensorCounts: number[] = [];
  const hashChecks: boolean[] = [];
  const trainedOn: number[][] = [];
  let lastLoss = NaN;
  let lastEval: { testAccuracy: number; testLoss: number } | null = null;
  let stoppedBy: number | null = null;
  const maxEpochs = config.steps === null ? config.epochs : Number.POSITIVE_INFINITY;
  const maxSteps = config.steps ?? Number.POSITIVE_INFINITY;
  const finished = (p: Progress) => p.epoch >= maxEpochs || p.step >= maxSteps;

  let generation = await membership.first();
  for (;;) {
    const pg = generation.pg;
    try {
      // --- A generation starts: one state for everyone, then DDP over this group. ---
      const synced = await syncState(pg, model, optimizer, makeOptimizer, progress, inFlight, opts);
      progress = synced.progress;
      optimizer = synced.optimizer;
      inFlight = -1;
      progress.generations++;
      emit({ type: 'joined', rank: pg.rank, worldSize: pg.worldSize, backend: backendChoice.backend, fallbackReason: backendChoice.fallbackReason, adapter: gpu.adapter });
      watchLinks(pg, emit);
      const ddp = await DistributedDataParallel.create(model, pg);
      if (progress.generations === 1) {
        emit({ type: 'log', level: 'info', message: `Model ${config.model}: ${ddp.parameterCount} parameters in ${ddp.buckets.length} bucket(s)` });
      }

      // --- Train until done, stopped, or the membership changes. ---
      let outcome: 'done' | 'stopped' | 'regroup' = 'done';
      epochs: while (!finished(progress)) {
        const sampler = new DistributedSampler(trainSet.length, {
          numReplicas: pg.worldSize,
          rank: pg.rank,
          shuffle: config.shuffle,
          seed: config.seed,
          startIndex: progress.consumed,
        });
        sampler.setEpoch(progress.epoch);
        const indices = sampler.indices();
        const stepsLeft = Math.ceil(indices.length / config.batchSize);
        const fullEpochSteps = Math.ceil(Math.ceil(trainSet.length / pg.worldSize) / config.batchSize);
        emit({ type: 'shard', epoch: progress.epoch, samples: sampler.numSamples, datasetSize: trainSet.length, stepsPerEpoch: fullEpochSteps });
        const totalSteps = Math.min(maxSteps, progress.step + stepsLeft + (maxEpochs - progress.epoch - 1) * fullEpochSteps);
        for (let k = 0; k < stepsLeft && progress.step < maxSteps; k++) {
          const batchIdx = indices.slice(k * config.batchSize, (k + 1) * config.batchSize);
          inFlight = progress.step + 1;
          const t0 = performance.now();
          const { x, y } = trainSet.batch(batchIdx);
          const xs = tf.tensor(x, [batchIdx.length, ...trainSet.inputShape]);
          const ys = tf.tensor1d(y, 'int32');
          let correctT: tf.Tensor | undefined;
          let loss: number;
          let timings: { compute: number; readback: number; allreduce: number };
          try {
            ({ loss, timings } = await ddp.backward(() => {
              const logits = model.apply(xs, { training: true }) as tf.Tensor;
              // Train accuracy from the same forward pass; kept past the gradient computation's tidy.
              correctT = tf.keep(logits.argMax(-1).equal(ys).sum());
              return classificationLoss(logits, ys, trainSet.numClasses);
            }));
          } finally {
            xs.dispose();
            ys.dispose();
          }
          const correct = (await correctT!.data())[0];
          correctT!.dispose();
          const a0 = performance.now();
          ddp.step(optimizer);
          const apply = performance.now() - a0;

          // Commit: the step's samples are trained on; the group's position moves past them.
          const before = progress.consumed;
          progress.consumed = Math.min(trainSet.length, progress.consumed + config.batchSize * pg.worldSize);
          addSpan(progress.coverage[progress.epoch], before, progress.consumed);
          progress.step++;
          inFlight = -1;
          if (flags.recordIndices) (trainedOn[progress.epoch] ??= []).push(...batchIdx);

          const stepMs = performance.now() - t0;
          const mine = new Float32Array(METRICS);
          mine.set([loss, correct / batchIdx.length, (batchIdx.length / stepMs) * 1000, timings.compute, timings.readback, timings.allreduce, apply]);
          mine[7] = opts.stopRequested() ? 1 : 0;
          mine[8] = membership.pendingJoins() > 0 ? 1 : 0;
          if (flags.checkWeights) {
            const h = parseInt(await ddp.weightsHash(), 16);
            mine[9] = h >>> 16;
            mine[10] = h & 0xffff;
          }
          const all = await pg.allGather(mine);
          const ranks: RankStepMetrics[] = [];
          let joinWanted = false;
          for (let r = 0; r < pg.worldSize; r++) {
            const m = all.subarray(r * METRICS, (r + 1) * METRICS);
            ranks.push({ rank: r, loss: m[0], accuracy: m[1], samplesPerSec: m[2], breakdownMs: { compute: m[3], readback: m[4], allreduce: m[5], apply: m[6] } });
            if (m[7] === 1 && stoppedBy === null) stoppedBy = r;
            if (m[8] === 1) joinWanted = true;
          }
          if (flags.checkWeights) {
            const first = all.subarray(9, 11).join();
            hashChecks.push(ranks.every((_, r) => all.subarray(r * METRICS + 9, r * METRICS + 11).join() === first));
          }
          lastLoss = ranks.reduce((s, r) => s + r.loss, 0) / ranks.length;
          if (progress.step > 1) {
            // The first step compiles shaders: leave it out of the averages.
            timedSteps++;
            for (const key of Object.keys(sums) as Array<keyof StepBreakdownMs>) sums[key] += ranks.reduce((s, r) => s + r.breakdownMs[key], 0) / ranks.length;
            samplesPerSecTotal += ranks.reduce((s, r) => s + r.samplesPerSec, 0);
          }
          tensorCounts.push(tf.memory().numTensors);
          emit({ type: 'step', epoch: progress.epoch, step: progress.step, totalSteps, ranks, elapsedSec: (performance.now() - started) / 1000 });
          if (config.evalEvery > 0 && progress.step % config.evalEvery === 0 && progress.consumed < trainSet.length) {
            lastEval = await evaluate(pg, model, testSet);
            emit({ type: 'eval', epoch: progress.epoch, step: progress.step, ...lastEval });
          }
          if (config.checkpointEvery > 0 && progress.step % config.checkpointEvery === 0 && pg.rank === 0) {
            await checkpoint(model, optimizer, progress, opts);
          }
          if (stoppedBy !== null) {
            emit({ type: 'stopped', by: stoppedBy, atStep: progress.step });
            outcome = 'stopped';
            break epochs;
          }
          if (joinWanted && membership.elastic) {
            outcome = 'regroup';
            break epochs;
          }
        }
        if (progress.consumed >= trainSet.length) {
          lastEval = await evaluate(pg, model, testSet);
          emit({ type: 'eval', epoch: progress.epoch, step: progress.step, ...lastEval });
          progress.epoch++;
          progress.consumed = 0;
          progress.coverage[progress.epoch] = [];
          if (pg.rank === 0 && (config.checkpointEvery > 0 || config.elastic)) await checkpoint(model, optimizer, progress, opts);
        }
      }

      if (outcome === 'regroup') {
        emit({ type: 'log', level: 'info', message: `Tabs are waiting to join: regrouping after step ${progress.step}` });
        await membership.regroup(generation);
        generation = await nextGeneration(membership, generation.id, emit);
        continue;
      }
      if (lastEval === null || outcome === 'stopped' || !finishedEpoch(progress)) lastEval = await evaluate(pg, model, testSet);
      return await finish();

      async function finish(): Promise<TrainResult> {
        const p = progress!;
        const weights = await ddp.flatWeights();
        const probeCount = Math.min(8, testSet.length);
        const probeBatch = testSet.batch(Array.from({ length: probeCount }, (_, i) => i));
        const logitsT = tf.tidy(() => model.predict(tf.tensor(probeBatch.x, [probeCount, ...testSet.inputShape])) as tf.Tensor);
        const logits = (await logitsT.data()) as Float32Array;
        logitsT.dispose();
        const coverage = p.coverage.filter((spans) => spans.length > 0);
        const summary: Record<string, unknown> = {
          rank: pg.rank,
          worldSize: pg.worldSize,
          backend: backendChoice.backend,
          model: config.model,
          dataset: config.dataset,
          steps: p.step,
          epochs: p.epoch,
          samplesPerSec: timedSteps > 0 ? samplesPerSecTotal / timedSteps : null,
          finalLoss: lastLoss,
          testAccuracy: lastEval!.testAccuracy,
          testLoss: lastEval!.testLoss,
          weightHash: hashFloat32(weights),
          breakdownMs: Object.fromEntries(Object.entries(sums).map(([key, v]) => [key, timedSteps > 0 ? v / timedSteps : null])),
          seconds: (performance.now() - started) / 1000,
          generations: p.generations,
          stepsRedone: p.stepsRedone,
          pausedGenerations,
          resumes: p.resumes,
          // Per epoch: the spans of the sample order trained on, and whether they cover it exactly once.
          samplesSeen: coverage.map((spans) => ({
            spans,
            samples: spans.reduce((s, [a, b]) => s + b - a, 0),
            exactlyOnce: exactlyOnce(spans),
            complete: spans.length > 0 && spans[spans.length - 1][1] === trainSet.length,
          })),
          // Live tensors after each step: flat when nothing leaks.
          liveTensors: { steps: tensorCounts.length, min: Math.min(...tensorCounts), max: Math.max(...tensorCounts) },
          ...(flags.checkWeights ? { identicalEveryStep: hashChecks.every(Boolean), checkedSteps: hashChecks.length } : {}),
          ...(stoppedBy !== null ? { stoppedBy } : {}),
          ...(flags.recordIndices ? { trainedOn } : {}),
          ...(flags.returnWeights && pg.rank === 0 ? { weights: encodeValue(new Uint8Array(weights.buffer, weights.byteOffset, weights.byteLength)) } : {}),
        };
        emit({ type: 'done', summary });
        return { summary, model, pg, probe: { inputs: probeBatch.x, inputShape: testSet.inputShape, logits } };
      }
    } catch (err) {
      if (!membership.elastic || !recoverable(err)) {
        pg.destroy();
        throw err;
      }
      const e = err as Error;
      emit({ type: 'log', level: 'warn', message: `Generation failed at step ${progress?.step ?? 0}${inFlight > 0 ? ` (step ${inFlight} in flight)` : ''}: ${e.message}` });
      generation = await nextGeneration(membership, generation.id, emit);
    }
  }
}

const finishedEpoch = (p: Progress) => p.consumed === 0;

/** Failures a new generation can recover from: a lost rank or server, a replaced group. */
function recoverable(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  return !['ConfigMismatchError', 'ShapeMismatchError', 'CollectiveMismatchError', 'RangeError', 'TypeError'].includes(err.name);
}

async function nextGeneration(membership: Membership, after: number, emit: (e: TrainEvent) => void): Promise<{ id: number; pg: ProcessGroup }> {
  emit({ type: 'log', level: 'info', message: 'Waiting for the next generation of the group…' });
  return membership.next(after);
}

/** Every tab of a session must train the same job: the first to arrive sets it. */
async function agreeOnConfig(opts: TrainerOptions): Promise<void> {
  const { config, store } = opts;
  const mine = JSON.stringify({ ...config, worldSize: config.elastic ? null : config.worldSize });
  const theirs = new TextDecoder().decode(await store.compareSet('__train/config', '', mine));
  if (theirs === mine) return;
  const session = JSON.parse(theirs) as Record<string, unknown>;
  const agreed = JSON.parse(mine) as Record<string, unknown>;
  const diffs = Object.keys(session)
    .filter((k) => JSON.stringify(session[k]) !== JSON.stringify(agreed[k]))
    .map((k) => `${k}: session ${JSON.stringify(session[k])}, this tab ${JSON.stringify(agreed[k])}`);
  throw new ConfigMismatchError(`this tab's configuration disagrees with session "${opts.session}": ${diffs.join('; ')}`);
}

/** A fixed group (initProcessGroup) or an elastic one (ElasticAgent), behind one interface. */
async function joinGroup(opts: TrainerOptions, onPaused: () => void): Promise<Membership> {
  const { config, emit, store } = opts;
  if (!config.elastic) {
    const stopWaiting = store.on('members', (e) => emit({ type: 'waiting', joined: e.ranks, worldSize: e.worldSize }));
    const pg = await initProcessGroup({ url: opts.serverUrl, session: opts.session, worldSize: config.worldSize, rank: opts.rank, timeoutMs: opts.timeoutMs, store });
    stopWaiting();
    return {
      elastic: undefined,
      first: async () => ({ id: 1, pg }),
      next: () => Promise.reject(new Error('a fixed-size group has no next generation')),
      pendingJoins: () => 0,
      regroup: async () => {},
    };
  }
  store.close(); // the agent keeps its own connection, and reconnects it
  const agent = await ElasticAgent.start({
    url: opts.serverUrl,
    session: opts.session,
    min: config.elastic.min,
    max: config.elastic.max,
    timeoutMs: opts.timeoutMs,
  });
  agent.on((e) => {
    switch (e.type) {
      case 'paused':
        onPaused();
        emit({ type: 'log', level: 'warn', message: `Paused: ${e.members} rank(s), below the minimum of ${e.min}. Training resumes when more tabs join.` });
        emit({ type: 'waiting', joined: [], worldSize: e.min });
        break;
      case 'waiting':
        emit({ type: 'log', level: 'info', message: `Waiting to join: ${e.reason}` });
        break;
      case 'join-pending':
        emit({ type: 'log', level: 'info', message: `${e.waiting} tab(s) waiting to join at the next step` });
        break;
      case 'reconnecting':
        emit({ type: 'log', level: 'warn', message: `Server unreachable (${e.reason}); reconnecting in ${Math.round(e.waitMs / 100) / 10} s (attempt ${e.attempt})` });
        break;
      case 'reconnected':
        emit({ type: 'log', level: 'info', message: 'Reconnected to the server' });
        break;
      case 'generation':
        emit({ type: 'log', level: 'info', message: `Generation ${e.gen}: rank ${e.rank} of ${e.worldSize}` });
        break;
      default: {
        const unknown: never = e;
        void unknown;
      }
    }
  });
  return {
    elastic: agent,
    first: () => agent.next(0),
    next: (after) => agent.next(after),
    pendingJoins: () => agent.pendingJoins,
    regroup: async (generation) => {
      // Everyone past the step's last collective first, so the new generation interrupts nobody.
      await generation.pg.barrier();
      await agent.requestRegroup(generation as Generation);
    },
  };
}

/**
 * Gives every rank of a new generation the same state: the replica that committed the most steps
 * sends its weights, optimizer state and progress to the others. With no live state anywhere,
 * rank 0 resumes from the latest checkpoint, or everyone starts fresh from the seed.
 */
async function syncState(
  pg: ProcessGroup,
  model: tf.LayersModel,
  optimizer: tf.Optimizer,
  makeOptimizer: () => tf.Optimizer,
  progress: Progress | null,
  inFlight: number,
  opts: TrainerOptions,
): Promise<{ progress: Progress; optimizer: tf.Optimizer }> {
  const { emit } = opts;
  const status = await pg.allGather(Float32Array.of(progress ? progress.step : -1, inFlight));
  let best = -1;
  let source = 0;
  for (let r = 0; r < pg.worldSize; r++) {
    if (status[2 * r] > best) {
      best = status[2 * r];
      source = r;
    }
  }
  // A step some rank had started but nobody committed is trained again.
  let redone = false;
  for (let r = 0; r < pg.worldSize; r++) if (status[2 * r + 1] === best + 1 && best >= 0) redone = true;

  let opt = optimizer;
  const adopt = async (src: number, own: Progress | null): Promise<Progress> => {
    const shared = await shareState(pg, src, model, opt, own);
    // Every rank, the source too, restores the same bytes into a fresh optimizer: a restored Adam
    // recomputes beta powers with pow(), which can differ in the last bit from the running product,
    // so only restoring everywhere keeps the replicas bit-identical. (Fresh, because TF.js's
    // setWeights would leak the old moment variables.)
    opt.dispose();
    opt = makeOptimizer();
    await loadOptimizerState(opt, shared.optimizer);
    return shared.progress;
  };
  if (best < 0) {
    // Nobody has trained yet: a checkpoint, if there is one, else the seed.
    const resumed = pg.rank === 0 ? await restoreFromCheckpoint(model, makeOptimizer, opts) : null;
    if (resumed) {
      opt.dispose();
      opt = resumed.optimizer;
    }
    const flags = await pg.broadcast(Float32Array.of(resumed ? 1 : 0), 0);
    if (flags[0] === 0) return { progress: freshProgress(), optimizer: opt };
    return { progress: await adopt(0, resumed?.progress ?? null), optimizer: opt };
  }
  const next = await adopt(source, pg.rank === source ? progress : null);
  if (redone) next.stepsRedone++;
  if (progress !== null || pg.rank !== source) {
    const note = `resumed at step ${next.step} from the replica of rank ${source}${redone ? `; step ${best + 1} is trained again` : ''}`;
    next.resumes.push(note);
    emit({ type: 'log', level: 'info', message: `New group of ${pg.worldSize}: ${note}` });
  }
  return { progress: next, optimizer: opt };
}

/** Broadcasts `source`'s progress, weights and optimizer state to every rank of the group. */
async function shareState(
  pg: ProcessGroup,
  source: number,
  model: tf.LayersModel,
  optimizer: tf.Optimizer,
  progress: Progress | null,
): Promise<{ progress: Progress; optimizer: TensorBundle }> {
  // First a small JSON message (progress and the optimizer's layout), as bytes.
  let opt: TensorBundle = { weightSpecs: [], weightData: new ArrayBuffer(0) };
  let header = new Float32Array(0);
  if (pg.rank === source) {
    opt = await optimizerState(optimizer);
    const json = new TextEncoder().encode(JSON.stringify({ progress, optimizerSpecs: opt.weightSpecs, optimizerBytes: opt.weightData.byteLength }));
    header = new Float32Array(Math.ceil(json.length / 4));
    new Uint8Array(header.buffer).set(json);
  }
  const length = await pg.broadcast(Float32Array.of(header.length), source);
  if (pg.rank !== source) header = new Float32Array(length[0]);
  await pg.broadcast(header, source);
  const text = new TextDecoder().decode(new Uint8Array(header.buffer)).replace(/\0+$/, '');
  const meta = JSON.parse(text) as { progress: Progress; optimizerSpecs: TensorBundle['weightSpecs']; optimizerBytes: number };

  // Then the weights, in trainableWeights order.
  const weights = tf.tidy(() => tf.concat(model.trainableWeights.map((w) => w.read().reshape([-1]))));
  const flat = (await weights.data()) as Float32Array;
  weights.dispose();
  await pg.broadcast(flat, source);
  if (pg.rank !== source) {
    let offset = 0;
    for (const w of model.trainableWeights) {
      const size = w.shape.reduce<number>((a, b) => a * (b ?? 1), 1);
      const t = tf.tensor(flat.subarray(offset, offset + size), w.shape as number[], 'float32');
      w.write(t);
      t.dispose();
      offset += size;
    }
  }
  // Then the optimizer state (all of its tensors are 4-byte types).
  const optFlat = pg.rank === source ? new Float32Array(opt.weightData) : new Float32Array(meta.optimizerBytes / 4);
  await pg.broadcast(optFlat, source);
  return { progress: structuredClone(meta.progress), optimizer: { weightSpecs: meta.optimizerSpecs, weightData: optFlat.buffer as ArrayBuffer } };
}

/** Rank 0: the latest valid checkpoint of this session (or of `resumeFrom`), if any. */
async function restoreFromCheckpoint(
  model: tf.LayersModel,
  makeOptimizer: () => tf.Optimizer,
  opts: TrainerOptions,
): Promise<{ progress: Progress; optimizer: tf.Optimizer } | null> {
  const session = opts.config.resumeFrom ?? opts.session;
  const loaded = await loadCheckpoint(opts.serverUrl, session);
  if (!loaded) return null;
  for (const s of loaded.skipped) {
    opts.emit({ type: 'log', level: 'warn', message: `Checkpoint ${s.name} is unusable (${s.reason}); using the previous one, ${loaded.name}` });
  }
  loadModelWeights(model, loaded.checkpoint.model);
  const optimizer = makeOptimizer();
  await loadOptimizerState(optimizer, loaded.checkpoint.optimizer);
  const saved = loaded.checkpoint.meta.progress as Progress;
  const skipped = loaded.skipped.map((k) => `${k.name} (${k.reason})`).join(', ');
  const note = `resumed at step ${saved.step} from checkpoint ${loaded.name} of session "${session}"${skipped ? `; skipped unusable ${skipped}` : ''}`;
  const progress: Progress = { ...saved, resumes: [...saved.resumes, note] };
  opts.emit({ type: 'log', level: 'info', message: `Resumed from checkpoint ${loaded.name} (step ${saved.step}, epoch ${saved.epoch + 1})` });
  return { progress, optimizer };
}

/** Rank 0 saves the model, optimizer state and progress to the server's disk. */
async function checkpoint(model: tf.LayersModel, optimizer: tf.Optimizer, progress: Progress, opts: TrainerOptions): Promise<void> {
  try {
    const saved = await saveCheckpoint(opts.serverUrl, opts.session, {
      meta: { step: progress.step, epoch: progress.epoch, consumed: progress.consumed, progress, config: opts.config },
      model: await modelArtifacts(model),
      optimizer: await optimizerState(optimizer),
    });
    opts.emit({ type: 'log', level: 'info', message: `Checkpoint ${saved.name} saved (step ${progress.step}, ${saved.bytes} bytes)` });
  } catch (err) {
    // Training goes on; the previous checkpoint is still there.
    opts.emit({ type: 'log', level: 'warn', message: `Checkpoint at step ${progress.step} failed: ${(err as Error).message}` });
  }
}

function addSpan(spans: Array<[number, number]>, start: number, end: number): void {
  const last = spans[spans.length - 1];
  if (last && last[1] === start) last[1] = end;
  else spans.push([start, end]);
}

/** True when the spans run from 0 with no gap and no overlap: every sample so far trained on once. */
function exactlyOnce(spans: Array<[number, number]>): boolean {
  let at = 0;
  for (const [a, b] of spans) {
    if (a !== at || b < a) return false;
    at = b;
  }
  return true;
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
