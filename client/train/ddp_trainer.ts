/**
 * The data-parallel (DDP) strategy's trainer: every rank trains the whole model on its share of
 * each batch and DDP averages the gradients, with its comm hooks, devices, stragglers and summary.
 */
import * as tf from '@tensorflow/tfjs';
import {
  DataParallel,
  TrainState,
  type BackwardOptions,
  type DistributedDataParallel,
  classificationLoss,
  correctPredictions,
  fetchBatch,
  hashFloat32,
  labelsPerSample,
  isRecoverable,
  runElastic,
  slowFactor,
  Straggler,
  type Json,
  type ProcessGroup,
  type StepTimeline,
} from '../../src/index.ts';
import { encodeValue } from '../../src/c10d/protocol.ts';
import { linkReport } from '../report.ts';
import type { BackendChoice } from './backend.ts';
import { attackPlanOf, hostOptimizer, sampleDue, type BackendName } from '../../src/jobs/train_config.ts';
import type { StepBreakdownMs, TrainEvent } from './events.ts';
import { commSetup, denseStepBytes, plainAllReduceBytes, TRAIN_FRAME_BYTES, type CommSetup } from './comm.ts';
import { allReduceBytes } from '../../src/c10d/collective_bytes.ts';
import { DiLoCo, fragmentRanges, fragmentsSyncingAt } from '../../src/parallel/diloco.ts';
import { setActiveDataParallel } from '../device_hook.ts';
import { fleetReporter } from './fleet_local.ts';
import { contributionTracker } from './contributions.ts';
import { evaluate, evaluateAndReport, labelsTensor } from './evaluation.ts';
import { dashboardEvents, sampleText, startJob, watchLinks, type CommMetrics, type DeviceMetrics, type Metrics, type TrainerOptions, type TrainResult } from './harness.ts';

/** Every how many steps the page hears its devices' figures. */
const DEVICE_REPORT_EVERY = 10;

