/**
 * The built-in training job as a pipeline (x data-parallel) run: `--pp S --dp D`. The library's
 * `runPipeline` carries the layout, the subgroups, the schedule and the checkpoints; what is left
 * here is what the plain job does too (data, metrics, evaluation, the dashboard's events), and the
 * pipeline's own figures: each stage's layers and memory, the measured bubble beside the
 * formula, where a step's time went, and the schedule's timeline.
 */
import * as tf from '@tensorflow/tfjs';
import { bubbleFraction, classificationLoss, correctPredictions, fetchBatch, labelsPerSample, hashFloat32, layerFactoriesOf, modelLayers, runPipeline, slowFactor, Straggler, type Dataset, type ElasticEvent, type PipelineMesh, type PipelineRoundContext, type PipelineStage, type TimelineEntry } from '../../src/index.ts';
import { flatTrainableWeights } from '../../src/parallel/replicas.ts';
import { encodeValue } from '../../src/wire/protocol.ts';
import { linkReport } from '../report.ts';
import { fleetReporter } from './fleet_local.ts';
import { labelsTensor, labelTotals } from './evaluation.ts';
import { modelSpecOf, startJob, dashboardEvents, watchLinks, type Metrics, type PipelineMetrics, type TrainerOptions, type TrainResult } from './harness.ts';
import { hostOptimizer } from '../../src/jobs/train_config.ts';

/** Every this many steps the ranks gather replica 0's timeline for the dashboard. */
const TIMELINE_EVERY = 5;

type StepFigures = Metrics & PipelineMetrics;

export async function trainPipeline(opts: TrainerOptions): Promise<TrainResult> {
  const { config, emit, flags } = opts;
  const started = performance.now();
  const { backend, gpu, trainSet, testSet, newModel } = await startJob(opts);
  const shareFleet = fleetReporter(opts.emit);
  // The host's model: loaded whole once, each stage built from its share of the layers, with their weights.
  const layers = config.model === 'user' ? layerFactoriesOf(await newModel()) : modelLayers(modelSpecOf(config, trainSet));
  const schedule = config.schedule;
  const microBatches = config.microBatches;
  const activationDtype = config.activationDtype;
  const loss = (out: tf.Tensor, labels: tf.Tensor) => classificationLoss(out, labels, trainSet.numClasses);

  const sums = { compute: 0, waitActivations: 0, waitGradients: 0, allreduce: 0, apply: 0, bubble: 0, slowed: 0 };
  // --slow: this tab's factor is looked up by its world rank in the current round, every step.
  let straggler = new Straggler(1);
  let timedSteps = 0;
  let samplesPerSecTotal = 0;
  let peakTensors = 0;
  let peakStashed = 0;
  const tensorCounts: number[] = [];
  const hashChecks: boolean[] = [];
  let lastLoss = NaN;
  let lastTimeline: { entries: TimelineEntry[]; total: number } = { entries: [], total: 0 };
  const evals: Array<{ step: number; testAccuracy: number; testLoss: number }> = [];
  const toDashboard = dashboardEvents(emit, true);

  const evaluateAndEmit = async (ctx: PipelineRoundContext, step: number, epoch: number) => {
    const result = { step, ...(await evaluate(ctx, testSet, config.batchSize, microBatches)) };
    evals.push(result);
    emit({ type: 'eval', epoch, ...result });
    return result;
  };

  const run = await runPipeline<StepFigures>({
    url: opts.serverUrl,
    session: opts.session,
    // Read at each use (checkpoints): the host's removal of a tab changes it during the run.
    get token() {
      return opts.token;
    },
    onToken: opts.onToken,
    onRendezvous: opts.onRendezvous,
    ...(opts.rank === undefined ? {} : { rank: opts.rank }),
    timeoutMs: opts.timeoutMs,
    store: opts.store,
    stages: config.pp,
    replicas: config.dp,
    layers,
    inputShape: trainSet.inputShape,
    ...(config.splitPoints ? { splitPoints: config.splitPoints } : {}),
    optimizer: () => hostOptimizer(config),
    datasetLength: trainSet.length,
    batchSize: config.batchSize,
    epochs: config.epochs,
    steps: config.steps,
    shuffle: config.shuffle,
    seed: config.seed,
    // A lost rank sends every stage back to the last checkpoint: without one set, the run would start over.
    checkpointEvery: config.checkpointEvery > 0 ? config.checkpointEvery : 50,
    checkpointMeta: { config: { ...config } },
    resumeFrom: config.resumeFrom,
    shouldStop: opts.stopRequested,
    stopVote: opts.stopVote ?? 'any',
    ...(opts.host === undefined ? {} : { host: opts.host }),
    ddp: { errorIfNonfinite: true },
    checkReplicasEvery: config.dp > 1 ? 100 : 0,

    async step({ indices, stage, ddp, optimizer, mesh }) {
      const t0 = performance.now();
      const factor = slowFactor(config.slow, mesh.world.rank);
      if (straggler.factor !== factor) straggler = new Straggler(factor);
      const batch = await fetchBatch(trainSet, indices);
      const r = await stage.step({
        ddp,
        batchSize: indices.length,
        microBatches,
        schedule,
        activationDtype,
        // A straggler stage waits after each pass in proportion to its compute, before sending on.
        ...(straggler.slow ? { straggler } : {}),
        ...(stage.isFirst ? { inputs: batch.x } : {}),
        ...(stage.isLast ? { labels: Int32Array.from(batch.y), loss, metric: (out: tf.Tensor, labels: tf.Tensor) => correctPredictions(out, labels) } : {}),
      });
      const a0 = performance.now();
      await ddp.step(optimizer);
      const apply = performance.now() - a0;
      peakTensors = Math.max(peakTensors, r.peakTensors);
      peakStashed = Math.max(peakStashed, r.peakStashed);
      lastTimeline = { entries: r.timeline, total: r.timings.total };
      const hash = flags.checkWeights ? parseInt(await ddp.weightsHash(), 16) : 0;
      return {
        loss: r.loss,
        accuracy: r.metric / (indices.length * labelsPerSample(trainSet)),
        samples: indices.length,
        samplesPerSec: (indices.length / (performance.now() - t0)) * 1000,
        compute: r.timings.compute,
        readback: 0,
        allreduce: r.timings.allreduce,
        // The stage's all-reduce runs after its last backward: no span is measured to overlap.
        comm: 0,
        apply,
        waitActivations: r.timings.waitActivations,
        waitGradients: r.timings.waitGradients,
        slowed: r.timings.slowed,
        bubble: r.bubble,
        stage: mesh.stage,
        replica: mesh.replica,
        hashHi: hash >>> 16,
        hashLo: hash & 0xffff,
      };
    },

    onRound({ mesh, stage }) {
      emit({ type: 'joined', rank: mesh.world.rank, worldSize: mesh.world.worldSize, round: mesh.world.round, backend: backend.backend, fallbackReason: backend.fallbackReason, adapter: gpu.adapter, ...(backend.probe ? { probe: backend.probe } : {}) });
      shareFleet(mesh.world, backend, gpu.adapter);
      emit({
        type: 'pipeline',
        ...placeOf(mesh),
        schedule,
        microBatches,
        layers: stage.allLayers.map((l) => ({ index: l.index, className: l.className, parameters: l.parameters, stage: l.stage })),
        bubbleFormula: bubbleFraction(mesh.stages, microBatches),
      });
      watchLinks(mesh.world, emit);
    },

    async onStep(ctx) {
      const { mesh, step, epoch, metrics } = ctx;
      // The loss and accuracy are the last stage's; the other stages of its replica show the same.
      const lastStage = metrics.filter((m) => m.stage === mesh.stages - 1);
      lastLoss = lastStage.reduce((s, m) => s + (m.loss ?? NaN), 0) / lastStage.length;
      if (flags.checkWeights) {
        // Replicas of one stage must agree; different stages hold different weights.
        hashChecks.push(metrics.every((m) => metrics.filter((o) => o.stage === m.stage).every((o) => o.hashHi === m.hashHi && o.hashLo === m.hashLo)));
      }
      if (step > 1) {
        // The first step compiles shaders: leave it out of the averages.
        timedSteps++;
        const mine = metrics[mesh.world.rank]!;
        for (const key of Object.keys(sums) as Array<keyof typeof sums>) sums[key] += mine[key];
        samplesPerSecTotal += metrics.filter((m) => m.stage === 0).reduce((s, m) => s + m.samplesPerSec, 0);
      }
      tensorCounts.push(tf.memory().numTensors);
      if (step === 1 || step % TIMELINE_EVERY === 0) await emitTimeline(ctx, step, lastTimeline, microBatches, emit);
      if (config.evalEvery > 0 && step % config.evalEvery === 0) await evaluateAndEmit(ctx, step, epoch);
    },

    async onEpochEnd(ctx) {
      await evaluateAndEmit(ctx, ctx.step, ctx.epoch);
    },

    onEvent: (e: ElasticEvent) => toDashboard(fillLosses(e, config.pp)),
  });

  const { mesh, stage, ddp } = run;
  const ctx: PipelineRoundContext = { mesh, stage, ddp, step: run.steps, epoch: run.epoch };
  if (run.stoppedBy !== null) emit({ type: 'stopped', by: run.stoppedBy, atStep: run.steps });
  const latest = evals.at(-1);
  const final = latest?.step === run.steps ? latest : await evaluateAndEmit(ctx, run.steps, run.epoch);
  const weights = await flatTrainableWeights(stage.model);
  const whole = flags.returnWeights ? await gatherModelWeights(stage, mesh.replica, weights) : null;
  // What the trained pipeline predicts on the first test samples (the last stage holds the logits).
  const probeCount = Math.min(8, testSet.length);
  const probeBatch = await fetchBatch(testSet, Array.from({ length: probeCount }, (_, i) => i));
  const logitsT = await stage.forward({ batchSize: probeCount, ...(stage.isFirst ? { inputs: probeBatch.x } : {}) });
  const logits = logitsT ? ((await logitsT.data()) as Float32Array) : new Float32Array(0);
  logitsT?.dispose();
  const links = await linkReport(mesh.world);
  const mean = (v: number) => (timedSteps > 0 ? v / timedSteps : null);
  const summary: Record<string, unknown> = {
    rank: mesh.world.rank,
    worldSize: mesh.world.worldSize,
    backend: backend.backend,
    model: config.model,
    dataset: config.dataset,
    steps: run.steps,
    epochs: run.epoch,
    samplesPerSec: mean(samplesPerSecTotal),
    finalLoss: lastLoss,
    testAccuracy: final.testAccuracy,
    testLoss: final.testLoss,
    // The language model: its test loss per character as a perplexity (the stages cannot sample: each holds a part).
    ...(config.model === 'lm' ? { perplexity: Math.exp(final.testLoss) } : {}),
    weightHash: hashFloat32(weights),
    breakdownMs: {
      compute: mean(sums.compute),
      waitActivations: mean(sums.waitActivations),
      waitGradients: mean(sums.waitGradients),
      allreduce: mean(sums.allreduce),
      apply: mean(sums.apply),
      // --slow: this rank's own waits, as every figure here is this rank's.
      ...(config.slow !== null ? { slowed: mean(sums.slowed) } : {}),
    },
    // --slow: this rank's factor (its stage is slowed) and the ms it waited per step on average.
    ...(config.slow !== null ? { slowFactor: slowFactor(config.slow, mesh.world.rank), slowedMs: mean(sums.slowed) } : {}),
    seconds: (performance.now() - started) / 1000,
    generations: run.generations,
    stepsRedone: run.stepsRedone,
    resumes: run.resumes,
    liveTensors: { steps: tensorCounts.length, min: Math.min(...tensorCounts), max: Math.max(...tensorCounts) },
    pipeline: {
      ...placeOf(mesh),
      schedule,
      microBatches,
      activationDtype,
      layers: stage.layers.map((l) => l.index),
      layerClasses: stage.layers.map((l) => l.className),
      parameters: stage.parameterCount,
      peakLiveTensors: peakTensors,
      peakStashedMicroBatches: peakStashed,
      bubble: { measured: mean(sums.bubble), formula: bubbleFraction(mesh.stages, microBatches) },
      breakdownMs: { compute: mean(sums.compute), waitActivations: mean(sums.waitActivations), waitGradients: mean(sums.waitGradients), allreduce: mean(sums.allreduce), apply: mean(sums.apply) },
      weightHash: hashFloat32(weights),
    },
    links,
    ...(flags.checkWeights ? { identicalEveryStep: hashChecks.every(Boolean), checkedSteps: hashChecks.length } : {}),
    ...(run.stoppedBy !== null ? { stoppedBy: run.stoppedBy } : {}),
    ...(whole ? { weights: encodeValue(new Uint8Array(whole.buffer, whole.byteOffset, whole.byteLength)) } : {}),
  };
  emit({ type: 'done', summary });
  return {
    summary,
    model: stage.model,
    pg: mesh.world,
    close: run.close,
    probe: { inputs: stage.isLast ? probeBatch.x : new Float32Array(0), inputShape: testSet.inputShape, logits },
  };
}