export async function trainDdp(opts: TrainerOptions): Promise<TrainResult> {
  const { config, emit, flags } = opts;
  const started = performance.now();
  const job = await startJob(opts);
  const { gpu, trainSet, testSet } = job;
  const shareFleet = fleetReporter(emit);
  // `let`: a lost WebGPU device is re-created (or falls back) during the run.
  let backend: BackendChoice = job.backend;
  // The model and its state are rebuilt when this tab's GPU is lost: everything below reads these two.
  const { newModel } = job;
  const newState = (m: tf.LayersModel) => new TrainState({ model: m, optimizer: () => hostOptimizer(config) });
  let model = await newModel();
  let state = newState(model);
  opts.onModel?.(model, job.text?.tokenizer.chars);
  // --devices K > 1: K Workers compute each batch's gradients (DataParallel). Made for the model
  // they serve: a model rebuilt after a lost GPU gets devices of its own at its first step.
  let dp: DataParallel | undefined;
  const devicesFor = async (m: tf.LayersModel): Promise<DataParallel | undefined> => {
    if (config.devices <= 1) return undefined;
    if (dp?.model === m) return dp;
    dp?.close();
    dp = undefined;
    const made = await DataParallel.create(m, { devices: config.devices, backend: config.backend === 'auto' ? backend.backend : config.backend, loss: { kind: 'softmaxCrossEntropy', numClasses: trainSet.numClasses } });
    dp = made;
    setActiveDataParallel(made);
    emit({ type: 'devices', devices: made.devices });
    const fallbacks = made.devices.filter((d) => d.fallbackReason);
    for (const d of fallbacks) emit({ type: 'log', level: 'warn', message: `Device ${d.device}: ${d.fallbackReason}` });
    emit({ type: 'log', level: 'info', message: `This tab computes on ${made.devices.length} devices (Workers): ${made.devices.map((d) => `device ${d.device} on ${d.backend}`).join(', ')}` });
    return made;
  };

  const sums: StepBreakdownMs & { slowed: number } = { compute: 0, readback: 0, allreduce: 0, apply: 0, slowed: 0 };
  // --comm-hook: one hook for the whole run (runElastic registers it on each round's DDP and keeps its state).
  const comm = commSetup(config.commHook);
  const robust = { aggregation: config.aggregation, ...(config.attack ? { attack: attackPlanOf(config.attack) } : {}) };
  // Robust aggregation: the judgments of each step, to the dashboard and, added up, to the result.
  const judged = contributionTracker(dashboardEvents(emit, config.min === config.max));
  const hook = comm.hook;
  /** This rank's bytes over the timed steps, sent and the float32 all-reduce's; and localsgd's averagings among them. */
  const bytes = { sent: 0, dense: 0, averagings: 0, afterStart: 0, stepsAfterStart: 0 };
  let commSpan = 0;
  // This rank's step, split: the exposed all-reduce is waiting for the slowest rank plus the wire,
  // estimated per step as the least any rank waited (the last rank to arrive waits only for the wire).
  const own = { compute: 0, readback: 0, waitSlowest: 0, wire: 0, apply: 0, batch: 0 };
  // The step after which the hook compresses (PowerSGD's startIter, post-local SGD's startStep; 0: from the first).
  const hookStart = comm.spec.kind === 'powersgd' ? comm.spec.startIter : comm.spec.kind === 'localsgd' ? comm.spec.startStep : 0;
  // --slow: this tab's factor is looked up by its rank in the current round, every step.
  let straggler = new Straggler(1);
  let slowedTotal = 0;
  let timedSteps = 0;
  let samplesPerSecTotal = 0;
  const tensorCounts: number[] = [];
  const hashChecks: boolean[] = [];
  let lastLoss = NaN;
  const evals: Array<{ step: number; testAccuracy: number; testLoss: number }> = [];
  let announcedModel = false;

  let lastSample: Extract<TrainEvent, { type: 'sample' }> | undefined;
  /** The steps after which the language model wrote (the job's report lists them). */
  const sampleSteps: number[] = [];
  // A language model also writes: every tab samples its own replica (the same text where replicas are identical).
  const writeSample = async (step: number) => {
    if (!job.text) return;
    lastSample = await sampleText(model, job.text, step);
    sampleSteps.push(step);
    emit(lastSample);
  };
  const evaluateAndEmit = async (pg: ProcessGroup, step: number, epoch: number, figures?: { testAccuracy: number; testLoss: number }) => {
    const result = { step, ...(figures ?? (await evaluate(pg, model, testSet))) };
    evals.push(result);
    emit({ type: 'eval', epoch, ...result });
    await writeSample(step);
    return result;
  };

  /** The evaluation after the run (see evaluateAndReport); null when the host skipped it. */
  const finalEvaluation = async (pg: ProcessGroup, step: number, epoch: number) => {
    const figures = await evaluateAndReport(pg, model, testSet, step, emit, () => opts.skipEvaluation?.() === true);
    return figures === null ? null : evaluateAndEmit(pg, step, epoch, figures);
  };

  /** This rank's gradients computed on the page's own backend, averaged by DDP; and the right predictions. */
  const backwardHere = async (ddp: DistributedDataParallel, x: Float32Array, y: Int32Array, stretch: BackwardOptions) => {
    const n = y.length / labelsPerSample(trainSet);
    const xs = tf.tensor(x, [n, ...trainSet.inputShape]);
    const ys = labelsTensor(trainSet, y, n);
    let correctT: tf.Tensor | undefined;
    try {
      const result = await ddp.backward(() => {
        const logits = model.apply(xs, { training: true }) as tf.Tensor;
        // Train accuracy from the same forward pass; kept past the gradient computation's tidy.
        correctT = tf.keep(correctPredictions(logits, ys));
        return classificationLoss(logits, ys, trainSet.numClasses);
        // A straggler waits in proportion to its forward, backward and readback, before its all-reduces.
      }, stretch);
      // No samples this step (balanced batches): DDP did not run the forward.
      return { result, correct: correctT ? (await correctT.data())[0]! : 0 };
    } finally {
      // Also when the step fails (a lost GPU): nothing of it may stay behind.
      correctT?.dispose();
      xs.dispose();
      ys.dispose();
    }
  };

  // Started before joining, so that the group does not wait for the Workers at its first step.
  await devicesFor(model);
  let run: Awaited<ReturnType<typeof runElastic<Metrics & CommMetrics & DeviceMetrics & { stepMs: number }>>>;
  try {
    run = await runElastic<Metrics & CommMetrics & DeviceMetrics & { stepMs: number }>({
      url: opts.serverUrl,
      session: opts.session,
      // Read at each use (checkpoints): the host's removal of a tab changes it during the run.
      get token() {
        return opts.token;
      },
      onToken: opts.onToken,
      min: config.min,
      max: config.max,
      rank: config.min === config.max ? opts.rank : undefined,
      timeoutMs: opts.timeoutMs,
      store: opts.store,
      state,
      datasetLength: trainSet.length,
      batchSize: config.batchSize,
      epochs: config.epochs,
      steps: config.steps,
      shuffle: config.shuffle,
      seed: config.seed,
      // An elastic session keeps a checkpoint every 50 steps too: when every tab has gone, the link
      // reopened goes on from there instead of starting a second run under the same name.
      checkpointEvery: config.checkpointEvery > 0 || config.min === config.max ? config.checkpointEvery : 50,
      // A language model's vocabulary too: `npm run export:torch` writes it beside the weights.
      checkpointMeta: { config, ...(job.text ? { vocabulary: job.text.tokenizer.chars } : {}) } as unknown as Json,
      resumeFrom: config.resumeFrom,
      shouldStop: opts.stopRequested,
      stopVote: opts.stopVote ?? 'any',
      ...(opts.host === undefined ? {} : { host: opts.host }),
      spectate: opts.spectate ?? false,
      onRendezvous: opts.onRendezvous,
      // A tab of a shared session is untrusted: a NaN gradient, or replicas that drift apart, end
      // the run with a name instead of spoiling every replica in silence.
      // --aggregation: DDP's gradients, or with DiLoCo its outer step's pseudo-gradients (--attack: for measuring it).
      ddp: { errorIfNonfinite: true, ...(comm.diloco ? {} : robust) },
      // Local SGD's replicas differ on purpose between averagings: a hash check would take that for
      // divergence (the NaN check above still guards every step).
      // DiLoCo's replicas too, but runElastic checks those at the next full outer step after each
      // 100th (without streaming: with it the replicas are identical only at the end).
      checkReplicasEvery: comm.averager ? 0 : 100,
      ...(config.linkWindowBytes === null ? {} : { linkWindowBytes: config.linkWindowBytes }),
      // The host's images, streamed: the next step's load while this one computes (a failure shows at that step).
      ...(trainSet.prepare ? { prefetch: (next: number[]) => void trainSet.prepare!(next).catch(() => {}) } : {}),
      // A slow tab (a phone, a background tab) gets fewer samples per step: the group keeps its pace.
      balanceBatches: config.balance,
      commHook: hook === undefined ? undefined : () => hook,
      modelAverager: comm.modelAverager,
      diloco: comm.diloco && { ...comm.diloco, ...robust },
      // DiLoCo's inner steps meet nowhere: the ranks vote at outer steps, and at least every
      // DILOCO_VOTE_EVERY steps so that a stop, a joiner and the dashboard's figures wait no longer.
      voteEvery: comm.diloco ? Math.min(comm.diloco.syncEvery, DILOCO_VOTE_EVERY) : 1,
      // Votes ride on the gradients (onStep runs a step late), except after the steps an
      // evaluation must see the model of.
      voteAfter: (step) => config.evalEvery > 0 && step % config.evalEvery === 0,
      voteWithGradients: config.voteWithGradients,

      async step({ indices, step, ddp, optimizer, pg }) {
        const t0 = performance.now();
        const factor = slowFactor(config.slow, pg.rank);
        if (straggler.factor !== factor) straggler = new Straggler(factor);
        const { x, y } = await fetchBatch(trainSet, indices);
        const stretch = straggler.slow ? { straggler } : {};
        const devices = await devicesFor(model);
        let result: Awaited<ReturnType<typeof ddp.backward>>;
        let correct: number;
        let deviceMetrics: DeviceMetrics = { devices: 1, deviceMs: 0 };
        if (devices && indices.length > 0) {
          // The devices compute; DDP averages their gathered gradients across ranks (a straggler stretches their time).
          const local = await devices.computeGradients({ x, y });
          result = await ddp.backward(local, stretch);
          correct = local.correct ?? 0;
          const working = local.devices.filter((d) => d.samples > 0);
          deviceMetrics = { devices: devices.devices.length, deviceMs: working.reduce((s, d) => s + d.computeMs, 0) / Math.max(1, working.length) };
          if (step % DEVICE_REPORT_EVERY === 0 || step === 1) emit({ type: 'devices', devices: devices.deviceStats() });
        } else {
          ({ result, correct } = await backwardHere(ddp, x, y, stretch));
        }
        // Robust aggregation refused a rank's gradient (a NaN or an infinity): say which, every step it happens.
        for (const j of ddp.lastAggregation?.step === step ? ddp.lastAggregation.judgments : []) {
          if (j.status === 'refused') emit({ type: 'log', level: 'warn', message: `Step ${step}: rank ${j.rank}'s gradient was refused (${j.reason ?? 'non-finite'}); the others' were aggregated` });
        }
        const a0 = performance.now();
        await ddp.step(optimizer);
        const apply = performance.now() - a0;
        const hash = flags.checkWeights ? parseInt(await ddp.weightsHash(), 16) : 0;
        return {
          ...stepBytes(comm, result, step, ddp, pg),
          ...deviceMetrics,
          // No samples (balanced batches gave them to faster tabs): no loss and no accuracy, not 0.
          loss: indices.length > 0 ? result.loss : null,
          // Of every label: a language model's accuracy is its next-character accuracy.
          accuracy: indices.length > 0 ? correct / (indices.length * labelsPerSample(trainSet)) : null,
          // This rank's share of the step's samples (balanced batches differ between ranks).
          samples: indices.length,
          // A rank given no samples (balanced batches) may finish a step that meets nobody in 0 ms: 0, not 0/0.
          samplesPerSec: indices.length > 0 ? (indices.length / (performance.now() - t0)) * 1000 : 0,
          stepMs: performance.now() - t0,
          ...result.timings,
          apply,
          // A 32-bit hash in two halves, each exact in the float32 the vote carries.
          hashHi: hash >>> 16,
          hashLo: hash & 0xffff,
        };
      },

      onRound({ pg, ddp }) {
        emit({ type: 'joined', rank: pg.rank, worldSize: pg.worldSize, round: pg.round, backend: backend.backend, fallbackReason: backend.fallbackReason, adapter: gpu.adapter, ...(backend.probe ? { probe: backend.probe } : {}) });
        shareFleet(pg, backend, gpu.adapter);
        if (!announcedModel) emit({ type: 'log', level: 'info', message: `Model ${job.modelName}: ${ddp.parameterCount} parameters in ${ddp.buckets.length} bucket(s)` });
        announcedModel = true;
        watchLinks(pg, emit);
      },

      async onStep({ pg, step, epoch, metrics }) {
        // The global batch's loss: each rank's mean loss weighted by its samples (balanced batches differ).
        lastLoss = weightedLoss(metrics);
        if (flags.checkWeights) hashChecks.push(metrics.every((m) => m.hashHi === metrics[0]!.hashHi && m.hashLo === metrics[0]!.hashLo));
        if (step > 1) {
          // The first step compiles shaders: leave it out of the averages.
          timedSteps++;
          for (const key of Object.keys(sums) as Array<keyof typeof sums>) sums[key] += metrics.reduce((s, m) => s + m[key], 0) / metrics.length;
          slowedTotal += metrics[pg.rank]!.slowed;
          bytes.sent += metrics[pg.rank]!.commBytes;
          commSpan += metrics.reduce((s, m) => s + m.comm, 0) / metrics.length;
          if (step > hookStart) {
            bytes.afterStart += metrics[pg.rank]!.commBytes;
            bytes.stepsAfterStart++;
          }
          bytes.dense += metrics[pg.rank]!.commDenseBytes;
          if (comm.averager?.averagesAt(step) || syncsAt(comm, step)) bytes.averagings++;
          samplesPerSecTotal += metrics.reduce((s, m) => s + m.samplesPerSec, 0);
          const mine = metrics[pg.rank]!;
          const wire = Math.min(...metrics.map((m) => m.allreduce));
          own.compute += mine.compute;
          own.readback += mine.readback;
          own.wire += wire;
          own.waitSlowest += mine.allreduce - wire;
          own.apply += mine.apply;
          own.batch += Math.max(0, mine.stepMs - mine.compute - mine.readback - mine.allreduce - mine.apply);
        }
        tensorCounts.push(tf.memory().numTensors);
        const atEpochEnd = state.progress.position >= trainSet.length;
        if (config.evalEvery > 0 && step % config.evalEvery === 0 && !atEpochEnd) await evaluateAndEmit(pg, step, epoch);
        // Between evaluations too, early and then ever more rarely (N, 2N, 4N ...): the writing shows
        // within the first minute, and later samples cost little. Every rank at the same steps.
        else if (sampleDue(step, config.firstSample) && !atEpochEnd) await writeSample(step);
      },

      async onEpochEnd({ pg, step, epoch }) {
        await evaluateAndEmit(pg, step, epoch);
      },

      // After a lost GPU, on the re-created backend: the same model as at the start; the group's
      // state comes with the next round.
      async rebuildState({ backend: now, fallbackReason }) {
        // recreateBackend starts webgpu again, or one of its default fallbacks (webgl, cpu).
        backend = { backend: now as BackendName, ...(fallbackReason ? { fallbackReason } : {}) };
        if (fallbackReason) emit({ type: 'log', level: 'warn', message: `Backend fallback: ${fallbackReason}` });
        model = await newModel();
        state = newState(model);
        opts.onModel?.(model, job.text?.tokenizer.chars);
        return state;
      },

      onEvent: judged.onEvent,
    });
  } finally {
    // The Workers end with the run, also when it fails; their figures stay readable.
    dp?.close();
  }

  const { pg } = run;
  if (run.stoppedBy !== null) emit({ type: 'stopped', by: run.stoppedBy, atStep: run.steps });
  const latest = evals.at(-1);
  // The collectives after the run: a tab closed as it ended costs figures, not the run.
  const final = latest?.step === run.steps ? latest : await finalEvaluation(pg, run.steps, run.epoch);
  const weights = await run.ddp.flatWeights();
  const probeCount = Math.min(8, testSet.length);
  const probeBatch = await fetchBatch(testSet, Array.from({ length: probeCount }, (_, i) => i));
  const logitsT = tf.tidy(() => model.predict(tf.tensor(probeBatch.x, [probeCount, ...testSet.inputShape])) as tf.Tensor);
  const logits = (await logitsT.data()) as Float32Array;
  logitsT.dispose();
  const links = await linkReport(pg);
  // The same reductions bare, in the same run on the same group: what the step's communication is held against.
  // A measurement after the run: a rank lost now (a tab frozen at the last step) costs the figure, not the run.
  const bareAllReduceMs = await bareBucketsAllReduce(pg, run.ddp.buckets).catch((err: unknown) => {
    if (!isRecoverable(err)) throw err;
    emit({ type: 'log', level: 'warn', message: `The bare all-reduce measured after the run was not taken: ${(err as Error).message}` });
    return null;
  });
  const timelineMs = stepTimeline(own, timedSteps, run.timeline);
  const summary: Record<string, unknown> = {
    rank: pg.rank,
    worldSize: pg.worldSize,
    backend: backend.backend,
    // backend=auto: what each backend measured (ms per step of this model), the chosen one above.
    ...(backend.probe ? { backendProbe: backend.probe } : {}),
    model: config.model,
    ...(config.hidden === null ? {} : { hiddenUnits: config.hidden }),
    parameters: model.countParams(),
    dataset: config.dataset,
    // The host's images fetched as the steps needed them (--stream-data), not all at the start.
    ...(config.dataset === 'user' ? { dataStreamed: trainSet.prepare !== undefined } : {}),
    steps: run.steps,
    epochs: run.epoch,
    samplesPerSec: timedSteps > 0 ? samplesPerSecTotal / timedSteps : null,
    finalLoss: lastLoss,
    // null when the host skipped the evaluation after the run.
    testAccuracy: final?.testAccuracy ?? null,
    testLoss: final?.testLoss ?? null,
    ...(final === null ? { evaluationSkipped: true } : {}),
    // The language model: its test loss per character as a perplexity, the baseline of the
    // characters' frequencies, characters per second, and what it writes at the end.
    ...(job.text && lastSample
      ? { perplexity: final === null ? null : Math.exp(final.testLoss), unigram: job.text.unigram, context: trainSet.inputShape[0], tokensPerSec: timedSteps > 0 ? (samplesPerSecTotal / timedSteps) * trainSet.inputShape[0]! : null, sample: lastSample.prompt + lastSample.text, sampleSteps }
      : {}),
    weightHash: hashFloat32(weights),
    // Averaged over ranks, as every figure of the breakdown (`slowed` only when the job has stragglers).
    breakdownMs: Object.fromEntries(
      Object.entries(sums)
        .filter(([key]) => key !== 'slowed' || config.slow !== null)
        .map(([key, v]) => [key, timedSteps > 0 ? v / timedSteps : null]),
    ),
    // --comm-hook: the hook, this rank's mean bytes per timed step, and their share of the float32 all-reduce's.
    commHook: commHookSummary(comm, run.ddp.commHook.name, run.ddp.parameterCount, pg, bytes.averagings),
    bytesPerStep: timedSteps > 0 ? bytes.sent / timedSteps : null,
    denseBytesPerStep: timedSteps > 0 ? bytes.dense / timedSteps : null,
    compressionRatio: bytes.dense > 0 ? bytes.sent / bytes.dense : null,
    // The same after the hook's start (PowerSGD's plain warm-up steps left out).
    bytesPerStepAfterStart: bytes.stepsAfterStart > 0 ? bytes.afterStart / bytes.stepsAfterStart : null,
    // Overlap: of the communication's span per step, what ran while buckets were still being read
    // back (hidden) and what the step waited for at its end (exposed, breakdownMs.allreduce). Averaged over ranks.
    // DiLoCo: of its outer all-reduces' time on the wire, what ran behind the next inner steps.
    overlap: run.ddp.commHook instanceof DiLoCo ? dilocoOverlap(run.ddp.commHook) : overlapOf(timedSteps, commSpan, sums.allreduce),
    // Where this rank's step went, mean ms per timed step (see stepTimeline); and the float32
    // all-reduce of the buckets alone, timed after training on the same group.
    timelineMs,
    bareAllReduceMs,
    // --devices: how many this rank computed on and, with more than one, each one's backend and figures.
    devices: config.devices,
    ...(dp ? { deviceReports: dp.deviceStats() } : {}),
    // --slow: this rank's factor (in the last round) and the ms it waited per step on average.
    ...(config.slow !== null ? { slowFactor: slowFactor(config.slow, pg.rank), slowedMs: timedSteps > 0 ? slowedTotal / timedSteps : null } : {}),
    seconds: (performance.now() - started) / 1000,
    generations: run.generations,
    stepsRedone: run.stepsRedone,
    pausedGenerations: run.pausedGenerations,
    resumes: run.resumes,
    // Live tensors after each step: flat when nothing leaks.
    liveTensors: { steps: tensorCounts.length, min: Math.min(...tensorCounts), max: Math.max(...tensorCounts) },
    // The final group's links: which way each one's bytes went (host, srflx, prflx, relay).
    links,
    ...(flags.checkWeights ? { identicalEveryStep: hashChecks.every(Boolean), checkedSteps: hashChecks.length } : {}),
    ...(run.stoppedBy !== null ? { stoppedBy: run.stoppedBy } : {}),
    ...judged.result(),
    ...(flags.returnWeights && pg.rank === 0 ? { weights: encodeValue(new Uint8Array(weights.buffer, weights.byteOffset, weights.byteLength)) } : {}),
  };
  emit({ type: 'done', summary });
  return { summary, model, pg, close: run.close, probe: { inputs: probeBatch.x, inputShape: testSet.inputShape, logits } };
}

/**
 * This rank's timeline, mean ms per timed step: compute, readback, waitSlowest and wire (the
 * exposed all-reduce, split), apply, batch (the rest of the step function: the batch's tensors,
 * the metrics), then what runElastic measured around the step: average (local SGD), vote (the
 * step-boundary all-gather), page (onStep: the dashboard's events, evaluations; replica checks,
 * checkpoints) and other; total is the wall time per step.
 */
function stepTimeline(own: Record<'compute' | 'readback' | 'waitSlowest' | 'wire' | 'apply' | 'batch', number>, steps: number, run: StepTimeline): Record<string, number | null> {
  const mean = (v: number) => (steps > 0 ? v / steps : null);
  const measured = (v: number) => (run.steps > 0 ? v : null);
  const { average, vote, page, other, total } = run;
  return {
    ...Object.fromEntries(Object.entries(own).map(([k, v]) => [k, mean(v)])),
    ...Object.fromEntries(Object.entries({ average, vote, page, other, total }).map(([k, v]) => [k, measured(v)])),
  };
}

/** Median ms of the buckets' float32 all-reduces, one after the other, over `iters` rounds (each after a barrier). */
async function bareBucketsAllReduce(pg: ProcessGroup, buckets: ReadonlyArray<{ start: number; end: number }>, iters = 5): Promise<number | null> {
  if (pg.worldSize < 2 || buckets.length === 0) return null;
  const times: number[] = [];
  for (let i = 0; i <= iters; i++) {
    await pg.barrier();
    const t0 = performance.now();
    for (const b of buckets) await pg.allReduce(new Float32Array(b.end - b.start), 'avg');
    if (i > 0) times.push(performance.now() - t0); // the first warms up
  }
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)]!;
}