/** This rank's place in the S x D layout, as the dashboard and the summary say it. */
function placeOf(mesh: PipelineMesh): { stage: number; stages: number; replica: number; replicas: number } {
  return { stage: mesh.stage, stages: mesh.stages, replica: mesh.replica, replicas: mesh.replicas };
}

/**
 * A pipeline's stages other than the last do not compute the loss: on the dashboard each rank of
 * a replica shows its replica's loss and accuracy (those of its last stage).
 */
function fillLosses(e: ElasticEvent, stages: number): ElasticEvent {
  if (e.type !== 'step') return e;
  const metrics = e.metrics.map((m, rank) => {
    const last = e.metrics[Math.floor(rank / stages) * stages + stages - 1];
    return last ? { ...m, loss: last.loss!, accuracy: last.accuracy! } : m;
  });
  return { ...e, metrics };
}

/**
 * The schedule as it ran on replica 0's stages in the last step, gathered over the world (every
 * rank calls this at the same step: it is a collective) and sent to the dashboard.
 */
async function emitTimeline(ctx: PipelineRoundContext, step: number, mine: { entries: TimelineEntry[]; total: number }, microBatches: number, emit: TrainerOptions['emit']): Promise<void> {
  const slots = 2 * microBatches;
  const row = new Float32Array(1 + 4 * slots).fill(-1);
  row[0] = mine.total;
  mine.entries.slice(0, slots).forEach((t, i) => row.set([t.phase === 'F' ? 0 : 1, t.microBatch, t.start, t.end], 1 + 4 * i));
  const all = await ctx.mesh.world.allGather(row);
  const stages = Array.from({ length: ctx.mesh.stages }, (_, s) => {
    const r = all.subarray(s * row.length, (s + 1) * row.length);
    const entries: TimelineEntry[] = [];
    for (let i = 0; i < slots; i++) {
      const [phase, microBatch, start, end] = r.subarray(1 + 4 * i, 5 + 4 * i);
      if (phase! < 0) continue;
      entries.push({ phase: phase === 0 ? 'F' : 'B', microBatch: microBatch!, start: start!, end: end! });
    }
    return { stage: s, totalMs: r[0]!, entries };
  });
  emit({ type: 'timeline', step, stages });
}