/** With DiLoCo, the ranks vote at least this often (runElastic's voteEvery): a stop or a joiner waits at most this many steps. */
const DILOCO_VOTE_EVERY = 16;

/**
 * A step's bytes for the vote: what the backward's reductions sent (plus, with localsgd, the
 * model averaging runElastic does after this step, when it averages: one float32 all-reduce of
 * every trainable weight, computed), and what the float32 all-reduce of the buckets would have.
 */
function stepBytes(comm: CommSetup, sent: { commBytes: number; carriedValues: number }, step: number, ddp: { buckets: ReadonlyArray<{ start: number; end: number }>; parameterCount: number }, pg: ProcessGroup): CommMetrics {
  const averaging = comm.averager?.averagesAt(step) ? plainAllReduceBytes(ddp.parameterCount, pg.rank, pg.worldSize) : outerStepBytes(comm, ddp.parameterCount, pg, step);
  return { commBytes: sent.commBytes + averaging, commDenseBytes: denseStepBytes(ddp.buckets, pg.rank, pg.worldSize, TRAIN_FRAME_BYTES, sent.carriedValues) };
}

/** Whether some DiLoCo fragment takes its outer step after `step` (DiLoCo.syncsAt's rule). */
function syncsAt(comm: CommSetup, step: number): boolean {
  return comm.diloco !== undefined && fragmentsSyncingAt(step, comm.diloco.syncEvery, comm.diloco.fragments ?? 1).length > 0;
}

/**
 * What DiLoCo's outer all-reduces started after `step` send from this rank (its pseudo-gradient's
 * fragments whose turn it is, in the wire type), computed; every fragment's when `step` is
 * undefined (one outer step of the whole model). 0 without DiLoCo.
 */
function outerStepBytes(comm: CommSetup, parameterCount: number, pg: ProcessGroup, step?: number): number {
  const d = comm.diloco;
  if (!d) return 0;
  const ranges = fragmentRanges(parameterCount, d.fragments ?? 1);
  const turn = step === undefined ? ranges.map((_, f) => f) : fragmentsSyncingAt(step, d.syncEvery, d.fragments ?? 1);
  return turn.reduce((sum, f) => sum + allReduceBytes(ranges[f]!.end - ranges[f]!.start, pg.rank, pg.worldSize, { frameBytes: TRAIN_FRAME_BYTES, wire: d.wire ?? 'float32' }), 0);
}

/**
 * The summary's `commHook`: the option as given (`name`: one of COMM_HOOK_NAMES, src/jobs/comm_hook_spec.ts)
 * and its numbers, and `registered`, the name of the hook the last round's DDP reduced with (its
 * own `allreduce` without one). PowerSGD adds its last step's counts (`lastStats`: elements this
 * rank all-reduced, and those an uncompressed all-reduce would have); localsgd the averagings in
 * the timed steps and what one sends from this rank; diloco its outer steps and what one sends.
 */