/**
 * Test accuracy and loss through the pipelines: replica d evaluates every D-th test sample, its
 * first stage feeding the inputs and its last computing the sums, which are all-reduced over
 * the world (the other stages add zeros).
 */
async function evaluate(ctx: PipelineRoundContext, test: Dataset, batch: number, microBatches: number): Promise<{ testAccuracy: number; testLoss: number }> {
  const { mesh, stage } = ctx;
  const totals = new Float32Array(3); // correct, loss sum, count
  const mine: number[] = [];
  for (let i = mesh.replica; i < test.length; i += mesh.replicas) mine.push(i);
  // Batches of the training batch's size: a stage waits for the one before it one micro-batch
  // at a time, never for a pass much longer than training's.
  for (let s = 0; s < mine.length; s += batch) {
    const idx = mine.slice(s, s + batch);
    const { x, y } = await fetchBatch(test, idx);
    const logits = await stage.forward({ batchSize: idx.length, microBatches, ...(stage.isFirst ? { inputs: x } : {}) });
    if (!logits) continue;
    const out = tf.tidy(() => labelTotals(logits, labelsTensor(test, y, idx.length), test.numClasses));
    logits.dispose();
    const [c, l] = await out.data();
    out.dispose();
    totals[0] += c!;
    totals[1] += l!;
    totals[2] += idx.length * labelsPerSample(test);
  }
  await mesh.world.allReduce(totals, 'sum');
  return { testAccuracy: totals[0]! / totals[2]!, testLoss: totals[1]! / totals[2]! };
}

/**
 * The whole model's trainable weights in model order, on replica 0's first stage (world rank 0):
 * every other stage of replica 0 sends its own; other replicas hold copies and send nothing.
 */
async function gatherModelWeights(stage: PipelineStage, replica: number, mine: Float32Array): Promise<Float32Array | null> {
  if (replica !== 0) return null;
  const pipe = stage.group;
  if (!stage.isFirst) {
    await pipe.send(Float32Array.of(mine.length), 0);
    await pipe.send(mine, 0);
    return null;
  }
  const parts = [mine];
  for (let s = 1; s < stage.numStages; s++) {
    const [length] = await pipe.recv(new Float32Array(1), s);
    parts.push(await pipe.recv(new Float32Array(length!), s));
  }
  const whole = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    whole.set(p, at);
    at += p.length;
  }
  return whole;
}