function commHookSummary(comm: CommSetup, registered: string, parameterCount: number, pg: ProcessGroup, averagings: number): Record<string, unknown> {
  const spec = comm.spec;
  switch (spec.kind) {
    case 'powersgd': {
      const stats = comm.powerSGD!.lastStats;
      return { name: spec.kind, registered, rank: spec.rank, startIter: spec.startIter, wire: spec.wire, statsStep: stats.step, elementsSent: stats.elementsSent, elementsDense: stats.elementsDense };
    }
    case 'localsgd':
      return { name: spec.kind, registered, period: spec.period, startStep: spec.startStep, averagings, averageBytes: plainAllReduceBytes(parameterCount, pg.rank, pg.worldSize) };
    case 'diloco':
      return { name: spec.kind, registered, syncEvery: spec.syncEvery, outerLr: spec.outerLr, outerMomentum: spec.outerMomentum, wire: spec.wire, stream: spec.stream, overlap: spec.overlap, outerSteps: averagings, outerStepBytes: outerStepBytes(comm, parameterCount, pg) };
    default:
      return { name: spec.kind, registered };
  }
}

/** DiLoCo's outer all-reduces: mean span and exposed wait per all-reduce, and the share of the span hidden behind inner steps. */
function dilocoOverlap(d: DiLoCo): { commMs: number; exposedMs: number; hiddenShare: number; allReduces: number } | null {
  const c = d.comm;
  if (c.allReduces === 0 || c.spanMs <= 0) return null;
  const exposed = Math.min(c.exposedMs, c.spanMs);
  return { commMs: c.spanMs / c.allReduces, exposedMs: exposed / c.allReduces, hiddenShare: 1 - exposed / c.spanMs, allReduces: c.allReduces };
}

/** Mean communication span and exposed wait per step, and the share of the span hidden behind the backward. */
function overlapOf(steps: number, span: number, exposed: number): { commMs: number; exposedMs: number; hiddenShare: number } | null {
  if (steps === 0 || span <= 0) return null;
  const commMs = span / steps;
  const exposedMs = Math.min(exposed / steps, commMs);
  return { commMs, exposedMs, hiddenShare: 1 - exposedMs / commMs };
}

/** The step's loss over the global batch: each rank's mean loss weighted by its samples (a rank without samples has none). */
function weightedLoss(metrics: ReadonlyArray<{ loss: number | null; samples: number }>): number {
  let samples = 0;
  let sum = 0;
  for (const m of metrics) {
    if (m.loss === null || !(m.samples > 0)) continue;
    samples += m.samples;
    sum += m.loss * m.samples;
  }
  return samples > 0 ? sum / samples : NaN;
}
